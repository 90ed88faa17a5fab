"""The fake E2B's HTTP server: one loopback port for both roles, the API and every sandbox's envd.

``E2B_API_URL`` and ``E2B_SANDBOX_URL`` both point here; as E2B's edge proxy does, requests that
carry ``E2b-Sandbox-Id`` go to that sandbox's envd (``envd.py``), the rest to the control plane
(``api.py``). A sandbox that was killed or expired answers every sandbox route, ``/health``
included, with 502 ``{"code": 502, "message": "sandbox <id> was not found"}``, so the SDK's own
probe turns it into ``SandboxNotRunningException``.

The Connect routes (``/process.Process/*``) are served by the generated WSGI application through a
small bridge: the request body is read whole (``Content-Length`` or chunked), and each piece the
application yields is written at once as an HTTP/1.1 chunk, so stream events arrive as they happen.
The SDK speaks HTTP/1.1 to an ``http://`` URL, so no h2c is needed.
"""

from __future__ import annotations

import io
import json
import socket
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from . import api, files


class Server(ThreadingHTTPServer):
    """A burst of connections must not overflow the listen backlog (the SDK opens many at once)."""

    request_queue_size = 512
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet about connections a client (or the chaos) dropped; loud about anything else."""
        if not isinstance(sys.exc_info()[1], (ConnectionError, OSError)):
            super().handle_error(request, client_address)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    @property
    def fake(self) -> Any:
        return self.server.fake  # type: ignore[attr-defined]

    def setup(self) -> None:
        super().setup()
        with self.fake.lock:
            self.fake.connections.append(self.connection)

    # -- plumbing --------------------------------------------------------------------------------

    def body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def send(self, status: int, payload: Any = None, headers: dict | None = None, raw: bytes | None = None,
             content_type: str = "application/json") -> None:
        data = raw if raw is not None else (b"" if payload is None else json.dumps(payload).encode())
        self.send_response(status)
        if status != 204:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, str(value))
        self.end_headers()
        self.wfile.write(data)

    def error(self, status: int, message: str, headers: dict | None = None) -> None:
        self.send(status, {"code": status, "message": message}, headers)

    def drop(self) -> None:
        """The connection dies before an answer (a proxy restart, a reset)."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def wsgi(self, app: Any, body: bytes) -> None:
        url = urlsplit(self.path)
        environ = {
            "REQUEST_METHOD": self.command, "PATH_INFO": url.path, "QUERY_STRING": url.query, "SCRIPT_NAME": "",
            "SERVER_NAME": "127.0.0.1", "SERVER_PORT": str(self.server.server_address[1]),
            "SERVER_PROTOCOL": "HTTP/1.1", "REMOTE_ADDR": self.client_address[0],
            "CONTENT_LENGTH": str(len(body)), "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "wsgi.input": io.BytesIO(body), "wsgi.errors": sys.stderr, "wsgi.url_scheme": "http",
            "wsgi.version": (1, 0), "wsgi.multithread": True, "wsgi.multiprocess": False, "wsgi.run_once": False,
        }
        for key, value in self.headers.items():
            name = "HTTP_" + key.upper().replace("-", "_")
            if name not in ("HTTP_CONTENT_TYPE", "HTTP_CONTENT_LENGTH"):
                environ[name] = value
        started: list = []

        def start_response(status: str, headers: list, exc_info: Any = None) -> Any:
            started[:] = [status, headers]
            return lambda data: None

        result = app(environ, start_response)
        try:
            head = False
            for piece in result:
                if not head:
                    self._head(started)
                    head = True
                if piece:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.flush()
            if not head:
                self._head(started)
            self.wfile.write(b"0\r\n\r\n")
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()

    def _head(self, started: list) -> None:
        status, headers = started
        self.send_response(int(status.split()[0]), status.partition(" ")[2])
        for key, value in headers:
            if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(key, value)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    # -- routing ---------------------------------------------------------------------------------

    def handle_any(self) -> None:
        fake = self.fake
        body = self.body()
        path = urlsplit(self.path).path
        sandbox_id = self.headers.get("E2b-Sandbox-Id")
        route = _route(self.command, path, sandbox_id is not None)
        target = sandbox_id or api.path_id(path)
        with fake.lock:
            fake.calls.append((route, target))
        if route == "unknown":
            return self.error(404, f"no route for {self.command} {path}")
        if sandbox_id is None and not self.headers.get("X-API-KEY"):
            return self.error(401, "Invalid API key")
        if sandbox_id is not None:
            fake.expire()
            if fake.running(sandbox_id) is None:
                return self.error(502, f"sandbox {sandbox_id} was not found")
        fault = fake.take_fault(route, body)
        if fault is not None:
            if fault.status == 0:
                return self.drop()
            return self.error(fault.status, fault.message, fault.headers)
        if fake.latency.get(route):
            time.sleep(fake.latency[route])
        chaos = fake.roll(route)
        if chaos == "drop":
            return self.drop()
        if chaos == "vanish":
            fake.vanish(target or "")
            return self.error(502, f"sandbox {target} was not found")
        if chaos is not None:
            return self.error(int(chaos), f"chaos: injected {chaos}",
                              {"Retry-After": "0.1"} if chaos == "429" else None)
        if sandbox_id is not None:
            return self._envd(route, sandbox_id, body)
        return api.handle(self, route, path, body)

    def _envd(self, route: str, sandbox_id: str, body: bytes) -> None:
        if route == "health":
            return self.send(204)
        if route == "files":
            query = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
            return files.handle(self, self.fake.running(sandbox_id), query, body)
        return self.wsgi(self.fake.process_app, body)

    do_GET = do_POST = do_DELETE = do_PUT = handle_any


def _route(method: str, path: str, envd: bool) -> str:
    """A short name for the request, which faults and counts use."""
    if envd:
        if path == "/health":
            return "health"
        if path == "/files":
            return "files"
        if path.startswith("/process.Process/"):
            return {"Start": "exec"}.get(path.rsplit("/", 1)[1], path.rsplit("/", 1)[1].lower())
        return "unknown"
    return api.route(method, path)

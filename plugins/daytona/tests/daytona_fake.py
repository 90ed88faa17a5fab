"""A fake Daytona API and toolbox on 127.0.0.1, for tests that drive the real ``daytona`` SDK.

It implements the REST endpoints the SDK calls for what the provider uses: create, get, list by
labels (paged by cursor), delete, last-activity, and on the toolbox (``toolboxProxyUrl`` points back
here) ``process/execute`` and ``files/bulk-upload`` / ``files/bulk-download``. Like Daytona's
daemon, ``process/execute`` feeds the command text to ``/bin/sh`` on its stdin, merges stderr into
stdout, and on timeout kills the process group and answers 408.

Each fake sandbox is a container of its own on this host (``trl_sandbox.remote.fake_container``: a
bubblewrap with its own PID namespace, ``/tmp``, ``/var/tmp`` and ``/dev/shm``), as Daytona gives
each sandbox its own container: commands, uploads and downloads happen inside it, a process a
command leaves running lives on there for the next command (until the sandbox is deleted), and a
command sees only its own sandbox's processes. ``exec_commands`` records the command text of every
exec, per sandbox. It stands in for the vendor's cloud: only test programs may be sent to it.

Faults are injected per route (``create``, ``get``, ``list``, ``delete``, ``exec``, ``upload``,
``download``, ``activity``, ``snapshot_sandbox``, ``snapshot_get``, ``snapshot_delete``): ``fail(route, status, times, headers, message, match)`` answers the
next requests (whose body contains ``match``, if given) with an error envelope; ``stick_next_creates(n)`` leaves new sandboxes in ``starting`` forever;
``vanish(id)`` makes a sandbox disappear (404 everywhere). ``chaos(seed, transient, vanish)``
turns on seeded random faults like a busy real service's: each create and exec fails with
probability ``transient`` (503, 502, 429 or a dropped connection) and each exec finds its sandbox
reclaimed with probability ``vanish``; ``chaos(None)`` turns them off. ``created_labels`` records
the labels of every sandbox ever created. ``latency`` (route -> seconds) delays answers, like a
real service's create (about a second) and exec round trip (tens of milliseconds).

Snapshots (``POST /sandbox/{id}/snapshot``, ``GET``/``DELETE /snapshots/{id or name}``, and a
create with ``snapshot``): a snapshot of a fake sandbox is a tarball of its ``/var/tmp`` (the
container's only lasting writable place besides ``/tmp``), unpacked into each sandbox created from
it. ``snapshot_fault(kind)`` spoils the next snapshot: ``"ghost"`` (the call succeeds but no
snapshot exists), ``"pending"`` (it stays ``pending`` forever), ``"boot404"`` (it is ``active``
but a create from it answers 404). ``snapshots`` holds the live ones by name.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from trl_sandbox.remote.fake_container import FakeContainer, FileError

API_KEY = "test-key"


@dataclass
class FakeSandbox:
    id: str
    request: dict
    state: str = "started"
    created_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat())
    procs: set = field(default_factory=set)
    activity: int = 0
    container: FakeContainer | None = None


@dataclass
class FakeSnapshot:
    id: str
    name: str
    source: str
    data: bytes
    state: str = "active"
    boot404: bool = False
    created_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat())


@dataclass
class Fault:
    status: int
    times: int
    headers: dict
    message: str
    match: bytes | None = None  # only requests whose body contains this


class _Server(ThreadingHTTPServer):
    # A real service accepts a burst of connections; the standard library's backlog of 5 would
    # drop SYNs of a 64-request burst, and the client's TCP retries (1 s, 3 s) would time the fake.
    request_queue_size = 256

    def handle_error(self, request, client_address) -> None:
        """Quiet about connections a client (or the chaos) dropped; loud about anything else."""
        if not isinstance(sys.exc_info()[1], (ConnectionError, OSError)):
            super().handle_error(request, client_address)


class FakeDaytona:
    def __init__(self, page_size: int = 2) -> None:
        self.page_size = page_size
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.deleted: list[str] = []
        self.calls: list[tuple[str, str | None]] = []  # (route, sandbox id)
        self.exec_commands: dict[str, list[str]] = {}
        self.faults: dict[str, list[Fault]] = {}
        self.stuck_creates = 0
        self.snapshots: dict[str, FakeSnapshot] = {}
        self.snapshot_faults: list[str] = []
        self.snapshots_made = 0  # every snapshot call that succeeded, ghosts included
        self.created_labels: list[dict] = []
        self.latency: dict[str, float] = {}
        self._chaos: tuple[random.Random, float, float] | None = None
        self.spawned: list = []  # every process started, killed at stop()
        self.connections: list = []
        self.lock = threading.Lock()
        self._ids = itertools.count(1)
        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.server.fake = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self.server.serve_forever, name="fake-daytona", daemon=True)
        self._stopped = False

    # -- control ---------------------------------------------------------------------------------

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def api_url(self) -> str:
        return self.base + "/api"

    def start(self) -> FakeDaytona:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.server.shutdown()
        self.server.server_close()
        with self.lock:  # also the kept-alive connections: the service is gone
            for connection in self.connections:
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        with self.lock:
            for proc in self.spawned:
                if proc.returncode is None:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            sandboxes = list(self.sandboxes.values())
        for sandbox in sandboxes:
            _kill_all(sandbox)

    def fail(self, route: str, status: int, times: int = 1, headers: dict | None = None, message: str = "",
             match: str | None = None) -> None:
        with self.lock:
            self.faults.setdefault(route, []).append(
                Fault(status, times, dict(headers or {}), message or f"injected {status}",
                      match.encode() if match else None)
            )

    def chaos(self, seed: int | None, transient: float = 0.2, vanish: float = 0.05) -> None:
        with self.lock:
            self._chaos = None if seed is None else (random.Random(seed), transient, vanish)

    def roll(self, route: str) -> str | None:
        """The chaos for one request: None, "vanish", or a transient fault's name."""
        with self.lock:
            if self._chaos is None or route not in ("create", "exec"):
                return None
            rng, transient, vanish = self._chaos
            draw = rng.random()
            if draw < transient:
                return rng.choice(["503", "502", "429", "drop"])
            if route == "exec" and draw < transient + vanish:
                return "vanish"
            return None

    def stick_next_creates(self, n: int = 1) -> None:
        with self.lock:
            self.stuck_creates += n

    def snapshot_fault(self, kind: str, times: int = 1) -> None:
        assert kind in ("ghost", "pending", "boot404")
        with self.lock:
            self.snapshot_faults.extend([kind] * times)

    def drop_snapshot(self, name: str) -> None:
        """The snapshot vanishes (deleted behind our back)."""
        with self.lock:
            self.snapshots.pop(name, None)

    def snapshot_dto(self, snap: FakeSnapshot) -> dict:
        return {"id": snap.id, "organizationId": "org-test", "general": False, "name": snap.name,
                "imageName": None, "state": snap.state, "size": len(snap.data) / 1e9, "entrypoint": None,
                "cpu": 1, "gpu": 0, "mem": 1, "disk": 3, "errorReason": None, "createdAt": snap.created_at,
                "updatedAt": snap.created_at, "lastUsedAt": None, "sourceSandboxId": snap.source}

    def find_snapshot(self, ref: str) -> FakeSnapshot | None:
        with self.lock:
            return self.snapshots.get(ref) or next((s for s in self.snapshots.values() if s.id == ref), None)

    def vanish(self, sandbox_id: str) -> None:
        with self.lock:
            sandbox = self.sandboxes.pop(sandbox_id)
            _kill_all(sandbox)

    def live(self) -> list[str]:
        with self.lock:
            return [s.id for s in self.sandboxes.values() if s.state != "destroyed"]

    def count(self, route: str) -> int:
        with self.lock:
            return sum(1 for r, _ in self.calls if r == route)

    # -- helpers for the handler -----------------------------------------------------------------

    def take_fault(self, route: str, body: bytes) -> Fault | None:
        with self.lock:
            for fault in self.faults.get(route) or []:
                if fault.match is None or fault.match in body:
                    fault.times -= 1
                    if fault.times <= 0:
                        self.faults[route].remove(fault)
                    return fault
            return None

    def dto(self, sandbox: FakeSandbox, full: bool = True) -> dict:
        r = sandbox.request
        build = r.get("buildInfo") or None
        out = {
            "id": sandbox.id, "organizationId": "org-test", "name": r.get("name") or sandbox.id,
            "user": r.get("user") or "daytona", "labels": r.get("labels") or {}, "public": bool(r.get("public")),
            "networkBlockAll": bool(r.get("networkBlockAll")), "target": r.get("target") or "us",
            "cpu": r.get("cpu") or 1, "gpu": 0, "memory": r.get("memory") or 1, "disk": r.get("disk") or 3,
            "toolboxProxyUrl": self.base + "/toolbox", "state": sandbox.state, "snapshot": r.get("snapshot"),
            "autoStopInterval": r.get("autoStopInterval"), "autoDeleteInterval": r.get("autoDeleteInterval"),
            "createdAt": sandbox.created_at, "updatedAt": sandbox.created_at,
            "buildInfo": ({"dockerfileContent": build.get("dockerfileContent", ""), "contextHashes": [],
                           "createdAt": sandbox.created_at, "updatedAt": sandbox.created_at, "snapshotRef": "x"}
                          if build and full else None),
        }
        if full:
            out.update(env=r.get("env") or {}, kvm=False)
        return {k: v for k, v in out.items() if v is not None}


def _kill_all(sandbox: FakeSandbox) -> None:
    """The sandbox is gone: its container, and every process in it, with it."""
    for proc in list(sandbox.procs):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if sandbox.container is not None:
        sandbox.container.kill()


def _split_multipart(body: bytes, content_type: str) -> list[tuple[dict[str, str], bytes]]:
    """Byte-exact multipart/form-data parsing: [(disposition parameters, data)]."""
    boundary = None
    for part in content_type.split(";"):
        key, _, value = part.strip().partition("=")
        if key.lower() == "boundary":
            boundary = value.strip('"')
    if not boundary:
        raise ValueError("no multipart boundary")
    parts = []
    for chunk in body.split(b"--" + boundary.encode())[1:]:
        if chunk.startswith(b"--"):
            break
        head, _, data = chunk.partition(b"\r\n\r\n")
        if data.endswith(b"\r\n"):
            data = data[:-2]
        params: dict[str, str] = {}
        for line in head.decode("latin-1").split("\r\n"):
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-disposition":
                for item in value.split(";")[1:]:
                    k, _, v = item.strip().partition("=")
                    params[k.lower()] = v.strip('"')
        parts.append((params, data))
    return parts


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        with self.fake.lock:
            self.fake.connections.append(self.connection)

    @property
    def fake(self) -> FakeDaytona:
        return self.server.fake  # type: ignore[attr-defined]

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, payload: object = None, headers: dict | None = None,
              raw: bytes | None = None, content_type: str = "application/json") -> None:
        body = raw if raw is not None else (b"" if payload is None else json.dumps(payload).encode())
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, str(value))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, code: str | None = None, headers: dict | None = None) -> None:
        envelope = {"statusCode": status, "message": message, "code": code or f"HTTP_{status}",
                    "timestamp": datetime.now(timezone.utc).isoformat(), "path": self.path, "method": self.command}
        self._send(status, envelope, headers)

    def _route(self) -> tuple[str, str | None, str]:
        parts = [p for p in urlsplit(self.path).path.split("/") if p]
        method = self.command
        if parts[:1] == ["api"]:
            rest = parts[1:]
            if rest[:1] == ["snapshots"] and len(rest) == 2:
                return ("snapshot_delete" if method == "DELETE" else "snapshot_get"), rest[1], ""
            if rest[:1] == ["sandbox"]:
                if len(rest) == 1:
                    return ("create" if method == "POST" else "list"), None, ""
                if len(rest) == 2:
                    return ("delete" if method == "DELETE" else "get"), rest[1], ""
                if rest[2:] == ["last-activity"]:
                    return "activity", rest[1], ""
                if rest[2:] == ["snapshot"] and method == "POST":
                    return "snapshot_sandbox", rest[1], ""
            return "unknown", None, ""
        if parts[:1] == ["toolbox"] and len(parts) >= 3:
            tail = "/".join(parts[2:])
            route = {"process/execute": "exec", "files/bulk-upload": "upload",
                     "files/bulk-download": "download"}.get(tail, "unknown")
            return route, parts[1], tail
        return "unknown", None, ""

    def _handle(self) -> None:
        route, sandbox_id, _ = self._route()
        body = self._body()
        fake = self.fake
        with fake.lock:
            fake.calls.append((route, sandbox_id))
        if route == "unknown":
            return self._error(404, f"no route for {self.command} {self.path}")
        if self.headers.get("Authorization") != f"Bearer {API_KEY}":
            return self._error(401, "Invalid credentials", "UNAUTHORIZED")
        fault = fake.take_fault(route, body)
        if fault is not None:
            return self._error(fault.status, fault.message, headers=fault.headers)
        if fake.latency.get(route):
            time.sleep(fake.latency[route])  # this request's own thread: others go on meanwhile
        chaos = fake.roll(route)
        if chaos == "drop":  # the connection dies before an answer (a proxy restart, a reset)
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return None
        if chaos == "vanish":
            with contextlib.suppress(KeyError):
                fake.vanish(sandbox_id or "")
        elif chaos is not None:
            return self._error(int(chaos), f"chaos: injected {chaos}")
        if route == "create":
            return self._create(json.loads(body or b"{}"))
        if route == "list":
            return self._list()
        if route in ("snapshot_get", "snapshot_delete"):
            snap = fake.find_snapshot(sandbox_id or "")
            if snap is None:
                return self._error(404, f"Snapshot {sandbox_id} not found", "NOT_FOUND")
            if route == "snapshot_delete":
                fake.drop_snapshot(snap.name)
            return self._send(200, fake.snapshot_dto(snap))
        with fake.lock:
            sandbox = fake.sandboxes.get(sandbox_id or "")
        if sandbox is None or sandbox.state == "destroyed" and route != "get":
            return self._error(404, f"Sandbox with ID or name {sandbox_id} not found", "NOT_FOUND")
        if route == "get":
            return self._send(200, fake.dto(sandbox))
        if route == "delete":
            with fake.lock:
                sandbox.state = "destroyed"
                fake.deleted.append(sandbox.id)
                _kill_all(sandbox)
            return self._send(200, fake.dto(sandbox))
        if route == "activity":
            with fake.lock:
                sandbox.activity += 1
            return self._send(201, raw=b"", content_type="text/plain")
        if sandbox.state != "started":
            return self._error(409, f"Sandbox {sandbox.id} is not started", "CONFLICT")
        if route == "snapshot_sandbox":
            return self._snapshot(sandbox, json.loads(body or b"{}"))
        if route == "exec":
            return self._exec(sandbox, json.loads(body or b"{}"))
        if route == "upload":
            return self._upload(sandbox, body)
        if route == "download":
            return self._download(sandbox, json.loads(body or b"{}"))

    do_GET = do_POST = do_DELETE = _handle

    # -- control plane ---------------------------------------------------------------------------

    def _create(self, request: dict) -> None:
        fake = self.fake
        name = request.get("snapshot")
        snap = fake.find_snapshot(name) if name else None
        if name and (snap is None and name.startswith("trl-sandbox-env-") or snap is not None and snap.boot404):
            return self._error(404, f"Snapshot {name} not found", "NOT_FOUND")
        if snap is not None and snap.state != "active":
            return self._error(400, f"Snapshot {name} is {snap.state}", "BAD_REQUEST")
        container = FakeContainer()
        if snap is not None:  # the snapshot's file system state
            subprocess.run(container.argv(["tar", "-C", "/var/tmp", "-xf", "-"]), input=snap.data, check=True,
                           env=container.env, capture_output=True, timeout=60)
        with fake.lock:
            sandbox_id = f"sbx-{next(fake._ids)}-{uuid.uuid4().hex[:6]}"
            sandbox = FakeSandbox(sandbox_id, request, container=container)
            if fake._stopped:
                container.kill()
            if fake.stuck_creates > 0:
                fake.stuck_creates -= 1
                sandbox.state = "starting"
            fake.sandboxes[sandbox_id] = sandbox
            fake.created_labels.append(dict(request.get("labels") or {}))
        self._send(200, fake.dto(sandbox))

    def _list(self) -> None:
        fake = self.fake
        query = parse_qs(urlsplit(self.path).query)
        wanted = json.loads(query["labels"][0]) if "labels" in query else {}
        cursor = int(query["cursor"][0]) if query.get("cursor") else 0
        limit = int(query["limit"][0]) if query.get("limit") else fake.page_size
        with fake.lock:
            matching = [s for s in fake.sandboxes.values() if s.state != "destroyed"
                        and all((s.request.get("labels") or {}).get(k) == v for k, v in wanted.items())]
            page = [fake.dto(s, full=False) for s in matching[cursor:cursor + limit]]
        following = cursor + limit if cursor + limit < len(matching) else None
        self._send(200, {"items": page, "nextCursor": str(following) if following is not None else None})

    def _snapshot(self, sandbox: FakeSandbox, request: dict) -> None:
        fake = self.fake
        container = sandbox.container
        data = subprocess.run(container.argv(["tar", "-C", "/var/tmp", "-cf", "-", "."]), env=container.env,
                              capture_output=True, check=True, timeout=60).stdout
        with fake.lock:
            fault = fake.snapshot_faults.pop(0) if fake.snapshot_faults else None
            fake.snapshots_made += 1
            if fault != "ghost":
                snap = FakeSnapshot(f"snap-{uuid.uuid4().hex[:8]}", request["name"], sandbox.id, data)
                snap.state = "pending" if fault == "pending" else "active"
                snap.boot404 = fault == "boot404"
                fake.snapshots[snap.name] = snap
        self._send(200, fake.dto(sandbox))

    # -- toolbox ---------------------------------------------------------------------------------

    def _exec(self, sandbox: FakeSandbox, request: dict) -> None:
        container = sandbox.container
        env = dict(container.env)  # ``python3`` is this interpreter, as if it were the image's
        env.update(sandbox.request.get("env") or {})
        env.update(request.get("envs") or {})
        cwd = request.get("cwd") or "/"
        if not container.isdir(cwd):
            return self._error(400, f"cwd {cwd} does not exist", "BAD_REQUEST")
        timeout = request.get("timeout") or None
        with self.fake.lock:
            self.fake.exec_commands.setdefault(sandbox.id, []).append(request.get("command", ""))
        proc = subprocess.Popen(container.argv(["/bin/sh"], cwd), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
        with self.fake.lock:
            sandbox.procs.add(proc)
            self.fake.spawned.append(proc)
        try:
            out, _ = proc.communicate(request.get("command", "").encode(), timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.communicate()
            return self._error(408, "command execution timeout", "REQUEST_TIMEOUT")
        finally:
            with self.fake.lock:
                sandbox.procs.discard(proc)
        if self.fake.sandboxes.get(sandbox.id) is not sandbox or sandbox.state == "destroyed":
            return self._error(404, f"Sandbox {sandbox.id} not found", "NOT_FOUND")
        self._send(200, {"exitCode": proc.returncode, "result": out.decode("utf-8", "replace")})

    def _upload(self, sandbox: FakeSandbox, body: bytes) -> None:
        # Fields ``files[i].path`` (the destination) and ``files[i].file`` (the bytes).
        paths: dict[str, str] = {}
        datas: dict[str, bytes] = {}
        for params, data in _split_multipart(body, self.headers.get("Content-Type", "")):
            index, _, kind = params.get("name", "").rpartition(".")
            if kind == "path":
                paths[index] = data.decode()
            elif kind == "file":
                datas[index] = data
        for index, data in datas.items():
            path = paths[index]
            try:  # like a strict daemon: the parent directory must exist
                sandbox.container.write(path, data)
            except FileError as exc:
                return self._send(400, {"errors": [f"{path}: {exc.strerror.lower()}"]})
        self._send(200, raw=b"", content_type="text/plain")

    def _download(self, sandbox: FakeSandbox, request: dict) -> None:
        boundary = uuid.uuid4().hex
        out = bytearray()
        for path in request.get("paths", []):
            out += f"--{boundary}\r\n".encode()
            try:
                data = sandbox.container.read(path)
            except FileError as exc:
                error = {"message": f"{path}: {exc.strerror.lower()}", "statusCode": 404, "code": "FILE_NOT_FOUND",
                         "source": "DAYTONA_DAEMON"}
                out += (f'Content-Disposition: form-data; name="error"; filename="{path}"\r\n'
                        "Content-Type: application/json\r\n\r\n").encode()
                out += json.dumps(error).encode() + b"\r\n"
                continue
            out += (f'Content-Disposition: form-data; name="file"; filename="{path}"\r\n'
                    "Content-Type: application/octet-stream\r\n\r\n").encode()
            out += data + b"\r\n"
        out += f"--{boundary}--\r\n".encode()
        self._send(200, raw=bytes(out), content_type=f"multipart/form-data; boundary={boundary}")

"""A fake E2B (API and envd) on 127.0.0.1, driven by the real, unmodified ``e2b`` SDK.

Tests, benchmarks and users trying the provider offline point the SDK at it with
``E2B_API_URL=E2B_SANDBOX_URL=http://127.0.0.1:PORT`` and any ``E2B_API_KEY``
(``FakeE2B.env()``); ``python -m trl_sandbox_e2b.fake --port 0`` runs it standalone. Each fake
sandbox is a container of its own on this host (``trl_sandbox.remote.fake_container``: a
bubblewrap with its own PID namespace, ``/tmp``, ``/var/tmp`` and ``/dev/shm``), as E2B gives each
sandbox a micro-VM: a process a command leaves lives on there until the sandbox is killed or its
lifetime (``timeout``) ends, when everything in it dies. It stands in for the vendor's cloud: only
test programs may be sent to it. The container runs commands as its root (E2B's ``user="root"``).

Faults (what a busy real service does): ``fail(route, status, times, headers, message, match)``
answers the next requests of a route (``create``, ``list``, ``get``, ``kill``, ``set_timeout``,
``connect``, ``exec``, ``files``, ``health``, ``sendinput``, ...) with an error, status 0 drops the
connection; ``vanish(id)`` kills a sandbox behind the client's back; ``chaos(seed, transient,
vanish)`` turns on seeded random faults on creates and execs (503, 502, 429 or a dropped
connection with probability ``transient``; a vanished sandbox with ``vanish``); ``latency``
(route -> seconds) delays answers; ``stall_next_creates(n, seconds)`` makes sandboxes whose create
answers late; ``max_sandboxes`` caps the running ones (429 past it, as a plan's
concurrency limit). ``created_metadata`` records the metadata of every sandbox ever created.
``snapshot_store`` holds the snapshots (``snapshots.py``), with its own faults.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from trl_sandbox.remote.fake_container import FakeContainer

from .envd import make_app
from .server import Handler, Server
from .snapshots import SnapshotStore

API_KEY = "e2b_fake_key"
#: What the fake implements: stdin closing (0.5.2) and octet-stream uploads (0.5.7).
ENVD_VERSION = "0.5.7"


@dataclass
class Fault:
    status: int
    times: int
    headers: dict
    message: str
    match: bytes | None = None


@dataclass
class FakeSandbox:
    id: str
    fake: Any
    template: str
    metadata: dict
    envs: dict
    internet: bool
    end_at: float
    container: FakeContainer
    started_at: float = field(default_factory=time.time)
    procs: dict = field(default_factory=dict)
    next_pid: int = 100
    gone: bool = False


class FakeE2B:
    def __init__(self, port: int = 0, page_size: int = 2) -> None:
        self.page_size = page_size
        self.envd_version = ENVD_VERSION
        self.templates = {"base"}
        self.snapshot_store = SnapshotStore()
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.killed: list[str] = []
        self.idempotent: dict[str, str] = {}
        self.calls: list[tuple[str, str | None]] = []
        self.faults: dict[str, list[Fault]] = {}
        self.created_metadata: list[dict] = []
        self.create_requests: list[dict] = []
        self.latency: dict[str, float] = {}
        self.max_sandboxes: int | None = None
        self.stalls: list[float] = []
        self.spawned: list = []
        self.connections: list = []
        self.lock = threading.RLock()
        self._chaos: tuple[random.Random, float, float] | None = None
        self._ids = itertools.count(1)
        self.process_app = make_app(self)
        self.server = Server(("127.0.0.1", port), Handler)
        self.server.fake = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self.server.serve_forever, name="fake-e2b", daemon=True)
        self._reaper = threading.Thread(target=self._reap, name="fake-e2b-lifetimes", daemon=True)
        self._stopped = threading.Event()

    # -- control ---------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def env(self) -> dict[str, str]:
        """The variables that point the ``e2b`` SDK at this fake."""
        return {"E2B_API_URL": self.url, "E2B_SANDBOX_URL": self.url, "E2B_API_KEY": API_KEY}

    def start(self) -> FakeE2B:
        self._thread.start()
        self._reaper.start()
        return self

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.server.shutdown()
        self.server.server_close()
        with self.lock:
            for connection in self.connections:
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            sandboxes = list(self.sandboxes.values())
        for sandbox in sandboxes:
            self._end(sandbox)
        with self.lock:
            for popen in self.spawned:
                if popen.poll() is None:
                    try:
                        os.killpg(popen.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    popen.wait()

    def fail(self, route: str, status: int, times: int = 1, headers: dict | None = None, message: str = "",
             match: str | None = None) -> None:
        with self.lock:
            self.faults.setdefault(route, []).append(
                Fault(status, times, dict(headers or {}), message or f"injected {status}",
                      match.encode() if match else None))

    def take_fault(self, route: str, body: bytes) -> Fault | None:
        with self.lock:
            for fault in self.faults.get(route) or []:
                if fault.match is None or fault.match in body:
                    fault.times -= 1
                    if fault.times <= 0:
                        self.faults[route].remove(fault)
                    return fault
        return None

    def stall_next_creates(self, n: int = 1, seconds: float = 5.0) -> None:
        """The next ``n`` creates make their sandbox at once but answer ``seconds`` late."""
        with self.lock:
            self.stalls.extend([seconds] * n)

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

    def count(self, route: str) -> int:
        with self.lock:
            return sum(1 for r, _ in self.calls if r == route)

    def live(self) -> list[str]:
        self.expire()
        with self.lock:
            return [s.id for s in self.sandboxes.values() if not s.gone]

    def running(self, sandbox_id: str) -> FakeSandbox | None:
        with self.lock:
            sandbox = self.sandboxes.get(sandbox_id)
        if sandbox is None or sandbox.gone:
            return None
        if time.time() >= sandbox.end_at:
            self._end(sandbox)
            return None
        return sandbox

    def vanish(self, sandbox_id: str) -> None:
        """The sandbox dies behind the client's back (its host failed, its lifetime ended)."""
        with self.lock:
            sandbox = self.sandboxes.get(sandbox_id)
        if sandbox is not None:
            self._end(sandbox)

    def kill(self, sandbox_id: str) -> None:
        with self.lock:
            sandbox = self.sandboxes.get(sandbox_id)
            if sandbox is not None and not sandbox.gone:
                self.killed.append(sandbox_id)
        if sandbox is not None:
            self._end(sandbox)

    def expire(self) -> None:
        now = time.time()
        with self.lock:
            due = [s for s in self.sandboxes.values() if not s.gone and now >= s.end_at]
        for sandbox in due:
            self._end(sandbox)

    # -- sandboxes -------------------------------------------------------------------------------

    def make_sandbox(self, template: str, request: dict, snapshot: bytes | None = None) -> FakeSandbox:
        container = FakeContainer()
        if snapshot is not None:  # the snapshot's file system state
            subprocess.run(container.argv(["tar", "-C", "/var/tmp", "-xf", "-"]), input=snapshot,
                           check=True, env=container.env, capture_output=True, timeout=60)
        with self.lock:
            sandbox_id = f"i{next(self._ids)}{uuid.uuid4().hex[:12]}"
            sandbox = FakeSandbox(sandbox_id, self, template, dict(request.get("metadata") or {}),
                                  dict(request.get("envVars") or {}), bool(request.get("allow_internet_access", True)),
                                  time.time() + float(request.get("timeout") or 300), container)
            if self._stopped.is_set():
                sandbox.gone = True
                container.kill()
            self.sandboxes[sandbox_id] = sandbox
            self.created_metadata.append(dict(sandbox.metadata))
            self.create_requests.append(dict(request))
        return sandbox

    def _end(self, sandbox: FakeSandbox) -> None:
        """The sandbox is gone: its container, and every process in it, with it."""
        with self.lock:
            if sandbox.gone and not sandbox.procs:
                return
            sandbox.gone = True
            procs = list(sandbox.procs.values())
        for proc in procs:
            proc.kill_group()
        sandbox.container.kill()

    def _reap(self) -> None:
        while not self._stopped.wait(0.5):
            self.expire()

"""What the fake Modal service remembers: sandboxes (each a container of its own), their execs,
images, apps, and the faults a test asked for.

Shared by the control-plane servicer (``api.py``) and the command router (``router.py``). Every
mutation happens on the fake's one event loop, except the few control calls a test makes from its
own thread, which take ``lock``.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from grpclib import GRPCError, Status
from modal_proto import api_pb2

from trl_sandbox.remote.fake_container import FakeContainer

#: Image builder version the fake's environment reports (one the pinned SDK accepts).
IMAGE_BUILDER_VERSION = "2026.10"


@dataclass
class Exec:
    """One command started by ``TaskExecStart``: its process and everything it printed so far."""

    proc: asyncio.subprocess.Process
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    closed: dict[int, bool] = field(default_factory=lambda: {1: False, 2: False})
    stdin_written: int = 0
    stdin_closed: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    timer: asyncio.TimerHandle | None = None

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


@dataclass
class Sandbox:
    id: str
    task_id: str
    app_id: str
    tags: dict[str, str]
    definition: Any
    container: FakeContainer
    env: dict[str, str] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    result: int = 0  # a GenericResult status; 0 while it runs
    execs: dict[str, Exec] = field(default_factory=dict)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    timer: asyncio.TimerHandle | None = None

    @property
    def running(self) -> bool:
        return self.result == 0


@dataclass
class Fault:
    status: Status
    times: int
    message: str
    retry_after: float | None = None
    match: bytes | None = None


class Dropped(BaseException):
    """Raised after a handler reset its stream (RST_STREAM): grpclib then sends nothing more, as when
    a proxy drops the request. A ``BaseException`` so that grpclib does not log it as a crash."""


def grpc_error(status: Status, message: str, retry_after: float | None = None) -> GRPCError:
    """A gRPC error as Modal's servers send it; a throttle carries an ``RPCRetryPolicy`` detail."""
    details = [api_pb2.RPCRetryPolicy(retry_after_secs=retry_after)] if retry_after is not None else None
    return GRPCError(status, message, details)


class State:
    """The service's memory. ``faults``/``chaos`` are the tests' knobs (see ``FakeModal``)."""

    def __init__(self, missing_images: tuple[str, ...] = ("no-such-image",)) -> None:
        self.lock = threading.Lock()
        self.sandboxes: dict[str, Sandbox] = {}
        self.by_task: dict[str, Sandbox] = {}
        self.apps: dict[str, str] = {}
        self.images: dict[str, list[str]] = {}
        self.snapshots: dict[str, bytes] = {}  # image id -> tarball of /var/tmp
        self.boot404: set[str] = set()  # snapshot images a create answers NOT_FOUND for
        self.snapshot_faults: list[str] = []
        self.snapshots_made = 0
        self.created_tags: list[dict[str, str]] = []
        self.calls: list[str] = []
        self.exec_argv: list[list[str]] = []
        self.procs: list[asyncio.subprocess.Process] = []  # every exec's process, reaped at stop
        self.faults: dict[str, list[Fault]] = {}
        self.missing_images = missing_images
        self.chaos: tuple[random.Random, float, float] | None = None
        self.latency: dict[str, float] = {}  # RPC name -> seconds added before it is served
        self.stalls: dict[str, list[float]] = {}  # RPC name -> extra seconds for its next requests
        self.router_url = ""
        self.stopped = False

    # -- faults ----------------------------------------------------------------------------------

    def take_fault(self, rpc: str, request: Any) -> Fault | None:
        with self.lock:
            self.calls.append(rpc)
            for fault in self.faults.get(rpc) or []:
                if fault.match is None or fault.match in request.SerializeToString():
                    fault.times -= 1
                    if fault.times <= 0:
                        self.faults[rpc].remove(fault)
                    return fault
        return None

    async def delay(self, rpc: str) -> None:
        """A real service's latency for ``rpc`` (a create takes about a second, an exec tens of ms)."""
        with self.lock:
            stalls = self.stalls.get(rpc)
            wait = self.latency.get(rpc, 0.0) + (stalls.pop(0) if stalls else 0.0)
        if wait:
            await asyncio.sleep(wait)

    def roll(self, rpc: str) -> str | None:
        """The chaos for one request: None, "vanish", or a transient fault's name."""
        with self.lock:
            if self.chaos is None or rpc not in ("SandboxCreateV2", "TaskExecStart"):
                return None
            rng, transient, vanish = self.chaos
            draw = rng.random()
            if draw < transient:
                return rng.choice(["UNAVAILABLE", "INTERNAL", "RESOURCE_EXHAUSTED", "drop"])
            if rpc == "TaskExecStart" and draw < transient + vanish:
                return "vanish"
            return None

    # -- sandboxes -------------------------------------------------------------------------------

    def live(self) -> list[str]:
        with self.lock:
            return [s.id for s in self.sandboxes.values() if s.running]

    def new_ids(self) -> tuple[str, str]:
        return f"sb-fake-{uuid.uuid4().hex}", f"ta-fake{uuid.uuid4().hex[:16]}V"

    def add(self, sandbox: Sandbox) -> None:
        with self.lock:
            self.sandboxes[sandbox.id] = sandbox
            self.by_task[sandbox.task_id] = sandbox
            self.created_tags.append(dict(sandbox.tags))

    def end(self, sandbox: Sandbox, status: int, forget: bool = False) -> None:
        """The sandbox stops (terminated, timed out, or vanished): its container and every
        process in it die; ``forget``: the service no longer knows it at all (NOT_FOUND)."""
        with self.lock:
            if sandbox.running:
                sandbox.result = status
            if forget:
                self.sandboxes.pop(sandbox.id, None)
                self.by_task.pop(sandbox.task_id, None)
        if sandbox.timer is not None:
            sandbox.timer.cancel()
        for run in list(sandbox.execs.values()):
            kill_group(run.proc)
        sandbox.container.kill()
        try:
            sandbox.ended.set()
        except RuntimeError:  # another thread during shutdown: nobody waits any more
            pass

    def task(self, task_id: str) -> Sandbox:
        """The running sandbox of a task; NOT_FOUND when it is gone, as Modal's router answers."""
        with self.lock:
            sandbox = self.by_task.get(task_id)
        if sandbox is None or not sandbox.running:
            raise GRPCError(Status.NOT_FOUND, f"Task {task_id} not found")
        return sandbox


def kill_group(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

"""A fake Modal service on 127.0.0.1 that the real, unmodified ``modal`` SDK talks to.

One grpclib server hosts both the control plane (``api.py``, the wheel's ``ModalClientBase``) and
the command router (``router.py``, the wheel's ``TaskCommandRouterBase``), with Modal's own status
details codec, so throttling details (``RPCRetryPolicy``) decode as they do against Modal. Every
sandbox is a container of its own (``trl_sandbox.remote.fake_container``): its own PID namespace,
``/tmp``, ``/var/tmp`` and ``/dev/shm``; what a command leaves running lives on in it until the
sandbox ends, as on the service. For tests, benchmarks and trying the provider offline
(``python -m trl_sandbox_modal.fake --port 0``); it stands in for the vendor's cloud and runs what
it is sent on this host, inside bubblewrap: send it only your own test programs.

Knobs (thread-safe, from the test's thread): ``fail(rpc, status, ...)`` answers the next calls of
one RPC with a gRPC error (a throttle with ``retry_after`` carries Modal's retry policy);
``chaos(seed, transient, vanish)`` fails creates and exec starts at random (UNAVAILABLE, INTERNAL,
RESOURCE_EXHAUSTED or a reset stream) and makes sandboxes vanish; ``vanish(id)`` deletes one behind
the client's back (NOT_FOUND from then on); ``latency`` (RPC name -> seconds) delays answers like a
real service's, ``stall(rpc, seconds)`` only the next ones. ``live()``, ``created_tags``, ``count(rpc)`` and
``exec_argv`` show what happened.
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from grpclib import Status
from grpclib.server import Server
from modal._utils.grpc_utils import custom_detail_codec

from .api import TOKEN_ID, TOKEN_SECRET, Api
from .router import Router
from .state import Fault, State, kill_group

__all__ = ["SDK_ATTEMPTS", "TOKEN_ID", "TOKEN_SECRET", "FakeModal"]

#: Requests one call of the pinned SDK makes for a retryable status (``modal/_utils/grpc_utils.py``:
#: control-plane calls 1 + 3 retries; command-router calls 1 + 10).
SDK_ATTEMPTS = {"control": 4, "router": 11}


class FakeModal:
    def __init__(self, port: int = 0, host: str = "127.0.0.1") -> None:
        self.state = State()
        self._host, self._port = host, port
        self._loop = asyncio.new_event_loop()
        self._server: Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-modal", daemon=True)
        fd, self.config_path = tempfile.mkstemp(prefix="trl-sandbox-modal-fake-", suffix=".toml")
        os.close(fd)  # an empty config: nothing of the user's ~/.modal.toml applies
        self._stopped = False

    # -- life ------------------------------------------------------------------------------------

    def start(self) -> FakeModal:
        self._thread.start()
        self._call(self._start())
        return self

    async def _start(self) -> None:
        self._server = Server([Api(self.state), Router(self.state)], status_details_codec=custom_detail_codec)
        await self._server.start(self._host, self._port)
        self._port = self._server._server.sockets[0].getsockname()[1]
        self.state.router_url = self.url

    def stop(self) -> None:
        """Stop serving and end every sandbox with all its processes; the config file goes too."""
        if self._stopped:
            return
        self._stopped = True
        self.state.stopped = True
        try:
            self._call(self._stop(), timeout=60)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
            if not self._thread.is_alive():
                self._loop.close()
            for sandbox in list(self.state.sandboxes.values()):
                sandbox.container.kill()
            try:
                os.unlink(self.config_path)
            except FileNotFoundError:
                pass

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for sandbox in list(self.state.sandboxes.values()):
            self.state.end(sandbox, 3)
        # Reap every exec's process here, so that no transport outlives this loop.
        for proc in self.state.procs:  # also those of sandboxes that vanished
            kill_group(proc)
        waits = [proc.wait() for proc in self.state.procs]
        if waits:
            await asyncio.wait_for(asyncio.gather(*waits, return_exceptions=True), 10)
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 5)
            except asyncio.TimeoutError:
                pass

    def _call(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        async def call() -> Any:
            return fn(*args)
        return self._call(call())

    # -- where it is -----------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def env(self) -> dict[str, str]:
        """The variables that point the ``modal`` SDK at this fake."""
        return {"MODAL_SERVER_URL": self.url, "MODAL_TOKEN_ID": TOKEN_ID, "MODAL_TOKEN_SECRET": TOKEN_SECRET,
                "MODAL_CONFIG_PATH": self.config_path}

    # -- knobs -----------------------------------------------------------------------------------

    def fail(self, rpc: str, status: str | Status, times: int | None = None, *, message: str = "",
             retry_after: float | None = None, match: str | None = None) -> None:
        """Answer the next ``times`` requests of ``rpc`` (whose request contains ``match``) with an error.

        By default as many as one SDK call sends for that error: Modal's client retries UNAVAILABLE,
        INTERNAL and the like itself (``SDK_ATTEMPTS``), so only a fault that outlasts those
        retries reaches the provider; a throttle with ``retry_after`` or any other status once."""
        status = Status[status] if isinstance(status, str) else status
        if times is None:
            retried = status in (Status.UNAVAILABLE, Status.INTERNAL, Status.UNKNOWN, Status.CANCELLED,
                                 Status.DEADLINE_EXCEEDED)
            times = SDK_ATTEMPTS["router" if rpc.startswith("Task") else "control"] if retried else 1
        with self.state.lock:
            self.state.faults.setdefault(rpc, []).append(
                Fault(status, times, message or f"injected {status.name}", retry_after,
                      match.encode() if match else None))

    def chaos(self, seed: int | None, transient: float = 0.2, vanish: float = 0.05) -> None:
        with self.state.lock:
            self.state.chaos = None if seed is None else (random.Random(seed), transient, vanish)

    @property
    def latency(self) -> dict[str, float]:
        return self.state.latency

    @latency.setter
    def latency(self, value: dict[str, float]) -> None:
        self.state.latency = dict(value)

    def stall(self, rpc: str, seconds: float, times: int = 1) -> None:
        """Delay the next ``times`` requests of ``rpc`` by ``seconds`` (then served as usual)."""
        with self.state.lock:
            self.state.stalls.setdefault(rpc, []).extend([seconds] * times)

    def vanish(self, sandbox_id: str) -> None:
        """The sandbox disappears: its processes die, and every later call about it is NOT_FOUND."""
        sandbox = self.state.sandboxes[sandbox_id]
        self._run(self.state.end, sandbox, 3, True)

    def snapshot_fault(self, kind: str, times: int = 1) -> None:
        """Spoil the next snapshot: ``ghost``, ``pending`` or ``boot404`` (see ``router.py``)."""
        assert kind in ("ghost", "pending", "boot404")
        with self.state.lock:
            self.state.snapshot_faults.extend([kind] * times)

    def drop_snapshots(self) -> None:
        """Every snapshot image vanishes behind the client's back."""
        with self.state.lock:
            self.state.snapshots.clear()

    # -- what happened ---------------------------------------------------------------------------

    def live(self) -> list[str]:
        return self.state.live()

    @property
    def created_tags(self) -> list[dict[str, str]]:
        with self.state.lock:
            return list(self.state.created_tags)

    @property
    def sandboxes(self) -> dict[str, Any]:
        return self.state.sandboxes

    @property
    def exec_argv(self) -> list[list[str]]:
        with self.state.lock:
            return list(self.state.exec_argv)

    @property
    def snapshots_made(self) -> int:
        with self.state.lock:
            return self.state.snapshots_made

    def count(self, rpc: str) -> int:
        with self.state.lock:
            return sum(1 for r in self.state.calls if r == rpc)

"""What runs on a node: one Ray actor holding one local bubblewrap sandbox.

The actor is the local provider moved to another machine, unchanged: the same supervisor, the
same judge, the same limits and isolation, so every verdict guarantee of ``local`` holds on every
node. Ray only carries the calls and owns the process: the actor is never detached, so when the
process that made it dies (or its node does) Ray ends the actor's worker, and bubblewrap, started
with ``--die-with-parent``, takes the sandbox and every process in it along.

Errors cross the wire as a kind and a message, not as pickled exceptions: the driver turns them
back into the contract's types (``InfraError``, ``FileNotFoundError``, ...) from a fixed table,
so nothing a node sends can make the driver build an arbitrary class.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import threading
from collections.abc import Mapping
from typing import Any

from trl_sandbox.environments.builds import SetupFailed
from trl_sandbox.environments.spec import EnvironmentSpec
from trl_sandbox.sandbox import ConfigError, InfraError, SandboxGoneError, SandboxSpec

MAX_INTERNED = 32  # large arguments an actor keeps (the driver sends at most this many whole to keep)

# The errors that cross the wire by name (subclasses before their bases); anything else is
# reported as an InfraError. The driver raises them again from this same table.
ERRORS: dict[str, type[BaseException]] = {
    "ConfigError": ConfigError, "SandboxGoneError": SandboxGoneError, "SetupFailed": SetupFailed,
    "InfraError": InfraError,
    "FileNotFoundError": FileNotFoundError, "PermissionError": PermissionError,
    "IsADirectoryError": IsADirectoryError, "ValueError": ValueError, "TypeError": TypeError, "OSError": OSError,
}


def _lower_oom_score() -> None:
    """Ray starts its workers with ``oom_score_adj`` 1000 (picked first by the OOM killer, so the
    raylet survives); the sandbox's programs must be picked before what judges them, which needs
    room below 1000. A worker may lower its own score back to what its parent allowed; where the
    kernel refuses, the supervisor's start says so and the probe reports it with what to set."""
    try:
        with open("/proc/self/oom_score_adj") as f:
            own = int(f.read().strip() or 0)
        if own > 0:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("0")
    except (OSError, ValueError):
        pass


def failure(exc: BaseException) -> tuple[str, str, str]:
    """``exc`` as ``("raise", kind, message)``, its kind a key of ``ERRORS``."""
    for kind, cls in ERRORS.items():
        if isinstance(exc, cls):
            return ("raise", kind, str(exc))
    return ("raise", "InfraError", f"{type(exc).__name__}: {exc}")


class SandboxActor:
    """One local sandbox on the node Ray placed this actor on (made with ``ray.remote`` by the
    provider, with the placement options of its settings).

    A threaded actor (plain methods, several at once) driving its own event loop thread: the
    local sandbox is asyncio code, and a call handed from Ray's thread to that loop costs less
    than Ray's own async actor machinery (measured: about 0.3 ms of the actor's CPU per exec). The
    loop thread also starts bubblewrap, whose ``--die-with-parent`` follows the thread that forked
    it: this one lives as long as the actor.

    Every method answers ``("ok", value)`` or ``("raise", kind, message)``. Calls that carry
    ``reset=True`` first return the sandbox to a clean state (a reset the pool asked for at
    check-in travels with the next call, so it costs no round trip of its own).
    """

    def __init__(self, local_settings: Mapping[str, Any], spec: SandboxSpec) -> None:
        self._settings = dict(local_settings)
        self._spec = spec
        self._provider: Any = None
        self._sandbox: Any = None
        self._interned: dict[str, str] = {}  # large arguments by digest (the judge's source)
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._run_loop, name="trl-sandbox-loop", daemon=True).start()

    def _run_loop(self) -> None:
        # Ray starts its workers niced (15); a sandboxed program would then lose the CPU to anything
        # else on the node and could reach its wall-clock backstop without being slow. Niceness is
        # per thread, and bubblewrap inherits this one's. Lowering it needs privilege: best effort.
        try:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
        except OSError:
            pass
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def _run(self, coro: Any, reset: bool = False) -> tuple:
        async def call() -> tuple:
            try:
                if reset:
                    await self._sandbox.reset()
                return ("ok", await coro)
            except BaseException as exc:
                coro.close()  # never awaited when the reset failed
                return failure(exc)

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result()

    def start(self) -> tuple:
        """Build the local provider here (its checks run on this node: bwrap, the interpreter,
        cgroups) and start the sandbox; answer where it runs and how its time is bounded."""
        _lower_oom_score()
        try:
            from trl_sandbox.local.provider import LocalProvider

            self._provider = LocalProvider(**self._settings)
        except TypeError as exc:  # an unknown local setting
            return ("raise", "ConfigError", f"bad settings for the local sandbox on the node: {exc}")
        except BaseException as exc:
            return failure(exc)
        answer = self._run(self._provider.create(self._spec))
        if answer[0] != "ok":
            return answer
        self._sandbox = answer[1]
        import ray

        provider = self._provider
        return ("ok", {
            "node_id": ray.get_runtime_context().get_node_id(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "local_id": self._sandbox.id,
            "python_version": provider.python_version,
            "isolation_mode": provider.isolation_mode,
            "time_budget": provider.time_budget,
            "wall_factor": provider.wall_factor,
            "wall_margin_s": provider.wall_margin_s,
        })

    def exec(self, reset: bool, argv: list[str], stdin: bytes | None, timeout: float, cwd: str | None,
             env: Mapping[str, str] | None, interned: Mapping[int, str] | None = None, keep: tuple = ()) -> tuple:
        """``interned``: argument positions the driver sent as a digest of a large argument it sent
        whole before (with its position in ``keep``); a digest not held here answers ``("resend",)``."""
        if interned:
            argv = list(argv)
            for position, digest in interned.items():
                if digest not in self._interned:
                    return ("resend",)
                argv[position] = self._interned[digest]
        for position, digest in keep:
            if len(self._interned) < MAX_INTERNED:
                self._interned[digest] = argv[position]
        return self._run(self._sandbox.exec(argv, stdin=stdin, timeout=timeout, cwd=cwd, env=env), reset)

    def write_file(self, reset: bool, path: str, data: bytes) -> tuple:
        return self._run(self._sandbox.write_file(path, data), reset)

    def read_file(self, reset: bool, path: str) -> tuple:
        return self._run(self._sandbox.read_file(path), reset)

    def reset(self) -> tuple:
        return self._run(self._sandbox.reset())

    # -- prepared environments: the local provider's own, on this node ---------------------------

    def _environment(self, prepared: Any, failed: SetupFailed | None = None) -> dict[str, Any]:
        """What the driver needs of a prepared environment (or the setup's failure, which the
        driver raises as ``SetupFailed``), and this actor's build counters since the last answer
        (its ``Builds.drain()``, the failure's included), for the driver's per-step metrics."""
        stats = dataclasses.asdict(self._provider.environments.builds.drain())
        if failed is not None:
            return {"failed": str(failed), "stats": stats}
        return {"key": prepared.key, "tree": str(prepared.tree), "stats": stats,
                "mode": getattr(self._sandbox, "environment_mode", "")}

    def prepare_environment(self, spec: EnvironmentSpec) -> tuple:
        """Build ``spec`` on this node once (the local provider's single flight: one future per
        key in this process, the key's file lock across the node's actors), or find it built."""
        async def prepare() -> dict[str, Any]:
            try:
                return self._environment(await self._provider.prepare_environment(spec))
            except SetupFailed as exc:
                return self._environment(None, exc)

        return self._run(prepare())

    def use_environment(self, reset: bool, spec: EnvironmentSpec) -> tuple:
        """This lease's own copy of ``spec``'s prepared tree (built here first if this node has
        none yet: a node that joined after the driver prepared the key)."""
        async def use() -> dict[str, Any]:
            try:
                prepared = await self._provider.prepare_environment(spec)
            except SetupFailed as exc:
                return self._environment(None, exc)
            await self._sandbox.use_environment(prepared)
            return self._environment(prepared)

        return self._run(use(), reset)

    def alive(self) -> tuple:
        return self._run(self._sandbox.alive())

    def close(self) -> tuple:
        """Stop the sandbox and remove its cgroup before Ray ends this process."""
        if self._provider is None:
            return ("ok", None)
        return self._run(self._provider.aclose())

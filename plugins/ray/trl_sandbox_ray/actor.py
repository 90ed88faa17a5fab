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

import os
import socket
from collections.abc import Mapping
from typing import Any

from trl_sandbox.sandbox import ConfigError, SandboxSpec

# The error kinds an actor reports, subclasses before their bases; anything else is "InfraError".
KINDS = ("ConfigError", "SandboxGoneError", "InfraError", "FileNotFoundError", "PermissionError",
         "IsADirectoryError", "ValueError", "TypeError", "OSError")


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
    """``exc`` as ``("raise", kind, message)``, its kind from ``KINDS``."""
    from trl_sandbox.sandbox import InfraError, SandboxGoneError

    classes = {"ConfigError": ConfigError, "SandboxGoneError": SandboxGoneError, "InfraError": InfraError,
               "FileNotFoundError": FileNotFoundError, "PermissionError": PermissionError,
               "IsADirectoryError": IsADirectoryError, "ValueError": ValueError, "TypeError": TypeError,
               "OSError": OSError}
    for kind in KINDS:
        if isinstance(exc, classes[kind]):
            return ("raise", kind, str(exc))
    return ("raise", "InfraError", f"{type(exc).__name__}: {exc}")


class SandboxActor:
    """One local sandbox on the node Ray placed this actor on (made with ``ray.remote`` by the
    provider, with the placement options of its settings).

    Every method answers ``("ok", value)`` or ``("raise", kind, message)``. Calls that carry
    ``reset=True`` first return the sandbox to a clean state (a reset the pool asked for at
    check-in travels with the next call, so it costs no round trip of its own).
    """

    def __init__(self, local_settings: Mapping[str, Any], spec: SandboxSpec) -> None:
        self._settings = dict(local_settings)
        self._spec = spec
        self._provider: Any = None
        self._sandbox: Any = None

    async def start(self) -> tuple:
        """Build the local provider here (its checks run on this node: bwrap, the interpreter,
        cgroups) and start the sandbox; answer where it runs and how its time is bounded."""
        _lower_oom_score()
        try:
            from trl_sandbox.local.provider import LocalProvider

            self._provider = LocalProvider(**self._settings)
            self._sandbox = await self._provider.create(self._spec)
        except TypeError as exc:  # an unknown local setting
            return ("raise", "ConfigError", f"bad settings for the local sandbox on the node: {exc}")
        except BaseException as exc:
            return failure(exc)
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

    async def exec(self, reset: bool, argv: list[str], stdin: bytes | None, timeout: float,
                   cwd: str | None, env: Mapping[str, str] | None) -> tuple:
        return await self._call(self._sandbox.exec(argv, stdin=stdin, timeout=timeout, cwd=cwd, env=env), reset)

    async def write_file(self, reset: bool, path: str, data: bytes) -> tuple:
        return await self._call(self._sandbox.write_file(path, data), reset)

    async def read_file(self, reset: bool, path: str) -> tuple:
        return await self._call(self._sandbox.read_file(path), reset)

    async def reset(self) -> tuple:
        return await self._call(self._sandbox.reset())

    async def alive(self) -> tuple:
        return await self._call(self._sandbox.alive())

    async def usage(self) -> tuple:
        try:
            return ("ok", self._provider.usage())
        except BaseException as exc:
            return failure(exc)

    async def close(self) -> tuple:
        """Stop the sandbox and remove its cgroup before Ray ends this process."""
        if self._provider is None:
            return ("ok", None)
        return await self._call(self._provider.aclose())

    async def _call(self, awaitable: Any, reset: bool = False) -> tuple:
        try:
            if reset:
                await self._sandbox.reset()
            return ("ok", await awaitable)
        except BaseException as exc:
            if hasattr(awaitable, "close"):
                awaitable.close()  # never awaited when the reset failed
            return failure(exc)

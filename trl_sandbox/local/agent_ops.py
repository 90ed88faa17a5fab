"""The local sandbox's part of grading agent tasks out of the agent's reach (``supervisor/changes.py``).

Four requests to the supervisor, each answered only by it (never by anything a program wrote):
the episode's changes to its copy of the prepared environment (every process ended first), writing
such changes into a fresh copy, the hidden tests read-only at ``/tests``, and the verifier's own
reports under ``/logs/verifier`` once it has run.
"""

from __future__ import annotations

import errno
import marshal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from trl_sandbox.local.supervisor import protocol as _proto

# What ``environment_changes`` returns: (relative path, kind, mode, payload); kind is "f" (a file and
# its contents), "d" (a directory), "o" (an opaque directory: it replaces the prepared one), "l" (a
# symlink and its target) or "w" (deleted).
Change = tuple[str, str, int, bytes]


class ChangesTooLarge(Exception):
    """The episode changed more than the bounds allow: a verdict on the agent, never ``infra``."""


class AgentGrading:
    """Mixed into ``LocalSandbox``, whose ``_simple`` sends one request and reads its answer."""

    _simple: Callable[..., Awaitable[tuple[int, int, bytes]]]
    exec: Callable[..., Awaitable[Any]]
    group: Any  # the sandbox's cgroup (``SandboxGroup``), or None

    def ran_out_of_memory(self) -> bool:
        """Whether the kernel's OOM killer struck in this sandbox's memory cgroup since it was last
        asked (each exec asks): after the sandbox died during a grading request, the agent's own
        doing (memory its programs left charged, SysV shared memory included), not infra."""
        return self.group is not None and self.group.new_oom_kills()

    async def run_verifier(self, command: str, *, timeout: float, env: Mapping[str, str]) -> Any:
        """The verifier's command, every process it orphans killed at once by the supervisor (the
        namespace's init): a daemon left by the agent's code, run by the tests in a child, could
        otherwise overwrite the script's reward file after its last write."""
        return await self.exec(["/bin/sh", "-c", command], timeout=timeout, env=env, orphans_die=True)

    async def environment_changes(self, max_bytes: int = 64 << 20, max_entries: int = 20_000) -> list[Change]:
        try:
            _, _, data = await self._simple((_proto.OP_CHANGES, int(max_bytes), int(max_entries)), timeout=120.0)
        except OSError as exc:
            if exc.errno == errno.EFBIG:
                raise ChangesTooLarge(str(exc)) from None
            raise
        return marshal.loads(data)

    async def apply_changes(self, changes: Sequence[Change]) -> None:
        await self._simple((_proto.OP_APPLY, list(changes)), timeout=120.0)

    async def bring_tests(self, files: Mapping[str, bytes]) -> None:
        await self._simple((_proto.OP_TESTS, {str(k): bytes(v) for k, v in files.items()}), timeout=60.0)

    async def verifier_reports(self) -> dict[str, bytes | None]:
        _, _, data = await self._simple((_proto.OP_VERDICT,), timeout=60.0)
        return marshal.loads(data)

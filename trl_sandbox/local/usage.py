"""How much of the machine the local sandboxes used: the provider's per-step metrics.

Rewards compete with generation for the same cores; a user sees it in ``sandbox/cpu_s`` (CPU
seconds the sandboxes used since the previous reading). With cgroups the number comes from the
run's parent group, which the kernel charges with every process of every sandbox, removed ones
included. Without them it is summed from ``/proc`` over each sandbox's process tree (bwrap, the
supervisor, the programs it has reaped), and a removed sandbox's last reading is kept, so the
figure is close but misses the last moments of processes that vanished between two readings.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from trl_sandbox.local.cgroups import Cgroups
    from trl_sandbox.local.container import LocalSandbox


class LocalProvider(Protocol):
    """What the usage readings read of the ``trl_sandbox.local.provider.LocalProvider``."""

    _cgroups: Cgroups
    _sandboxes: dict[str, LocalSandbox]
    wall_timeouts: int

TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and its descendants, with the children each has reaped."""
    total = 0
    frontier = [pid]
    seen = set()
    while frontier:
        p = frontier.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    frontier.extend(int(c) for c in f.read().split())
        except (OSError, IndexError, ValueError):
            continue
    return total / TICK


class _Usage:
    """Turns cumulative CPU counters into per-reading deltas for ``LocalProvider.usage``."""

    def __init__(self, provider: LocalProvider) -> None:
        self._provider = provider
        self._retired = 0.0  # without cgroups: final readings of removed sandboxes
        self._seen: dict[str, float] = {}
        self._last_total = self._total()
        self._last_wall_timeouts = 0

    def _total(self) -> float:
        cgroups = self._provider._cgroups
        if cgroups.version:
            try:
                value = cgroups.cpu_seconds()
            except OSError:
                value = None
            if value is not None:
                return value
        live = 0.0
        for sandbox in list(self._provider._sandboxes.values()):
            reading = tree_cpu_seconds(sandbox.pid)
            self._seen[sandbox.id] = max(reading, self._seen.get(sandbox.id, 0.0))
            live += self._seen[sandbox.id]
        return self._retired + live

    def retire(self, sandbox: LocalSandbox) -> None:
        """Keep a sandbox's last reading before it is stopped (its processes, and their counters, go)."""
        if not self._provider._cgroups.version:
            last = max(tree_cpu_seconds(sandbox.pid), self._seen.pop(sandbox.id, 0.0))
            self._retired += last

    def read(self) -> dict[str, float | str]:
        total = self._total()
        delta, self._last_total = max(0.0, total - self._last_total), total
        walls = self._provider.wall_timeouts
        wall_delta, self._last_wall_timeouts = walls - self._last_wall_timeouts, walls
        return {
            "sandbox/isolation_mode": self._provider._cgroups.mode,
            "sandbox/cpu_s": delta,
            "sandbox/wall_timeouts": float(wall_delta),
        }

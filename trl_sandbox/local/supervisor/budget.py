"""An exec's time budget: how much CPU its processes have used, and when its time is up.

With ``time_budget="cpu"`` an exec's timeout is CPU time of its whole process tree, however
detached (a program that only waited for a core, because other sandboxes were busy, is not out of
time); the wall clock only ends what sleeps or blocks. ``"wall"``: the timeout is wall-clock time.
"""

import os

from . import state as S

try:  # in the sandbox the meter rides in this package (``local.command.supervisor_files``)
    from .meter import MeterShare
except ImportError:  # on the host (tests)
    from trl_sandbox.judge.meter import MeterShare


def children_cpu_s():
    """CPU seconds of every process this supervisor has reaped so far."""
    t = os.times()
    return t.children_user + t.children_system


def stat_fields(pid):
    """The fields of ``/proc/<pid>/stat`` after the command name (``[1]`` is the parent's pid,
    ``[11:15]`` the CPU ticks: own user, own system, reaped children's user and system), or None
    when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def ticks_of(pid, children=False):
    """A process's CPU ticks so far (with ``children``, those of the children it reaped too)."""
    fields = stat_fields(pid)
    try:
        return sum(int(v) for v in fields[11:15 if children else 13])
    except (TypeError, ValueError):  # gone (no fields), or not what the kernel writes
        return 0


def tree_cpu(children_cpu):
    """CPU seconds used since the exec began by every process of the sandbox but PID 1: the live
    ones and zombies from /proc (their own time and that of the children they reaped), the ones PID 1
    reaped from its children's times. Setsid, double-forked and daemonised processes all count."""
    ticks = 0
    for name in os.listdir("/proc"):
        if name.isdigit() and name != "1":
            ticks += ticks_of(name, children=True)  # 0 for one that exited meanwhile (its reaper has it)
    return ticks / S.CLK_TCK + (children_cpu_s() - children_cpu)


try:
    # Cores the sandbox's processes may run on: between two reads, the tree can use at most this
    # many CPU seconds per second of wall time.
    CORES = max(1, len(os.sched_getaffinity(0)))
except (AttributeError, OSError):
    CORES = os.cpu_count() or 1


class Budget:
    """When an exec has run out of time. With ``time_budget="cpu"`` its timeout is CPU time of its
    process tree: a program that only waited for a core (other sandboxes were busy) is not out of
    time; the tree's CPU is read only when it could first have used the budget up on every usable
    core (timeout / ``CORES`` of wall time; then as often as what is left allows, so that extra
    cores buy nothing), and a program that ends sooner costs nothing. The wall clock ends what
    sleeps or blocks, at the backstop."""

    def __init__(self, start, timeout, children_cpu, offset=0.0):
        self.cpu = S.TIME_BUDGET == "cpu"
        self.timeout = timeout
        self.children_cpu = children_cpu
        self.offset = offset  # CPU seconds of a process that was there before (a resident judge)
        # The sandbox's cgroup, less PID 1 (this process): it also counts the processes the kernel
        # reaped by itself, whose time reaches no rusage (``judge/meter.py``).
        self.share = MeterShare() if self.cpu else None
        self.wall_deadline = start + (S.WALL_FACTOR * timeout + S.WALL_MARGIN_S if self.cpu else timeout)
        self.next_check = start + timeout / CORES if self.cpu else self.wall_deadline
        self.wall_hit = False

    def wait_s(self, now):
        """Seconds to wait before looking again, or None when the time is up."""
        if now >= self.wall_deadline:
            self.wall_hit = self.cpu
            return None
        if now >= self.next_check:
            left = self.timeout - self.used()
            if left <= 0:
                return None
            self.next_check = now + max(0.005, left / CORES)
        return min(self.next_check, self.wall_deadline) - now

    def used(self):
        """CPU seconds of the exec so far: its processes' from /proc, at least what the meter charged."""
        counted = tree_cpu(self.children_cpu) - self.offset
        metered = self.share.used() if self.share is not None else None
        return counted if metered is None else max(counted, metered)

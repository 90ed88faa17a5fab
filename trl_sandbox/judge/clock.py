# ruff: noqa: UP031  (runs on the sandbox's Python, 3.8+: plain %-formatting on purpose)
"""The candidate's time budget, kept by the judge: a part of the judge's source.

``trl_sandbox.judge.verdict.JUDGE_SOURCE`` is ``judge/candidate.py``, ``judge/resident.py``, this file, ``judge/conn.py`` and
``judge/program.py``, run as one program in the sandbox (standard library only, Python 3.8+). The
budget is the CPU time of the candidate's whole process family, read from /proc only once the
candidate could have used it up, with a wall-clock backstop for a candidate that sleeps or blocks.
"""

import os
import time

if "MeterShare" not in globals():  # on the host; in the sandbox ``judge/meter.py``'s text runs first
    from trl_sandbox.judge.meter import MeterShare


def _cpu_seconds(pid, leave_out=None):
    """CPU seconds of the candidate process ``pid`` and every process it started, live or reaped:
    its descendants and whatever shares the judge's process group or the candidate's own (a judge
    that stays resident across programs starts each candidate in a session of its own): work
    handed to a child, even one that moved to a new session after being counted here, is the
    candidate's work too. The judge itself and PID 1 are left out. None once the candidate is gone.

    With ``leave_out`` (a judge in the local sandbox: the forker's pid where the judge is resident,
    none where it runs as a plain exec), every process
    of the sandbox's pid namespace counts but PID 1, the judge and those: the candidate is the
    only program there, so whatever else runs is its own, however it detached (a process that left
    its session and was orphaned to PID 1 is neither a descendant nor in a group looked at above).
    A zombie keeps its times until reaped, and PID 1 reaps nothing while a judged program runs."""
    me, group = os.getpid(), os.getpgrp()
    procs = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/" + name + "/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            procs[int(name)] = (int(fields[1]), int(fields[2]), sum(int(x) for x in fields[11:15]))
        except (OSError, IndexError, ValueError):
            continue
    if pid not in procs:
        return None
    if leave_out is not None:
        return sum(t for other, (_, _, t) in procs.items() if other not in (me, 1) and other not in leave_out) / _CLK_TCK
    family = {pid}
    grew = True
    while grew:
        grew = False
        for other, (ppid, _, _) in procs.items():
            if ppid in family and other not in family:
                family.add(other)
                grew = True
    ticks = sum(t for other, (_, pgrp, t) in procs.items()
                if other not in (me, 1) and (other in family or pgrp == group or pgrp == pid))
    return ticks / _CLK_TCK


try:
    _CLK_TCK = os.sysconf("SC_CLK_TCK")
except (ValueError, OSError):
    _CLK_TCK = 100


try:
    # The cores the candidate's processes may run on: between two reads of its CPU time, they
    # can use at most this many seconds of it per second of wall time.
    _CORES = max(1, len(os.sched_getaffinity(0)))
except (AttributeError, OSError):
    _CORES = os.cpu_count() or 1


class _Clock:
    """The candidate's time budget. ``cpu``: its own CPU time (loading and every call), so a
    candidate that only waited for a core, because other programs were busy, still gets its whole
    budget; the wall clock ends one that sleeps or blocks, at ``wall_limit``. ``wall``: the budget
    is wall-clock time. The candidate's CPU is read only once it could have used the budget up on
    every usable core (budget / cores of wall time), then as often as what is left allows: extra
    cores buy nothing."""

    def __init__(self, start, limit, wall_limit, mode):
        self.cpu = mode == "cpu"
        self.limit = limit
        self.wall_deadline = start + (wall_limit if self.cpu else limit)
        self.next_check = start + limit / _CORES if self.cpu else self.wall_deadline
        self.leave_out = None  # a resident judge's: see _cpu_seconds
        self.share = None

    def exclude(self, pids):
        """The candidate is the only program in the sandbox: every process but PID 1, the judge and
        ``pids`` counts against it, and so does what the sandbox's meter charged meanwhile beyond
        the judge (processes the kernel reaped by itself, whose time reaches no rusage)."""
        self.leave_out = tuple(pids)
        # Less the judge's own CPU (one rusage call). PID 1 and the forker idle through an exec:
        # what little they do counts against the candidate, cheaper than reading their times for
        # every program (a tenth of a short one).
        self.share = MeterShare()

    def wait_s(self, pid):
        """Seconds to wait before looking again; None once the budget is spent."""
        now = time.monotonic()
        if now >= self.wall_deadline:
            return None
        if now >= self.next_check:
            used = _cpu_seconds(pid, self.leave_out)
            metered = self.share.used() if self.share is not None and used is not None else None
            if metered is not None:
                used = max(used, metered)
            if used is not None:
                if used >= self.limit:
                    return None
                self.next_check = now + max(0.005, (self.limit - used) / _CORES)
            else:
                self.next_check = now + 0.05  # gone: the pipe reports it
        return min(self.next_check, self.wall_deadline) - now

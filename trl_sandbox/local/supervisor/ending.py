"""How an exec ends: everything of it killed, and its exit code and flags as the host reads them.

Used by the plain exec path (``forkserver``) and the resident judge's (``resident``) alike.
"""

import os
import signal

from . import state as S
from .protocol import F_TIMED_OUT, F_TRUNCATED, F_WALL


def outcome(status, timed_out, budget, out):
    """The result's flags and exit code."""
    flags = F_TRUNCATED if out.truncated else 0
    if timed_out:
        return flags | F_TIMED_OUT | (F_WALL if budget.wall_hit else 0), -signal.SIGKILL
    exit_code = exit_code_of(status)
    if exit_code == -signal.SIGXCPU:
        flags |= F_TIMED_OUT  # the CPU-seconds limit is a time limit too
    return flags, exit_code


def exit_code_of(status):
    """0-255 for an exit, minus the signal number for a death by signal (as subprocess does)."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return -1


def kill_all():
    """SIGKILL every process of the namespace but ourselves; False when there was none."""
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def kill_orphans(main):
    """SIGKILL (and reap) every child of ours but ``main``. We are the namespace's init, so every
    process whose parent ended is our child: the orphans of a program that ``main`` runs."""
    me = os.getpid()
    try:  # the kernel's list of our children (CONFIG_PROC_CHILDREN): one read
        with open(f"/proc/{me}/task/{me}/children", "rb") as f:
            pids = [int(p) for p in f.read().split()]
    except OSError:
        pids = []
        for name in os.listdir("/proc"):
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    if name.isdigit() and int(f.read().rsplit(b")", 1)[1].split()[1]) == me:
                        pids.append(int(name))
            except (OSError, IndexError, ValueError):
                continue
    for pid in pids:
        if pid != main:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, os.WNOHANG)
            except (ProcessLookupError, ChildProcessError):
                pass


def drain_wakeups():
    try:
        while os.read(S.WAKE_R, 512):
            pass
    except OSError:
        pass

"""The judge that stays resident: one process per judged program instead of two.

A judged program used to be a forked judge that forked the candidate, a second process, and both
were set up, torn down and swept for every program. Here the judge (the warm program whose module
defines ``_serve_candidate`` and ``_ATTACH``, see ``judge/program.py``) runs in one long-lived
process, and each program costs one fork: the candidate's.

Who holds what, and why it is as safe as a fresh judge per program:

* The candidate is forked from a pristine copy of this fork server (the forker, ``forker.py``,
  forked from PID 1 right after the judge, so that PID 1 shares no page with any candidate), never
  from the judge: the judge's memory holds the nonce and the tests of every program it judged, and
  a fork would hand all of that to the next candidate. Neither PID 1 nor the forker ever reads an
  exec's stdin, so they hold none of it. The candidate gets its part of the payload from the judge
  over a pipe, after the fork, as before.
* The candidate cannot reach the judge nor the forker: both are non-dumpable (no /proc/<pid>/mem
  or fd, no ptrace, which is denied anyway), each in a session of its own, as is every candidate
  (``prepare_candidate``: no candidate can join their process groups, nor reach them as "my own
  group"), and the candidate's seccomp filter refuses every signal to their pids, to their groups
  and to -1 by every road (``kill`` and its kin, descriptor ownership: ``kernel.owner_blocks``;
  ``clone(CLONE_PARENT)``, whose child's exit signal would go to the forker, for every program)
  and every ``prlimit64`` on another process. Only PID 1 may signal them.
* Nothing of a program outlives its exec: the forker reaps the candidate and, if anything else is
  left in the sandbox than the judge, the forker and the one waiting candidate the forker reported
  by pid (ancestry is no mark), PID 1 kills every process but itself (the
  judge and the forker included, which then start afresh for the next judged program). An exec
  that runs out of time, any other exec (its sweep kills everything) and any failure of the judge
  or the forker end both. A lease's reset does not: the judge holds nothing of the scratch places (its working directory is
  ``/``), and what it holds of earlier programs no program can reach.
* The judge runs trusted code only (the task's setup and tests) and decodes what the candidate
  sends with the same bounded, class-refusing unpickler; it has no capabilities and the usual
  seccomp filter; its memory and descriptors are bounded by the program's rlimits (not its CPU
  seconds: the exec's budget bounds its time, and an exec that runs out ends it).
"""

import os
import select
import signal
import socket
import struct
import sys
import time

from . import forker, kernel
from . import state as S
from .budget import Budget, children_cpu_s, ticks_of
from .child import apply_limits, exit_status
from .ending import drain_wakeups, kill_all, outcome
from .forked import settle_helper
from .output import Output
from .protocol import K_ERROR, reply

ENABLED = True  # the configuration's "resident_judge"
PID = None  # the judge's pid, while one runs
SOCKET = None  # PID 1's end of the judge's socket
DONE = struct.Struct("<i")  # the judge's exit status for an exec
# PID 1's word to the judge with an exec's descriptors: the candidate's pid and the forker's (the
# judge's clock counts every other process of the sandbox against the candidate).
REQUEST = struct.Struct("<ii")
JUDGE_NAME = b"trl-judge"  # the resident judge's process name


def usable(code, env):
    """Whether this exec of a warm program can go to a resident judge."""
    return (
        ENABLED
        and S.USE_PIDFD
        and not env
        and hasattr(socket, "send_fds")
        and callable(code)
        and "_serve_candidate" in code.__globals__
        and "_ATTACH" in code.__globals__
    )


def forget():
    """The judge is gone (killed by a sweep, or exited): the next judged exec starts one, and a
    forker whose candidates' filter names it."""
    global PID, SOCKET
    if SOCKET is not None:
        SOCKET.close()
    PID = SOCKET = None
    forker.forget()


def alive(pid):
    """Whether PID 1's child ``pid`` still runs (one that died is reaped here)."""
    if pid is None:
        return True  # not started yet
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == 0
    except ChildProcessError:
        return False


def cpu_ticks():
    """The judge's CPU so far (it forks nothing), to leave out of an exec's budget."""
    return ticks_of(PID)


def start(main):
    """Fork the judge. Returns None in PID 1, and the judge's job in the forked child."""
    global PID, SOCKET
    pid, got = forker.fork_helper("resident", main)
    if pid == 0:
        return got
    PID, SOCKET = pid, got
    return None


def do_exec(main, stdin_fd, timeout, cwd):
    """Run one judged program: have the forker fork the candidate, hand the exec to the judge,
    wait for both. Returns None in PID 1, and a job in a forked child (the judge, the forker)."""
    if PID is not None and not (alive(PID) and alive(forker.PID)):
        sweep()  # one of them died between execs (the OOM killer, say): both start afresh
    if PID is None:
        job = start(main)
        if job is not None:
            return job
    if forker.PID is None:
        job = forker.start(main, PID)
        if job is not None:
            return job
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    ticks_before = cpu_ticks() + forker.cpu_ticks()
    children_cpu = children_cpu_s()
    start_time = time.monotonic()
    pid = forker.fork_candidate(cwd, [req_r, resp_w, err_w])
    for fd in (req_r, resp_w):
        os.close(fd)
    sent = False
    if pid is not None:
        try:
            socket.send_fds(SOCKET, [REQUEST.pack(pid, forker.PID)], [stdin_fd, out_w, err_w, req_w, resp_r])
            sent = True
        except OSError:
            pass
    for fd in (stdin_fd, out_w, err_w, req_w, resp_r):
        if fd != S.DEVNULL:
            os.close(fd)
    if not sent:  # the judge or the forker is gone: nothing ran, the host may try again
        for fd in (out_r, err_r):
            os.close(fd)
        sweep()
        reply(K_ERROR, part1=b"exec failed in the supervisor: the resident judge or its forker is gone")
        return None
    budget = Budget(start_time, timeout, children_cpu, ticks_before / S.CLK_TCK)
    status, timed_out, out, killed = wait(pid, budget, out_r, err_r)
    duration = time.monotonic() - start_time
    flags, exit_code = outcome(status, timed_out, budget, out)
    if killed or PID is None or forker.PID is None or leftovers():
        sweep()
    out.send(flags, exit_code, duration, out_r, err_r)
    if forker.PID is not None:  # nothing of this exec is left: the next candidate may be forked
        forker.prefork()
    return None


def wait(pid, budget, out_r, err_r):
    """Collect output until the judge has answered, the forker has reaped the candidate and the
    pipes are closed, or the time is up. Returns ``(status, timed_out, output, killed)``;
    ``status`` is the judge's (a wait status: its exit code, or how it died); ``killed``: everything
    was killed."""
    reaper = forker.SOCKET.fileno()
    poller = select.poll()
    for fd in (out_r, err_r, reaper, SOCKET.fileno()):
        poller.register(fd, select.POLLIN)
    out = Output(out_r, err_r)
    status = None
    candidate_done = timed_out = killed = False
    try:
        while status is None or not candidate_done or out.open:
            if status is None or not candidate_done:
                remaining = budget.wait_s(time.monotonic())
                if remaining is None:
                    timed_out = killed = True
                    kill_all()  # the sweep that follows reaps the candidate
                    if not candidate_done:
                        candidate_done = True
                        poller.unregister(reaper)
                    if status is None:
                        poller.unregister(SOCKET.fileno())  # _judge_died closes it (and the forker's)
                        status = _judge_died()
                    continue
                events = poller.poll(remaining * 1000.0)
            else:
                events = poller.poll(1000.0)
                if not events:
                    break  # something unkillable holds a pipe: give up on the rest
            for fd, _ in events:
                if fd == reaper and not candidate_done:
                    candidate_done = True
                    poller.unregister(reaper)
                    if not forker.reaped() or (status is not None and out.open):
                        # The forker is gone (the candidate may live on), or whatever outlives
                        # both may hold the pipes: end it all now.
                        kill_all()
                        killed = True
                elif status is None and fd == SOCKET.fileno():
                    poller.unregister(fd)
                    status = _judge_answer()
                    if status is None:
                        # The judge died during the exec (no signal of a program reaches it; the
                        # OOM killer may): end it all, and answer the exec as the program's own
                        # result, a judge's death by a signal, never a failure of the supervisor.
                        kill_all()
                        killed = True
                        if not candidate_done:
                            candidate_done = True
                            poller.unregister(reaper)
                        status = _judge_died()
                    elif not candidate_done:
                        try:
                            os.kill(pid, signal.SIGKILL)  # the judge has ended it; make sure
                        except OSError:
                            pass
                elif fd in (out_r, err_r) and not out.read(fd):
                    poller.unregister(fd)
    finally:
        os.close(out_r)
        os.close(err_r)
    return status, timed_out, out, killed


def _judge_answer():
    """The judge's exit code for this exec (as a wait status); None when it died instead."""
    try:
        data = SOCKET.recv(DONE.size)
    except OSError:
        data = b""
    if len(data) == DONE.size:
        return (DONE.unpack(data)[0] & 0xFF) << 8
    return None


def _judge_died():
    """Reap the judge (killed, or dying) and forget it. Its wait status."""
    pid = PID
    forget()
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return signal.SIGKILL


def leftovers():
    """Whether any process but PID 1, the judge, the forker and the one waiting candidate the
    forker reported by pid when it forked it is left (the exec's candidate has been reaped).
    Ancestry is no mark: a process can have a parent it was not forked by (``CLONE_PARENT``, which
    the filter refuses, is one way), and a program's process may take any name."""
    keep = {"1", str(PID), str(forker.PID), str(forker.waiting_pid())}
    return any(name.isdigit() and name not in keep for name in os.listdir("/proc"))


def run_resident(job):
    """The judge: a session of its own, the program's limits but CPU seconds, no capabilities and
    the usual filter; then one exec after another from PID 1 until it goes away."""
    _, main, sock = job
    sock = settle_helper(sock, devnull_at=4)
    apply_limits(skip=("RLIMIT_CPU",))
    kernel.enter_program()
    kernel.PREPARED.prctl(kernel.PR_SET_DUMPABLE, 0, 0, 0, 0)
    # Its name in ps and /proc/<pid>/comm: the one mark that tells it from the forker (neither holds
    # a capability, both wear a filter).
    kernel.PREPARED.prctl(kernel.PR_SET_NAME, JUDGE_NAME, 0, 0, 0)
    current = []

    def attach(candidate_part, code):
        pid, req_w, resp_r, forker_pid = current
        try:
            size = len(candidate_part).to_bytes(4, "big")
            view = memoryview(b"".join((size, candidate_part, len(code).to_bytes(4, "big"), code)))
            while view:
                view = view[os.write(req_w, view):]
        except OSError:
            pass  # the candidate is gone: the judge's first read says so
        return pid, req_w, resp_r, forker_pid

    main.__globals__["_ATTACH"] = attach
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, REQUEST.size, 5)
        except OSError:
            os._exit(0)
        if len(data) != REQUEST.size or len(fds) != 5:
            os._exit(0)  # PID 1 went away (or sent what it never sends)
        stdin_fd, out_w, err_w, req_w, resp_r = fds
        for fd, target in ((stdin_fd, 0), (out_w, 1), (err_w, 2)):
            os.dup2(fd, target)
            os.close(fd)
        pid, forker_pid = REQUEST.unpack(data)
        current[:] = [pid, req_w, resp_r, forker_pid]
        status, fatal = 0, False
        try:
            main()
        except SystemExit as exc:
            status = exit_status(exc)
        except BaseException as exc:
            status, fatal = 1, True
            try:
                sys.excepthook(type(exc), exc, exc.__traceback__)
                sys.stderr.flush()
            except BaseException:
                pass
        try:
            os.kill(pid, signal.SIGKILL)  # the judge has, unless it failed first
        except OSError:
            pass
        for fd in (req_w, resp_r):
            os.close(fd)
        for fd in (0, 1, 2):
            os.dup2(S.DEVNULL, fd)
        current[:] = []
        try:
            sock.send(DONE.pack(status))
        except OSError:
            os._exit(0)
        if fatal:
            os._exit(1)  # a judge that failed is not used again


def sweep():
    """Kill and reap every process of the namespace but ourselves. Their IPC namespace (each
    plain exec has its own; judged candidates may make no IPC objects) goes with the last of them,
    and with it every SysV object and POSIX message queue they made. A resident judge is one of
    them."""
    forget()
    if kill_all():
        while True:
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break
    if not S.USE_PIDFD:
        drain_wakeups()

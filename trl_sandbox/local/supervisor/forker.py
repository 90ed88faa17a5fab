"""The candidates' forker: a small process that forks every judged program's candidate, so that
the supervisor (PID 1) never shares its pages with one.

After a fork every private page of the parent is shared copy-on-write with the child, and the
first write to one, by either, is a page fault (a page copy while the other still maps it). PID 1
answers requests between and during execs, and its writes used to cost about 260 faults per
judged program, each a few microseconds on a virtual machine. The forker writes to a handful of
pages per fork: it reads a request, forks, reports the pid, reaps the child and reports that.

It is forked from PID 1, pristine, right after the resident judge, and is as much out of a
candidate's reach: a session of its own, non-dumpable (no /proc/<pid>/mem or fd: its socket to PID
1 is not to be had), and the candidates' seccomp filter refuses every signal, priority and
scheduling call aimed at it, as at the judge (``kernel.protecting``). It holds no capability and
runs no program code. What every candidate would set up alike is set up here once and inherited: a
fresh interpreter state (streams, ``__main__``), the OOM score, the limits but CPU seconds, no
capabilities, no new privileges, and the seccomp filter: built here (it names this process's own
pid) and put on the forker itself, so that every candidate has it from birth (attaching a filter
costs more CPU than the fork; inheriting one costs nothing). The filter refuses IPC objects, so a
candidate needs no IPC namespace of its own: once forked, it only takes its own process group and
CPU limit.

Once an exec has ended with nothing of it left, PID 1 asks the forker for the next program's
candidate ahead of time (``prefork``): it is forked, sets itself up (process group, limits, clean
kernel, filter) and waits for its exec's descriptors and working directory, so that its fork and
set-up leave the program's path. No program process exists while it is forked, and a plain exec
ends it with the judge before it runs (``forkserver.do_exec``).

A sweep kills it with everything else; the next judged exec forks a new one.
"""

import _socket
import gc
import os
import resource
import select
import socket
import struct

from . import forked, kernel
from . import state as S
from .budget import ticks_of
from .child import EXIT_CANNOT_RUN, OOM_PROGRAM, apply_limits, child_fail, set_oom_score

PID = None  # the forker's pid, while one runs
SOCKET = None  # PID 1's end of its socket
# b"P" + the candidate's pid (-errno: no fork); b"R" + its wait status; b"W" + the pid of the
# candidate forked ahead by a prefork (-1: none).
MESSAGE = struct.Struct("<ci")
# The waiting candidate, as the forker reported it when it forked it: the one process besides the
# judge and the forker that may outlive an exec. None: none (or not reported yet: PENDING).
WAITING = None
PENDING = False  # a prefork was sent and its b"W" not read yet
ANSWER_S = 10.0  # a forker that takes longer than this to fork is taken for gone


def fork_helper(kind, main):
    """Fork one of the sandbox's resident helpers (the judge, the forker) with a socket to PID 1:
    ``(pid, PID 1's end)`` in PID 1, ``(0, job)`` in the child."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for hook in S.PRE_FORK:
        hook()
    pid = os.fork()
    if pid == 0:
        ours.close()
        return 0, (kind, main, theirs)
    theirs.close()
    return pid, ours


def start(main, judge_pid):
    """Fork the forker. Returns None in PID 1, and the forker's job in the forked child (with the
    judge's pid, which its filter protects)."""
    global PID, SOCKET
    pid, got = fork_helper("forker", main)
    if pid == 0:
        return (*got, judge_pid)
    PID, SOCKET = pid, got
    return None


def forget():
    """The forker is gone (a sweep killed it, or it exited): the next judged exec starts one."""
    global PID, SOCKET, WAITING, PENDING
    if SOCKET is not None:
        SOCKET.close()
    PID = SOCKET = WAITING = None
    PENDING = False


def waiting_pid():
    """The pid of the candidate the forker forked ahead (its b"W" word, read here the first time:
    it was sent right after the fork, long before anyone asks), or None."""
    global WAITING, PENDING
    if PENDING:
        PENDING = False
        WAITING = None
        try:
            ready, _, _ = select.select([SOCKET], [], [], ANSWER_S)
            data = SOCKET.recv(MESSAGE.size) if ready else b""
        except OSError:
            data = b""
        if len(data) == MESSAGE.size:
            kind, pid = MESSAGE.unpack(data)
            WAITING = pid if kind == b"W" and pid > 0 else None
    return WAITING


def cpu_ticks():
    """The forker's CPU so far, its own and its reaped candidates', to leave out of a budget."""
    return ticks_of(PID, children=True)


def fork_candidate(cwd, fds):
    """Have the forker fork a candidate with ``fds`` (request and response pipes, stderr) in
    ``cwd``. Its pid, or None when the forker is gone or could not fork."""
    global WAITING
    path = os.fsencode(os.path.join(S.WORK, cwd or ""))
    waiting_pid()  # the prefork's word comes first on the socket
    WAITING = None  # handed this exec (or, gone, killed and reaped by the forker)
    try:
        socket.send_fds(SOCKET, [path], fds)
        ready, _, _ = select.select([SOCKET], [], [], ANSWER_S)
        data = SOCKET.recv(MESSAGE.size) if ready else b""
    except OSError:
        data = b""
    if len(data) != MESSAGE.size:
        return None
    kind, pid = MESSAGE.unpack(data)
    return pid if kind == b"P" and pid > 0 else None


def reaped():
    """Read the forker's word that the candidate is reaped. False: the forker is gone (the
    candidate, if it still runs, is PID 1's now, and a sweep must end it)."""
    try:
        data = SOCKET.recv(MESSAGE.size)
    except OSError:
        data = b""
    return len(data) == MESSAGE.size and MESSAGE.unpack(data)[0] == b"R"


# -- in the forker ---------------------------------------------------------------------------------


def prefork():
    """Ask the forker to fork the next candidate now, while the host reads this exec's answer: it
    sets itself up and waits for its exec, off the next program's path. Sent only once this exec
    has ended with nothing of it left, so that no program process ever sees a waiting candidate."""
    global PENDING
    try:
        SOCKET.send(PREFORK)
        PENDING = True
    except OSError:
        pass  # the forker is gone: the next judged exec finds out


PREFORK = b"\0prefork"  # a request with no descriptors (a fork request always has three)

# The forker's loop talks to its sockets with the C methods, not socket.send_fds/recv_fds: every
# page it writes between two forks is a copy-on-write fault, once per candidate, and those helpers
# (and an import statement per fork) wrote about forty more pages per candidate.
FDS_SPACE = socket.CMSG_LEN(3 * 4)
FD_TRIPLE = struct.Struct("3i")
# The C socket pair, not socket.socketpair's Python wrapper objects: fewer pages written per fork.
_socketpair, _AF_UNIX, _SOCK_SEQPACKET = _socket.socketpair, socket.AF_UNIX, socket.SOCK_SEQPACKET


def _fds_of(ancillary):
    """The descriptors of a received message's SCM_RIGHTS record."""
    fds = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(memoryview(data)[: len(data) - len(data) % 4].cast("i"))
    return fds


# -- in the forker ---------------------------------------------------------------------------------


def run_forker(job):
    """The forker's loop: one candidate at a time, forked (or taken ready from a prefork),
    reported, reaped, reported."""
    _, main, sock, judge_pid = job
    sock = forked.settle_helper(sock, devnull_at=0)  # its OOM score and interpreter state are inherited
    global OOM_FD, OOM_SCORES
    OOM_FD = set_oom_score(S.OOM_HELPER, keep=True)  # see _fork
    OOM_SCORES = (b"%d" % OOM_PROGRAM, b"%d" % S.OOM_HELPER)
    # What every candidate would set up alike is set up here once and inherited: the program's
    # limits but CPU seconds (which count per process: each candidate sets its own), no
    # capabilities, no new privileges, the candidates' filter, non-dumpable.
    apply_limits(skip=("RLIMIT_CPU",))
    forked.CPU_LIMITS = tuple(limit for limit in S.RLIMITS if limit[0] == resource.RLIMIT_CPU)
    kernel.shed_privileges()
    kernel.take_filter(kernel.protecting(judge_pid, os.getpid()))
    kernel.PREPARED.prctl(kernel.PR_SET_DUMPABLE, 0, 0, 0, 0)
    gc.freeze()  # what PID 1 made since it last froze: no candidate's collector scans it
    kernel.release_free_heap()  # fewer pages to copy at every fork and to unmap at every exit
    ready = None  # (pid, our end of its socket): a candidate set up and waiting for its exec
    receive = sock.recvmsg
    while True:
        try:
            path, ancillary, flags, _ = receive(1 << 16, FDS_SPACE)
        except OSError:
            os._exit(0)
        fds = _fds_of(ancillary)
        if path == PREFORK and not fds:
            if ready is None:
                ready = _fork_waiting(main)
            try:  # PID 1 knows the waiting candidate by this pid, never by whose child it is
                sock.send(MESSAGE.pack(b"W", ready[0] if ready is not None else -1))
            except OSError:
                os._exit(0)
            continue
        if not path or len(fds) != 3 or flags & socket.MSG_TRUNC:
            os._exit(0)  # PID 1 went away (or sent what it never sends)
        pid = _hand_over(ready, path, fds) if ready is not None else None
        ready = None
        if pid is None:
            pid = _fork_now(main, fds, path)
        for fd in fds:
            os.close(fd)
        try:
            sock.send(MESSAGE.pack(b"P", pid))
            if pid > 0:
                _, status = os.waitpid(pid, 0)
                sock.send(MESSAGE.pack(b"R", status))
        except OSError:
            os._exit(0)


def _reseed():
    """What the preloaded modules' fork hooks would have done in each child (``random``'s reseeds
    its generator), done here before each fork as PID 1 does before its own: else every candidate
    of this forker would draw the same random numbers. Here it costs the forker a page or two; in
    the child it would cost about forty copy-on-write faults."""
    for hook in S.PRE_FORK:
        hook()


OOM_FD = None  # the forker's own oom_score_adj, open (read and write)
OOM_SCORES = (b"1000", b"500")  # a candidate's, the forker's


def _fork():
    """``os.fork()``, the child born with the programs' OOM score.

    The forker raises its own score for the fork and lowers it back after (down to no lower than
    it was, which needs no privilege), through a file it opened while it could: a candidate, a
    non-dumpable process, cannot open its own ``oom_score_adj`` unless it makes itself dumpable
    for the write, which would cost every candidate code and faults on its path. The file is
    closed in the child before any program code runs (its descriptors above 3 are closed or
    replaced, ``wire_candidate`` and ``_fork_waiting``). A write that fails raises: the forker is
    gone, and the exec says so."""
    high, low = OOM_SCORES
    os.pwrite(OOM_FD, high, 0)
    try:
        pid = os.fork()
    except BaseException:
        os.pwrite(OOM_FD, low, 0)
        raise
    if pid:
        os.pwrite(OOM_FD, low, 0)
    return pid


def _fork_now(main, fds, path):
    """Fork a candidate for this exec. Its pid (-errno when no fork could be made)."""
    _reseed()
    try:
        pid = _fork()
    except OSError as exc:
        return -(exc.errno or 1)
    if pid == 0:
        try:
            forked.wire_candidate(fds)
            forked.prepare_candidate()
            forked.serve_candidate(main, path)
        except BaseException as exc:
            child_fail(f"cannot start the program: {exc!r}", EXIT_CANNOT_RUN)
        os._exit(EXIT_CANNOT_RUN)
    return pid


def warm_waiting(rounds=24):
    """Run, here in PID 1 before any fork, what a waiting candidate runs to take its exec (a
    socket object on its descriptor, ``socket.recv_fds``): each waiting candidate then finds that
    code quickened and its lookups cached, where it would write them, a copy-on-write fault per
    page (see ``_warm_serving`` in ``trl_sandbox/judge/resident.py`` for the rest of a candidate's path)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        for _ in range(rounds):
            socket.send_fds(ours, [b"/work"], [S.DEVNULL] * 3)
            with socket.socket(fileno=os.dup(theirs.fileno())) as ready:
                _, fds, _, _ = socket.recv_fds(ready, 1 << 16, 3)
            for fd in fds:
                os.close(fd)
    finally:
        ours.close()
        theirs.close()


def _fork_waiting(main):
    """Fork a candidate that sets itself up and waits for its exec: ``(pid, socket)``, or None."""
    ours, theirs = _socketpair(_AF_UNIX, _SOCK_SEQPACKET)
    _reseed()
    try:
        pid = _fork()
    except OSError:
        ours.close()
        theirs.close()
        return None
    if pid == 0:
        fd = theirs.detach()
        os.dup2(fd, 3)  # in place of the forker's socket to PID 1
        os.closerange(4, S.FD_LIMIT)
        error = None
        try:
            forked.prepare_candidate()
        except BaseException as exc:
            error = exc  # reported on the exec's stderr, once there is one
        try:
            with socket.socket(fileno=3) as ready:  # closed before the descriptors are put in place
                path, fds, flags, _ = socket.recv_fds(ready, 1 << 16, 3)
        except BaseException:
            os._exit(0)
        if not path or len(fds) != 3 or flags & socket.MSG_TRUNC:
            os._exit(0)  # the forker went away
        try:
            forked.wire_candidate(fds)
            if error is not None:
                raise error
            forked.serve_candidate(main, path)
        except BaseException as exc:
            child_fail(f"cannot start the program: {exc!r}", EXIT_CANNOT_RUN)
        os._exit(EXIT_CANNOT_RUN)
    theirs.close()
    return pid, ours


def _hand_over(ready, path, fds):
    """Give the waiting candidate its exec. Its pid, or None when it is gone (then reaped)."""
    pid, ours = ready
    try:
        ours.sendmsg([path], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, FD_TRIPLE.pack(*fds))])
        return pid
    except OSError:
        try:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        except OSError:
            pass
        return None
    finally:
        ours.close()

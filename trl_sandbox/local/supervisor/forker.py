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
scheduling call aimed at it, as at the judge (``kernel.protecting``). It keeps the supervisor's
capabilities, which its children need for a clean kernel, and runs no program code. What every
candidate would set up alike is set up here once and inherited: a fresh interpreter state (streams,
``__main__``), the OOM score, and the filter (built here: it names this process's own pid).

A sweep kills it with everything else; the next judged exec forks a new one.
"""

import gc
import os
import select
import socket
import struct

from . import kernel
from . import state as S
from .child import EXIT_CANNOT_RUN, child_fail, oom_first

PID = None  # the forker's pid, while one runs
SOCKET = None  # PID 1's end of its socket
MESSAGE = struct.Struct("<ci")  # b"P" + the candidate's pid (-errno: no fork); b"R" + its wait status
ANSWER_S = 10.0  # a forker that takes longer than this to fork is taken for gone


def start(main):
    """Fork the forker. Returns None in PID 1, and the forker's job in the forked child."""
    global PID, SOCKET
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for hook in S.PRE_FORK:
        hook()
    pid = os.fork()
    if pid == 0:
        ours.close()
        return ("forker", main, theirs)
    theirs.close()
    PID, SOCKET = pid, ours
    return None


def forget():
    """The forker is gone (a sweep killed it, or it exited): the next judged exec starts one."""
    global PID, SOCKET
    if SOCKET is not None:
        SOCKET.close()
    PID = SOCKET = None


def cpu_ticks():
    """The forker's CPU so far, its own and its reaped candidates', to leave out of a budget."""
    try:
        with open(f"/proc/{PID}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return sum(int(fields[i]) for i in (11, 12, 13, 14))
    except (OSError, IndexError, ValueError):
        return 0


def fork_candidate(cwd, fds):
    """Have the forker fork a candidate with ``fds`` (request and response pipes, stderr) in
    ``cwd``. Its pid, or None when the forker is gone or could not fork."""
    path = os.fsencode(os.path.join(S.WORK, cwd or ""))
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


def run_forker(job):
    """The forker's loop: one candidate at a time, forked, reported, reaped, reported."""
    from . import resident

    _, main, sock = job
    os.setsid()
    os.chdir("/")
    oom_first()  # inherited by every candidate
    fd = sock.detach()
    if fd != 3:
        os.dup2(fd, 3)
        os.close(fd)
    for fd in (0, 1, 2):
        os.dup2(S.DEVNULL, fd)
    S.DEVNULL = 0
    os.closerange(4, S.FD_LIMIT)
    sock = socket.socket(fileno=3)
    resident.become_python()
    filter_ = kernel.protecting(resident.PID, os.getpid())
    kernel.PREPARED.prctl(kernel.PR_SET_DUMPABLE, 0, 0, 0, 0)
    gc.freeze()  # what PID 1 made since it last froze: no candidate's collector scans it
    while True:
        try:
            path, fds, flags, _ = socket.recv_fds(sock, 1 << 16, 3)
        except OSError:
            os._exit(0)
        if not path or len(fds) != 3 or flags & socket.MSG_TRUNC:
            os._exit(0)  # PID 1 went away (or sent what it never sends)
        try:
            pid = os.fork()
        except OSError as exc:
            pid = -(exc.errno or 1)
        if pid == 0:
            try:
                resident.run_candidate(main, fds, path, filter_)
            except BaseException as exc:
                child_fail(f"cannot start the program: {exc!r}", EXIT_CANNOT_RUN)
            os._exit(EXIT_CANNOT_RUN)
        for fd in fds:
            os.close(fd)
        try:
            sock.send(MESSAGE.pack(b"P", pid))
            if pid > 0:
                _, status = os.waitpid(pid, 0)
                sock.send(MESSAGE.pack(b"R", status))
        except OSError:
            os._exit(0)

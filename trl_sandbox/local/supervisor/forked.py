"""What the resident judge, the forker and every judged candidate do right after their fork, before
anything of theirs runs: a fresh interpreter state, a session of their own, their descriptors.

The forker (``forker.run_forker``) sets up what all candidates share once and each candidate then
runs ``prepare_candidate``, ``wire_candidate`` and ``serve_candidate``; the judge and the forker
start with ``settle_helper``.
"""

import os
import resource
import signal
import socket
import sys

from . import state as S
from .child import set_oom_score

# The program's CPU-seconds limit, which counts per process: each candidate sets it on itself
# (``prepare_candidate``). Picked out of the limits once, by the forker, so that a candidate, a fresh
# fork, runs as little code as it can before its program (every page it writes is a fault).
CPU_LIMITS = ()


def become_python():
    """What a forked Python child sets up before running anything (see child.run_python_child)."""
    import builtins
    import gc

    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__ = S.STREAMS[False]
    sys.argv = ["-c"]
    sys.path = list(S.BASE_PATH)  # isolated (-I): nothing of the working directory
    main = type(sys)("__main__")
    main.__dict__.update(__annotations__={}, __builtins__=builtins,
                         __loader__=sys.modules["_frozen_importlib"].BuiltinImporter)
    sys.modules["__main__"] = main
    signal.signal(signal.SIGINT, signal.default_int_handler)
    gc.enable()


def settle_helper(sock, devnull_at):
    """What the judge and the forker do first: a session of their own, ``/`` as working directory,
    the OOM killer's choice after every program and before the supervisor, their socket to PID 1 as descriptor 3, /dev/null on 0, 1, 2 and
    ``devnull_at`` (``S.DEVNULL`` from then on), every other descriptor closed, and a fresh
    interpreter state. Returns the socket."""
    os.setsid()
    os.chdir("/")
    set_oom_score(S.OOM_HELPER)  # raises: a helper that cannot is not started (the exec fails)
    fd = sock.detach()
    if fd != 3:
        os.dup2(fd, 3)
        os.close(fd)
    for fd in {0, 1, 2, devnull_at}:
        os.dup2(S.DEVNULL, fd)
    S.DEVNULL = devnull_at
    os.closerange(max(3, devnull_at) + 1, S.FD_LIMIT)
    become_python()
    return socket.socket(fileno=3)


def wire_candidate(fds):
    """A candidate's descriptors: the request and response pipes as 3 and 4 (where
    ``_serve_candidate`` expects them), stdout and stderr both the exec's stderr (stdout carries
    the verdict only), stdin /dev/null; every other descriptor closed (the forker's socket too)."""
    req_r, resp_w, err_w = fds
    os.dup2(S.DEVNULL, 0)
    os.dup2(err_w, 1)
    os.dup2(err_w, 2)
    if resp_w == 3:
        resp_w = os.dup(resp_w)  # out of the way of the request pipe
    if req_r != 3:
        os.dup2(req_r, 3)
    if resp_w != 4:
        os.dup2(resp_w, 4)
    os.closerange(5, S.FD_LIMIT)


def prepare_candidate():
    """A candidate's own session (and process group) and CPU limit. The forker has set up the
    rest for all of them (``forker.run_forker``): a fresh interpreter state, ``/`` as working
    directory, the programs' OOM score (``forker._fork``), the other limits, the seccomp filter,
    no capabilities, no new privileges, non-dumpable.

    A session, not only a group: a process may move into any process group of its own session,
    and the forker's group is its session's. A candidate left in the forker's session could join
    the forker's group (``setpgid(0, forker)``) and then reach the forker through every call that
    names "my own group" (``kill(0, SIGSTOP)``, ``setpriority(PRIO_PGRP, 0)``), which the filter
    cannot tell from a call on the candidate's own group. In a session of its own, the groups it
    and its processes can join are its own."""
    os.setsid()
    for name, soft, hard in CPU_LIMITS:
        try:
            resource.setrlimit(name, (soft, hard))
        except (ValueError, OSError):
            pass


def serve_candidate(main, path):
    """Into the exec's working directory, and serve the judge (``_serve_candidate``)."""
    os.chdir(os.fsdecode(path))
    try:
        main.__globals__["_serve_candidate"](3, 4)
    except BaseException:
        pass
    os._exit(0)

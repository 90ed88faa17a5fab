"""The exec path in the supervisor: plan how to run an argv, compile, fork, collect the output,
and kill everything the exec left behind.

Python execs are served by forking this pre-imported interpreter; anything else is ``fork`` +
``execve``. The child gets its own process group, fresh pipes for stdout and stderr, stdin from a
memfd (or ``/dev/null``), the configured rlimits and a clean kernel (``kernel.enter_program``).
When it exits or times out, everything else left in the namespace is killed and reaped; its IPC
namespace, with every object a program made in it, goes with the last of them.

The cost of a fork is dominated by the pages the child and the supervisor touch afterwards
(each is a copy-on-write fault), so the child's preparation is done once, before any fork
(standard streams, rlimits, compiled code, the seccomp program), and modules whose fork hooks
would run in every child are kept out of the pre-imported set (``threading``) or have their hook
run in the supervisor instead (``random`` is reseeded before each fork).
"""

import gc
import mmap
import os
import select
import time
import warnings

from . import resident
from . import state as S
from .budget import Budget, children_cpu_s
from .child import EXIT_NOT_FOUND
from .ending import drain_wakeups, kill_all, kill_orphans, outcome
from .files import read_regular
from .output import Output
from .protocol import F_OOM, K_RESULT, read_fd, receive_stdin, reply

# Single-letter interpreter flags that a forked interpreter can honour (or that make no difference
# to one that is already running). Any other flag (-m, -O, -W, -X, ...) runs the real interpreter.
PY_FLAGS = frozenset("IsSuBEq")
# Sources longer than this are compiled in the child (under its limits), not in the supervisor.
MAX_PARENT_COMPILE = 512 * 1024
READ_STDIN = "\0read-stdin\0"  # python_plan's marker for "the program itself comes on stdin"


def python_plan(argv, stdin, cwd, env):
    """Describe how to run ``argv`` in a forked interpreter, or return None to execve it.

    Returns ``(source, filename, sys_argv, path0, unbuffered, stdin)``: ``path0`` is what a fresh
    interpreter puts first on ``sys.path`` (None under -I) and ``stdin`` what the child reads.
    """
    if argv[0] not in S.PY_NAMES:
        return None
    if env and any(k.startswith("PYTHON") for k in env):
        return None
    unbuffered = isolated = False
    i, n = 1, len(argv)
    while i < n:
        arg = argv[i]
        if arg == "-" or arg == "--" or not arg.startswith("-"):
            break
        letters = arg[1:]
        command = letters.endswith("c")
        if command:
            letters = letters[:-1]
        if not all(ch in PY_FLAGS for ch in letters):
            return None
        unbuffered = unbuffered or "u" in letters
        isolated = isolated or "I" in letters
        if command:
            if i + 1 >= n:
                return None
            return (argv[i + 1], "<string>", ["-c"] + argv[i + 2:], None if isolated else "", unbuffered, stdin)
        i += 1
    if i < n and argv[i] == "--":
        i += 1
    if i >= n or argv[i] == "-":
        # The program comes from stdin; once it is read, the child's stdin is at end of file.
        if stdin is None:
            return None
        return (stdin, "<stdin>", ["-" if i < n else ""] + argv[i + 1:], None if isolated else "", unbuffered, None)
    script = argv[i]
    path = os.path.normpath(os.path.join(S.WORK, cwd or "", script))
    try:
        source = read_regular(path)
    except OSError:
        return None  # let the real interpreter report it (or read the FIFO) in its own words
    return (source, path, argv[i:], None if isolated else os.path.dirname(path), unbuffered, stdin)


class _Warned(Exception):
    """Raised out of compile() by the first compile-time warning (see compiled())."""


def _refuse_warning(*args, **kwargs):
    raise _Warned


def compile_quietly(source, filename):
    """compile(), or None when it warns (SyntaxWarning, DeprecationWarning, ...).

    Compile-time warnings must reach the program's stderr as a fresh interpreter prints them,
    never the supervisor's (bwrap's stderr: a flood of them once hung PID 1). The first one
    stops the compile here; the child compiles the source again itself, under its own limits
    and filters, with its stderr in place.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = _refuse_warning
        try:
            return compile(source, filename, "exec", dont_inherit=True)
        except _Warned:
            return None


def compiled(source, filename):
    """A code object, compiled here before the fork; the exception compile raised; or None to
    have the child compile it.

    Code is kept for sources seen before (a judge program sent with every exec, a benchmark's
    programs): one seen for the first time is compiled and dropped after the fork, so the
    unique programs of training never fill the cache (nor grow the memory every fork copies).
    """
    if len(source) > MAX_PARENT_COMPILE:
        return None  # compiled by the child, under its limits
    key = (source, filename)
    cache = S.CACHE
    code = cache.pop(key, None)
    if code is None:
        try:
            code = compile_quietly(source, filename)
        except Exception as exc:  # SyntaxError, ValueError (NUL bytes), RecursionError, ...
            exc.__traceback__ = None
            return exc
        if code is None:
            return None
        digest = hash(key)
        if digest not in S.SEEN:
            if len(S.SEEN) >= 4096:
                S.SEEN.clear()
            S.SEEN.add(digest)
            return code
        S.SEEN.discard(digest)
        S.CACHE_BYTES[0] += len(source)
        while cache and (len(cache) >= S.CACHE_MAX_ENTRIES or S.CACHE_BYTES[0] > S.CACHE_MAX_BYTES):
            old = next(iter(cache))
            del cache[old]
            S.CACHE_BYTES[0] -= len(old[0])
        # Frozen objects are never scanned by a child's collector (fewer copy-on-write faults)
        # and are invisible to its gc.get_objects().
        gc.freeze()
    cache[key] = code  # most recently used last
    return code


ORPHAN_POLL_S = 0.001


def do_exec(request):
    """Run one exec. Returns None in the supervisor, and the job to run in the forked child."""
    _, argv, stdin_len, timeout, cwd, env = request[:6]
    orphans_die = len(request) > 6 and bool(request[6])  # see wait_child
    # The raw stdin frame follows the request: take it off the channel before anything else.
    stdin_fd = receive_stdin(stdin_len) if stdin_len else S.DEVNULL
    if not argv:
        if stdin_fd != S.DEVNULL:
            os.close(stdin_fd)
        reply(K_RESULT, code=EXIT_NOT_FOUND, part2=b"trl-sandbox: empty argv\n")
        return None
    if S.WARM_SOURCES:
        argv = [S.WARM_SOURCES.get(a, a) if a[:1] == "\0" else a for a in argv]
    plan = python_plan(argv, READ_STDIN if stdin_fd != S.DEVNULL else None, cwd, env)
    code = None
    if plan is not None:
        if plan[0] is READ_STDIN:  # the program itself comes on stdin (not a secret of the judge)
            plan = (read_fd(stdin_fd),) + plan[1:]
            os.close(stdin_fd)
            stdin_fd = S.DEVNULL
        # A warm program (the judge, see main.warm_up) runs as its main() in the child; only an
        # isolated one (-I), whose imports cannot depend on the directory it is started in.
        code = S.WARM.get(plan[0]) if plan[3] is None and plan[1] == "<string>" else None
        if code is None:
            code = compiled(plan[0], plan[1])
        elif resident.usable(code, env):
            return resident.do_exec(code, stdin_fd, timeout, cwd)
    if resident.PID is not None:
        # The judge, its forker and the waiting candidate never share the sandbox with another
        # program (the sweep after this exec would end them anyway).
        resident.sweep()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    # A page of its own for every exec: whatever a program writes into it dies with the exec.
    S.STATUS = status_page = mmap.mmap(-1, 1)
    for hook in S.PRE_FORK:
        hook()
    children_cpu = children_cpu_s()
    start = time.monotonic()
    S.VERIFIER = orphans_die
    pid = os.fork()
    if pid == 0:
        return (plan, code, argv, cwd, env, stdin_fd, out_w, err_w)
    S.STATUS = None
    S.VERIFIER = False
    os.close(out_w)
    os.close(err_w)
    if stdin_fd != S.DEVNULL:
        os.close(stdin_fd)
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass  # it already did so itself (and maybe exec'ed)
    budget = Budget(start, timeout, children_cpu)
    status, timed_out, out = wait_child(pid, budget, out_r, err_r, orphans_die)
    duration = time.monotonic() - start
    flags, exit_code = outcome(status, timed_out, budget, out)
    oom = status_page[0] == 1
    status_page.close()
    if oom or (plan is None and exit_code > 0 and out.ends_with_memory_error(err_r)):
        flags |= F_OOM
    resident.sweep()
    out.send(flags, exit_code, duration, out_r, err_r)
    return None


def wait_child(pid, budget, out_r, err_r, orphans_die=False):
    """Collect output until the child has exited and the pipes are closed, or its time is up.

    With ``orphans_die`` (an agent task's verifier), every process the program orphans is killed
    within ``ORPHAN_POLL_S`` of its orphaning: a daemon left by code the verifier ran cannot wait
    for the verifier's last write and overwrite it. We are the namespace's init, so no process of
    the program can stop or kill us to delay this.

    Returns ``(status, timed_out, output)``.
    """
    watch = os.pidfd_open(pid) if S.USE_PIDFD else S.WAKE_R
    poller = select.poll()
    poller.register(out_r, select.POLLIN)
    poller.register(err_r, select.POLLIN)
    poller.register(watch, select.POLLIN)
    out = Output(out_r, err_r)
    timed_out = False
    status = None
    try:
        while status is None or out.open:
            if status is None:
                remaining = budget.wait_s(time.monotonic())
                if remaining is None:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if not done:
                        timed_out = True
                        kill_all()
                        status = os.waitpid(pid, 0)[1]
                    poller.unregister(watch)
                    continue
                if orphans_die:
                    kill_orphans(pid)
                    remaining = min(remaining, ORPHAN_POLL_S)
                events = poller.poll(remaining * 1000.0)
            else:
                events = poller.poll(1000.0)
                if not events:
                    break  # an unkillable process holds a pipe: give up on the rest
            for fd, _ in events:
                if fd == watch:
                    if not S.USE_PIDFD:
                        drain_wakeups()
                    done, st = os.waitpid(pid, os.WNOHANG)
                    if done:
                        status = st
                        poller.unregister(watch)
                        if out.open:
                            # Whatever outlives the child may hold its pipes: end it now.
                            kill_all()
                    continue
                if not out.read(fd):
                    poller.unregister(fd)
    finally:
        if S.USE_PIDFD:
            os.close(watch)
        os.close(out_r)
        os.close(err_r)
    return status, timed_out, out

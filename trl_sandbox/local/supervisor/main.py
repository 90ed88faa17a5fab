"""Start-up, configuration and the request loop of the supervisor (PID 1 of the sandbox).

The container's command line carries nothing but the entry script; the configuration and every
request arrive over stdin, and every answer leaves over stdout (``protocol``).

Why PID 1: the kernel delivers to a namespace's init only the signals it installed a handler
for, and this supervisor installs none (except SIGCHLD on Python 3.8), so sandboxed code cannot
kill it (``kill -9 -1``, ``os.kill(1, 9)``, killing the parent are no-ops for it); and
``kill(-1, SIGKILL)`` sent by init reaches every other process of the namespace at once,
including ones that double-forked or called ``setsid``. The supervisor is non-dumpable, so its
memory and descriptors (``/proc/1/mem``, ``/proc/1/fd``, ...) are closed to sandboxed code, and
it keeps capabilities (``kernel``) that no program has.
"""

import functools
import gc
import os
import resource
import signal
import sys

from . import changes, files, forker, kernel, layers, protocol, resident
from . import state as S
from .child import EXIT_CANNOT_RUN, child_fail, run_exec_child, run_python_child
from .forkserver import do_exec
from .protocol import (
    K_ERROR,
    K_OK,
    OP_APPLY,
    OP_CHANGES,
    OP_CONFIG,
    OP_ENV,
    OP_EXEC,
    OP_PING,
    OP_READ,
    OP_RESET,
    OP_TESTS,
    OP_VERDICT,
    OP_WRITE,
    reply,
)

ENTRY_DIR = "/.trl-sandbox"  # where the host ships these files in; never on a program's sys.path


def _noop(signum, frame):
    pass


def startup():
    """Move the host channel off fds 0/1, become non-dumpable, and apply the configuration."""
    protocol.CTL_IN, protocol.CTL_OUT = os.dup(0), os.dup(1)  # dup(): non-inheritable across execve
    S.DEVNULL = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
    S.SPLICE = splice_works()
    protocol.DROP[0] = S.DEVNULL
    os.dup2(S.DEVNULL, 0)
    os.dup2(S.DEVNULL, 1)
    # Bound our own descriptor numbers so that a child closes all of them with one closerange().
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    S.FD_LIMIT = 1024 if hard == resource.RLIM_INFINITY else min(hard, 1024)
    resource.setrlimit(resource.RLIMIT_NOFILE, (S.FD_LIMIT, hard))
    # Programs (not the supervisor) are the OOM killer's first choice: each child and candidate
    # raises its own oom_score_adj to 1000 (child.set_oom_score), the judge and the forker to
    # halfway between that and the score the supervisor was started with, which it keeps (the
    # lowest: raising needs no privilege, lowering does), so that memory a program pinned where no
    # process maps it (tmpfs, memfd) costs the program, then the helpers, and never the sandbox.
    with open("/proc/self/oom_score_adj", "rb") as f:
        own = int(f.read())
    if own >= 999:
        raise SystemExit(f"trl-sandbox supervisor: started with oom_score_adj {own}: no room below the programs' 1000")
    S.OOM_HELPER = (own + 1000) // 2
    if kernel.libc().prctl(kernel.PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise SystemExit("trl-sandbox supervisor: prctl(PR_SET_DUMPABLE, 0) failed")
    # As PID 1, signals without a handler are dropped: SIGINT must not keep Python's handler.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    request = protocol.read_request()
    if not request or request[0] != OP_CONFIG:
        raise SystemExit("trl-sandbox supervisor: expected a configuration message")
    # How the end of a child is noticed: a pidfd (Python 3.9+, Linux 5.3+) in the poll set, or
    # else SIGCHLD through a wake-up pipe (the only signal handler the supervisor installs).
    S.USE_PIDFD = hasattr(os, "pidfd_open") and request[1].get("exit_watch", "auto") != "sigchld"
    if S.USE_PIDFD:
        try:
            os.close(os.pidfd_open(os.getpid()))
        except OSError:
            S.USE_PIDFD = False
    if not S.USE_PIDFD:
        S.WAKE_R, S.WAKE_W = os.pipe()
        os.set_blocking(S.WAKE_R, False)
        os.set_blocking(S.WAKE_W, False)
        signal.signal(signal.SIGCHLD, _noop)
        signal.set_wakeup_fd(S.WAKE_W, warn_on_full_buffer=False)
    configure(request[1])


def splice_works():
    """Whether outputs can go pipe -> memfd -> pipe, and overflow to /dev/null, by os.splice."""
    if not hasattr(os, "splice"):
        return False  # Python < 3.10: outputs are read into memory
    fds = []
    try:
        r, w = os.pipe()
        fds += [r, w]
        back_r, back_w = os.pipe()
        fds += [back_r, back_w]
        memfd = os.memfd_create("probe", os.MFD_CLOEXEC)
        fds.append(memfd)
        os.write(w, b"xy")
        ok = os.splice(r, memfd, 1) == 1 and os.splice(r, S.DEVNULL, 1) == 1
        return ok and os.splice(memfd, back_w, 1, offset_src=0) == 1 and os.read(back_r, 1) == b"x"
    except OSError:
        return False
    finally:
        for fd in fds:
            os.close(fd)


def configure(config):
    S.WORK = config["work_dir"]
    S.MEMORY_MODE = config.get("memory_mode", "deny")
    if S.MEMORY_MODE not in ("deny", "cgroup"):
        raise SystemExit("trl-sandbox supervisor: memory_mode must be 'deny' or 'cgroup'")
    S.TIME_BUDGET = config.get("time_budget", "cpu")
    if S.TIME_BUDGET not in ("cpu", "wall"):
        raise SystemExit("trl-sandbox supervisor: time_budget must be 'cpu' or 'wall'")
    S.WALL_FACTOR = float(config.get("wall_factor", S.WALL_FACTOR))
    S.WALL_MARGIN_S = float(config.get("wall_margin_s", S.WALL_MARGIN_S))
    try:
        S.CLK_TCK = os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError):
        pass
    S.OUTPUT_CAP = int(config["output_bytes"])
    resident.ENABLED = bool(config.get("resident_judge", True))
    S.CACHE_MAX_BYTES = int(config.get("cache_bytes", S.CACHE_MAX_BYTES))
    S.CACHE_MAX_ENTRIES = int(config.get("cache_entries", S.CACHE_MAX_ENTRIES))
    version = "{}.{}".format(*sys.version_info[:2])
    names = {"python", "python3", "python" + version, sys.executable}
    names.update(config.get("python_names", ()))
    S.PY_NAMES = frozenset(n for n in names if n)
    sys.path[:] = [p for p in sys.path if p != ENTRY_DIR and not p.startswith(ENTRY_DIR + "/")]
    S.BASE_PATH = list(sys.path)
    # The scratch places get tmpfs mounts of our own, replaced by every reset.
    files.SCRATCH[:] = [(p, int(size), int(mode)) for p, size, mode in config.get("scratch", ())]
    kernel.own_mount_namespace()
    files.fresh_scratch()
    layers.cover_idle()
    kernel.prepare(S.MEMORY_MODE)
    # A child's standard streams, made once here: its fds 0-2 have these numbers, and its copies
    # of these objects start out empty. Encodings and error handlers are the ones this
    # interpreter chose from the sandbox's environment, as a fresh interpreter would.
    S.ORIGINAL_STDIO = (sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__, sys.__stderr__)
    stdio = [(f.encoding, f.errors) for f in S.ORIGINAL_STDIO[3:]]
    # They are made while fds 1 and 2 are pipes, as in a child, so that what they find out about
    # their descriptors once (seekable or not) is true there.
    pipe_r, pipe_w = os.pipe()
    saved_stderr = os.dup(2)
    os.dup2(pipe_w, 1)
    os.dup2(pipe_w, 2)
    try:
        S.STREAMS[False] = make_streams(stdio, False)
        S.STREAMS[True] = make_streams(stdio, True)
    finally:
        os.dup2(S.DEVNULL, 1)
        os.dup2(saved_stderr, 2)
        for fd in (pipe_r, pipe_w, saved_stderr):
            os.close(fd)
    S.RLIMITS[:] = rlimits(config["limits"])
    # A second reference to the compile cache that nothing in Python can reach (see child.run_child).
    import ctypes

    ctypes.pythonapi.Py_IncRef(ctypes.py_object(S.CACHE))
    preload(config.get("preload", ()))
    warm_up(config.get("warm", ()))
    if resident.ENABLED:
        forker.warm_waiting()
    os.chdir(S.WORK)
    gc.collect()
    gc.disable()  # the supervisor makes few cycles; reset() collects them
    gc.freeze()


def preload(names):
    """Import ``names``; a reseeding fork hook (``random``'s) is run before each fork instead."""
    real = os.register_at_fork

    def register(**hooks):
        child = hooks.get("after_in_child")
        owner = getattr(child, "__self__", None)
        if child is not None and getattr(child, "__name__", "") == "seed" and type(owner).__module__ == "random":
            S.PRE_FORK.append(reseeder(owner))
            del hooks["after_in_child"]
        if hooks:
            real(**hooks)

    os.register_at_fork = register
    try:
        for name in names:
            try:
                __import__(name)
            except Exception:
                pass
    finally:
        os.register_at_fork = real


def reseeder(generator):
    """``generator.seed()`` (what random's fork hook calls) as one C call, run before every fork.

    ``Random.seed(None)`` is the C generator's ``seed(None)`` (fresh state from the kernel) plus
    ``gauss_next = None``. The fork server and the forker never draw a Gaussian, so it is cleared
    once, here; the Python method's frame would cost the forker about twenty more copy-on-write
    faults per candidate (every page it writes is shared again with the next one)."""
    import _random

    generator.gauss_next = None
    return functools.partial(_random.Random.seed, generator, None)


def warm_up(sources):
    """Run the module body of each trusted program (the judge) once, here, before any program.

    ``sources`` holds ``[token, source]`` pairs: the host sends the token in place of the source.
    An exec of exactly that source then calls its ``main()`` in the forked child instead of running
    the body again: its definitions, classes and resolved library calls are inherited with the
    fork, pristine for every exec, like the preloaded modules. A body that fails here (or defines no
    ``main``) is left to the ordinary path, which reports the failure in the program's own words.
    """
    import builtins

    for token, source in sources:
        S.WARM_SOURCES[token] = source
        namespace = {"__name__": "__trl_sandbox_warm__", "__builtins__": builtins}
        try:
            exec(compile(source, "<string>", "exec", dont_inherit=True), namespace)
        except Exception:
            continue
        if callable(namespace.get("main")):
            S.WARM[source] = namespace["main"]
        warm = namespace.get("_warm_serving")  # the judge's: its candidates' path, run once here
        if callable(warm):
            try:
                warm()
            except Exception:
                pass


# POSIX message queues are charged to RLIMIT_MSGQUEUE (per user of the sandbox's namespace):
# fixed here, so that the bound is known whatever the host's default.
MSGQUEUE_BYTES = 819200


def rlimits(lim):
    """The (resource, soft, hard) triples a child sets on itself before running the program."""
    out = []
    cpu = lim.get("cpu_seconds")
    if cpu:
        soft = max(1, int(-(-float(cpu) // 1)))
        out.append((resource.RLIMIT_CPU, soft, soft + 1))  # SIGXCPU at soft, SIGKILL one second later
    for name, key, scale in (
        (resource.RLIMIT_AS, "memory_mb", 1 << 20),
        (resource.RLIMIT_NPROC, "max_processes", 1),
        (resource.RLIMIT_FSIZE, "file_size_mb", 1 << 20),
        (resource.RLIMIT_NOFILE, "open_files", 1),
    ):
        if lim.get(key):
            value = int(lim[key]) * scale
            out.append((name, value, value))
    out.append((resource.RLIMIT_CORE, 0, 0))
    out.append((resource.RLIMIT_MSGQUEUE, MSGQUEUE_BYTES, MSGQUEUE_BYTES))
    return out


def make_streams(stdio, unbuffered):
    import io

    streams = []  # the same classes and settings as the interpreter's own create_stdio()
    for fd, (encoding, errors) in enumerate(stdio):
        raw = io.FileIO(fd, "r" if fd == 0 else "w", closefd=False)
        raw.name = ("<stdin>", "<stdout>", "<stderr>")[fd]
        if fd == 0:
            buf = io.BufferedReader(raw)
        elif unbuffered:
            buf = raw
        else:
            buf = io.BufferedWriter(raw)
        streams.append(io.TextIOWrapper(buf, encoding=encoding, errors=errors,
                                        line_buffering=(fd == 2 and not unbuffered), write_through=unbuffered))
    return tuple(streams)


def serve():
    """Answer requests until the host goes away. Returns a job only in a forked child."""
    handlers = {OP_WRITE: files.do_write, OP_READ: files.do_read, OP_RESET: files.do_reset,
                OP_ENV: layers.do_environment, OP_CHANGES: changes.do_changes, OP_APPLY: changes.do_apply,
                OP_TESTS: changes.do_tests, OP_VERDICT: changes.do_verdict}
    reply(K_OK, part1="python {}.{}.{}".format(*sys.version_info[:3]).encode())
    while True:
        request = protocol.read_request()
        if request is None:
            return None
        op = request[0]
        if op == OP_EXEC:
            try:
                job = do_exec(request)
            except Exception as exc:  # fork failed, or a bug: answer, and let the host retire us
                if os.getpid() != 1:
                    os._exit(EXIT_CANNOT_RUN)  # a child never answers the host
                resident.sweep()
                reply(K_ERROR, part1=f"exec failed in the supervisor: {exc!r}".encode("utf-8", "replace"))
                continue
            if job is not None:
                return job
        elif op == OP_PING:
            reply(K_OK)
        else:
            try:
                handlers[op](request)
            except Exception as exc:
                code = exc.errno if isinstance(exc, OSError) and exc.errno else 0
                reply(K_ERROR, code=code, part1=str(exc).encode("utf-8", "replace"))
                if op == OP_RESET:
                    # The host sends its next request right behind a reset, unanswered: nothing
                    # may run in a sandbox that could not be made clean. The pool replaces it.
                    sys.exit(EXIT_CANNOT_RUN)


def probe():
    """What the host runs once at construction: every kernel feature a sandbox needs, tried for
    real. Prints the interpreter version, or the failure (and exits 1)."""
    try:
        kernel.own_mount_namespace()
        kernel.fresh_tmpfs("/tmp", 1, 0o1777)
        kernel.fresh_tmpfs("/tmp", 1, 0o1777)
        kernel.prepare("deny")
        pid = os.fork()
        if pid == 0:
            try:
                kernel.enter_program()
                column = kernel.ARCHES[os.uname().machine][0]
                keyctl = kernel.DENIED["keyctl"][column]
                denied = kernel.libc().syscall(keyctl, 0, -1, 0, 0, 0) != 0  # KEYCTL_GET_KEYRING_ID
                os._exit(0 if denied else 3)
            except BaseException as exc:
                os.write(2, f"{exc}\n".encode())
                os._exit(2)
        status = os.waitpid(pid, 0)[1]
        if status != 0:
            raise OSError(f"a program could not be given a clean kernel (status {status})")
    except OSError as exc:
        sys.stderr.write(f"trl-sandbox kernel check failed: {exc}\n")
        sys.exit(1)
    print("{}.{}.{}".format(*sys.version_info[:3]))


def run_child(job):
    """In the forked child, with the supervisor's stack already unwound."""
    # Programs must not reach what earlier programs sent. Clearing the compile cache here would
    # free every cached code object (a copy-on-write fault per page), so only the name is
    # dropped: the hidden reference taken in main.configure() keeps the cache alive and
    # unreachable (frozen objects are not in gc.get_objects() either).
    S.CACHE = None
    try:
        if job[0] == "resident":
            resident.run_resident(job)
        elif job[0] == "forker":
            forker.run_forker(job)
        elif job[0] is None:
            run_exec_child(job)
        else:
            run_python_child(job)
    except BaseException as exc:  # a failure of the setup itself: never fall back into the supervisor
        child_fail(f"cannot start the program: {exc!r}", EXIT_CANNOT_RUN)
    os._exit(EXIT_CANNOT_RUN)


def main():
    if sys.argv[1:] == ["--probe"]:
        probe()
        return
    startup()
    job = serve()
    if job is None:
        sys.exit(0)
    # Only a forked child gets here: the frames that handled earlier requests are gone.
    run_child(job)

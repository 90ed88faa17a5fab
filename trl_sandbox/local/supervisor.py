"""The supervisor of a local sandbox: PID 1 inside the bubblewrap container.

This file runs *inside* the sandbox with the sandbox's interpreter (standard library only,
Python 3.8+). The container's command line carries nothing but its path; the configuration and
every request arrive over stdin, and every answer leaves over stdout.

Protocol (integers little-endian):

* host -> supervisor: ``u32 length`` + ``marshal`` dump (version 4) of a tuple whose first item
  is an opcode: ``(CONFIG, dict)`` once, first; ``(EXEC, argv, stdin_len, timeout_s, cwd|None,
  env|None)`` followed by ``stdin_len`` raw bytes of stdin (spliced straight into a memfd, never
  held in the supervisor's memory); ``(WRITE, path, data, mode)``; ``(READ, path)``;
  ``(RESET,)``; ``(PING,)``.
* supervisor -> host: a fixed 24-byte header ``kind:u8 flags:u8 pad:2 code:i32 duration:f64
  len1:u32 len2:u32`` followed by ``len1 + len2`` bytes. ``kind`` is ``K`` (ok; the first one,
  sent once the configuration is applied, carries the interpreter version), ``R`` (an exec
  result: code = exit code, flags = timed out / out of memory / truncated, payload = stdout then
  stderr), ``D`` (file contents) or ``E`` (an error: code = errno, payload = message). The host
  needs nothing but ``struct`` to read an answer, and interprets nothing the sandbox could forge.

Why PID 1: the kernel delivers to a namespace's init only the signals it installed a handler
for, and this supervisor installs none (except SIGCHLD on Python 3.8), so sandboxed code cannot
kill it (``kill -9 -1``, ``os.kill(1, 9)``, killing the parent are no-ops for it); and
``kill(-1, SIGKILL)`` sent by init reaches every other process of the namespace at once,
including ones that double-forked or called ``setsid``. The supervisor is non-dumpable, so its
memory and descriptors (``/proc/1/mem``, ``/proc/1/fd``, ...) are closed to sandboxed code.

Python execs are served by forking this pre-imported interpreter (the fork server); anything
else is ``fork`` + ``execve``. The child gets its own process group, fresh pipes for stdout and
stderr, stdin from a memfd (or ``/dev/null``) and the configured rlimits. When it exits or
times out, everything else left in the namespace is killed and reaped.

The cost of a fork is dominated by the pages the child and the supervisor touch afterwards
(each is a copy-on-write fault), so the child's preparation is done once, here, before any
fork (standard streams, rlimits, compiled code), and modules whose fork hooks would run in every
child are kept out of the pre-imported set (``threading``) or have their hook run in the
supervisor instead (``random`` is reseeded before each fork, so every child still starts from
fresh entropy).
"""

import _signal
import atexit
import builtins
import errno
import gc
import marshal
import mmap
import os
import resource
import select
import signal
import stat
import struct
import sys
import time

# -- protocol --------------------------------------------------------------------------------

OP_CONFIG, OP_EXEC, OP_WRITE, OP_READ, OP_RESET, OP_PING = 1, 2, 3, 4, 5, 6
K_OK, K_RESULT, K_DATA, K_ERROR = b"K"[0], b"R"[0], b"D"[0], b"E"[0]
F_TIMED_OUT, F_OOM, F_TRUNCATED = 1, 2, 4
HEADER = struct.Struct("<BBxxidII")
LENGTH = struct.Struct("<I")

# Exit status of a child that could not be started (command not found, bad cwd), as in a shell.
EXIT_NOT_FOUND, EXIT_CANNOT_RUN = 127, 126
# Single-letter interpreter flags that a forked interpreter can honour (or that make no difference
# to one that is already running). Any other flag (-m, -O, -W, -X, ...) runs the real interpreter.
PY_FLAGS = frozenset("IsSuBEq")
# Sources longer than this are compiled in the child (under its limits), not in the supervisor.
MAX_PARENT_COMPILE = 512 * 1024
PR_SET_DUMPABLE = 4
IPC_RMID = 0

# -- state, set up by startup() and configure() ----------------------------------------------

CTL_IN = CTL_OUT = DEVNULL = -1
USE_PIDFD = hasattr(os, "pidfd_open")
WAKE_R = WAKE_W = -1  # SIGCHLD wake-up pipe, only where pidfds are missing (Python 3.8)
FD_LIMIT = 1024
WORK = "/work"
WIPE = ("/work", "/tmp", "/dev/shm")
OUTPUT_CAP = 1 << 24
PY_NAMES = frozenset()
BASE_PATH = []
STREAMS = {}
ORIGINAL_STDIO = ()  # kept alive so that replacing them in a child frees nothing
RLIMITS = []
PRE_FORK = []  # fork hooks that must give each child fresh state, run in the supervisor instead
IPC_FILES = []  # (open fd of /proc/sysvipc/<kind>, length when empty, kind)
CACHE = {}
SEEN = set()  # hashes of sources compiled once and not kept
CACHE_BYTES = [0]
CACHE_MAX_BYTES = 1 << 20
CACHE_MAX_ENTRIES = 512
STATUS = None  # one shared byte: 1 when a forked Python child died of an uncaught MemoryError
LIBC = None
PRCTL = None


def _noop(signum, frame):
    pass


def libc():
    global LIBC
    if LIBC is None:
        import ctypes

        LIBC = ctypes.CDLL(None, use_errno=True)
    return LIBC


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def reply(kind, flags=0, code=0, duration=0.0, part1=b"", part2=b""):
    write_all(CTL_OUT, b"".join((HEADER.pack(kind, flags, code, duration, len(part1), len(part2)), part1, part2)))


def read_exact(n):
    """Exactly ``n`` bytes from the host, or None at end of file. Unbuffered on purpose: a
    read-ahead buffer would swallow the start of the raw stdin frame that follows an exec."""
    chunks = []
    while n > 0:
        chunk = os.read(CTL_IN, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_request():
    head = read_exact(4)
    if head is None:
        return None
    (size,) = LENGTH.unpack(head)
    body = read_exact(size)
    if body is None:
        return None
    return marshal.loads(body)


SCRUB = None  # a reusable buffer, zeroed after every use, for kernels or Pythons without splice


def receive_stdin(n):
    """Move the ``n`` raw stdin bytes that follow an exec request into a fresh memfd.

    They never become a Python object here: os.splice moves them from the host pipe to the
    memfd inside the kernel. Every program is forked from this process, so anything kept in
    its memory (a judge's nonce, a dataset's hidden tests) would be readable by the next one.
    """
    global SCRUB
    fd = os.memfd_create("stdin", os.MFD_CLOEXEC)
    left = n
    splice = getattr(os, "splice", None)
    while left > 0:
        moved = 0
        if splice is not None:
            try:
                moved = splice(CTL_IN, fd, left)
            except OSError:
                splice = None
                continue
        else:
            if SCRUB is None:
                SCRUB = bytearray(1 << 16)
            view = memoryview(SCRUB)[: min(left, len(SCRUB))]
            try:
                moved = os.readv(CTL_IN, [view])
                write_all(fd, view[:moved])
            finally:
                view[:] = bytes(len(view))
                view.release()
        if moved <= 0:
            os.close(fd)
            raise EOFError("the host channel ended inside a stdin frame")
        left -= moved
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def read_fd(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


READ_STDIN = "\0read-stdin\0"  # python_plan's marker for "the program itself comes on stdin"


# -- start-up --------------------------------------------------------------------------------


def startup():
    """Move the host channel off fds 0/1, become non-dumpable, and apply the configuration."""
    global CTL_IN, CTL_OUT, DEVNULL, WAKE_R, WAKE_W, FD_LIMIT, USE_PIDFD, PRCTL
    CTL_IN, CTL_OUT = os.dup(0), os.dup(1)  # dup() makes them non-inheritable across execve
    DEVNULL = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
    os.dup2(DEVNULL, 0)
    os.dup2(DEVNULL, 1)
    # Bound our own descriptor numbers so that a child closes all of them with one closerange().
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    FD_LIMIT = 1024 if hard == resource.RLIM_INFINITY else min(hard, 1024)
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, hard))
    # Without a memory cgroup nothing bounds the sum of the children's address spaces, so make
    # every process of the sandbox the host OOM killer's first choice (the largest one goes).
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    PRCTL = libc().prctl
    if PRCTL(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise SystemExit("trl-sandbox supervisor: prctl(PR_SET_DUMPABLE, 0) failed")
    # As PID 1, signals without a handler are dropped: SIGINT must not keep Python's handler.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    for kind in ("shm", "sem", "msg"):
        try:
            fd = os.open("/proc/sysvipc/" + kind, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        IPC_FILES.append((fd, len(os.pread(fd, 4096, 0)), kind))
    request = read_request()
    if not request or request[0] != OP_CONFIG:
        raise SystemExit("trl-sandbox supervisor: expected a configuration message")
    # How the end of a child is noticed: a pidfd (Python 3.9+, Linux 5.3+) in the poll set, or
    # else SIGCHLD through a wake-up pipe (the only signal handler the supervisor installs).
    if USE_PIDFD and request[1].get("exit_watch", "auto") != "sigchld":
        try:
            os.close(os.pidfd_open(os.getpid()))
        except OSError:
            USE_PIDFD = False
    else:
        USE_PIDFD = False
    if not USE_PIDFD:
        WAKE_R, WAKE_W = os.pipe()
        os.set_blocking(WAKE_R, False)
        os.set_blocking(WAKE_W, False)
        signal.signal(signal.SIGCHLD, _noop)
        signal.set_wakeup_fd(WAKE_W, warn_on_full_buffer=False)
    configure(request[1])


def configure(config):
    global WORK, WIPE, OUTPUT_CAP, PY_NAMES, BASE_PATH, STATUS, CACHE_MAX_BYTES, CACHE_MAX_ENTRIES, ORIGINAL_STDIO
    WORK = config["work_dir"]
    WIPE = tuple(config.get("wipe", (WORK, "/tmp", "/dev/shm")))
    OUTPUT_CAP = int(config["output_bytes"])
    CACHE_MAX_BYTES = int(config.get("cache_bytes", CACHE_MAX_BYTES))
    CACHE_MAX_ENTRIES = int(config.get("cache_entries", CACHE_MAX_ENTRIES))
    version = "{}.{}".format(*sys.version_info[:2])
    names = {"python", "python3", "python" + version, sys.executable}
    names.update(config.get("python_names", ()))
    PY_NAMES = frozenset(n for n in names if n)
    if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    BASE_PATH = list(sys.path)
    # A child's standard streams, made once here: its fds 0-2 have these numbers, and its copies
    # of these objects start out empty. Encodings and error handlers are the ones this
    # interpreter chose from the sandbox's environment, as a fresh interpreter would.
    ORIGINAL_STDIO = (sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__, sys.__stderr__)
    stdio = [(f.encoding, f.errors) for f in ORIGINAL_STDIO[3:]]
    # They are made while fds 1 and 2 are pipes, as in a child, so that what they find out about
    # their descriptors once (seekable or not) is true there.
    pipe_r, pipe_w = os.pipe()
    saved_stderr = os.dup(2)
    os.dup2(pipe_w, 1)
    os.dup2(pipe_w, 2)
    try:
        STREAMS[False] = make_streams(stdio, False)
        STREAMS[True] = make_streams(stdio, True)
    finally:
        os.dup2(DEVNULL, 1)
        os.dup2(saved_stderr, 2)
        for fd in (pipe_r, pipe_w, saved_stderr):
            os.close(fd)
    RLIMITS[:] = rlimits(config["limits"])
    # A second reference to the compile cache that nothing in Python can reach (see run_child).
    import ctypes

    ctypes.pythonapi.Py_IncRef(ctypes.py_object(CACHE))
    STATUS = mmap.mmap(-1, 1)  # MAP_SHARED | MAP_ANONYMOUS: written by the child, read here
    preload(config.get("preload", ()))
    os.chdir(WORK)
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
            PRE_FORK.append(child)
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


# -- the exec path ---------------------------------------------------------------------------


def python_plan(argv, stdin, cwd, env):
    """Describe how to run ``argv`` in a forked interpreter, or return None to execve it.

    Returns ``(source, filename, sys_argv, path0, unbuffered, stdin)``: ``path0`` is what a fresh
    interpreter puts first on ``sys.path`` (None under -I) and ``stdin`` what the child reads.
    """
    if argv[0] not in PY_NAMES:
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
    path = os.path.normpath(os.path.join(WORK, cwd or "", script))
    try:
        source = read_regular(path)
    except OSError:
        return None  # let the real interpreter report it (or read the FIFO) in its own words
    return (source, path, argv[i:], None if isolated else os.path.dirname(path), unbuffered, stdin)


def compiled(source, filename):
    """A code object, compiled here before the fork; or the exception compile raised.

    Code is kept for sources seen before (a judge program sent with every exec, a benchmark's
    programs): one seen for the first time is compiled and dropped after the fork, so the
    unique programs of training never fill the cache (nor grow the memory every fork copies).
    """
    if len(source) > MAX_PARENT_COMPILE:
        return None  # compiled by the child, under its limits
    key = (source, filename)
    code = CACHE.pop(key, None)
    if code is None:
        try:
            code = compile(source, filename, "exec", dont_inherit=True)
        except Exception as exc:  # SyntaxError, ValueError (NUL bytes), RecursionError, ...
            exc.__traceback__ = None
            return exc
        digest = hash(key)
        if digest not in SEEN:
            if len(SEEN) >= 4096:
                SEEN.clear()
            SEEN.add(digest)
            return code
        SEEN.discard(digest)
        CACHE_BYTES[0] += len(source)
        while CACHE and (len(CACHE) >= CACHE_MAX_ENTRIES or CACHE_BYTES[0] > CACHE_MAX_BYTES):
            old = next(iter(CACHE))
            del CACHE[old]
            CACHE_BYTES[0] -= len(old[0])
        # Frozen objects are never scanned by a child's collector (fewer copy-on-write faults)
        # and are invisible to its gc.get_objects().
        gc.freeze()
    CACHE[key] = code  # most recently used last
    return code


def do_exec(request):
    """Run one exec. Returns None in the supervisor, and the job to run in the forked child."""
    _, argv, stdin_len, timeout, cwd, env = request
    # The raw stdin frame follows the request: take it off the channel before anything else.
    stdin_fd = receive_stdin(stdin_len) if stdin_len else DEVNULL
    if not argv:
        if stdin_fd != DEVNULL:
            os.close(stdin_fd)
        reply(K_RESULT, code=EXIT_NOT_FOUND, part2=b"trl-sandbox: empty argv\n")
        return None
    plan = python_plan(argv, READ_STDIN if stdin_fd != DEVNULL else None, cwd, env)
    code = None
    if plan is not None:
        if plan[0] is READ_STDIN:  # the program itself comes on stdin (not a secret of the judge)
            plan = (read_fd(stdin_fd),) + plan[1:]
            os.close(stdin_fd)
            stdin_fd = DEVNULL
        code = compiled(plan[0], plan[1])
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    STATUS[0] = 0
    for hook in PRE_FORK:
        hook()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        return (plan, code, argv, cwd, env, stdin_fd, out_w, err_w)
    os.close(out_w)
    os.close(err_w)
    if stdin_fd != DEVNULL:
        os.close(stdin_fd)
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass  # it already did so itself (and maybe exec'ed)
    status, timed_out, out, err, truncated = wait_child(pid, start + timeout, out_r, err_r)
    duration = time.monotonic() - start
    flags = F_TRUNCATED if truncated else 0
    if timed_out:
        flags |= F_TIMED_OUT
        exit_code = -signal.SIGKILL
    else:
        exit_code = exit_code_of(status)
        if exit_code == -signal.SIGXCPU:
            flags |= F_TIMED_OUT  # the CPU-seconds limit is a time limit too
    if STATUS[0] == 1 or (plan is None and exit_code > 0 and last_line(err).startswith(b"MemoryError")):
        flags |= F_OOM
    sweep()
    reply(K_RESULT, flags, exit_code, duration, out, err)
    return None


def last_line(data):
    return data.rstrip().rsplit(b"\n", 1)[-1]


def exit_code_of(status):
    """0-255 for an exit, minus the signal number for a death by signal (as subprocess does)."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return -1


def wait_child(pid, deadline, out_r, err_r):
    """Collect output until the child has exited and the pipes are closed, or the deadline.

    Returns ``(status, timed_out, stdout, stderr, truncated)``. Output beyond the cap is read
    and dropped, so that a writer never blocks on a full pipe.
    """
    watch = os.pidfd_open(pid) if USE_PIDFD else WAKE_R
    poller = select.poll()
    poller.register(out_r, select.POLLIN)
    poller.register(err_r, select.POLLIN)
    poller.register(watch, select.POLLIN)
    chunks = {out_r: [], err_r: []}
    kept = {out_r: 0, err_r: 0}
    open_pipes = 2
    truncated = timed_out = False
    status = None
    read = os.read
    try:
        while status is None or open_pipes:
            if status is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if not done:
                        timed_out = True
                        kill_all()
                        status = os.waitpid(pid, 0)[1]
                    poller.unregister(watch)
                    continue
                events = poller.poll(remaining * 1000.0)
            else:
                events = poller.poll(1000.0)
                if not events:
                    break  # an unkillable process holds a pipe: give up on the rest
            for fd, _ in events:
                if fd == watch:
                    if not USE_PIDFD:
                        drain_wakeups()
                    done, st = os.waitpid(pid, os.WNOHANG)
                    if done:
                        status = st
                        poller.unregister(watch)
                        if open_pipes:
                            # Whatever outlives the child may hold its pipes: end it now.
                            kill_all()
                    continue
                data = read(fd, 65536)
                if not data:
                    poller.unregister(fd)
                    open_pipes -= 1
                    continue
                room = OUTPUT_CAP - kept[fd]
                if len(data) > room:
                    truncated = True
                    data = data[:room] if room > 0 else b""
                if data:
                    chunks[fd].append(data)
                    kept[fd] += len(data)
    finally:
        if USE_PIDFD:
            os.close(watch)
        os.close(out_r)
        os.close(err_r)
    return status, timed_out, b"".join(chunks[out_r]), b"".join(chunks[err_r]), truncated


def kill_all():
    """SIGKILL every process of the namespace but ourselves; False when there was none."""
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def drain_wakeups():
    try:
        while os.read(WAKE_R, 512):
            pass
    except OSError:
        pass


def sweep():
    """Kill and reap every process of the namespace but ourselves; drop SysV IPC objects."""
    if kill_all():
        while True:
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break
    if not USE_PIDFD:
        drain_wakeups()
    for fd, empty, kind in IPC_FILES:
        data = os.pread(fd, 1 << 20, 0)
        if len(data) > empty:
            remove_ipc(kind, data)


def remove_ipc(kind, table):
    """SysV shared memory, semaphores and message queues outlive their processes: remove them."""
    lib = libc()
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 2:
            continue
        ident = int(fields[1])
        if kind == "shm":
            lib.shmctl(ident, IPC_RMID, None)
        elif kind == "sem":
            lib.semctl(ident, 0, IPC_RMID, 0)
        else:
            lib.msgctl(ident, IPC_RMID, None)


# -- the child -------------------------------------------------------------------------------


def child_fail(message, code):
    try:
        os.write(2, f"trl-sandbox: {message}\n".encode("utf-8", "replace"))
    finally:
        os._exit(code)


def child_setup(job):
    """Common to both kinds of child: descriptors, signals, cwd, environment."""
    plan, code, argv, cwd, env, stdin_fd, out_w, err_w = job
    if not USE_PIDFD:
        _signal.set_wakeup_fd(-1)
        _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
    os.dup2(stdin_fd, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.closerange(3, FD_LIMIT)
    if cwd:
        try:
            os.chdir(os.path.join(WORK, cwd))
        except OSError as exc:
            child_fail(f"cannot change directory to {cwd!r}: {exc.strerror}", EXIT_NOT_FOUND)
    if env:
        os.environ.update(env)


def apply_limits():
    setrlimit = resource.setrlimit
    for name, soft, hard in RLIMITS:
        try:
            setrlimit(name, (soft, hard))
        except (ValueError, OSError):
            pass


def run_exec_child(job):
    argv = job[2]
    os.setpgid(0, 0)
    child_setup(job)
    # Python ignores these two; a program started by execve gets the default dispositions.
    _signal.signal(_signal.SIGPIPE, _signal.SIG_DFL)
    _signal.signal(_signal.SIGXFSZ, _signal.SIG_DFL)
    apply_limits()
    try:
        os.execvpe(argv[0], argv, os.environ)
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in argv or env
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        child_fail(f"cannot execute {argv[0]!r}: {reason}",
                   EXIT_NOT_FOUND if getattr(exc, "errno", None) == errno.ENOENT else EXIT_CANNOT_RUN)


def run_python_child(job):
    """Become a fresh ``__main__``, run the program, and exit as the interpreter would."""
    source, filename, sys_argv, path0, unbuffered, _ = job[0]
    code = job[1]
    child_setup(job)
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__ = STREAMS[unbuffered]
    sys.argv = sys_argv
    sys.path = BASE_PATH if path0 is None else [path0] + BASE_PATH
    main = type(sys)("__main__")  # with the attributes the interpreter gives its __main__
    namespace = main.__dict__
    namespace["__annotations__"] = {}
    namespace["__builtins__"] = builtins
    if filename == "<string>":
        namespace["__loader__"] = sys.modules["_frozen_importlib"].BuiltinImporter
    else:
        namespace["__file__"] = filename
        namespace["__cached__"] = None
        if filename == "<stdin>":
            namespace["__loader__"] = sys.modules["_frozen_importlib"].BuiltinImporter
        else:
            namespace["__loader__"] = sys.modules["_frozen_importlib_external"].SourceFileLoader("__main__", filename)
    sys.modules["__main__"] = main
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)
    PRCTL(PR_SET_DUMPABLE, 1, 0, 0, 0)  # as after execve: its own /proc/self is its own again
    gc.enable()
    apply_limits()
    status = 0
    interrupted = False
    try:
        if code is None:
            code = compile(source, filename, "exec", dont_inherit=True)
        elif isinstance(code, BaseException):
            raise code
        del job, source
        exec(code, namespace)
    except SystemExit as exc:
        status = exit_status(exc)
    except BaseException as exc:
        if isinstance(exc, MemoryError):
            STATUS[0] = 1
        interrupted = isinstance(exc, KeyboardInterrupt)
        status = 1
        tb = exc.__traceback__
        tb = tb.tb_next if tb is not None else None  # hide this frame, as the interpreter does
        try:
            sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        except BaseException:
            pass
    status = finish(status)
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)


def exit_status(exc):
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(str(code) + "\n")
    except BaseException:
        pass
    return 1


def finish(status):
    """What Py_FinalizeEx does that a program can observe: join threads, atexit, flush."""
    threading = sys.modules.get("threading")  # only there if the program imported it
    if threading is not None:
        try:
            threading._shutdown()
        except SystemExit as exc:
            status = exit_status(exc)
        except BaseException:
            pass
    if atexit._ncallbacks():
        try:
            atexit._run_exitfuncs()
        except BaseException:
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            if stream is sys.stdout:
                status = 120
    return status


def run_child(job):
    """In the forked child, with the supervisor's stack already unwound."""
    # Programs must not reach what earlier programs sent. Clearing the compile cache here would
    # free every cached code object (a copy-on-write fault per page), so only the name is
    # dropped: the hidden reference taken in configure() keeps the cache alive and unreachable
    # (frozen objects are not in gc.get_objects() either).
    global CACHE
    CACHE = None
    try:
        if job[0] is None:
            run_exec_child(job)
        else:
            run_python_child(job)
    except BaseException as exc:  # a failure of the setup itself: never fall back into the supervisor
        child_fail(f"cannot start the program: {exc!r}", EXIT_CANNOT_RUN)
    os._exit(EXIT_CANNOT_RUN)


# -- files and reset -------------------------------------------------------------------------


def open_regular(path, flags, mode=0o644):
    """Open a regular file without blocking: a FIFO or device a program left must not hang us."""
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path):
    with open(open_regular(path, os.O_RDONLY), "rb") as f:
        return f.read()


def confined(path):
    """``path`` under the work directory, also once symlinks are resolved.

    Programs may leave symlinks in the work directory (to ``/proc/1/mem``, say); the host's
    file operations must not follow them out. No program runs while the host reads or writes
    files (leftovers are killed after every exec), so the check cannot be raced.
    """
    full = os.path.normpath(os.path.join(WORK, path))
    for candidate in (full, os.path.realpath(full)):
        if "\0" in path or not (candidate == WORK or candidate.startswith(WORK + "/")):
            raise PermissionError(errno.EACCES, "path escapes the work directory", path)
    return full


def do_write(request):
    _, path, data, mode = request
    full = confined(path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    fd = open_regular(full, os.O_WRONLY | os.O_CREAT, mode)
    try:
        os.ftruncate(fd, 0)
        write_all(fd, data)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    reply(K_OK)


def do_read(request):
    reply(K_DATA, part1=read_regular(confined(request[1])))


def wipe(top, mode):
    """Empty ``top``, including what was made read-only or unsearchable."""
    try:
        os.chmod(top, mode)
        names = os.listdir(top)
    except FileNotFoundError:
        return
    for name in names:
        path = os.path.join(top, name)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError:  # a directory (EISDIR) or some odd entry
            wipe(path, 0o700)
            os.rmdir(path)


def do_reset(request):
    sweep()
    for top in WIPE:
        wipe(top, 0o1777 if top in ("/tmp", "/dev/shm") else 0o755)
    os.chdir(WORK)
    gc.collect()
    gc.freeze()
    reply(K_OK)


# -- main loop -------------------------------------------------------------------------------


def serve():
    """Answer requests until the host goes away. Returns a job only in a forked child."""
    handlers = {OP_WRITE: do_write, OP_READ: do_read, OP_RESET: do_reset}
    reply(K_OK, part1="python {}.{}.{}".format(*sys.version_info[:3]).encode())
    while True:
        request = read_request()
        if request is None:
            return None
        op = request[0]
        if op == OP_EXEC:
            try:
                job = do_exec(request)
            except Exception as exc:  # fork failed, or a bug: answer, and let the host retire us
                if os.getpid() != 1:
                    os._exit(EXIT_CANNOT_RUN)  # a child never answers the host
                sweep()
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


if __name__ == "__main__":
    startup()
    _job = serve()
    if _job is None:
        sys.exit(0)
    # Only a forked child gets here: the frames that handled earlier requests are gone.
    run_child(_job)

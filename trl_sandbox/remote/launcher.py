"""The launcher that runs every program inside a remote sandbox (Daytona, CoreWeave): a clean lease
without an extra round trip. Sent with each exec (``python3 -I -S -c SOURCE SPEC ARGV...``, or forked
by the resident launcher, ``launcher_resident``); standard library only, Python 3.8+, Linux. Before
the program gets control, in this order:

1. In ``sweep`` mode (namespaces refused by the image), kill every process the sandbox did not
   have when it was made but this launcher and its ancestors (``launcher_cleaning.sweep``).
2. If a reset is due, empty ``/tmp``, ``/var/tmp``, ``/dev/shm`` and the work directory (keeping
   only ``keep``: this exec's stderr file, the resident's directory), then recreate the work dir.
3. Run the program. In ``ns`` mode in a PID namespace of its own, whose init (below) dies with the
   launcher (``PR_SET_PDEATHSIG``) and ends the namespace when the program ends: the kernel kills
   every process the program left, however it detached. The program sees a fresh ``/proc``, a
   read-only root where the image allows it (the scratch places and the work dir writable, the
   resident's directory hidden) and has no capabilities left (every set empty, no_new_privs), so it
   cannot unmount that ``/proc``, enter another namespace, or regain them by exec. The namespace
   comes from ``unshare(CLONE_NEWPID|CLONE_NEWNS)`` when the daemon runs as root with CAP_SYS_ADMIN,
   else inside a new user namespace. In ``sweep`` mode the program runs as ``uid`` (when the
   launcher may switch to it) and the sweep runs again after it exits.

The probe (``launcher_main``) reports what the image allows and leaves the resident running. A failure of the launcher's own
work is a line ``[trl-sandbox-lease:TAG:failed] why`` on stdout before the program ran, and exit
status 125: the provider raises ``SandboxGoneError`` (the pool runs the program on another sandbox).
The wall-clock limit (``timeout``) counts from the program's own start (the cleaning is never its
time); a program past it is killed with all it started, and the last line is
``[trl-sandbox-lease:TAG:timeout]``. The ``TAG`` is fresh per exec and never visible to the program,
so neither line can be forged. A program's status is relayed as it left (a signal by the same signal).
"""

# Only modules that load in a few milliseconds (``signal``, ``json``, ``base64`` and ``shutil`` pull
# in ``enum`` and ``re``, about 25 ms per exec): the launcher runs before every program.
import _signal as signal
import binascii
import ctypes
import os
import resource
import sys

CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUSER = 0x20000, 0x20000000, 0x10000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 1, 24, 38, 47
LIBC = ctypes.CDLL(None, use_errno=True)

if "wipe" not in globals():
    # On the host (tests, linters) the cleaning and the resident are modules of their own. Sent to
    # a sandbox, their text runs first (``trl_sandbox.remote.lease``) and has defined these names.
    from trl_sandbox.remote.launcher_cleaning import WRITABLE, sweep, wipe


def _check(result, what):
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _b(text):
    return None if text is None else text.encode()


def _mount(source, target, fstype, flags, data=None):
    LIBC.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    _check(LIBC.mount(_b(source), _b(target), _b(fstype), flags, _b(data)), "mount " + target)


def _prctl(option, arg):
    LIBC.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return LIBC.prctl(option, arg, 0, 0, 0)


def _write(path, text):
    with open(path, "w") as fh:
        fh.write(text)


def enter_namespaces():
    """Make this process's next child PID 1 of a fresh PID namespace (the child then makes its own
    mount namespace: this process stays out of it, so it never waits for that namespace's teardown).

    Returns how: "ns" (we hold CAP_SYS_ADMIN) or "userns" (inside a user namespace of our own).
    Raises OSError when the image refuses both."""
    try:
        _check(LIBC.unshare(CLONE_NEWPID), "unshare")
        return "ns"
    except OSError:
        pass
    uid, gid = os.getuid(), os.getgid()
    _check(LIBC.unshare(CLONE_NEWUSER | CLONE_NEWPID), "unshare(user)")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"0 {uid} 1")
    _write("/proc/self/gid_map", f"0 {gid} 1")
    return "userns"


def seal_filesystem(work, hide=()):
    """In the program's own mount namespace: a fresh /proc, a read-only root (where the image lets
    us), the scratch places and the work dir still writable, each of ``hide`` under an empty
    read-only tmpfs (the resident's FIFOs). Returns whether the root is read-only."""
    _check(LIBC.unshare(CLONE_NEWNS), "unshare(mount)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for path in WRITABLE + (work,):
        if os.path.isdir(path):
            try:
                _mount(path, path, None, MS_BIND | MS_REC)
            except OSError:
                return False
    hide_dirs(hide)
    # Every other mount read-only too, /dev above all: a program that could replace /dev/null
    # (root owns /dev) would feed the next program's stdin. Each keeps its other flags (a user
    # namespace may not clear nosuid, nodev or noexec).
    writable = WRITABLE + (work, "/proc")
    sealed = True
    with open("/proc/self/mountinfo") as fh:
        mounts = [line.split() for line in fh]
    for fields in mounts:
        point = fields[4].replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")
        if any(point == w or point.startswith(w + "/") for w in writable):
            continue
        options = fields[5].split(",")
        if "ro" in options:
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for name, bit in (("nosuid", MS_NOSUID), ("nodev", MS_NODEV), ("noexec", MS_NOEXEC),
                          ("noatime", 1024), ("nodiratime", 2048), ("relatime", 1 << 21)):
            if name in options:
                flags |= bit
        try:
            _mount(None, point, None, flags)
        except OSError:
            sealed = False
    return sealed


def hide_dirs(paths):
    """Each of ``paths`` under an empty read-only tmpfs, in this mount namespace: a FIFO is writable
    on a read-only mount, so the resident's must be out of sight, not only read-only."""
    for path in paths:
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)


def shed_capabilities():
    """No capability left, now or after exec (a root program execs with bounding set empty)."""
    _prctl(PR_CAP_AMBIENT, 4)  # PR_CAP_AMBIENT_CLEAR_ALL
    for cap in range(64):
        if _prctl(PR_CAPBSET_DROP, cap) != 0 and ctypes.get_errno() == 22:  # EINVAL: past the last cap
            break

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    header, data = Header(0x20080522, 0), (Data * 2)()
    _check(LIBC.capset(ctypes.byref(header), ctypes.byref(data)), "capset")
    _check(_prctl(PR_SET_NO_NEW_PRIVS, 1), "no_new_privs")


def limit(spec):
    limits = spec.get("limits")
    if not limits:
        return
    for name, key in (("RLIMIT_CPU", "cpu"), ("RLIMIT_AS", "as"), ("RLIMIT_FSIZE", "fsize"),
                      ("RLIMIT_NOFILE", "nofile")):
        if limits.get(key) is not None:
            resource.setrlimit(getattr(resource, name), (int(limits[key]), int(limits[key])))


def program(spec, argv, stdin_data):
    """In the child that becomes the program: limits, stdin, cwd, privileges, then exec."""
    try:
        if stdin_data is not None:
            fd = os.memfd_create("stdin") if hasattr(os, "memfd_create") else None
            if fd is None:
                read, write = os.pipe()
                os.write(write, stdin_data)
                os.close(write)
                fd = read
            else:
                os.write(fd, stdin_data)
                os.lseek(fd, 0, os.SEEK_SET)
            os.dup2(fd, 0)
            os.close(fd)
        os.chdir(spec.get("cwd") or spec["work"])
        limit(spec)
        uid = spec.get("uid")
        if spec.get("mode") == "sweep" and uid is not None and os.geteuid() == 0:
            try:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            except OSError:
                pass  # the probe said so: the program keeps the launcher's user
        # In both modes: a program with CAP_SYS_ADMIN could unmount the /proc the sweep and the
        # namespace rely on, or enter another namespace; with CAP_KILL signal what is not its own.
        shed_capabilities()
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; an exec keeps that
            signal.signal(sig, signal.SIG_DFL)
    except OSError as exc:
        os.write(2, (f"trl-sandbox: cannot start the program: {exc}\n").encode())
        os._exit(126)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        os.write(2, (f"{argv[0]}: {exc.strerror}\n").encode())
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)


def init(spec, argv, stdin_data, alive, report):
    """PID 1 of the program's namespace: dies with the launcher; seals the filesystem; starts the
    program and reaps every orphan until the program ends; then reports its wait status and exits,
    which makes the kernel kill whatever the program left."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    try:
        os.read(alive, 1)  # not blocking: the launcher still holds the write end, or is gone already
    except BlockingIOError:
        pass
    else:
        os._exit(1)
    seal_filesystem(spec["work"], spec.get("hide") or ())
    child = os.fork()
    if child == 0:
        os.close(report)
        program(spec, argv, stdin_data)
    late = deadline(spec, -1)
    status = None
    while status is None:
        try:
            pid, got = os.wait()
        except ChildProcessError:
            break
        if pid == child:
            status = got
    signal.setitimer(signal.ITIMER_REAL, 0)
    # Kill and reap everything the program left before reporting, so the launcher may relay at
    # once: the kernel's own teardown of the namespaces, after this process exits, costs about
    # 10 ms that nobody waits for. kill(-1) from PID 1 reaches every other process in the
    # namespace in one pass (a fork racing it fails), and every one of them ends as our child.
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass
    while True:
        try:
            os.wait()
        except ChildProcessError:
            break
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # whoever waits for the end of the output must not wait for our teardown
        os.dup2(null, fd)
    os.write(report, (str(status if status is not None else 255 << 8) + ("T" if late else "") + "\n").encode())
    os._exit(0)


def deadline(spec, target):
    """The program's wall-clock limit, counted from its own start (the cleaning before it is not
    its time): at ``spec["timeout"]`` seconds, SIGKILL ``target`` (-1 from a namespace's init:
    everything in it). Returns a list that is non-empty once the limit has struck."""
    late = []
    if spec.get("timeout"):
        def strike(signum, frame):
            late.append(1)
            try:
                os.kill(target, signal.SIGKILL)
            except OSError:
                pass

        signal.signal(signal.SIGALRM, strike)
        signal.setitimer(signal.ITIMER_REAL, float(spec["timeout"]))
    return late


def timed_out(spec):
    """The program ran past its limit: say so with the tag (the program cannot know it)."""
    os.write(1, ("[trl-sandbox-lease:{}:timeout]\n".format(spec.get("tag", ""))).encode())
    os._exit(124)


def relay(status):
    """Leave as the program left: the same exit status, or death by the same signal."""
    sys.stdout.flush()
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else status >> 8)


def fail(spec, why):
    os.write(1, ("[trl-sandbox-lease:{}:failed] {}\n".format(spec.get("tag", ""), why)).encode())
    os._exit(125)


def launch(spec, argv):
    """One program, cleaned before and isolated (or swept); leaves as the program left."""
    mode = spec.get("mode", "ns")
    null = os.stat(os.devnull)
    if not (null.st_mode & 0o170000 == 0o020000 and os.major(null.st_rdev) == 1 and os.minor(null.st_rdev) == 3):
        fail(spec, "/dev/null is not the null device any more")  # whatever a program put there
    stdin_data = None
    if spec.get("stdin") == "b64":
        chunks = []
        while True:  # fd 0 itself: in a resident's fork it is the exec's stdin, not sys.stdin's
            chunks.append(os.read(0, 1 << 16))
            if not chunks[-1]:
                break
        stdin_data = binascii.a2b_base64(b"".join(chunks))
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    try:
        if mode == "sweep":
            sweep(spec.get("spare") or ())
        if spec.get("reset"):
            wipe(spec)
        os.makedirs(spec["work"], exist_ok=True)
        if mode == "sweep" and spec.get("uid") is not None and os.geteuid() == 0:
            os.chown(spec["work"], spec["uid"], spec["uid"])
    except Exception as exc:  # whatever a program left that breaks the cleaning: never its neighbour's error
        fail(spec, f"cleaning the sandbox: {type(exc).__name__}: {exc}")
    sys.stdout.flush()
    if mode == "sweep":
        child = os.fork()
        if child == 0:
            program(spec, argv, stdin_data)
        late = deadline(spec, child)
        _, status = os.waitpid(child, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        try:
            sweep(spec.get("spare") or ())
        except Exception as exc:
            fail(spec, f"sweeping after the program: {type(exc).__name__}: {exc}")
        if late:
            timed_out(spec)
        relay(status)
    try:
        enter_namespaces()
    except OSError as exc:
        fail(spec, f"the image refused a PID namespace: {exc}")
    alive_read, alive_write = os.pipe()
    report_read, report_write = os.pipe()
    os.set_blocking(alive_read, False)
    child = os.fork()
    if child == 0:
        os.close(alive_write)
        os.close(report_read)
        init(spec, argv, stdin_data, alive_read, report_write)
    os.close(alive_read)
    os.close(report_write)
    answer = b""
    while not answer.endswith(b"\n"):
        chunk = os.read(report_read, 64)
        if not chunk:
            break
        answer += chunk
    if not answer.endswith(b"\n"):
        fail(spec, "the program's namespace ended without a status")
    if answer.endswith(b"T\n"):
        timed_out(spec)
    relay(int(answer.rstrip(b"T\n")))


"""The launcher that runs every program inside a remote sandbox (Daytona, CoreWeave): a clean lease
without an extra round trip. Sent with each exec (``python3 -I -S -c SOURCE SPEC ARGV...``, or forked
by the resident launcher, ``launcher_resident``); standard library only, Python 3.8+, Linux. Before
the program gets control, in this order:

1. In ``sweep`` mode (namespaces refused by the image), kill every process the sandbox did not
   have when it was made but this launcher and its ancestors (``launcher_cleaning.sweep``).
2. If a reset is due, empty ``/tmp``, ``/var/tmp``, ``/dev/shm`` and the work directory (keeping
   only ``keep``: the resident's directory), then recreate the work dir.
3. Run the program. In ``ns`` mode in a PID namespace of its own, whose init (below) dies with the
   launcher (``PR_SET_PDEATHSIG``) and ends the namespace when the program ends: the kernel kills
   every process the program left, however it detached. The program sees a fresh ``/proc``, a
   read-only root where the image allows it (the scratch places and the work dir writable, the
   resident's directory hidden) and has no capabilities left (every set empty, no_new_privs), so it
   cannot unmount that ``/proc``, enter another namespace, or regain them by exec. The namespace
   comes from ``unshare(CLONE_NEWPID|CLONE_NEWNS)`` when the daemon runs as root with CAP_SYS_ADMIN,
   else inside a new user namespace. The program also gets its own IPC and UTS namespaces and,
   unless the spec allows the network, a network namespace with only loopback; ``/proc/sys`` and
   the kernel's other writable interfaces are read-only, its keyrings fresh, and the init's signal
   dispositions all the default, so that nothing a program sends ends it (``launcher_isolation``).
   Without the network, the Unix sockets bound in the file system by the sandbox's processes are
   covered by the null device. With ``user``, the program enters a user namespace of its own as
   that uid (mapped onto the launcher's user) before its exec, which then clears every capability.
   In ``sweep`` mode the program runs as ``uid`` (when the launcher may switch to it), with
   ``private`` in network, IPC, UTS and mount namespaces of its own (``/proc/sys`` read-only), the
   launcher ignores every signal but SIGCHLD, and the sweep runs again after the program exits. In both
   modes, with ``cap``, the program's stdout and stderr are pipes the launcher copies up to ``cap``
   bytes each (``streams``).

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
import os
import resource
import sys

if "wipe" not in globals():
    # On the host (tests, linters) the cleaning and the resident are modules of their own. Sent to
    # a sandbox, their text runs first (``trl_sandbox.remote.lease``) and has defined these names.
    from trl_sandbox.remote.launcher_cleaning import sweep, wipe, wipe_ipc
if "apply_environment" not in globals():
    from trl_sandbox.remote.launcher_environment import apply_environment, drop_environment, freeze
if "shed_capabilities" not in globals():  # every mode sends it
    from trl_sandbox.remote.launcher_isolation import (
        PR_SET_DUMPABLE,
        PR_SET_PDEATHSIG,
        _prctl,
        default_signals,
        enter_namespaces,
        fresh_keyrings,
        hide_dirs,
        listening_sockets,
        own_user,
        private_namespaces,
        private_sweep,
        seal_filesystem,
        shed_capabilities,
    )


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
        sweep_mode = spec.get("mode") == "sweep"
        if sweep_mode and spec.get("private"):
            isolate(spec, private_sweep, spec.get("network"))
            isolate(spec, hide_dirs, spec.get("hide") or ())  # the pristine tree of an environment
        uid = spec.get("uid")
        if sweep_mode and uid is not None and os.geteuid() == 0:
            try:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            except OSError:
                pass  # the probe said so: the program keeps the launcher's user
        fresh_keyrings()
        if not sweep_mode and spec.get("user") is not None:
            isolate(spec, own_user, spec["user"])
        # In both modes: a program with CAP_SYS_ADMIN could unmount the /proc the sweep and the
        # namespace rely on, or enter another namespace; with CAP_KILL signal what is not its own.
        shed_capabilities()
        default_signals()  # Python ignores SIGPIPE and SIGXFSZ (an exec keeps that), a sweep launcher more
    except OSError as exc:
        os.write(2, (f"trl-sandbox: cannot start the program: {exc}\n").encode())
        os._exit(126)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        os.write(2, (f"{argv[0]}: {exc.strerror}\n").encode())
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)


def isolate(spec, step, *args):
    """One isolation step the probe found the image allows, in the program's fork: if it fails
    now, the exec is the launcher's failure (its line on the program's stdout), never a program
    run with less than the lease promised."""
    try:
        step(*args)
    except OSError as exc:
        fail(spec, f"{step.__name__}: {exc}")


def init(spec, argv, stdin_data, alive, report):
    """PID 1 of the program's namespace: dies with the launcher; seals the filesystem; starts the
    program and reaps every orphan until the program ends; then reports its wait status and exits,
    which makes the kernel kill whatever the program left."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    default_signals()
    try:
        os.read(alive, 1)  # not blocking: the launcher still holds the write end, or is gone already
    except BlockingIOError:
        pass
    else:
        os._exit(1)
    # Without the network, the sandbox's sockets in the file system go out of sight too (its own
    # network namespace hides the abstract ones): listed before that namespace is made.
    sockets = () if spec.get("network") else listening_sockets()
    private_namespaces(spec.get("network"))
    seal_filesystem(spec["work"], spec.get("hide") or (), sockets)
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
            if signal.getitimer(signal.ITIMER_REAL)[0] > 0:
                return  # the timer still runs: a SIGALRM a program sent, not the deadline
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


class streams:
    """With ``spec["cap"]``, the program's stdout and stderr are pipes that this launcher copies to
    its own, each up to ``cap`` bytes (the rest is read and dropped): a program that prints without
    end costs the host no more than that, and its output never counts against its own file-size
    limit (where the daemon's shell sends stderr to a file). Without it, the streams are passed on.
    One thread, ``select``: a process that made a PID namespace for its children may start none."""

    def __init__(self, spec):
        self.cap = spec.get("cap")
        self.pipes = [os.pipe(), os.pipe()] if self.cap else []
        self.open = {}

    def adopt(self):
        """In the child: the pipes' write ends become its stdout and stderr."""
        for fd, (read, write) in zip((1, 2), self.pipes):
            os.dup2(write, fd)
            os.close(read)
            os.close(write)

    def copy(self):
        for fd, (read, write) in zip((1, 2), self.pipes):
            os.close(write)
            self.open[read] = [fd, self.cap + 1]  # one byte past the cap: the host sees the cut

    def wait(self, event=None, done=lambda: True, limit=None):
        """Copy until ``done()`` and, after it, until both streams end (their writers are all gone
        once the program and what it left are), for at most ``limit`` seconds more however much a
        writer that outlived the program still writes. ``event``: a descriptor that wakes us for
        ``done``."""
        import select
        import time

        finished, end = done(), None
        while self.open or not finished:
            if finished and end is None:
                end = time.monotonic() + (limit or 0)
            watch = list(self.open)
            if event is not None and not finished:
                watch.append(event)
            wait_s = max(0, end - time.monotonic()) if finished else (None if event is not None else 0.01)
            ready = select.select(watch, [], [], wait_s)[0]
            if finished and (not ready or time.monotonic() > end):
                break  # a writer outlived the program's end by ``limit``: stop copying
            for read in ready:
                if read in self.open:
                    self._move(read)
            finished = finished or done()

    def _move(self, read):
        chunk = os.read(read, 1 << 16)
        fd, left = self.open[read]
        if not chunk:
            del self.open[read]
            os.close(read)
            return
        chunk = chunk[:left]
        self.open[read][1] = left - len(chunk)
        while chunk:
            try:
                chunk = chunk[os.write(fd, chunk):]
            except OSError:
                chunk = b""  # the reader is gone: read on, drop


def hide_memory():
    """Not dumpable (nor the init, a fork): a program of the launcher's own uid and capabilities
    (a daemon that is not root) would read the tag in our memory through ``/proc/PID/mem``."""
    _prctl(PR_SET_DUMPABLE, 0)


def launch(spec, argv):
    """One program, cleaned before and isolated (or swept); leaves as the program left."""
    mode = spec.get("mode", "ns")
    if mode == "sweep":
        hide_memory()
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
        if spec.get("drop"):  # the last lease's copy of a prepared environment (launcher_environment)
            drop_environment(spec)
        if spec.get("reset"):
            wipe(spec)
            if mode == "sweep":
                wipe_ipc(spec.get("spare_ipc") or {})
        if spec.get("freeze"):
            freeze(spec)
        if spec.get("env"):
            apply_environment(spec)
        os.makedirs(spec["work"], exist_ok=True)
        if mode == "sweep" and spec.get("uid") is not None and os.geteuid() == 0:
            os.chown(spec["work"], spec["uid"], spec["uid"])
    except Exception as exc:  # whatever a program left that breaks the cleaning: never its neighbour's error
        fail(spec, f"cleaning the sandbox: {type(exc).__name__}: {exc}")
    sys.stdout.flush()
    ends = streams(spec)
    if mode == "sweep":
        child = os.fork()
        if child == 0:
            ends.adopt()
            program(spec, argv, stdin_data)
        for sig in range(1, signal.NSIG):  # the program may be our own uid: nothing it sends stops us
            if sig not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
                try:
                    signal.signal(sig, signal.SIG_IGN)
                except (OSError, ValueError, RuntimeError):
                    pass
        late = deadline(spec, child)
        ends.copy()
        exited = []

        def reaped():
            if not exited:
                pid, status = os.waitpid(child, os.WNOHANG)
                if pid:
                    exited.append(status)
            return bool(exited)

        try:
            wake = os.pidfd_open(child)
        except (AttributeError, OSError):
            wake = None
        if ends.pipes:
            ends.wait(wake, reaped, limit=0)  # leftovers may hold the pipes: the sweep ends them
        else:
            exited.append(os.waitpid(child, 0)[1])
        status = exited[0]
        signal.setitimer(signal.ITIMER_REAL, 0)
        try:
            sweep(spec.get("spare") or ())
        except Exception as exc:
            ends.wait(limit=1)
            fail(spec, f"sweeping after the program: {type(exc).__name__}: {exc}")
        ends.wait(limit=1)
        if late:
            timed_out(spec)
        relay(status)
    try:
        enter_namespaces()
    except OSError as exc:
        fail(spec, f"the image refused a PID namespace: {exc}")
    hide_memory()  # after: a process that is not dumpable may not write its own uid_map
    alive_read, alive_write = os.pipe()
    report_read, report_write = os.pipe()
    os.set_blocking(alive_read, False)
    child = os.fork()
    if child == 0:
        os.close(alive_write)
        os.close(report_read)
        ends.adopt()
        init(spec, argv, stdin_data, alive_read, report_write)
    ends.copy()
    os.close(alive_read)
    os.close(report_write)
    answer = [b"", False]

    def reported():  # the init's status line, read without blocking
        while not answer[1]:
            try:
                chunk = os.read(report_read, 64)
            except BlockingIOError:
                return False
            answer[0] += chunk
            answer[1] = not chunk or answer[0].endswith(b"\n")
        return True

    os.set_blocking(report_read, False)
    if ends.pipes:
        ends.wait(report_read, reported, limit=5)
    else:
        os.set_blocking(report_read, True)
        reported()
    answer = answer[0]
    if not answer.endswith(b"\n"):
        fail(spec, "the program's namespace ended without a status")
    if answer.endswith(b"T\n"):
        timed_out(spec)
    relay(int(answer.rstrip(b"T\n")))


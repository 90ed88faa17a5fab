"""Processes for the I/O judge (``judge/io_runner.py``): start one with its limits, follow the CPU
time of everything it started however it detached, kill and reap all of it, and clean what it left in
the scratch directories. Standard library only; sent into the sandbox ahead of the runner's own text.
"""

import os
import resource
import signal
import time

if "guard_program" not in globals():
    # On the host the filter's rules and the meter are modules of their own; sent to a sandbox, their
    # text runs first.
    from trl_sandbox.judge.guard import guard_program
    from trl_sandbox.judge.meter import MeterShare, meter_memory, meter_own_memory, meter_run_delay

SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")
TICK = os.sysconf("SC_CLK_TCK")
ERR_FLOOD = 16 << 20  # bytes of stderr after which a test is ended as an output flood
# Processes a filter names at most (this one, its parent and group first, then the lowest numbers);
# a sandbox holds a handful when a program starts.
GUARDED_MAX = 256


def prctl(option, arg):
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, arg, 0, 0, 0) == 0
    except Exception:
        return False


def guard(spare=()):
    """Keep every process this one starts from now on off every process that exists now (this one,
    its parent and all above it, the sandbox's own, their process groups) but ``spare``: a seccomp
    filter on this process (``judge/guard.py``), which all it starts inherits and
    cannot shed. A test can then signal, stop, renice or re-limit only what did not exist before it
    ran: its own processes. None when the filter holds, else why not."""
    try:
        import ctypes

        here = {int(name) for name in os.listdir("/proc") if name.isdigit()} if os.path.isdir("/proc/self") else set()
        first = sorted({os.getpid(), os.getppid(), os.getpgrp()} - set(spare) - {0})
        rest = sorted(here - set(first) - set(spare) - {0})
        code = guard_program(os.uname().machine, (first + rest)[:GUARDED_MAX])

        class Fprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

        prog = Fprog(len(code) // 8, code)
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:
            return f"seccomp: {os.strerror(ctypes.get_errno())}"  # PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP
    except Exception as exc:  # noqa: BLE001 - any failure is the sandbox's, reported as such
        return str(exc) or type(exc).__name__
    return None


def children(pid):
    """Every direct child of ``pid`` (over all its threads)."""
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                found.extend(int(p) for p in fh.read().split())
        except OSError:
            pass
    return found


def descendants():
    """Every process below this one (orphans of a test are our children: we are a subreaper)."""
    seen, todo = [], children(os.getpid())
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.append(pid)
            todo.extend(children(pid))
    return seen


def cpu_of(pids):
    """CPU seconds of the living processes ``pids`` (their own and their reaped children's)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            total += sum(int(f) for f in fields[11:15])
        except (OSError, IndexError, ValueError):
            pass
    return total / TICK


def reaped_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def threads_gone(pid):
    """Whether every thread of ``pid`` has ended (dead, waiting to be reaped by a helper that may be
    stopped: nothing left to kill). A process whose main thread exited while another thread runs
    shows as a zombie in its own ``stat``; it is not gone until all its threads are."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as fh:
                if fh.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X"):
                    return False
        except (OSError, IndexError):
            continue
    return True


def kill_all(spare=()):
    """Kill and reap every process below this one, however it detached, but the helpers ``spare``
    (a process a helper reaps itself is waited for until it has). Returns the helpers that had
    died and were reaped here: their numbers are free for reuse from now on."""
    spared, gone, quiet = set(spare), [], 0
    for _ in range(100000):
        pids = [p for p in descendants() if p not in spared and not threads_gone(p)]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        reaped = False
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return gone  # no child at all: orphans are ours, so nothing is left below
            if pid == 0:
                break
            reaped = True
            if pid in spared:
                spared.discard(pid)
                gone.append(pid)
        # A scan reads each process's children while they may fork: a child forked after its
        # parent's list was read, whose parent then exited, is ours (we are a subreaper) only by
        # the next scan. Every such exit leaves a zombie to reap, but the warm interpreter reaps
        # its own (the test): done after two scans in a row that found nothing alive and reaped
        # nothing (the second starts after every exit the first saw, so it sees their orphans).
        quiet = quiet + 1 if not pids and not reaped else 0
        if quiet >= 2:
            return gone
        if pids:
            time.sleep(0.0005)
    return gone


def scratch_entries(extra=()):
    """What the scratch directories (and ``extra``) hold now: what a test adds is removed after it."""
    found = set()
    for place in SCRATCH + tuple(extra):
        try:
            found.update(os.path.join(place, name) for name in os.listdir(place))
        except OSError:
            pass
    return found


def remove(path):
    """Remove ``path`` and all below it. Python's walk recurses, so a tree a program made deeper
    than the recursion limit (or than PATH_MAX) is left to ``rm -rf``, which walks by descriptor."""
    try:
        _remove(path)
    except RecursionError:
        pass
    if os.path.lexists(path):
        for rm in ("/bin/rm", "/usr/bin/rm"):
            if os.access(rm, os.X_OK):
                os.waitpid(os.posix_spawn(rm, ["rm", "-rf", "--", path], {"PATH": "/usr/bin:/bin"}), 0)
                break


def _remove(path, retry=True):
    """A directory a program made unreadable is opened up first."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            for name in os.listdir(path):
                _remove(os.path.join(path, name))
            os.rmdir(path)
        else:
            os.unlink(path)
    except OSError:
        if retry:
            try:
                os.chmod(path, 0o700)
            except OSError:
                return
            _remove(path, retry=False)


def input_fd(data):
    """The test's input as a sealed in-memory file (a nameless file where memfd is missing)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("input", getattr(os, "MFD_ALLOW_SEALING", 2))
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
        try:
            import fcntl

            fcntl.fcntl(fd, 1033, 1 | 2 | 4 | 8)  # F_ADD_SEALS: seal, shrink, grow, write
        except Exception:
            pass
        return fd
    fd = os.open("/tmp", os.O_TMPFILE | os.O_RDWR, 0o600)  # nameless: no other test can open it
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def lower(which, value):
    """Set a limit to ``value``, or keep the sandbox's own where that is lower already."""
    _, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(which, (value, value))


def enter(cwd, stdin_fd, out_fd, err_fd, cpu, memory_mb):
    """In a new child: its own session, directory, standard streams and limits; nothing else open."""
    os.setsid()
    os.chdir(cwd)
    for fd, target in ((stdin_fd, 0), (out_fd, 1), (err_fd, 2)):
        os.dup2(fd, target)
    os.closerange(3, 1 << 16)
    if cpu:  # the tree's total is checked to the tick; this ends one busy process
        lower(resource.RLIMIT_CPU, int(cpu) + 1)
    if memory_mb:
        lower(resource.RLIMIT_AS, memory_mb << 20)
    lower(resource.RLIMIT_CORE, 0)
    try:  # the kernel's OOM killer takes a test before the runner (raising one's own score needs no right)
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("1000")
    except OSError:
        pass
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)


class Cold:
    """A program started by ``execve`` in a child of the runner; ``data_mb``: its ``RLIMIT_DATA``
    (a runtime that reserves more address space than any limit of a test's size: see
    ``judge/languages.py``)."""

    def __init__(self, argv, env, data_mb=0):
        self.argv, self.env, self.data_mb, self.pidfd = argv, env, data_mb, None

    def start(self, cwd, stdin_fd, out_fd, err_fd, cpu, memory_mb):
        self.pid = os.fork()
        if self.pid:
            return self.pid
        try:
            enter(cwd, stdin_fd, out_fd, err_fd, cpu, memory_mb)
            if self.data_mb:
                lower(resource.RLIMIT_DATA, self.data_mb << 20)
            os.execvpe(self.argv[0], self.argv, self.env)
        except BaseException as exc:  # noqa: BLE001 - nothing may return into the runner's code
            try:
                os.write(2, f"cannot run {self.argv[0]}: {exc}\n".encode())
            finally:
                os._exit(127)
        os._exit(127)

    def waitable(self):
        """Descriptors that become readable when the program ends (a pidfd where there is one)."""
        if self.pidfd is None and hasattr(os, "pidfd_open"):
            try:
                self.pidfd = os.pidfd_open(self.pid)
            except OSError:
                self.pidfd = -1
        return [self.pidfd] if self.pidfd is not None and self.pidfd >= 0 else []

    def poll(self, final=False):
        """(wait status, CPU seconds that ``reaped_cpu`` does not count) once it ended, else None;
        ``final``: it has been killed and reaped already, when not before."""
        try:
            got, raw = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            got, raw = self.pid, 9  # reaped by ``kill_all``: it was killed
        if got != self.pid:
            return None
        if self.pidfd is not None and self.pidfd >= 0:
            os.close(self.pidfd)
        self.pidfd = None
        return raw, 0.0


# A sleeping or blocked test ends at its wall backstop; time it spent waiting for a CPU (busy
# neighbours) is not counted there, up to this many backstops: a test that keeps itself runnable
# without running (niced, yielding next to busy neighbours) still ends, and a program's two time
# limits stay far below the reward call's deadline.
WAIT_CAP = 2


def run(starter, cwd, data, cpu, memory_mb, wall, out_cap, err_cap, spare=(), meter_mb=0):
    """Run one process tree to its end; returns a dict: status, cpu, out, err, memory (the peak the
    meter saw, bytes; None without one), why (TLE/OLE/MLE/None). ``starter`` is ``Cold`` or the warm
    interpreter; ``spare`` the runner's own helpers; ``memory_mb`` the address-space limit (0: none);
    ``meter_mb`` the bound on the memory the sandbox's meter charges to the test (0: none)."""
    import select

    stdin_fd = input_fd(data)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    base = reaped_cpu()
    # The meter (``judge/meter.py``): CPU of every process of the test, also those the kernel reaped
    # by itself, less what this runner used meanwhile (the warm interpreter's fork of the test and
    # PID 1's rare look at the exec's budget, a millisecond or so, count against the test: reading
    # their times too cost a fifth of a short Python test); memory outside any address space
    # (memfd, tmpfs, shared memory) less this runner's own growth.
    share = MeterShare()
    memory_base = meter_memory() if share.base is not None else None
    own_base = meter_own_memory() if memory_base is not None else 0
    start = time.monotonic()
    try:
        starter.start(cwd, stdin_fd, out_w, err_w, cpu, memory_mb)
    except OSError:
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        for fd in (stdin_fd, out_w, err_w):
            os.close(fd)
    extra = 0.0

    def tree_cpu():
        """What the tree used up to now, dead children not yet reaped by a stopped helper included,
        and at least what the meter charged (children reaped by the kernel itself included)."""
        counted = (reaped_cpu() - base) + extra + cpu_of([p for p in descendants() if p not in spare])
        metered = share.used()
        return counted if metered is None else max(counted, metered)

    peak = [0]

    def memory_over():
        if memory_base is None:
            return False
        now = meter_memory()
        if now is None:
            return False
        peak[0] = max(peak[0], now - memory_base - max(0, meter_own_memory() - own_base))
        return bool(meter_mb) and peak[0] > meter_mb << 20

    def out_of_wall(now):
        """Past the backstop, not counting the time the tree waited for a CPU (to a cap)."""
        elapsed = now - start
        if elapsed <= wall:
            return False
        if elapsed > WAIT_CAP * wall:
            return True
        return elapsed - meter_run_delay([p for p in descendants() if p not in spare]) > wall

    out, err = bytearray(), bytearray()
    open_fds = {out_r: (out, out_cap), err_r: (err, err_cap)}
    status, why, flooded = None, None, 0
    next_check = start + 0.01
    while True:
        if status is None:
            ended = starter.poll()
            if ended is not None:
                status, extra = ended
        if status is not None and not open_fds:
            break
        if status is not None and time.monotonic() - start > wall:
            break  # a leftover process holds the pipes open: it is killed below
        # Wake on output, on the program's end (``starter.waitable``) or every 10 ms for the checks.
        ready = select.select(list(open_fds) + ([] if status is not None else starter.waitable()), [], [], 0.01)[0]
        for fd in ready:
            if fd not in open_fds:
                continue
            chunk = os.read(fd, 1 << 16)
            buf, cap = open_fds[fd]
            if not chunk:
                os.close(fd)
                del open_fds[fd]
                continue
            buf += chunk[: max(0, cap + 1 - len(buf))]
            if len(buf) > cap and fd == out_r and why is None:
                why = "OLE"
            elif fd == err_r:
                flooded += len(chunk)
                if flooded > ERR_FLOOD and why is None:
                    why = "OLE"  # no right answer needs this much on stderr; reading it costs us
        if why == "OLE":
            break
        now = time.monotonic()
        if now >= next_check:  # every 10 ms (a short test never pays for it)
            next_check = now + 0.01
            if memory_over():
                why = "MLE"
                break
            if (cpu and tree_cpu() > cpu) or out_of_wall(now):
                why = "TLE"
                break
    seen = tree_cpu()
    if kill_all(spare) and hasattr(starter, "reaped"):
        starter.reaped()
    if status is None:
        ended = starter.poll(final=True)
        status, extra = ended if ended is not None else (9, extra)  # killed before it ended
    for fd in open_fds:
        os.close(fd)
    used = max(reaped_cpu() - base + extra, seen)
    if cpu and used > cpu and why is None:
        why = "TLE"
    return {"status": status, "cpu": used, "wall": time.monotonic() - start, "out": bytes(out),
            "err": bytes(err), "why": why, "memory": peak[0] if memory_base is not None else None}

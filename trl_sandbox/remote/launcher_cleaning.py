"""The lease launcher's cleaning, run before a program gets control (``launcher.py`` says when).

In ``sweep`` mode, stop and then SIGKILL every process that is not the launcher, one of its
ancestors (the vendor's daemon and its shell), PID 1, or one of the processes the sandbox had when
it was made (``spare``: pid and start time, so a recycled pid is not spared). Stopping first means
a process that forks as fast as it can cannot outrun the sweep; SIGKILL cannot be caught or
ignored; leaving the session or the process group (``setsid``, double fork) changes nothing, since
the sweep goes by pid, not by ancestry. On a reset, ``/tmp``, ``/var/tmp``, ``/dev/shm`` and the
work directory are emptied without following a link a program left.

Standard library only, Python 3.8+. Sent as one source with ``launcher.py`` (this text first) by
``trl_sandbox.remote.lease``; nothing of it stays in the sandbox between execs.
"""

import _signal as signal
import os

WRITABLE = ("/tmp", "/var/tmp", "/dev/shm")


def start_time(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2:].split()
    return int(fields[19]), int(fields[1])  # (start time, parent pid)


def pids():
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def ancestors(pid):
    chain = set()
    while pid > 1 and pid not in chain:
        chain.add(pid)
        info = start_time(pid)
        if info is None:
            break
        pid = info[1]
    return chain


def baseline():
    me = os.getpid()
    out = []
    for pid in pids():
        info = start_time(pid)
        if pid != me and info is not None:
            out.append([pid, info[0]])
    return out


def sweep(spare):
    """Stop, then kill, every process that is neither spared nor one of our ancestors."""
    if os.readlink("/proc/self") != str(os.getpid()):  # /proc is not our PID namespace's: pids would lie
        raise OSError(5, "/proc does not show this sandbox's processes")
    keep = ancestors(os.getpid()) | {1}
    for pid, started in spare:
        info = start_time(pid)
        if info is not None and info[0] == started:
            keep.add(pid)
    stopped = set()
    for _ in range(1000):
        fresh = False
        for pid in pids():
            if pid in keep or pid in stopped:
                continue
            try:
                os.kill(pid, signal.SIGSTOP)
                stopped.add(pid)
                fresh = True
            except ProcessLookupError:
                pass
            except PermissionError:
                keep.add(pid)  # not ours to stop (another user's): it cannot touch our programs either
        if not fresh:
            break
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return len(stopped)


IPC_KINDS = ("shm", "msg", "sem")


def ipc_baseline():
    """The SysV IPC objects the sandbox has now, by kind (ids; the probe's answer, spared by
    every ``wipe_ipc``)."""
    found = {}
    for kind in IPC_KINDS:
        try:
            with open(f"/proc/sysvipc/{kind}") as fh:
                found[kind] = [int(line.split()[1]) for line in fh.readlines()[1:] if line.split()]
        except (OSError, ValueError, IndexError):
            found[kind] = []
    return found


def wipe_ipc(spare):
    """In ``sweep`` mode (where a program may have no IPC namespace of its own), on a reset: remove
    every SysV object and POSIX message queue a program left (the SysV objects the sandbox had when
    it was made are spared)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    calls = {"shm": lambda i: libc.shmctl(i, 0, None), "msg": lambda i: libc.msgctl(i, 0, None),
             "sem": lambda i: libc.semctl(i, 0, 0)}  # IPC_RMID
    for kind, ids in ipc_baseline().items():
        for ident in ids:
            if ident not in (spare.get(kind) or ()):
                calls[kind](ident)
    if os.path.ismount("/dev/mqueue"):
        empty_queues("/dev/mqueue")
        return
    # No mqueue file system to list the queues by: one of our own, in a mount namespace of a fork
    # of ours (where we may make one: CAP_SYS_ADMIN), over /tmp there. Else the queues stay.
    child = os.fork()
    if child == 0:
        try:
            if libc.unshare(0x20000) == 0 and libc.mount(None, b"/", None, 16384 | (1 << 18), None) == 0 \
                    and libc.mount(b"mqueue", b"/tmp", b"mqueue", 2 | 4 | 8, None) == 0:  # MS_REC|MS_PRIVATE
                empty_queues("/tmp")
        finally:
            os._exit(0)
    os.waitpid(child, 0)


def empty_queues(where):
    for name in os.listdir(where):
        try:
            os.unlink(os.path.join(where, name))
        except OSError:
            pass


def remove(path):
    """``rm -rf`` (without ``shutil``): a directory the program made unreadable is opened up first."""
    if os.path.isdir(path) and not os.path.islink(path):
        try:
            os.chmod(path, 0o700)
        except OSError:
            pass
        for name in os.listdir(path):
            remove(os.path.join(path, name))
        os.rmdir(path)
    else:
        os.unlink(path)


def dumps(value):
    """JSON for the probe's answer (ints, strings without quotes or backslashes, bools, lists, None)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict):
        return "{{{}}}".format(", ".join(f'"{k}": {dumps(v)}' for k, v in value.items()))
    return "[{}]".format(", ".join(dumps(v) for v in value))


def wipe(spec):
    keep = set(spec.get("keep") or ())
    kept_dirs = {spec["work"]}  # emptied, not removed and made again
    for path in keep | {spec["work"]}:
        while path not in ("/", ""):
            path = os.path.dirname(path)
            kept_dirs.add(path)

    def empty(directory, doomed):
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return
        for name in names:
            path = os.path.join(directory, name)
            if path in keep:
                continue
            if path in kept_dirs and os.path.isdir(path) and not os.path.islink(path):
                empty(path, doomed)
                continue
            doomed.append(path)

    # Never through a symbolic link a program left in place of a directory (its target, anywhere
    # in the image, would be emptied by root): the link itself goes.
    doomed = []
    work = spec["work"]
    inside = any(work.startswith(d + "/") for d in WRITABLE)
    for directory in WRITABLE + (() if inside else (work,)):
        if os.path.islink(directory):
            doomed.append(directory)
        elif os.path.isdir(directory):
            empty(directory, doomed)
    stubborn = []
    for path in doomed:  # files and empty directories without spawning anything
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)
            else:
                os.unlink(path)
        except OSError:
            stubborn.append(path)
    if not stubborn or rm_rf(stubborn):
        return
    for path in stubborn:
        remove(path)


def rm_rf(paths):
    """``rm -rf`` when the image has it (it walks by file descriptor: a tree deeper than PATH_MAX or
    than Python's recursion limit goes too). True when it removed everything."""
    for rm in ("/bin/rm", "/usr/bin/rm"):
        if os.access(rm, os.X_OK):
            pid = os.posix_spawn(rm, ["rm", "-rf", "--", *paths], os.environ)
            status = os.waitpid(pid, 0)[1]
            return status == 0 and not any(os.path.lexists(p) for p in paths)
    return False

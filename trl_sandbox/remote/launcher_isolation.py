"""The lease launcher's isolation of a program (``launcher.py`` says when each runs): the PID
namespace, the program's own mount, network, IPC and UTS namespaces, a fresh ``/proc`` whose kernel
interfaces are read-only, a read-only root, no capabilities, fresh keyrings, and the signal
dispositions a namespace's init holds.

Standard library only, Python 3.8+, Linux. Sent as one source with the launcher's other parts
(``trl_sandbox.remote.lease``; this text before ``launcher.py``'s).
"""

import _signal as signal
import ctypes
import os
import sys

CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUSER = 0x20000, 0x20000000, 0x10000000
CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWNET = 0x04000000, 0x08000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 1, 24, 38, 47
PR_SET_DUMPABLE = 4
LIBC = ctypes.CDLL(None, use_errno=True)

if "wipe" not in globals():  # on the host; sent to a sandbox, the cleaning's text came before
    from trl_sandbox.remote.launcher_cleaning import WRITABLE


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


#: The uid (and gid) a program is in the user namespace of its own that it enters before exec.
PROGRAM_UID = 1000


def own_user(uid=PROGRAM_UID):
    """Enter a user namespace of the program's own in which it is ``uid``, mapped onto the
    launcher's own user (so the work dir and what the daemon writes there stay its own): the exec
    that follows clears every capability (``uid`` is not 0 there), and a process of a child user
    namespace holds none in the lease's PID, mount, network, IPC or UTS namespaces, whatever it
    does. The kernel's own permission checks still see the launcher's user (nothing else is
    mapped), so the read-only mounts stay the defence of what that user owns."""
    _prctl(PR_SET_DUMPABLE, 1)  # our /proc files (uid_map) our own: this fork holds nothing secret
    uid0, gid0 = os.getuid(), os.getgid()
    _check(LIBC.unshare(CLONE_NEWUSER), "unshare(user)")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid0} 1")
    _write("/proc/self/gid_map", f"{uid} {gid0} 1")


# The kernel's own interfaces under a fresh /proc that a uid 0 without capabilities could still
# write (sysctls, the SysRq trigger, IRQ affinities) or read about the host: read-only binds.
PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs")
# Whose masks hide the host: an empty read-only file or directory over each where it exists.
PROC_MASKS = ("/proc/kcore", "/proc/keys", "/proc/key-users", "/proc/timer_list", "/proc/sched_debug",
              "/proc/kallsyms", "/proc/modules")


def private_namespaces(network):
    """The lease's own IPC (SysV objects, POSIX message queues) and UTS (hostname) namespaces and,
    unless the spec allows the network, a network namespace with only loopback, up: nothing of the
    daemon's loopback (on Daytona the toolbox daemon listens there) is in reach."""
    flags = CLONE_NEWUTS | CLONE_NEWIPC | (0 if network else CLONE_NEWNET)
    _check(LIBC.unshare(flags), "unshare(uts, ipc, net)")
    if not network:
        loopback_up()


def private_sweep(network):
    """In ``sweep`` mode where the image lets root make namespaces without a user namespace: the
    program's own network, IPC and UTS namespaces, and a mount namespace of its own in which the
    sandbox's ``/proc`` has its kernel interfaces read-only (as ``seal_proc``)."""
    private_namespaces(network)
    _check(LIBC.unshare(CLONE_NEWNS), "unshare(mount)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    seal_proc()


def loopback_up():
    LIBC.socket.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    LIBC.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_char_p]
    fd = LIBC.socket(2, 2, 0)  # AF_INET, SOCK_DGRAM
    if fd < 0:
        _check(-1, "socket")
    try:
        request = ctypes.create_string_buffer(b"lo", 40)  # struct ifreq: name, then the flags (short)
        _check(LIBC.ioctl(fd, 0x8913, request), "SIOCGIFFLAGS lo")
        flags = int.from_bytes(request.raw[16:18], sys.byteorder) | 1  # IFF_UP
        request[16:18] = flags.to_bytes(2, sys.byteorder)
        _check(LIBC.ioctl(fd, 0x8914, request), "SIOCSIFFLAGS lo")
    finally:
        os.close(fd)


def seal_proc():
    """The fresh /proc's kernel interfaces read-only, its host-describing files masked."""
    for path in PROC_READ_ONLY:
        if os.path.exists(path):
            _mount(path, path, None, MS_BIND | MS_REC)
            _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for path in PROC_MASKS:
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
        elif os.path.exists(path):
            _mount(os.devnull, path, None, MS_BIND)


def seal_filesystem(work, hide=(), sockets=()):
    """In the program's own mount namespace: a fresh /proc (its kernel interfaces read-only), a
    read-only root (where the image lets us), the scratch places and the work dir still writable,
    each of ``hide`` under an empty read-only tmpfs (the resident's FIFOs), each of ``sockets``
    under the null device (``listening_sockets``). Returns whether the root is read-only."""
    _check(LIBC.unshare(CLONE_NEWNS), "unshare(mount)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    seal_proc()
    for path in WRITABLE + (work,):
        if os.path.isdir(path):
            try:
                _mount(path, path, None, MS_BIND | MS_REC)
            except OSError:
                return False
    hide_dirs(hide)
    hide_sockets(sockets)
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


def listening_sockets():
    """The paths of the Unix sockets bound in the file system by the sandbox's processes (the
    vendor's daemon among them), from ``/proc/net/unix`` of our network namespace: read before the
    program's own is made. A network namespace hides abstract sockets, not these."""
    found = []
    try:
        with open("/proc/net/unix") as fh:
            lines = fh.readlines()[1:]
    except OSError:
        return found
    for line in lines:
        fields = line.split(None, 7)
        if len(fields) == 8 and fields[7].startswith("/"):
            path = fields[7].rstrip("\n")
            if path not in found:
                found.append(path)
    return found


def hide_sockets(paths):
    """Each socket of ``paths`` under the null device in this mount namespace (a
    connect() there finds no socket). Opened without following a link, mounted through the
    descriptor: a link planted in a socket's place covers nothing else. A path we cannot open is
    out of the program's reach as well (its directory is not ours)."""
    for path in paths:
        try:
            fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if os.fstat(fd).st_mode & 0o170000 != 0o140000:  # not a socket (any more)
                continue
            _mount(os.devnull, f"/proc/self/fd/{fd}", None, MS_BIND)  # made read-only with the rest
        finally:
            os.close(fd)


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


def fresh_keyrings():
    """A new session keyring, and this user's own keyrings emptied: a key an earlier lease added
    (the user keyring outlives every process of the uid) is gone before the program starts."""
    number = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine)
    if number is None:
        return
    LIBC.syscall.restype = ctypes.c_long
    LIBC.syscall(number, 1, None, 0, 0, 0)  # KEYCTL_JOIN_SESSION_KEYRING (anonymous)
    for ring in (-4, -5):  # KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING
        LIBC.syscall(number, 7, ring, 0, 0, 0)  # KEYCTL_CLEAR



def default_signals():
    """Every disposition of the namespace's init set on purpose: the default, which for PID 1 means
    that the kernel drops whatever a program in the namespace sends (Python's SIGINT handler would
    let ``kill -INT 1`` end the init without a status). Only SIGALRM gets a handler (``deadline``),
    and it ignores a forged one."""
    for sig in range(1, signal.NSIG):
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError, RuntimeError):
                pass  # the C library's own (32, 33)

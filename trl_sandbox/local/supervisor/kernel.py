"""A clean kernel for every program: what the forked child does before the program's first
instruction, and the fresh scratch mounts of every lease.

The supervisor (PID 1) keeps two capabilities of the sandbox's user namespace, granted by
bwrap's ``--cap-add``: ``CAP_SYS_ADMIN`` (to own a mount namespace and mount tmpfs, and to give
each child its own IPC namespace), ``CAP_SETPCAP`` (to empty a child's bounding set) and
``CAP_DAC_OVERRIDE`` (overlayfs asks it of whoever mounts a lease's copy of a prepared environment). A child
then, before any program code runs:

1. in memory mode ``"cgroup"``, ``unshare(CLONE_NEWIPC)``: fresh SysV IPC and POSIX message
   queues. The namespace, with every object in it, goes away when the exec's last process is
   killed, so nothing a program made there reaches the next program or another sandbox. In mode
   ``"deny"`` the filter refuses every call that makes an IPC object, so the sandbox's (empty)
   namespace is as fresh, and the ~0.1 ms of CPU a namespace costs per exec is saved. A resident
   judge's candidates are refused IPC objects in every mode and make no namespace either.
2. drops every capability: bounding set, ambient set, then effective/permitted/inheritable.
3. ``PR_SET_NO_NEW_PRIVS`` and a seccomp filter in the spirit of Docker's default profile:
   keyrings, ``ptrace``, setting another process's rlimits (``prlimit64`` with a pid), new namespaces (``unshare``, ``setns``, ``clone`` with ``CLONE_NEW*``,
   and ``CLONE_PARENT``, which gives a process a parent it was not forked by;
   ``clone3`` is ENOSYS so that libc falls back to ``clone``), the ``mount`` family, kernel
   modules, ``bpf``, ``perf_event_open``, ``kexec``, ``userfaultfd``, ``process_vm_*`` and the
   like fail with EPERM; in memory mode ``"deny"`` so do SysV ``shmget``/``msgget``/``semget`` and
   ``memfd_create``, which pin memory outside every address-space limit, and ``mq_open``. Other architectures
   (e.g. i386 system calls from an x86_64 process) kill the process; the x32 range is EPERM.

Everything is prepared once in the supervisor (the BPF program is built with ``struct``, the
ctypes functions and buffers are made before any fork), so a child pays only the system calls.
"""

import ctypes
import os
import struct

try:  # in the sandbox the guard's rules ride in this package (``local.command.supervisor_files``)
    from . import guard as g
except ImportError:  # on the host: the judge's module
    from trl_sandbox.judge import guard as g

ARCHES = g.ARCHES
EPERM = g.EPERM

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NS_FLAGS = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
# CLONE_PARENT gives the new process its caller's parent (for a judged candidate: the forker, whose
# children the sweeps took for its waiting candidate), and sends its exit signal, any signal the
# caller picks, there. No program needs it: without it a process's children, and their exit
# signals, are its own (an orphan's exit signal becomes SIGCHLD to PID 1, which ignores it).
CLONE_REFUSED = CLONE_NS_FLAGS | g.CLONE_PARENT
MS_NOSUID, MS_NODEV, MS_NOATIME, MS_REC, MS_PRIVATE = 2, 4, 0x400, 0x4000, 0x40000
MS_RDONLY, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 8, 32, 4096
MNT_DETACH = 2
PR_SET_DUMPABLE, PR_SET_NAME, PR_SET_SECCOMP, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 4, 15, 22, 24, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2
CAPABILITY_VERSION_3 = 0x20080522

# Denied to every program (EPERM). Numbers from the kernel's uapi headers: x86_64, aarch64.
DENIED = {
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "unshare": (272, 97), "setns": (308, 268),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51),
    "move_mount": (429, 429), "open_tree": (428, 428), "fsopen": (430, 430), "fsconfig": (431, 431),
    "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442),
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "bpf": (321, 280),
    "perf_event_open": (298, 241), "userfaultfd": (323, 282), "acct": (163, 89),
    "swapon": (167, 224), "swapoff": (168, 225), "reboot": (169, 142),
    "sethostname": (170, 161), "setdomainname": (171, 162), "syslog": (103, 116),
    "quotactl": (179, 60), "quotactl_fd": (443, 443),
    "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264), "lookup_dcookie": (212, 18),
    "settimeofday": (164, 170), "clock_settime": (227, 112), "clock_adjtime": (305, 266), "adjtimex": (159, 171),
    "pidfd_getfd": (438, 438), "kcmp": (312, 272), "fanotify_init": (300, 262), "vhangup": (153, 58),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "memfd_secret": (447, 447), "nfsservctl": (180, 42),
    # x86_64 only
    "iopl": (172, None), "ioperm": (173, None), "create_module": (174, None), "get_kernel_syms": (177, None),
    "query_module": (178, None), "uselib": (134, None), "ustat": (136, None), "sysfs": (139, None),
    "_sysctl": (156, None),
}
# Every call that makes a SysV IPC object or a POSIX message queue: denied to every program in
# memory mode "deny", and to judged candidates in every mode (see ``seccomp_program``).
IPC_OBJECTS = {"shmget": (29, 194), "msgget": (68, 186), "semget": (64, 190), "mq_open": (240, 180)}
# Denied in memory mode "deny": memory a program could pin beyond RLIMIT_AS, and with it every
# call that makes an IPC object (so no program needs an IPC namespace of its own in that mode).
DENY_MODE = {**IPC_OBJECTS, "memfd_create": (319, 279)}

LIBC = None


def libc():
    global LIBC
    if LIBC is None:
        LIBC = ctypes.CDLL(None, use_errno=True)
    return LIBC


def check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def seccomp_program(machine, memory_mode, protect=None):
    """The BPF program (bytes of ``struct sock_filter``) for this machine and memory mode; with
    ``protect``, the filter of a resident judge's candidates: the pids that no signal from the
    filtered process may reach (the judge and the candidates' forker), and no IPC objects in any
    memory mode (``IPC_OBJECTS``).

    Why candidates never get IPC objects: a candidate is a function under test, called by the
    judge, and nothing in Python's standard library makes SysV IPC objects or POSIX message
    queues (``multiprocessing`` and ``shared_memory`` use files in ``/dev/shm``). Refusing them
    leaves the sandbox's own IPC namespace, which candidates share, as empty as a fresh one, so a
    candidate needs no namespace of its own and the forker no capability to make one: each
    candidate is ready when the fork returns."""
    if machine not in ARCHES:
        raise OSError(EPERM, f"no seccomp filter for the architecture {machine!r} (x86_64 and aarch64 have one)")
    column, audit_arch = ARCHES[machine]
    denied = [nrs[column] for nrs in DENIED.values()]
    if memory_mode == "deny":
        denied += [nrs[column] for nrs in DENY_MODE.values()]
    if protect is not None:
        denied += [nrs[column] for nrs in IPC_OBJECTS.values()]
        denied.append(g.PIDFD_SEND_SIGNAL[column])
    ins = []

    def op(code, k, jt=0, jf=0):
        ins.append(struct.pack("<HBBI", code, jt, jf, k))

    ins.extend(g.arch_check(column, audit_arch))
    rules = g.protect_rules(protect) if protect is not None else []
    # Calls whose arguments decide (ioctl, fcntl: the owner of a descriptor's async I/O signals):
    # each a block of its own, reached by one comparison of the number.
    specials = g.owner_blocks(column, protect) if protect is not None else []
    numbers = sorted(set(n for n in denied if n is not None))
    rest = numbers + [g.CLONE[column], g.CLONE3[column], g.PRLIMIT64[column]] + [nrs[column] for nrs, _, _ in rules]
    # The calls programs make most (read, write, mmap, ... on x86_64) are below every number
    # this filter looks at: allow them after one comparison (and one per special call below
    # them, ioctl on x86_64: two) instead of a walk down the list.
    lowest = min(rest)
    for nr, block in specials:
        if nr < lowest:
            op(g.JEQ, nr, 0, len(block))
            ins.extend(block)
    op(g.JGE, lowest, 1, 0)
    op(g.RET, g.RET_ALLOW)
    for nr, block in specials:
        if nr >= lowest:
            op(g.JEQ, nr, 0, len(block))
            ins.extend(block)
    ins.extend(g.rule_blocks(column, rules))
    for nr in numbers:
        op(g.JEQ, nr, 0, 1)
        op(g.RET, g.RET_ERRNO | EPERM)
    ins.extend(g.prlimit_and_clone(column, CLONE_REFUSED))
    return b"".join(ins)


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


class Prepared:
    """Everything a child needs, made in the supervisor before any fork."""

    def __init__(self, memory_mode):
        lib = libc()
        self.unshare = lib.unshare
        self.prctl = lib.prctl
        self.capset = lib.capset
        self.fresh_ipc = memory_mode != "deny"
        self.memory_mode = memory_mode
        self.code = seccomp_program(os.uname().machine, memory_mode)
        self.fprog = SockFprog(len(self.code) // 8, self.code)
        self.fprog_ref = ctypes.byref(self.fprog)
        self.cap_header = CapHeader(CAPABILITY_VERSION_3, 0)
        self.cap_data = (CapData * 2)()
        self.cap_refs = (ctypes.byref(self.cap_header), ctypes.byref(self.cap_data))
        self.bounding = bounding_set()


def bounding_set():
    """The capabilities in our bounding set (bwrap leaves only the ones it was asked to add)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapBnd:"):
                mask = int(line.split()[1], 16)
                return [cap for cap in range(64) if mask >> cap & 1]
    return []


PREPARED = None


def prepare(memory_mode):
    global PREPARED
    PREPARED = Prepared(memory_mode)


class Filter:
    """A seccomp program ready for ``enter_program`` (the buffers live as long as this object)."""

    def __init__(self, code):
        self.code = code
        self.fprog = SockFprog(len(code) // 8, code)
        self.ref = ctypes.byref(self.fprog)


def protecting(*pids):
    """The filter of a program that no signal of its may reach ``pids`` (a resident judge, the
    candidates' forker), made to be inherited: the forker takes it on (``take_filter``) and every
    candidate it forks has it from birth."""
    p = PREPARED
    return Filter(seccomp_program(os.uname().machine, p.memory_mode, protect=pids))


def take_filter(seccomp):
    """Put ``seccomp`` on this process (the forker), so that every candidate it forks has it.

    Every process that attaches a filter pays for the kernel to translate and compile it, about a
    third of a millisecond for ours (more than the fork itself); children inherit their parent's
    filter for nothing. ``shed_privileges`` has set ``PR_SET_NO_NEW_PRIVS``, which allows it."""
    check(PREPARED.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, seccomp.ref, 0, 0), "seccomp")


def shed_privileges():
    """No capabilities (bounding, ambient, effective, permitted and inheritable sets all empty) and
    ``PR_SET_NO_NEW_PRIVS``. Every program does this (``enter_program``); the forker does it once,
    and every candidate inherits it with nothing of its own to drop: its candidates make no
    namespace (their filter refuses IPC objects instead, see ``seccomp_program``)."""
    p = PREPARED
    prctl = p.prctl
    for cap in p.bounding:
        check(prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "PR_CAPBSET_DROP")
    check(prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "PR_CAP_AMBIENT_CLEAR_ALL")
    check(p.capset(*p.cap_refs), "capset")
    check(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")


def enter_program(seccomp=None):
    """In the forked child: a fresh IPC namespace (where IPC is allowed), no capabilities, the
    seccomp filter (``seccomp``: a ``Filter`` in place of the usual one)."""
    p = PREPARED
    if p.fresh_ipc:
        check(p.unshare(CLONE_NEWIPC), "unshare(CLONE_NEWIPC)")
    shed_privileges()
    check(p.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, p.fprog_ref if seccomp is None else seccomp.ref, 0, 0), "seccomp")


def release_free_heap():
    """Give the malloc heap's free pages back to the kernel (glibc's ``malloc_trim``; elsewhere
    nothing). A fork copies the page-table entry of every resident private page and the child's
    exit unmaps them all: in the candidates' forker a trim leaves about a seventh fewer, and a
    page malloc hands out again later is a fresh zero page, not a copy-on-write fault."""
    trim = getattr(libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)


# -- the scratch mounts ------------------------------------------------------------------------

MOUNTED = set()  # the places where the tmpfs on top is ours (and can be unmounted)


def read_only_proc():
    """A mount namespace of this process's own in which ``/proc`` is read-only: no process of it
    can write another's memory through ``/proc/<pid>/mem`` (open for writing fails with EROFS).
    For an agent task's verifier, whose tests may run the agent's code as the same uid as the
    script that writes the verdict (``ptrace`` and ``process_vm_writev`` are denied anyway). The
    flags a bind remount must keep (nosuid, nodev, noexec) are the mount's own."""
    lib = libc()
    check(lib.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    kept = os.statvfs("/proc").f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC)  # ST_* equal MS_* here
    check(lib.mount(None, b"/proc", None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept, None), "remount /proc read-only")


def own_mount_namespace():
    """Unshare the mount namespace (bwrap's belongs to its outer user namespace, where we cannot
    mount) so that every lease can get fresh tmpfs mounts."""
    lib = libc()
    check(lib.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    lib.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None)  # nothing of ours propagates anywhere


def fresh_tmpfs(path, size_mb, mode):
    """Replace the tmpfs on ``path`` by an empty one: contents and metadata (modes, ACLs, xattrs,
    ownership, special files, mounts below it) all as new."""
    lib = libc()
    target = path.encode()
    if path in MOUNTED:
        check(lib.umount2(target, MNT_DETACH), f"umount2({path})")
        MOUNTED.discard(path)
    # Inodes cost kernel memory that the size cap does not count: bound them too.
    inodes = max(1024, int(size_mb) * 256)
    options = f"size={int(size_mb)}m,nr_inodes={inodes},mode={mode:o},uid={os.getuid()},gid={os.getgid()}".encode()
    # noatime: reading a directory must leave no trace that the next lease could read.
    check(lib.mount(b"tmpfs", target, b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOATIME, options), f"mount({path})")
    MOUNTED.add(path)

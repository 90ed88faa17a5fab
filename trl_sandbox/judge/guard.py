"""Seccomp rules that keep a program's hands off named processes: the judges that outlive one program.

Two judges run programs that must not reach them: the resident function judge (its candidates must
not signal, stop, renice or re-limit the judge or the forker: ``kernel.seccomp_program`` with
``protect``) and the I/O judge (a test of a whole program must not do that to the runner, its warm
interpreter or anything above them: ``guard_program``, sent into the sandbox with the runner's text
and put on the runner itself, so that every process it starts inherits it). One set of rules
serves both. Standard library only (``struct``), Python 3.8+.

A signal reaches a process by these roads, each closed toward the protected pids P:
``kill``/``rt_sigqueueinfo`` to P, to P's process groups or to -1 (everyone); ``tkill``/``tgkill``/
``rt_tgsigqueueinfo`` to P; ``pidfd_send_signal`` (refused outright: it also takes a ``/proc/<pid>``
directory, which a filter cannot tell from another); and descriptor ownership (``owner_blocks``).
Scheduling, nice and I/O priority of P, of P's group or of the user's every process are refused
too, and so are ``prlimit64`` on another process and ``clone`` with ``CLONE_PARENT`` (a process
whose parent is not the one that forked it).
"""

import struct

# seccomp_data: nr (s32) @0, arch (u32) @4, ip @8, args[6] (u64) @16; little-endian on both.
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
LD_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
X32_SYSCALL_BIT = 0x40000000
EPERM, ENOSYS = 1, 38
ARCHES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7), "arm64": (1, 0xC00000B7)}

CLONE_PARENT = 0x00008000
CLONE, CLONE3 = (56, 220), (435, 435)
# prlimit64 on another process needs only the same uid (no ptrace access, so non-dumpable is no
# shield): a program could lower the supervisor's or the judge's limits (descriptors, CPU, address
# space) and break the next program. Allowed on itself (pid 0, what setrlimit() sends) and to read.
PRLIMIT64 = (302, 261)
EVERYONE = 0xFFFFFFFF
PIDFD_SEND_SIGNAL = (424, 424)
# Calls that make a SysV IPC object or a POSIX message queue (x86_64, aarch64): such objects live
# in the IPC namespace, not in a test's files, and would carry state from one test to the next.
IPC_OBJECTS = ((29, 194), (68, 186), (64, 190), (240, 180))  # shmget, msgget, semget, mq_open


def protect_rules(pids):
    """(system call numbers, argument, values refused) for the protected ``pids``."""
    pids = tuple(pids)
    targets = pids + tuple(-pid & 0xFFFFFFFF for pid in pids) + (EVERYONE,)
    return [
        ((62, 129), 0, targets),                         # kill
        ((129, 138), 0, targets),                        # rt_sigqueueinfo
        ((200, 130), 0, pids),                           # tkill
        ((234, 131), 0, pids),                           # tgkill
        ((297, 240), 0, pids),                           # rt_tgsigqueueinfo
        ((141, 140), 0, (2,)),                           # setpriority(PRIO_USER, ...)
        ((141, 140), 1, pids),                           # setpriority(PRIO_PROCESS or PRIO_PGRP, P)
        ((251, 30), 0, (3,)),                            # ioprio_set(IOPRIO_WHO_USER, ...)
        ((251, 30), 1, pids),                            # ioprio_set(IOPRIO_WHO_PROCESS or _PGRP, P)
        ((203, 122), 0, pids),                           # sched_setaffinity
        ((144, 119), 0, pids),                           # sched_setscheduler
        ((142, 118), 0, pids),                           # sched_setparam
        ((314, 274), 0, pids),                           # sched_setattr
    ]


# Descriptor ownership: the kernel sends a descriptor's async I/O signal (SIGIO, or any signal set
# with F_SETSIG, SIGKILL and SIGSTOP included) and SIGURG to its owner, with the credentials of the
# process that set the owner, so the owner is one more way to signal a process. F_SETOWN toward
# the protected pids or their groups is refused like kill(); F_SETOWN_EX and the ioctls FIOSETOWN,
# SIOCSPGRP and TIOCSPGRP pass the owner by pointer, which a filter cannot read, and are refused
# outright (F_SETOWN does all they do, and nothing in Python's standard library uses them).
# Numbers: x86_64, aarch64; the commands are the same on both.
IOCTL, FCNTL = (16, 29), (72, 25)
F_SETOWN, F_SETOWN_EX = 8, 15
OWNER_IOCTLS = (0x8901, 0x8902, 0x5410)  # FIOSETOWN, SIOCSPGRP, TIOCSPGRP


def ins(code, k, jt=0, jf=0):
    return struct.pack("<HBBI", code, jt, jf, k)


def owner_blocks(column, pids):
    """``[(number, instructions)]``: the ioctl and fcntl checks of a candidate's filter. Each block
    is entered only for its call and ends in a verdict; a common command costs its comparisons."""
    n = len(OWNER_IOCTLS)
    ioctl = [ins(LD_ABS, 24)]          # the request, low half
    ioctl += [ins(JEQ, cmd, n - i, 0) for i, cmd in enumerate(OWNER_IOCTLS)]
    ioctl += [ins(RET, RET_ALLOW), ins(RET, RET_ERRNO | EPERM)]
    pids = tuple(pids)
    targets = pids + tuple(-pid & 0xFFFFFFFF for pid in pids) + (EVERYONE,)
    m = len(targets)
    fcntl = [
        ins(LD_ABS, 24),               # the command, low half
        ins(JEQ, F_SETOWN_EX, 3 + m, 0),
        ins(JEQ, F_SETOWN, 0, 1 + m),
        ins(LD_ABS, 32),               # F_SETOWN's pid (a group: negative), low half
    ]
    fcntl += [ins(JEQ, t, m - i, 0) for i, t in enumerate(targets)]
    fcntl += [ins(RET, RET_ALLOW), ins(RET, RET_ERRNO | EPERM)]
    return [(IOCTL[column], ioctl), (FCNTL[column], fcntl)]


def rule_blocks(column, rules):
    """One block per rule: not this call, next block; the argument's low half (pids, "which" and
    priorities are 32 bits) one of the values, EPERM; else on to the next block (a call may have
    two rules), reloading the number."""
    out = []
    for nrs, arg, values in rules:
        out.append(ins(JEQ, nrs[column], 0, len(values) + 3))
        out.append(ins(LD_ABS, 16 + 8 * arg))
        out += [ins(JEQ, value, len(values) - i, 0) for i, value in enumerate(values)]
        out.append(ins(JEQ, 0, 1, 1))  # (always) past the EPERM
        out.append(ins(RET, RET_ERRNO | EPERM))
        out.append(ins(LD_ABS, 0))     # the syscall number again, for the next block
    return out


def prlimit_and_clone(column, refused_flags):
    """The end of a filter: ``prlimit64`` only on itself or to read; ``clone3`` ENOSYS (libc then
    falls back to ``clone``, whose flags a filter can read); ``clone`` with any of
    ``refused_flags`` EPERM; everything else allowed."""
    return [
        ins(JEQ, PRLIMIT64[column], 0, 10),
        ins(LD_ABS, 16),               # prlimit64: pid, low half
        ins(JEQ, 0, 0, 2),
        ins(LD_ABS, 20),               # pid, high half
        ins(JEQ, 0, 4, 0),             # pid 0: ourselves
        ins(LD_ABS, 32),               # new_limit, low half
        ins(JEQ, 0, 0, 3),
        ins(LD_ABS, 36),               # new_limit, high half
        ins(JEQ, 0, 0, 1),             # NULL: only reading another process's limits
        ins(RET, RET_ALLOW),
        ins(RET, RET_ERRNO | EPERM),
        ins(JEQ, CLONE3[column], 0, 1),
        ins(RET, RET_ERRNO | ENOSYS),
        ins(JEQ, CLONE[column], 1, 0),
        ins(RET, RET_ALLOW),
        ins(LD_ABS, 16),               # clone: the low half of the flags
        ins(JSET, refused_flags, 0, 1),
        ins(RET, RET_ERRNO | EPERM),
        ins(RET, RET_ALLOW),
    ]


def arch_check(column, audit_arch):
    """Another architecture's calls (i386 from an x86_64 process) kill; the x32 range is EPERM."""
    out = [ins(LD_ABS, 4), ins(JEQ, audit_arch, 1, 0), ins(RET, RET_KILL_PROCESS), ins(LD_ABS, 0)]
    if column == 0:
        out += [ins(JGE, X32_SYSCALL_BIT, 0, 1), ins(RET, RET_ERRNO | EPERM)]
    return out


def guard_program(machine, pids):
    """A filter of its own (stacked on whatever the process has) that keeps the process and all it
    starts off ``pids``: the roads of the module docstring, and no IPC object (``IPC_OBJECTS``: a
    test would find the one before it left). Raises ``OSError`` on an architecture without one."""
    if machine not in ARCHES:
        raise OSError(EPERM, f"no seccomp filter for the architecture {machine!r} (x86_64 and aarch64 have one)")
    column, audit_arch = ARCHES[machine]
    code = arch_check(column, audit_arch)
    for nr, block in owner_blocks(column, pids):
        code.append(ins(JEQ, nr, 0, len(block)))
        code += block
    code += rule_blocks(column, protect_rules(pids))
    code += [ins(JEQ, PIDFD_SEND_SIGNAL[column], 0, 1), ins(RET, RET_ERRNO | EPERM)]
    for nrs in IPC_OBJECTS:
        code += [ins(JEQ, nrs[column], 0, 1), ins(RET, RET_ERRNO | EPERM)]
    code += prlimit_and_clone(column, CLONE_PARENT)
    return b"".join(code)

"""The sandbox's meter: the CPU time and memory its control group has charged, read from inside.

Why a meter and not /proc: the kernel reaps a child by itself when its parent set ``SIGCHLD`` to
``SIG_IGN`` (or ``SA_NOCLDWAIT``), and then the child's CPU time reaches nobody's rusage; a child
that lives a few milliseconds is never seen in /proc either. A program could hide any amount of
work in such children. And memory a program holds outside its address space (memfd and tmpfs
files, SysV shared memory) is not bounded by ``RLIMIT_AS``. A control group charges both, whatever
the process and however briefly it lived.

The local provider binds the sandbox group's counters read-only at ``METER_DIR`` (a sandbox runs
one exec at a time, so the group's growth during a test is that exec's). Where they are absent
(cgroups off, a remote service), every reader returns None and the callers keep their /proc
accounting alone. Standard library only, Python 3.8+: sent into the sandbox with the judges' text
and the supervisor's package.
"""

import os

METER_DIR = "/run/trl-sandbox-meter"
# cgroup v2 ``cpu.stat`` (``usage_usec N``), v1 ``cpuacct.usage`` (nanoseconds).
METER_CPU_FILES = ("cpu.stat", "cpuacct.usage")
METER_MEMORY_FILE = "memory.stat"
# cgroup v1 keeps kernel memory (socket and pipe buffers, page tables, stacks, slab) apart.
METER_KMEM_FILE = "memory.kmem.usage_in_bytes"
# Memory a program holds: anonymous pages (v2 ``anon``, v1 ``rss``), shared memory (tmpfs, memfd,
# SysV: ``shmem`` in both) and the kernel's memory on its behalf (v2's own lines; v1's kmem file):
# a socket's buffers can hold a gigabyte no address space shows. Page cache of files read
# (libraries, a JVM's modules) is left out: it is charged to whoever touched it first, not to who
# uses it.
METER_MEMORY_KEYS = (b"anon", b"rss", b"shmem", b"total_rss", b"total_shmem")
METER_KERNEL_KEYS = (b"kernel_stack", b"pagetables", b"slab_unreclaimable", b"sock")


def _meter_read(name):
    try:
        fd = os.open(METER_DIR + "/" + name, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 1 << 16)
    except OSError:
        return None
    finally:
        os.close(fd)


def meter_cpu():
    """CPU seconds the sandbox's group has used since it was made, or None without a meter."""
    for name in METER_CPU_FILES:
        text = _meter_read(name)
        if text is None:
            continue
        try:
            if name == "cpu.stat":
                for line in text.splitlines():
                    key, _, value = line.partition(b" ")
                    if key == b"usage_usec":
                        return int(value) / 1e6
                return None
            return int(text) / 1e9
        except ValueError:
            return None
    return None


def meter_memory():
    """Bytes of anonymous and shared memory the sandbox's group holds now, or None without a meter.
    (A v1 group's hierarchical ``total_`` counters when the file has them.)"""
    text = _meter_read(METER_MEMORY_FILE)
    if text is None:
        return None
    found, kernel = {}, 0
    for line in text.splitlines():
        key, _, value = line.partition(b" ")
        if key in METER_MEMORY_KEYS or key in METER_KERNEL_KEYS:
            try:
                found[key] = int(value)
            except ValueError:
                return None
            if key in METER_KERNEL_KEYS:
                kernel += found[key]
    if b"anon" in found:  # v2
        return found[b"anon"] + found.get(b"shmem", 0) + kernel
    kmem = _meter_read(METER_KMEM_FILE)  # v1
    try:
        kernel = int(kmem) if kmem is not None else 0
    except ValueError:
        kernel = 0
    if b"total_rss" in found:
        return found[b"total_rss"] + found.get(b"total_shmem", 0) + kernel
    if b"rss" in found:
        return found[b"rss"] + found.get(b"shmem", 0) + kernel
    return None


try:
    _METER_PAGE = os.sysconf("SC_PAGE_SIZE")
except (ValueError, OSError):
    _METER_PAGE = 4096


def meter_run_delay(pids):
    """Seconds the most delayed thread of ``pids`` has waited, runnable, for a CPU (the kernel's
    ``schedstat``): time other sandboxes took, not the program. 0 where the kernel keeps none."""
    most = 0
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as fh:
                    most = max(most, int(fh.read().split()[1]))
            except (OSError, IndexError, ValueError):
                continue
    return most / 1e9


def meter_own_memory():
    """Bytes of this process's own resident memory (a judge's buffers of a test's output grow it:
    not the test's)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            fields = fh.read().split()
        return (int(fields[1]) - int(fields[2])) * _METER_PAGE
    except (OSError, IndexError, ValueError):
        return 0


class MeterShare:
    """The CPU a part of the sandbox used since this was made: the group's growth less what this
    process (the one keeping the budget: the runner, the judge, PID 1) used meanwhile, by its own
    rusage. Idle helpers' little work counts against the part: reading their times on every
    program cost a short one a tenth. ``used()`` is None without a meter."""

    def __init__(self):
        self.base = meter_cpu()
        self.my_base = _meter_self() if self.base is not None else 0.0

    def used(self):
        if self.base is None:
            return None
        now = meter_cpu()
        if now is None:
            return None
        return max(0.0, now - self.base - max(0.0, _meter_self() - self.my_base))


def _meter_self():
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime

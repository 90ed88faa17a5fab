"""A clean kernel per program: nothing a program makes in the kernel (keys, IPC objects, queues,
shared pages, mounts' metadata) reaches the next program, the next lease or another sandbox; the
calls a program never needs are denied; memory it could pin outside its address space is denied
(or left to a memory cgroup); and the supervisor's own output cannot block it.

Every defence has a positive control: the same attack in a plain process on the host, or inside
the same exec, where it works, so that a test cannot pass because the attack itself is broken.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest

from .local_helpers import local_host

LIMITS = {"memory_mb": 128, "max_processes": 32, "file_size_mb": 8, "output_bytes": 1 << 22}

# ctypes helpers shared by the programs below (they run inside the sandbox and on the host).
PRELUDE = textwrap.dedent("""
    import ctypes, json, os, struct, sys
    libc = ctypes.CDLL(None, use_errno=True)
    X86 = os.uname().machine == 'x86_64'
    NR = {'add_key': 248 if X86 else 217, 'keyctl': 250 if X86 else 219, 'unshare': 272 if X86 else 97,
          'ptrace': 101 if X86 else 117, 'setns': 308 if X86 else 268, 'clone': 56 if X86 else 220,
          'clone3': 435, 'bpf': 321 if X86 else 280, 'perf_event_open': 298 if X86 else 241,
          'userfaultfd': 323 if X86 else 282, 'process_vm_readv': 310 if X86 else 270,
          'mount': 165 if X86 else 40, 'init_module': 175 if X86 else 105}

    def call(name, *args):
        ctypes.set_errno(0)
        r = libc.syscall(NR[name], *args)
        return r if r >= 0 else -ctypes.get_errno()
""")
KEY_SPEC_USER_KEYRING, KEYCTL_SEARCH, KEYCTL_INVALIDATE = -4, 10, 21


@pytest.fixture(scope="module")
def host():
    # Memory mode "deny" (what a sandbox without a memory cgroup gets): test_local_cgroups.py covers
    # the "cgroup" mode, where the group charges what these calls pin.
    with local_host(work_size_mb=16, tmp_size_mb=8, shm_size_mb=4, memory_mode="deny") as h:
        yield h


@pytest.fixture(scope="module")
def box(host):
    return host.create(limits=LIMITS)


@pytest.fixture(scope="module")
def cgroup_box():
    """A sandbox whose filter allows the memory-pinning calls (for a memory cgroup to charge)."""
    with local_host(memory_mode="cgroup") as h:
        yield h.create(limits=LIMITS)


def run(box, source, **kwargs):
    r = box.py(PRELUDE + textwrap.dedent(source), **kwargs)
    assert r.exit_code == 0 and not r.timed_out, r
    return json.loads(r.stdout.splitlines()[-1])


def on_host(source, uid=None):
    """The same program in a plain process on the host (the positive control)."""
    def drop():
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
    r = subprocess.run(["/usr/bin/python3", "-c", PRELUDE + textwrap.dedent(source)], capture_output=True, text=True,
                       timeout=30, preexec_fn=drop, cwd="/")
    assert r.returncode == 0, r
    return json.loads(r.stdout.splitlines()[-1])


# -- keyrings ---------------------------------------------------------------------------------

ADD_KEY = f"""
    print(json.dumps(call('add_key', b'user', b'memory', b'remember me', 11, {KEY_SPEC_USER_KEYRING})))
"""
SEARCH_KEY = f"""
    print(json.dumps(call('keyctl', {KEYCTL_SEARCH}, {KEY_SPEC_USER_KEYRING}, b'user', b'memory', 0)))
"""


def test_keyrings_are_denied_so_no_key_is_memory_across_execs_resets_or_sandboxes(host, box):
    # Control: two plain processes of the host uid every sandbox runs as share one user keyring.
    uid = 65534 if os.geteuid() == 0 else None
    desc = "trl-sandbox-test-" + os.urandom(4).hex()
    key = on_host(ADD_KEY.replace("b'memory'", repr(desc.encode())), uid=uid)
    assert key > 0
    try:
        assert on_host(SEARCH_KEY.replace("b'memory'", repr(desc.encode())), uid=uid) == key
    finally:
        on_host(f"print(json.dumps(call('keyctl', {KEYCTL_INVALIDATE}, {key})))", uid=uid)
    # In a sandbox the calls themselves are refused, so nothing can be planted or found.
    other = host.create(limits=LIMITS)
    assert run(box, ADD_KEY) == -1  # EPERM
    for target in (box, other):
        assert run(target, SEARCH_KEY) == -1
    box.reset()
    assert run(box, SEARCH_KEY) == -1
    # /proc/keys, the list of the host uid's keys, is covered: nothing to read there either.
    r = box.exec(["sh", "-c", "cat /proc/keys 2>/dev/null | wc -l"])
    assert r.stdout.split()[0] == "0" and r.exit_code == 0, r
    other.destroy()


# -- IPC objects and shared pages ---------------------------------------------------------------

MAKE_QUEUES = """
    made = 0
    for i in range(150):
        q = libc.msgget(0x7000 + i, 0o1600)   # IPC_CREAT
        if q >= 0 and libc.msgsnd(q, struct.pack('l', 1) + b'remember', 8, 0) == 0:
            made += 1
    mq = libc.mq_open(b'/memory', os.O_CREAT | os.O_RDWR, 0o600, None)
    sent = libc.mq_send(mq, b'remember', 8, 0) == 0
    listed = open('/proc/sysvipc/msg').read().count('\\n') - 1
    print(json.dumps([made, sent, listed, os.path.exists('/dev/mqueue') or True]))
"""
FIND_QUEUES = """
    found = sum(libc.msgget(0x7000 + i, 0) >= 0 for i in range(150))
    listed = open('/proc/sysvipc/msg').read().count('\\n') - 1
    print(json.dumps([found, listed, libc.mq_open(b'/memory', os.O_RDWR) >= 0]))
"""


def test_message_queues_die_with_their_exec(cgroup_box, box):
    # Control: within one exec they are made, listed and found (msgget is allowed in "cgroup" mode).
    made, sent, listed, _ = run(cgroup_box, MAKE_QUEUES)
    assert (made, sent, listed) == (150, True, 150)
    assert run(cgroup_box, MAKE_QUEUES + FIND_QUEUES) == [150, 150, True]
    # The next exec has a fresh IPC namespace: neither SysV queues nor the POSIX queue are there.
    assert run(cgroup_box, FIND_QUEUES) == [0, 0, False]
    # In "deny" mode (the default) no queue can even be made.
    made, sent, _, _ = run(box, MAKE_QUEUES)
    assert (made, sent) == (0, False)
    assert run(box, FIND_QUEUES) == [0, 0, False]


SHARED_PAGES = """
    import mmap
    pages = []
    for line in open('/proc/self/maps'):
        fields = line.split()
        start, end = (int(x, 16) for x in fields[0].split('-'))
        if fields[1] == 'rw-s' and len(fields) > 5 and fields[5] == '/dev/zero':
            pages.append((start, end - start))
    seen = [ctypes.string_at(a + 1, 15) for a, n in pages]
    mark = sys.argv[1].encode()
    for a, n in pages:
        ctypes.memmove(a + 1, mark, len(mark))
    # Control: the write reads back (the probe works). The program's own forks do not share the
    # page (test_local_hostile.test_a_programs_forks_share_no_page_with_it_across_tests).
    child = [ctypes.string_at(pages[0][0] + 1, len(mark)).decode()] if pages else []
    print(json.dumps([len(pages), [s.rstrip(b'\\0').decode('latin-1') for s in seen], child]))
"""


def test_the_supervisors_shared_page_carries_nothing_to_the_next_program(box):
    mark = "mark-" + os.urandom(4).hex()
    source = PRELUDE + textwrap.dedent(SHARED_PAGES)
    n, seen, child = json.loads(box.exec(["python3", "-c", source, mark]).stdout)
    assert n >= 1 and child == [mark]
    n, seen, child = json.loads(box.exec(["python3", "-c", source, "second"]).stdout)
    assert mark not in seen and seen == [""] * n


# -- memory outside the address space ----------------------------------------------------------

PIN = """
    out = {'shmget': 0, 'shm': 0}
    seg = 32 << 20                    # 8 x 32 MiB: twice the 128 MiB address-space limit
    libc.shmat.restype = ctypes.c_void_p
    for _ in range(8):
        shm = libc.shmget(0, seg, 0o1600)
        if shm < 0:
            out['shmget'] = -ctypes.get_errno()
            break
        addr = libc.shmat(shm, None, 0)
        ctypes.memset(addr, 1, seg)   # populated, then detached: the segment keeps the pages
        libc.shmdt(ctypes.c_void_p(addr))
        out['shm'] += seg >> 20
    fds = []
    try:
        chunk = b'x' * (1 << 20)
        for _ in range(32):           # 32 x 8 MiB (RLIMIT_FSIZE bounds each one, not their sum)
            fds.append(os.memfd_create('pin'))
            for _ in range(8):
                os.write(fds[-1], chunk)
        out['memfd'] = sum(os.fstat(fd).st_size for fd in fds) >> 20
    except OSError as exc:
        out['memfd'] = -exc.errno
    out['listed'] = open('/proc/sysvipc/shm').read().count('\\n') - 1
    print(json.dumps(out))
"""
LEFT = "print(json.dumps(open('/proc/sysvipc/shm').read().count('\\n') - 1))"


def test_shared_memory_and_memfd_beyond_the_address_space_limit(box, cgroup_box):
    # Control: where the calls are allowed, a program pins three times its RLIMIT_AS.
    out = run(cgroup_box, PIN)
    assert out == {"shmget": 0, "shm": 256, "memfd": 256, "listed": 8}, out
    assert run(cgroup_box, LEFT) == 0, "the segments died with their exec's IPC namespace"
    # "deny" (the default): both calls fail with EPERM.
    out = run(box, PIN)
    assert out == {"shmget": -1, "shm": 0, "memfd": -1, "listed": 0}, out
    assert run(box, LEFT) == 0


# -- file-system metadata across reset() ---------------------------------------------------------

POISON = """
    acl = struct.pack('<I', 2) + b''.join(struct.pack('<HHI', tag, 0, 0xFFFFFFFF) for tag in (1, 4, 0x20))
    modes = []
    for d in ('/work', '/tmp', '/dev/shm'):
        os.setxattr(d, 'system.posix_acl_default', acl)     # setfacl -d -m u::---,g::---,o::---
        os.setxattr(d, 'user.planted', b'1')
        open(d + '/probe', 'w').close()
        modes.append(oct(os.stat(d + '/probe').st_mode & 0o777))
        os.unlink(d + '/probe')
    os.mknod('/work/fifo', 0o10666)
    os.chmod('/tmp', 0o700)
    print(json.dumps(modes))
"""
CHECK = """
    out = []
    for d in ('/work', '/tmp', '/dev/shm'):
        open(d + '/new', 'w').close()
        out.append([oct(os.stat(d + '/new').st_mode & 0o777), oct(os.stat(d).st_mode & 0o7777),
                    os.listxattr(d), sorted(os.listdir(d))])
    print(json.dumps(out))
"""


def test_reset_gives_back_pristine_scratch_places(box):
    # Control: the poisoned ACL applies within the lease (every new file gets mode 000).
    assert run(box, POISON) == ["0o0", "0o0", "0o0"]
    box.reset()
    assert run(box, CHECK) == [["0o644", "0o755", [], ["new"]], ["0o644", "0o1777", [], ["new"]],
                               ["0o644", "0o1777", [], ["new"]]]
    box.write("host.txt", "from the host")
    st = box.exec(["stat", "-c", "%a %u", "/work/host.txt"]).stdout
    assert st == "644 1000\n"
    box.reset()


# -- the supervisor's own output ----------------------------------------------------------------

FLOOD = "x = 1\n" + "if x is 1: pass\n" * 20000 + "print('done')\n"


def test_a_compile_warning_flood_reaches_the_program_not_the_supervisor(box):
    fresh = subprocess.run(["/usr/bin/python3", "-"], input=FLOOD, capture_output=True, text=True, timeout=60)
    assert fresh.stderr.count("SyntaxWarning") == 20000  # control: the flood is real
    for argv, setup in ((["python3", "-c", FLOOD], None), (["python3", "flood.py"], "flood.py")):
        if setup:
            box.write(setup, FLOOD)
        r = box.exec(argv, timeout=60)
        assert (r.exit_code, r.stdout, r.timed_out) == (0, "done\n", False), r
        where = "/work/flood.py" if setup else "<string>"
        assert r.stderr.splitlines()[0] == fresh.stderr.splitlines()[0].replace("<stdin>", where)
        assert r.stderr.count("SyntaxWarning") == 20000
        after = box.py("print('next')", timeout=5)
        assert (after.stdout, after.timed_out) == ("next\n", False)
    box.reset()


# -- calls a program never needs -----------------------------------------------------------------

DENIED = {
    "ptrace": "call('ptrace', 0, 0, 0, 0)",                    # PTRACE_TRACEME
    "unshare": "call('unshare', 0x08000000)",                  # CLONE_NEWIPC
    "setns": "call('setns', 0, 0)",
    "bpf": "call('bpf', 0, None, 0)",
    "perf_event_open": "call('perf_event_open', None, 0, -1, -1, 0)",
    "userfaultfd": "call('userfaultfd', 0)",
    "process_vm_readv": "call('process_vm_readv', os.getpid(), None, 0, None, 0, 0)",
    "init_module": "call('init_module', None, 0, b'')",
    "clone3": "call('clone3', None, 0)",
    # Not tried on the host (the control): they would mount on the host or fork a new network.
    "mount": "call('mount', b'none', b'/tmp', b'tmpfs', 0, None)",
    "clone_newnet": "call('clone', 0x40000000 | 17, None, None, None, None)",   # CLONE_NEWNET | SIGCHLD
}


def calls(names):
    return "print(json.dumps({" + ", ".join(f"{n!r}: {DENIED[n]}" for n in names) + "}))"


def test_calls_a_program_never_needs_are_denied(box):
    EPERM, ENOSYS = -1, -38
    out = run(box, calls(DENIED))
    assert out == {**{k: EPERM for k in DENIED}, "clone3": ENOSYS}, out
    # Control: on the host, outside any filter, the same calls are not refused that way.
    control = on_host(calls([n for n in DENIED if n not in ("mount", "clone_newnet")]))
    assert control["ptrace"] == 0 and control["clone3"] != ENOSYS, control
    assert control["unshare"] == (0 if os.geteuid() == 0 else EPERM), control
    # What programs do need still works: processes, threads, pipes, multiprocessing's semaphores.
    r = box.py(textwrap.dedent("""
        import multiprocessing, subprocess, threading
        t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()
        print(subprocess.run(['echo', 'child'], capture_output=True, text=True).stdout.strip())
        with multiprocessing.get_context('fork').Pool(2) as pool:
            print(sum(pool.map(abs, range(-5, 5))))
        print(open('/proc/self/status').read().count('Seccomp:\\t2'))
    """), timeout=30)
    assert r.stdout == "thread\nchild\n25\n1\n", r


OTHER_ABIS = """
    import mmap
    x32 = libc.syscall(39 | 0x40000000)                            # getpid through the x32 ABI
    x32 = x32 if x32 >= 0 else -ctypes.get_errno()
    code = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    code.write(bytes([0xB8, 0x14, 0, 0, 0, 0xCD, 0x80, 0xC3]))   # mov eax, 20 (getpid); int 0x80; ret
    print(json.dumps([x32, os.getpid()]), flush=True)
    i386 = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(code)))()
    print(json.dumps(i386 == os.getpid()))
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the i386 and x32 ABIs exist on x86_64 only")
def test_other_system_call_abis_do_not_get_around_the_filter(box):
    # Control: on the host a 64-bit process can make i386 system calls (int 0x80).
    r = subprocess.run(["/usr/bin/python3", "-c", PRELUDE + textwrap.dedent(OTHER_ABIS)], capture_output=True,
                       text=True, timeout=30)
    assert r.stdout.splitlines()[-1] == "true", r
    # In the sandbox an x32 call is EPERM and an i386 call kills the process (SIGSYS).
    r = box.py(PRELUDE + textwrap.dedent(OTHER_ABIS))
    assert json.loads(r.stdout.splitlines()[0])[0] == -1 and len(r.stdout.splitlines()) == 1, r
    assert r.exit_code == -31 and not r.timed_out, r
    # Programs started by execve run under the same filter.
    assert box.exec(["grep", "Seccomp:", "/proc/self/status"]).stdout == "Seccomp:\t2\n"


INODES = """
    import sys
    for _ in range(int(sys.argv[1])):                        # unnamed files: no entry, no mtime
        os.close(os.open('/tmp', os.O_TMPFILE | os.O_RDWR, 0o600))
    open('/tmp/new' + sys.argv[1], 'x').close()
    print(json.dumps(os.stat('/tmp/new' + sys.argv[1]).st_ino))
"""


def test_reset_leaves_no_trace_in_the_inode_counter(box):
    source = PRELUDE + textwrap.dedent(INODES)
    box.reset()
    first = json.loads(box.exec(["python3", "-c", source, "0"]).stdout)
    # Control: within a lease, unnamed files move the inode numbers of the next file.
    assert json.loads(box.exec(["python3", "-c", source, "50"]).stdout) >= first + 51
    box.reset()
    assert json.loads(box.exec(["python3", "-c", source, "0"]).stdout) == first
    box.reset()


PRLIMIT = """
    import resource
    out = {}
    for name, pid in TARGETS:
        try:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (4, 4))
            out[name] = "set"
        except OSError as exc:
            out[name] = exc.errno
    out["read"] = list(resource.prlimit(TARGETS[0][1], resource.RLIMIT_NOFILE))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))           # its own limits: allowed
    out["own"] = list(resource.getrlimit(resource.RLIMIT_NOFILE))
    print(json.dumps(out))
"""


def test_a_program_cannot_lower_another_processes_limits(box):
    # prlimit64 asks only for the same uid: a program could set the supervisor's descriptor limit
    # to 4 and break the next program (an infrastructure error charged to someone else's sample).
    out = run(box, PRLIMIT.replace("TARGETS", '[("init", 1), ("parent", os.getppid())]'))
    assert out["init"] == 1 and out["parent"] == 1, out  # EPERM
    assert out["read"][0] > 4 and out["own"] == [64, 64], out
    assert box.py("print(len(open('/proc/self/status').read()) > 0)").stdout == "True\n"
    # Control: on the host, outside the filter, the same call on a same-uid process works.
    child = subprocess.Popen(["sleep", "30"])
    try:
        control = on_host(PRLIMIT.replace("TARGETS", f'[("other", {child.pid})]'))
        assert control["other"] == "set" and control["read"] == [4, 4], control
    finally:
        child.kill()
        child.wait()

"""The local sandbox's judge stays resident across programs (one fork per judged program), and is
as out of reach as a fresh judge per program: no signal, limit or scheduling change from a
candidate reaches it, nothing a candidate leaves behind survives its exec, and no candidate can
find in its memory what the judge saw of earlier programs (tests, nonces).

Every attack has a positive control: the same code against a process the candidate owns, where
it works, or the same secret where it must be found.
"""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import textwrap
import time

import pytest

from trl_sandbox.judge.verdict import (
    build_program,
    call_spec,
    check_outcome,
    check_spec,
    parse_verdict,
    plain_loads,
)

from .local_helpers import local_host

SQUARE = "def f(x):\n    return x * x\n"
SQUARE_TESTS = check_spec(["assert f(2) == 4", "assert f(3) == 9"], bind=["f"])


def judged(box, source, spec, limit_s=2.0):
    program = build_program(source, spec, limit_s=limit_s)
    nonce = os.urandom(16)
    result = box.exec(list(program.argv), stdin=nonce + program.stdin, timeout=program.timeout)
    return result, nonce


def returned(box, source, limit_s=5.0):
    """What the candidate's ``f(0)`` returned (call mode), decoded as the host decodes it."""
    result, nonce = judged(box, source, call_spec("f", [0]), limit_s=limit_s)
    verdict = parse_verdict(result, nonce)
    assert verdict is not None and verdict.loaded, result
    test = verdict.tests[0]
    assert test["ok"], (test, result)
    return plain_loads(base64.b64decode(test["value"]))


def others(box):
    """Host pids of the sandbox's processes but its supervisor."""
    return sorted(set(box.namespace_members()) - {box.supervisor_pid()})


def resident(box):
    """``(judge, forker)``: what stays in a sandbox between judged programs, with the forker's
    next candidate, set up and waiting (``waiting_candidate``). The judge goes by its own name;
    neither holds a capability."""
    procs = settled(box)
    rest = [pid for pid in procs if parent_of(pid) == box.supervisor_pid()]
    assert len(rest) == 2, procs
    judge = [pid for pid in rest if name_of(pid) == "trl-judge"]
    assert len(judge) == 1, procs
    (forker,) = set(rest) - set(judge)
    return judge[0], forker


def waiting_candidate(box):
    """The forker's next candidate (it forks one after each judged exec that left nothing)."""
    _, forker = resident(box)
    (pid,) = [pid for pid in settled(box) if parent_of(pid) == forker]
    return pid


def settled(box):
    """The sandbox's processes once the waiting candidate, forked after the exec's answer, is
    there (or after a moment: none comes after an exec that ended the judge)."""
    deadline = time.monotonic() + 2
    procs = others(box)
    while len(procs) < 3 and time.monotonic() < deadline:
        time.sleep(0.005)
        procs = others(box)
    return procs


def parent_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def name_of(pid):
    with open(f"/proc/{pid}/comm") as f:
        return f.read().strip()


def capabilities_of(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))


def state_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def assert_square_passes(box):
    result, nonce = judged(box, SQUARE, SQUARE_TESTS)
    outcome = check_outcome(result, nonce, 2)
    assert outcome.status == "passed", (outcome, result)


@pytest.fixture(scope="module")
def host():
    with local_host() as h:
        yield h


@pytest.fixture
def box(host):
    b = host.create()
    yield b
    b.destroy()


def test_one_judge_serves_program_after_program(box):
    assert_square_passes(box)
    both = resident(box)  # the judge and the candidates' forker, resident; the candidate is gone
    for _ in range(5):
        assert_square_passes(box)
        assert resident(box) == both
    wrong, nonce = judged(box, "def f(x):\n    return x + x\n", SQUARE_TESTS)
    assert check_outcome(wrong, nonce, 2).status == "failed"
    waiting_candidate(box)  # forked after the answer: there before the control counts the host's
    # Control: with the resident judge switched off, every program has a judge of its own.
    with local_host(resident_judge="false") as h:
        fresh = h.create()
        assert_square_passes(fresh)
        assert others(fresh) == []


ATTACKS = r'''
import ctypes, json, os, resource, signal, time
libc = ctypes.CDLL(None, use_errno=True)
X86 = os.uname().machine == "x86_64"
NR = {"tkill": 200 if X86 else 130, "tgkill": 234 if X86 else 131, "rt_sigqueueinfo": 129 if X86 else 138,
      "pidfd_open": 434, "pidfd_send_signal": 424, "ioprio_set": 251 if X86 else 30}

def call(name, *args):
    ctypes.set_errno(0)
    r = libc.syscall(NR[name], *args)
    return "ok" if r >= 0 else os.strerror(ctypes.get_errno())

def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as exc:
        return exc.strerror

def attacks(target, stop=signal.SIGSTOP):
    siginfo = ctypes.create_string_buffer(128)
    siginfo[0:4] = int(stop).to_bytes(4, "little")
    siginfo[8:12] = (-1).to_bytes(4, "little", signed=True)  # si_code SI_QUEUE, as sigqueue() sends
    out = {
        "kill": attempt(lambda: os.kill(target, stop)),
        "killpg": attempt(lambda: os.killpg(target, stop)),
        "tkill": call("tkill", target, stop),
        "tgkill": call("tgkill", target, target, stop),
        "rt_sigqueueinfo": call("rt_sigqueueinfo", target, stop, siginfo),
        "prlimit": attempt(lambda: resource.prlimit(target, resource.RLIMIT_NOFILE, (4, 4))),
        "affinity": attempt(lambda: os.sched_setaffinity(target, {0})),
        "nice": attempt(lambda: os.setpriority(os.PRIO_PROCESS, target, 19)),
        "ioprio": call("ioprio_set", 1, target, (3 << 13)),
        "mem": attempt(lambda: open("/proc/%d/mem" % target, "rb").close()),
        "fds": attempt(lambda: os.listdir("/proc/%d/fd" % target)),
    }
    fd = libc.syscall(NR["pidfd_open"], target, 0)
    out["pidfd_send_signal"] = call("pidfd_send_signal", fd, stop, None, 0) if fd >= 0 else "no pidfd"
    return out

def f(x):
    me = os.getpid()
    judge = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]
    ready_r, ready_w = os.pipe()
    victim = os.fork()
    if victim == 0:
        os.setsid()  # a group and session of its own, as the judge has
        libc.prctl(4, 1, 0, 0, 0)  # dumpable (the candidate is not): /proc/PID/{fd,mem} are open
        os.write(ready_w, b"x")
        time.sleep(30)
        os._exit(0)
    os.read(ready_r, 1)
    control = attacks(victim)
    os.kill(victim, signal.SIGKILL)
    os.waitpid(victim, 0)
    hit = {str(pid): attacks(pid) for pid in judge}
    everyone = attempt(lambda: os.kill(-1, signal.SIGSTOP))
    group = attempt(lambda: (os.setpgid(0, judge[0]), os.kill(0, signal.SIGSTOP)))
    return json.dumps({"control": control, "judge": hit, "everyone": everyone, "group": group})
'''


def test_every_candidate_draws_its_own_random_numbers(box):
    """Candidates are forks of one forker: each must still start from a freshly seeded ``random``,
    as a program started on its own does."""
    source = "import random\ndef f(x):\n    random.seed(x) if x else None\n    return random.getrandbits(64)\n"
    drawn = [returned(box, source) for _ in range(4)]
    assert len(set(drawn)) == 4, drawn
    # Control: the value is the generator's (a seeded one gives the host's number).
    seeded, nonce = judged(box, source, call_spec("f", [7]))
    test = parse_verdict(seeded, nonce).tests[0]
    assert plain_loads(base64.b64decode(test["value"])) == random.Random(7).getrandbits(64)


WARMTH = r'''
import socket, sys
def quickened(code):  # CPython 3.11+: the interpreter rewrote it in place (warm-up done, caches in use)
    return code._co_code_adaptive != code.co_code
def f(x):
    serving = sys._getframe(1).f_code
    def fresh(y):
        return y
    fresh(1)
    return [serving.co_name, quickened(serving), quickened(socket.recv_fds.__code__), quickened(fresh.__code__)]
'''


def test_a_candidate_finds_the_code_it_runs_warmed_up_by_the_fork_server(box):
    """The fork server runs a candidate's serving and receiving code on made-up data before any
    fork, so that no candidate writes that code's warm-up into its own pages (a fault each)."""
    name, serving, receiving, fresh = returned(box, WARMTH)
    assert name == "_serve_requests"
    assert serving is True and receiving is True
    assert fresh is False  # control: code run once in the candidate is not


def test_a_candidate_cannot_reach_the_resident_judge(box):
    assert_square_passes(box)
    both = resident(box)
    out = json.loads(returned(box, ATTACKS))
    # Control: the same calls on a process the candidate started itself work, but prlimit on
    # another process, which no program may do (test_local_kernel.py).
    control = out["control"]
    assert control["prlimit"] == "Operation not permitted", control
    for name in ("kill", "killpg", "tkill", "tgkill", "rt_sigqueueinfo", "affinity", "nice", "ioprio", "mem", "fds"):
        assert control[name] == "ok", (name, control)
    # pidfd_send_signal cannot tell its target from a descriptor: a candidate may not use it at all.
    assert control["pidfd_send_signal"] == "Operation not permitted", control
    assert len(out["judge"]) == 2, out["judge"]  # the candidate saw both, and could reach neither
    for hit in out["judge"].values():  # the judge and the forker
        assert [k for k, v in hit.items() if v == "ok"] == [], hit
    assert out["everyone"] != "ok" and out["group"] != "ok", out
    # The judge and the forker are the same processes, running (not stopped), and still judge right.
    assert resident(box) == both and all(state_of(pid) in "RS" for pid in both), [state_of(p) for p in both]
    assert_square_passes(box)
    assert resident(box) == both
    # Control: a plain program may use pidfd_send_signal.
    plain = box.py(ATTACKS + "\nchild = os.fork()\nif child == 0:\n    time.sleep(30)\n"
                   "print(json.dumps(attacks(child, signal.SIGKILL)['pidfd_send_signal']))")
    assert plain.stdout == '"ok"\n', plain


DAEMON = """
import os, time
def f(x):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            while True:
                time.sleep(0.01)
        os._exit(0)
    time.sleep(0.05)
    return 1
"""


def test_what_a_candidate_leaves_behind_is_gone_with_its_exec(box):
    assert_square_passes(box)
    judge, _ = resident(box)
    assert returned(box, DAEMON) == 1
    # The daemon was killed, and with it the judge: the next judged program starts a fresh one.
    assert others(box) == []
    assert_square_passes(box)
    fresh, _ = resident(box)
    assert fresh != judge
    # Control: the same daemon in a plain exec does start (the sweep after it is what ends it).
    r = box.py("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(30)\nprint(len([p for p in os.listdir('/proc') if p.isdigit()]))")
    assert int(r.stdout) >= 2, r


SECRET_TESTS = check_spec(["assert f(2) == 4  # the hidden test SECRET-" + "a1b2c3d4e5"], bind=["f"])
SCAN = r"""
import os, re
# Patterns that match the secret (and a string of the candidate's own) without holding either
# whole: the scan must not find its own needle.
SECRET = re.compile(rb"hidden test SECRET-a1b2c3d4e[5]")
OWN = re.compile(rb"CANDIDATE-f6e5d4c3b[2]")
alive = "".join(["CANDIDATE-", "f6e5d4c3b2"])   # made at run time: in this process's memory

def scan(pattern):
    hits = 0
    with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
        for line in maps:
            fields = line.split()
            if "r" not in fields[1] or (len(fields) > 5 and fields[5] in ("[vvar]", "[vsyscall]")):
                continue
            lo, hi = (int(v, 16) for v in fields[0].split("-"))
            try:
                mem.seek(lo)
                hits += len(pattern.findall(mem.read(hi - lo)))
            except (OSError, OverflowError, ValueError):
                pass
    return hits

def f(x):
    import ctypes
    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # dumpable: /proc/self/mem is open to its owner
    return [scan(SECRET), scan(OWN) > 0]
"""


def test_no_candidate_finds_what_the_judge_saw_of_earlier_programs(box):
    for _ in range(3):  # the judge has run this test three times, and holds it in its memory
        result, nonce = judged(box, SQUARE, SECRET_TESTS)
        assert check_outcome(result, nonce, 1).status == "passed"
    resident(box)
    secret_hits, control = returned(box, SCAN)
    assert control is True  # the scan finds what is in the candidate's memory
    assert secret_hits == 0
    # Control: the same text in the candidate's own source (so in its memory) is found.
    hits, _ = returned(box, SCAN + "\n# the hidden test SECRET-a1b2c3d4e5\n")
    assert hits > 0


def test_the_judge_outlives_a_reset_and_not_a_plain_exec(box):
    assert_square_passes(box)
    first = resident(box)
    box.write("left.txt", "from the last lease")
    box.reset()  # a pool resets between leases: the judge stays, the scratch places are new
    assert resident(box) == first
    assert box.py("import os; print(os.listdir('.'))").stdout == "[]\n"
    assert others(box) == []  # a plain exec ends with a sweep: the judge goes with it
    assert_square_passes(box)
    second = resident(box)
    assert second[0] != first[0] and second[1] != first[1]
    # A candidate works in the fresh scratch place (the judge's own directory is /).
    files = returned(box, "import os\ndef f(x):\n    open('mine.txt', 'w').close()\n    return [os.getcwd(), os.listdir('.')]\n")
    assert files == ["/work", ["mine.txt"]], files
    box.reset()
    assert resident(box) == second
    assert returned(box, "import os\ndef f(x):\n    return os.listdir('.')\n") == []


BURN_IN_JUDGE = check_spec(["x = sum(range(6_000_000))\nassert f(2) == 4"], bind=["f"])
SLEEPER = "import time\ndef f(x):\n    time.sleep(1.2)\n    return x * x\n"


def test_the_exec_budget_leaves_out_what_the_judge_spent_before(box):
    # The judge spends CPU on earlier programs' tests (their own budgets count it); a later program
    # whose own CPU is small passes even when its wall time runs past the exec's CPU budget.
    spent = 0.0
    while spent < 2.0:
        result, nonce = judged(box, SQUARE, BURN_IN_JUDGE, limit_s=5.0)
        assert check_outcome(result, nonce, 1).status == "passed", result
        judge, _ = resident(box)
        with open(f"/proc/{judge}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        spent = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    started = time.monotonic()
    result, nonce = judged(box, SLEEPER, SQUARE_TESTS, limit_s=0.5)  # the exec's budget: 1.5 CPU s
    assert check_outcome(result, nonce, 2).status == "passed", result
    assert time.monotonic() - started >= 1.2
    # Control: a candidate that spins is still ended by its budget.
    result, nonce = judged(box, "def f(x):\n    while True:\n        pass\n", SQUARE_TESTS, limit_s=0.5)
    assert check_outcome(result, nonce, 2).status == "timeout", result
    assert_square_passes(box)


IPC = textwrap.dedent("""
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    def made(call, *args):
        ctypes.set_errno(0)
        r = call(*args)
        return r if r >= 0 else -ctypes.get_errno()
    def objects():
        return sum(len(open(f"/proc/sysvipc/{k}").read().splitlines()) - 1 for k in ("shm", "msg", "sem"))
    def f(x):
        libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        return {"shm": made(libc.shmget, 0x5eed, 4096, 0o1600), "msg": made(libc.msgget, 0x5eee, 0o1600),
                "sem": made(libc.semget, 0x5eef, 1, 0o1600),
                "mq": made(libc.mq_open, b"/trl-sandbox-mq", os.O_CREAT | os.O_RDWR, 0o600, None),
                "seen": objects()}
""")


def test_candidates_make_no_ipc_objects_in_any_memory_mode():
    """A judged candidate shares the sandbox's IPC namespace instead of making one of its own (which
    cost a tenth of a millisecond and more per program), so its filter refuses every call that makes
    a SysV IPC object or a POSIX message queue, also in memory mode "cgroup", where plain programs
    may make them (each in an IPC namespace of its own that dies with its exec)."""
    EPERM = -1
    with local_host(memory_mode="cgroup") as h:
        b = h.create()
        refused = {"shm": EPERM, "msg": EPERM, "sem": EPERM, "mq": EPERM, "seen": 0}
        assert returned(b, IPC) == refused
        # Control: a plain program in the same sandbox makes all four, and sees its own objects.
        plain = json.loads(b.py(IPC + "import json\nprint(json.dumps(f(0)))").stdout)
        assert min(plain["shm"], plain["msg"], plain["sem"], plain["mq"]) >= 0 and plain["seen"] == 3, plain
        assert returned(b, IPC) == refused  # and none of them reaches the next candidate


KERNEL_STATE = r'''
import json, os, resource
def state():
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
    limits = {name: resource.getrlimit(getattr(resource, name))
              for name in ("RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_FSIZE")}
    return {
        "caps": [status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")],
        "no_new_privs": status["NoNewPrivs"].strip(), "seccomp": status["Seccomp"].strip(),
        "own_group": os.getpgrp() == os.getpid(), "oom_score_adj": open("/proc/self/oom_score_adj").read().strip(),
        "ipc": os.readlink("/proc/self/ns/ipc"), "limits": limits, "fds": sorted(os.listdir("/proc/self/fd")),
    }
def f(x):
    return json.dumps(dict(state(), parent=os.getppid()))
'''


def test_candidates_come_from_the_forker_with_the_clean_kernel_of_any_program():
    """The forker, not PID 1, forks every candidate (so PID 1 shares no page with one), and what
    the forker set up once for all of them leaves each with the clean kernel of any program."""
    with local_host(memory_mode="cgroup") as h:
        box = h.create()
        first = json.loads(returned(box, KERNEL_STATE))
        _, forker = resident(box)
        second = json.loads(returned(box, KERNEL_STATE))
        assert capabilities_of(forker) == 0  # it holds nothing: its candidates make no namespace
        plain = json.loads(box.py(KERNEL_STATE + "import sys\nsys.stdout.write(f(0))").stdout)
        assert first["parent"] == second["parent"] != 1  # the resident forker
        assert plain["parent"] == 1  # (control: a plain program is PID 1's)
        for candidate in (first, second):  # and they have what any program has
            assert candidate["caps"] == ["0000000000000000"] * 5, candidate
            for key in ("caps", "no_new_privs", "seccomp", "own_group", "oom_score_adj", "limits"):
                assert candidate[key] == plain[key], (key, candidate[key], plain[key])
            # Only its request and response pipes beyond the standard three (the forker's socket
            # is gone); /proc/self/fd lists the descriptor that lists it, too.
            assert len(candidate["fds"]) == 6, candidate["fds"]
        # Candidates share the sandbox's IPC namespace, where nothing can be made (the test above);
        # a plain program in memory mode "cgroup" gets one of its own.
        assert first["ipc"] == second["ipc"] != plain["ipc"]


def test_a_plain_program_is_its_own_process_group_from_its_first_statement():
    """The forked interpreter puts itself in its own group before it runs anything (its parent
    does too, after the fork, and may come late: then the program's first children would stay in
    PID 1's group, out of reach of the group's kill). 300 programs, the group read first thing."""
    with local_host() as h:
        box = h.create()
        seen = [box.py("import os\nprint(os.getpgrp() == os.getpid())").stdout for _ in range(300)]
    assert seen == ["True\n"] * 300


UNSHARES = r'''
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
def unshare(flags):
    ctypes.set_errno(0)
    r = libc.syscall(272 if os.uname().machine == "x86_64" else 97, ctypes.c_ulong(flags))
    return r if r >= 0 else -ctypes.get_errno()
def tries():
    filters = [line.split()[-1] for line in open("/proc/self/status") if line.startswith("Seccomp_filters:")]
    return {"ipc": unshare(0x08000000), "ipc_and_high_bits": unshare(0x08000000 | 1 << 32),
            "user": unshare(0x10000000), "user_and_ipc": unshare(0x18000000), "mounts": unshare(0x00020000),
            "filters": filters, "dumpable": libc.prctl(3, 0, 0, 0, 0)}  # PR_GET_DUMPABLE
def f(x):
    return json.dumps(tries())
'''


def seccomp_of(pid):
    with open(f"/proc/{pid}/status") as f:
        return {k: v.strip() for k, v in (line.split(":", 1) for line in f) if k in ("Seccomp", "Seccomp_filters")}


def test_candidates_inherit_the_forkers_filter_and_make_no_namespace():
    """The forker wears its candidates' filter (a candidate inherits it instead of paying to attach
    its own) and holds no capability: no candidate can make a namespace of any kind."""
    import subprocess

    with local_host(memory_mode="cgroup") as h:
        box = h.create()
        tried = json.loads(returned(box, UNSHARES))
        EPERM = -1
        assert tried["dumpable"] == 0  # inherited from the forker: /proc/<pid>/mem and fd are root's
        assert {k: v for k, v in tried.items() if k not in ("filters", "dumpable")} == {
            "ipc": EPERM, "ipc_and_high_bits": EPERM, "user": EPERM, "user_and_ipc": EPERM, "mounts": EPERM}, tried
        assert tried["filters"] in ([], ["1"]), tried  # one filter, the forker's (older kernels: no line)
        judge, forker = resident(box)
        assert seccomp_of(forker)["Seccomp"] == "2" and seccomp_of(judge)["Seccomp"] == "2"
        assert capabilities_of(forker) == 0
        # Control: the same calls in a plain process on the host, outside any filter.
        host = subprocess.run(["/usr/bin/python3", "-c", UNSHARES + "print(f(0))"], capture_output=True,
                              text=True, timeout=30)
        control = json.loads(host.stdout)
        if os.geteuid() == 0:
            assert control["ipc"] == control["user"] == control["mounts"] == 0, control
        assert control["ipc_and_high_bits"] == -22, control  # EINVAL from the kernel, not EPERM
        assert control["dumpable"] == 1
        plain = box.py("import ctypes; print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))")
        assert plain.stdout == "1\n", plain  # a plain program in the sandbox is dumpable, as after execve


def ns_pid_of(pid):
    """A host pid's number inside the sandbox's pid namespace."""
    with open(f"/proc/{pid}/status") as f:
        return int(next(line.split()[-1] for line in f if line.startswith("NSpid:")))


SEEN = (
    "import os, time\n"
    "def f(x):\n"
    "    if x and os.fork() == 0:\n"
    "        time.sleep(5)\n"
    "        os._exit(0)\n"
    "    return [os.getpid(), sorted(int(p) for p in os.listdir('/proc') if p.isdigit())]\n"
)


def test_the_next_candidate_waits_ready_and_no_program_ever_sees_one():
    """After a judged exec that left nothing, the forker forks the next program's candidate, which
    sets itself up and waits; the next judged program runs in it (a reset between leases keeps
    it). It is forked only once the exec has ended, so no program process sees one waiting."""
    with local_host() as h:
        box = h.create()
        assert_square_passes(box)
        judge, forker = resident(box)
        inside = [1, ns_pid_of(judge), ns_pid_of(forker)]
        for _ in range(3):
            waiting = waiting_candidate(box)
            assert state_of(waiting) == "S" and capabilities_of(waiting) == 0  # set up, blocked
            box.reset()
            assert waiting_candidate(box) == waiting
            expected = ns_pid_of(waiting)
            me, seen = returned(box, SEEN)
            assert me == expected  # the program ran in the candidate that waited
            assert seen == sorted(inside + [me])  # and saw no other process
            assert resident(box) == (judge, forker)
        # Control: a process that comes while the program runs (its own child here) is seen.
        result, nonce = judged(box, SEEN, call_spec("f", [1]))
        verdict = parse_verdict(result, nonce)
        me, seen = plain_loads(base64.b64decode(verdict.tests[0]["value"]))
        assert len(seen) == 5 and set(inside + [me]) < set(seen), seen


def test_a_plain_program_never_shares_the_sandbox_with_the_judge():
    """A plain exec ends the judge, its forker and the waiting candidate before it runs (its sweep
    would end them after it anyway): no plain program can stop or slow them for a later lease."""
    with local_host() as h:
        box = h.create()
        assert_square_passes(box)
        waiting_candidate(box)
        plain = box.py("import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()) == [1, os.getpid()])")
        assert plain.stdout == "True\n", plain
        assert_square_passes(box)  # the next judged program starts them afresh
        resident(box)
        # Control: a process that is there while the plain program runs (its own child) is seen.
        plain = box.py("import os, time\nif os.fork() == 0:\n    time.sleep(5)\n    os._exit(0)\n"
                       "print(len([p for p in os.listdir('/proc') if p.isdigit()]))")
        assert plain.stdout == "3\n", plain


@pytest.mark.parametrize("victim", ["judge", "forker", "waiting candidate"])
def test_a_helper_that_died_between_programs_is_replaced_unseen(victim):
    """The judge, the forker or the waiting candidate killed between two judged programs (by the
    OOM killer, say): the next program is judged as if nothing happened."""
    with local_host() as h:
        box = h.create()
        assert_square_passes(box)
        judge, forker = resident(box)
        pid = {"judge": judge, "forker": forker, "waiting candidate": waiting_candidate(box)}[victim]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while state_of(pid) != "Z" and time.monotonic() < deadline:  # dead, not yet reaped
            time.sleep(0.002)
        assert state_of(pid) == "Z"
        assert_square_passes(box)
        now = resident(box)
        assert (now == (judge, forker)) == (victim == "waiting candidate"), (victim, now)

"""Nothing a judged program does reaches the resident judge, its forker or a later program, and
nothing it starts escapes its time budget or the OOM killer's order: hostile completions scored
through the public ``Scorer`` on the local provider, each with a control.

* A process made with ``CLONE_PARENT`` (a child of the forker, not of the candidate) used to be
  taken for the forker's waiting candidate and kill every later candidate of its sandbox.
* Work done in processes that leave the candidate's session and are orphaned (reparented to PID
  1) used to escape the judge's clock.
* File-descriptor ownership for asynchronous I/O (``F_SETOWN`` + ``F_SETSIG``) used to let a
  candidate have the kernel send SIGKILL to the judge (a wrong answer became ``infra``) or SIGSTOP
  to the forker (the exec ran into its wall backstop and kept its wrong answer's score).
* ``oom_score_adj`` was never written (the write failed, silently): every process kept 0.
"""

from __future__ import annotations

import os

import pytest

from trl_sandbox.tasks.builtin import TASKS
from trl_sandbox.tasks.generic import tasks_from_dict

from .local_helpers import local_host
from .test_resident_judge import parent_of, resident, settled

KADANE = """
def max_subarray_sum(xs):
    best = cur = xs[0]
    for x in xs[1:]:
        cur = max(x, cur + x)
        best = max(best, cur)
    return best
"""
WRONG = """
def max_subarray_sum(xs):
    return 0
"""
ENTRY = {**TASKS["max_subarray"], "tests": ["[-2, 1, -3, 4, -1, 2, 1, -5, 4]"]}


def task(timeout=2.0):
    return tasks_from_dict({"max_subarray": {**ENTRY, "timeout": timeout}}, extract="raw")[0]


def honest(i):
    """An honest completion, distinct per ``i`` (nothing is shared through the result cache)."""
    return f"# honest {i}\n" + KADANE


@pytest.fixture
def scorer():
    """A fresh pool of one sandbox per test: what one attack leaves cannot explain the next's result."""
    from trl_sandbox.pool.sandbox_pool import SandboxPool
    from trl_sandbox.scoring.scorer import Scorer

    with SandboxPool.open("local", size=1) as pool:
        yield Scorer(pool, cache_size=0)


# -- 1. a process that is not the candidate's child -----------------------------------------------

KILLER = """
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
CLONE = 56 if os.uname().machine == "x86_64" else 220
pid = libc.syscall(CLONE, {flags}, 0, 0, 0, 0)  # a raw clone: the child goes on here, as after fork()
if pid == 0:
    os.closerange(0, 1024)
    me = os.getpid()
    end = time.monotonic() + 30
    while time.monotonic() < end:  # kill every process that can be killed, again and again
        for p in os.listdir("/proc"):
            if p.isdigit() and int(p) not in (1, me):
                try:
                    os.kill(int(p), 9)
                except OSError:
                    pass
        time.sleep(0.002)
    os._exit(0)
time.sleep(0.2)
"""


def test_a_clone_parent_child_outlives_nothing(scorer):
    """``clone(CLONE_PARENT)`` is refused, and whatever is not the judge, the forker or the one
    waiting candidate they made is killed after the exec: the honest completions after it pass."""
    hostile = KILLER.format(flags=0x8000 | 17) + KADANE  # CLONE_PARENT | SIGCHLD
    (first,) = scorer.score([hostile], [task()])
    assert first.status in ("passed", "error"), first
    later = scorer.score([honest(i) for i in range(3)], [task()] * 3)
    assert [o.status for o in later] == ["passed"] * 3, later
    # Control: the killer works where it runs, as an ordinary child: it kills its own candidate.
    (own,) = scorer.score([KILLER.format(flags=17) + "\n# own child\n" + KADANE], [task()])
    assert own.status == "error", own
    assert [o.status for o in scorer.score([honest(9)], [task()])] == ["passed"]


# -- 2. CPU work in orphaned processes --------------------------------------------------------------

WORKERS = """
import os, pickle, time
def _work(seconds):  # CPU seconds of this process, however fast the machine is
    w = 0
    while time.process_time() < seconds:
        for i in range(10000):
            w += i
    return w
def _spawn(n, detach):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        if detach:  # leave the session and the family: the grandchild is orphaned to PID 1
            os.setsid()
            if os.fork():
                os._exit(0)
        os.close(r)
        os.write(w, pickle.dumps(_work(n)))
        os._exit(0)
    os.close(w)
    if detach:
        os.waitpid(pid, 0)
    return r, pid
def max_subarray_sum(xs):
    jobs = [_spawn({n}, {detach}) for _ in range({workers})]
    for r, pid in jobs:
        while os.read(r, 65536):
            pass
        if not {detach}:
            os.waitpid(pid, 0)
    best = cur = xs[0]
    for x in xs[1:]:
        cur = max(x, cur + x)
        best = max(best, cur)
    return best
"""


def test_work_in_orphaned_processes_counts_against_the_budget(scorer):
    """Two orphaned workers of 0.8 s each on a 1 s budget time out, and so do two ordinary children
    doing the same work side by side on two cores (the budget is read early enough that extra
    cores buy nothing). Controls: one ordinary child doing all of it times out, as it always did;
    one doing 0.4 s still passes."""
    orphaned = WORKERS.format(n=0.8, detach=True, workers=2)
    side_by_side = WORKERS.format(n=0.8, detach=False, workers=2)
    one_child = WORKERS.format(n=1.6, detach=False, workers=1)
    near = WORKERS.format(n=0.4, detach=False, workers=1)
    outcomes = scorer.score([orphaned, side_by_side, one_child, near], [task(1.0)] * 4)
    assert [o.status for o in outcomes] == ["timeout", "timeout", "timeout", "passed"], outcomes
    assert outcomes[0].reward == -1.0


def test_orphaned_work_counts_against_a_judge_that_runs_as_a_plain_exec():
    """The same with ``resident_judge=false`` (a judge process per program): the judge counts every
    process of the sandbox, which holds only it and its candidate's. Control: 0.4 s passes."""
    from trl_sandbox.pool.sandbox_pool import SandboxPool
    from trl_sandbox.scoring.scorer import Scorer

    with SandboxPool.open("local", size=1, settings={"resident_judge": False}) as pool:
        scorer = Scorer(pool, cache_size=0)
        outcomes = scorer.score([WORKERS.format(n=0.6, detach=True, workers=2),
                                 WORKERS.format(n=0.4, detach=False, workers=1)], [task(1.0)] * 2)
    assert [o.status for o in outcomes] == ["timeout", "passed"], outcomes


# -- 3. signals by file-descriptor ownership --------------------------------------------------------

OWNER = """
import fcntl, os, signal, socket, time
F_SETSIG = 10
def _by_ownership(target, sig):
    a, b = socket.socketpair()
    try:
        fcntl.fcntl(a.fileno(), fcntl.F_SETOWN, target)
        fcntl.fcntl(a.fileno(), F_SETSIG, sig)
        fcntl.fcntl(a.fileno(), fcntl.F_SETFL, fcntl.fcntl(a.fileno(), fcntl.F_GETFL) | os.O_ASYNC)
        b.send(b"x")
        return "sent"
    except OSError as exc:
        return exc.strerror
    finally:
        a.close()
        b.close()
def _named(name):
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and open("/proc/%s/comm" % p).read().strip() == name:
                return int(p)
        except OSError:
            pass
TARGET = {target}
"""

WRONG_AFTER = """
def max_subarray_sum(xs):
    _by_ownership(TARGET(), {sig})
    time.sleep(0.3)
    return 0
"""

OWN_CHILD = """
def max_subarray_sum(xs):
    pid = os.fork()
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    _by_ownership(pid, signal.SIGKILL)
    status = os.waitpid(pid, 0)[1]
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    best = cur = xs[0]
    for x in xs[1:]:
        cur = max(x, cur + x)
        best = max(best, cur)
    return best
"""

JUDGE = 'lambda: _named("trl-judge")'
# The forker is the candidate's parent.
FORKER = "lambda: os.getppid()"


@pytest.mark.parametrize("target, sig", [(JUDGE, "signal.SIGKILL"), (FORKER, "signal.SIGSTOP"),
                                         (JUDGE, "signal.SIGSTOP"), (FORKER, "signal.SIGKILL")],
                         ids=["judge-SIGKILL", "forker-SIGSTOP", "judge-SIGSTOP", "forker-SIGKILL"])
def test_no_signal_reaches_the_judge_or_the_forker_by_descriptor_ownership(scorer, target, sig):
    """A wrong answer stays ``failed`` (never ``infra``, never a score kept past a backstop) and
    its honest neighbours, queued behind it in the same sandbox, pass within the call's deadline:
    6 s, under the hostile exec's wall backstop (4 x its 1 s budget and margin, + 2 s), which a
    stopped forker used to hold it to."""
    hostile = OWNER.format(target=target) + WRONG_AFTER.format(sig=sig)
    rows = [task(1.0)] * 3
    outcomes = scorer.score([hostile, honest(11), honest(12)], rows, deadline_s=6)
    assert [o.status for o in outcomes] == ["failed", "passed", "passed"], outcomes
    assert outcomes[0].reward == 0.0


def test_descriptor_ownership_still_signals_the_candidates_own_child(scorer):
    """Control: the same road, pointed at a process of the candidate's own, works."""
    (own,) = scorer.score([OWNER.format(target="None") + OWN_CHILD], [task()])
    assert own.status == "passed", own


# -- 3b. "my own group" as a road to the forker --------------------------------------------------

JOIN = """
import os, signal
def max_subarray_sum(xs):
    try:
        os.setpgid(0, os.getppid())  # the forker's group: kill(0, ...) would then stop it
        return 0
    except PermissionError:
        pass
    # Control: the groups of the candidate's own session are open to its processes (it leads
    # the session, so it keeps its own group: its children move).
    kids = []
    for _ in range(2):
        kid = os.fork()
        if kid == 0:
            signal.pause()
            os._exit(0)
        kids.append(kid)
    os.setpgid(kids[0], kids[0])
    os.setpgid(kids[1], kids[0])
    joined = os.getpgid(kids[1]) == kids[0]
    for kid in kids:
        os.kill(kid, signal.SIGKILL)
        os.waitpid(kid, 0)
    if not joined:
        return 0
""" + "\n".join(KADANE.strip().splitlines()[1:]) + "\n"  # Kadane's body, after the checks


def test_a_candidate_cannot_join_the_forkers_process_group(scorer):
    """A candidate has a session of its own: the forker's process group (which a process of the
    forker's session could join) is out of its reach, and with it every call aimed at "my own
    group". Control, in the same program: its child joins the group of another of its children."""
    outcomes = scorer.score([JOIN, honest(21)], [task()] * 2)
    assert [o.status for o in outcomes] == ["passed", "passed"], outcomes


# -- 4. the OOM killer's order ----------------------------------------------------------------------


def oom_score_adj(pid):
    with open(f"/proc/{pid}/oom_score_adj") as f:
        return int(f.read())


READ_OWN = """
import os
def max_subarray_sum(xs):
    with open("/proc/self/oom_score_adj") as f:
        assert int(f.read()) == 1000
    # The forker sets a candidate's score through a file of its own: none of it is left here.
    for fd in os.listdir("/proc/self/fd"):
        try:
            assert "oom" not in os.readlink("/proc/self/fd/" + fd), fd
        except FileNotFoundError:
            pass  # the directory's own descriptor
    best = cur = xs[0]
    for x in xs[1:]:
        cur = max(x, cur + x)
        best = max(best, cur)
    return best
"""


def test_the_oom_killer_picks_programs_first_then_the_helpers_and_the_supervisor_last():
    """Read back from the host: the supervisor keeps the lowest score, the judge and the forker a
    middle one, the waiting candidate, every candidate and every plain program the highest."""
    from trl_sandbox.judge.verdict import build_program, call_outcome, call_spec

    with local_host() as host:
        box = host.create()
        program = build_program(READ_OWN, call_spec("max_subarray_sum", [[1, -2, 3]]), limit_s=2.0)
        nonce = os.urandom(16)
        result = box.exec(list(program.argv), stdin=nonce + program.stdin, timeout=program.timeout)
        assert call_outcome(result, nonce, [3]).status == "passed", result
        judge, forker = resident(box)
        (waiting,) = [pid for pid in settled(box) if parent_of(pid) == forker]
        supervisor = box.supervisor_pid()
        scores = {name: oom_score_adj(pid) for name, pid in
                  (("supervisor", supervisor), ("judge", judge), ("forker", forker), ("waiting", waiting))}
        assert scores["supervisor"] < scores["judge"] == scores["forker"] < scores["waiting"] == 1000, scores
        plain = box.py("print(open('/proc/self/oom_score_adj').read().strip())")
        assert plain.stdout == "1000\n", plain
        box.destroy()


# -- the wall backstop ------------------------------------------------------------------------------


def test_an_exec_that_ran_out_of_time_is_a_timeout_whatever_it_printed():
    """The verdict a judge printed counts only when the exec ended by itself: one the sandbox ended
    (its budget, or the wall backstop of an exec held open past its answer) is a ``timeout``, so
    holding an exec open cannot keep a wrong answer's 0.0 over a timeout's -1. Control: the same
    result, not timed out, keeps its verdict."""
    import dataclasses

    from trl_sandbox.judge.verdict import build_program, call_outcome, call_spec, check_outcome

    with local_host() as host:
        box = host.create()
        program = build_program(WRONG, call_spec("max_subarray_sum", [[1, -2, 3]]), limit_s=2.0)
        nonce = os.urandom(16)
        result = box.exec(list(program.argv), stdin=nonce + program.stdin, timeout=program.timeout)
        box.destroy()
    assert call_outcome(result, nonce, [3]).status == "failed", result  # control
    held = dataclasses.replace(result, timed_out=True)
    assert call_outcome(held, nonce, [3]).status == "timeout"
    assert check_outcome(held, nonce, 1).status == "timeout"


ROADS = r'''
import ctypes, fcntl, os, signal, socket, struct
def f(x):
    libc = ctypes.CDLL(None, use_errno=True)
    judge = [int(p) for p in os.listdir("/proc")
             if p.isdigit() and open("/proc/%s/comm" % p).read().strip() == "trl-judge"][0]
    out = {}
    def attempt(fn):
        try:
            fn()
            return "ok"
        except OSError as exc:
            return exc.strerror
    a, b = socket.socketpair()
    for name, pid in (("judge", judge), ("forker", os.getppid()), ("self", os.getpid())):
        out[name] = {
            "F_SETOWN": attempt(lambda: fcntl.fcntl(a.fileno(), fcntl.F_SETOWN, pid)),
            "F_SETOWN group": attempt(lambda: fcntl.fcntl(a.fileno(), fcntl.F_SETOWN, -pid)),
            "F_SETOWN_EX": attempt(lambda: fcntl.fcntl(a.fileno(), 15, struct.pack("ii", 1, pid))),
            "FIOSETOWN": attempt(lambda: fcntl.ioctl(a.fileno(), 0x8901, struct.pack("i", pid))),
            "SIOCSPGRP": attempt(lambda: fcntl.ioctl(a.fileno(), 0x8902, struct.pack("i", pid))),
        }
    # A timer's signal to a thread of another process (SIGEV_THREAD_ID): the kernel refuses it.
    event = ctypes.create_string_buffer(64)
    struct.pack_into("iii", event, 8, signal.SIGKILL, 4, 0)
    struct.pack_into("i", event, 20, judge)
    timer = ctypes.c_int()
    nr = {"x86_64": (222, 56, 240), "aarch64": (107, 220, 180)}[os.uname().machine]
    out["timer"] = "ok" if libc.syscall(nr[0], 1, event, ctypes.byref(timer)) == 0 else os.strerror(ctypes.get_errno())
    child = libc.syscall(nr[1], 0x8000 | signal.SIGCHLD, 0, 0, 0, 0)  # CLONE_PARENT
    if child == 0:
        os._exit(0)
    out["clone_parent"] = "ok" if child > 0 else os.strerror(ctypes.get_errno())
    mq = libc.syscall(nr[2], b"/q", os.O_CREAT | os.O_RDWR, 0o600, None)
    out["mq_open"] = "ok" if mq >= 0 else os.strerror(ctypes.get_errno())
    out["fcntl, ioctl"] = [attempt(lambda: fcntl.fcntl(a.fileno(), fcntl.F_GETFL)),
                           attempt(lambda: fcntl.ioctl(a.fileno(), 0x541B, b"\0" * 4))]  # FIONREAD
    return repr(out)
'''


def test_every_road_to_a_signal_is_closed_or_points_at_the_candidate():
    """Descriptor ownership in every form, a timer aimed at another process, ``CLONE_PARENT``
    and message-queue notification: refused toward the judge and the forker. Control: the owner
    may be the candidate itself, and common ``fcntl``/``ioctl`` commands work."""
    import ast

    from .test_resident_judge import returned

    with local_host() as host:
        box = host.create()
        out = ast.literal_eval(returned(box, ROADS))
        box.destroy()
    refused = "Operation not permitted"
    for name in ("judge", "forker"):
        assert set(out[name].values()) == {refused}, out
    assert out["self"] == {"F_SETOWN": "ok", "F_SETOWN group": "ok", "F_SETOWN_EX": refused,
                           "FIOSETOWN": refused, "SIOCSPGRP": refused}, out
    assert out["timer"] == "Invalid argument", out
    assert out["clone_parent"] == refused and out["mq_open"] == refused, out
    assert out["fcntl, ioctl"] == ["ok", "ok"], out

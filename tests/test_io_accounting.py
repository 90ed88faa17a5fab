"""What a test of a whole program is charged, and what it leaves: CPU the kernel reaps unseen,
memory outside the address space, a process whose main thread is gone, IPC objects, and time spent
waiting for a CPU. Each attack runs next to a positive control that shows its means work."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest

from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.tasks.generic import GenericTask

from .task_helpers import score

ONE = [{"input": "1 2\n", "output": "3\n"}]
FIVE = [{"input": f"{i} {i}\n", "output": f"{2 * i}\n"} for i in range(1, 6)]
SUM_PY = "a, b = map(int, input().split())\nprint(a + b)\n"


@pytest.fixture(scope="module")
def pool():
    with SandboxPool.open("local", size=2, made_by="test-io-accounting") as pool:
        yield pool


@pytest.fixture(scope="module")
def metered(pool):
    """Whether the sandboxes have the cgroup meter (cgroups available on this machine)."""
    return str(pool.provider_usage().get("sandbox/isolation_mode", "none")).startswith("cgroup")


def _row(tests=ONE, **columns):
    return {"task_id": "acct", "tests": tests, **columns}


def _exec(pool, source: str, timeout: float = 20.0):
    """A plain Python program in a sandbox of the pool (outside any judge): the controls."""
    return pool.loop.run(pool.aexec(["python3", "-c", source], timeout=timeout))


# -- CPU the kernel reaps by itself ------------------------------------------------------------

HIDE_C = r"""
#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>
static void burn(double s) { clock_t end = clock() + (clock_t)(s * CLOCKS_PER_SEC); volatile unsigned long x = 0; while (clock() < end) x++; }
int main(void) {
  IGNORE
  for (int i = 0; i < CHILDREN; i++) { if (fork() == 0) { burn(0.003); _exit(0); } while (wait(NULL) > 0) {} }
  long a, b; if (scanf("%ld %ld", &a, &b) != 2) return 1; printf("%ld\n", a + b); return 0; }
"""

HIDE_PY = """
import os, signal, time
IGNORE
def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
for _ in range(CHILDREN):
    if os.fork() == 0:
        burn(0.003)
        os._exit(0)
    try:
        while os.wait():
            pass
    except ChildProcessError:
        pass
"""


def _hide_c(children: int, ignore: bool = True) -> str:
    return HIDE_C.replace("CHILDREN", str(children)).replace("IGNORE", "signal(SIGCHLD, SIG_IGN);" if ignore else "")


def test_work_in_children_the_kernel_reaps_itself_counts_against_the_time_limit(pool):
    """Children reaped by the kernel (SIGCHLD ignored) take their CPU time with them: no rusage
    holds it, and 3 ms children are rarely sampled. Their work is 1.4x the limit: a time limit."""
    row = _row(FIVE, language="c", time_limit=0.25)
    hidden, reaped, light = score(pool, GenericTask(), [_hide_c(120), _hide_c(120, ignore=False), _hide_c(5)], row)
    assert light.status == "passed", light.detail  # the program is right and fast with little work
    assert reaped.status == "timeout", reaped.detail  # the same work, reaped by the program: counted
    assert hidden.status == "timeout" and "TLE" in hidden.detail, hidden.detail


def test_the_kernel_hides_such_childrens_time_from_rusage(pool):
    """The means: with SIGCHLD ignored, the children's CPU time reaches no rusage of the parent."""
    probe = HIDE_PY.replace("CHILDREN", "40") + "import resource\nu = resource.getrusage(resource.RUSAGE_CHILDREN)\n" \
        "print(u.ru_utime + u.ru_stime)\n"
    seen = {}
    for ignore in (True, False):
        result = _exec(pool, probe.replace("IGNORE", "signal.signal(signal.SIGCHLD, signal.SIG_IGN)" if ignore else ""))
        seen[ignore] = float(result.stdout.split()[-1])
    assert seen[False] >= 0.08 and seen[True] < 0.02, seen


def test_the_function_judge_counts_children_the_kernel_reaps_itself(pool):
    """A candidate whose call does 3x its budget in self-reaped children times out; with a budget
    that covers the work, the same candidate passes."""
    from trl_sandbox.scoring.scorer import Scorer
    from trl_sandbox.tasks.builtin import TASKS
    from trl_sandbox.tasks.generic import tasks_from_dict

    body = HIDE_PY.replace("CHILDREN", "300").replace("IGNORE", "signal.signal(signal.SIGCHLD, signal.SIG_IGN)")
    program = "def max_subarray_sum(xs):\n" + textwrap.indent(body, "    ") + \
        "    best = cur = xs[0]\n    for x in xs[1:]:\n        cur = max(x, cur + x)\n        best = max(best, cur)\n" \
        "    return best\n"
    entry = {**TASKS["max_subarray"], "tests": ["[-2, 1, -3, 4, -1, 2, 1, -5, 4]"]}
    tight = tasks_from_dict({"max_subarray": {**entry, "timeout": 0.3}}, extract="raw")[0]
    generous = tasks_from_dict({"max_subarray": {**entry, "timeout": 20.0}}, extract="raw")[0]
    scorer = Scorer(pool, cache_size=0)
    slow, control = scorer.score([program, program], [tight, generous])
    assert control.status == "passed", control
    assert slow.status == "timeout" and slow.reward == -1.0, slow


# -- memory outside the address space ----------------------------------------------------------

MEMFD_PY = """
import os
fds, chunk = [], b"x" * (1 << 20)
for _ in range(FILES):
    fds.append(os.memfd_create("pinned"))
    for _ in range(30):
        os.write(fds[-1], chunk)
a, b = map(int, input().split())
print(a + b)
"""

SHM_C = r"""
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
int main(void) {
  for (int i = 0; i < FILES; i++) {
    int fd = memfd_create("pinned", 0);
    if (fd < 0 || ftruncate(fd, 30 << 20) != 0) return 3;
    char *p = mmap(0, 30 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return 4;
    memset(p, 1, 30 << 20);
    munmap(p, 30 << 20);
  }
  long a, b; if (scanf("%ld %ld", &a, &b) != 2) return 1; printf("%ld\n", a + b); return 0; }
"""


def test_memory_held_outside_the_address_space_is_a_memory_limit(pool, metered):
    """300 MB in memfd files (written, or mapped and touched) on a 64 MB row: never a pass, and a
    memory limit where the sandbox has its meter. Controls: 30 MB the same way passes."""
    row = _row(FIVE, memory_limit=64)
    big_py, small_py = score(pool, GenericTask(), [MEMFD_PY.replace("FILES", "10"), MEMFD_PY.replace("FILES", "1")], row)
    c_row = _row(FIVE, memory_limit=64, language="c")
    big_c, small_c = score(pool, GenericTask(), [SHM_C.replace("FILES", "10"), SHM_C.replace("FILES", "1")], c_row)
    assert small_py.status == "passed" and small_c.status == "passed", (small_py.detail, small_c.detail)
    for big in (big_py, big_c):
        assert big.status != "passed", big.detail
        if metered:
            assert big.status == "error" and "MLE" in big.detail, big.detail


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node (IO_LANGUAGES=javascript)")
def test_a_typed_array_beyond_the_heap_flag_is_a_memory_limit(pool, metered):
    """V8's heap flag does not bound array buffers: 300 MB of them on a 64 MB row (the bound of a
    runtime with a heap flag is the row's limit and its own allowance: 192 MB for V8)."""
    read = "const [a, b] = require('fs').readFileSync(0, 'utf8').trim().split(/\\s+/).map(Number);\n"
    hog = "const xs = [];\nfor (let i = 0; i < 10; i++) { xs.push(new Uint8Array(30 << 20).fill(1)); }\nconst x = xs[9];\n" \
        + read + "console.log(a + b + x[5] - 1);\n"
    small = "const x = new Uint8Array(8 << 20); x.fill(1);\n" + read + "console.log(a + b + x[5] - 1);\n"
    big, control = score(pool, GenericTask(), [hog, small], _row(FIVE, memory_limit=64, language="javascript"))
    assert control.status == "passed", control.detail
    assert big.status != "passed", big.detail
    if metered:
        assert big.status == "error" and "MLE" in big.detail, big.detail


# -- a process whose main thread is gone -------------------------------------------------------

# Python helpers for both judges' programs: ``leave_survivor()`` forks a child whose main thread
# exits while another thread, named "survivor", lives on (the kernel shows the child as a zombie);
# it returns whether that means worked. ``survivors()`` finds such threads' processes.
SURVIVOR_KIT = """
import ctypes, os, threading, time

def survivors():
    found = []
    for pid in os.listdir("/proc"):
        try:
            for tid in os.listdir("/proc/%s/task" % pid):
                with open("/proc/%s/task/%s/comm" % (pid, tid)) as fh:
                    if fh.read().strip() == "survivor":
                        found.append(pid)
        except OSError:
            pass
    return found

def _leader_state():  # "Z" once the main thread has exited (the other thread names itself first)
    mine = survivors()
    return open("/proc/%s/stat" % mine[0]).read().rsplit(")", 1)[1].split()[0] if mine else "?"

def leave_survivor():
    if os.fork() == 0:
        for fd in (0, 1, 2):
            os.dup2(os.open(os.devnull, os.O_RDWR), fd)
        def live():
            ctypes.CDLL(None).prctl(15, b"survivor", 0, 0, 0)
            time.sleep(30)
        threading.Thread(target=live).start()
        ctypes.CDLL(None).pthread_exit(None)
    deadline = time.monotonic() + 5
    while _leader_state() != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    return _leader_state() == "Z"
"""

# Test 1 leaves a survivor (and checks the means); every later test prints a wrong answer if it finds one.
SURVIVOR = SURVIVOR_KIT + """
a, b = map(int, input().split())
earlier = survivors()
if a == 1:
    print(a + b if leave_survivor() else "the means failed")
else:
    print(a + b if not earlier else "found %s" % earlier)
"""


def test_a_process_whose_main_thread_exited_does_not_outlive_its_test(pool):
    """Test 1 checks the means (its child shows as a zombie while its thread runs); tests 2-5 pass
    only when nothing of test 1 is left."""
    outcome = score(pool, GenericTask(), [SURVIVOR], _row(FIVE))[0]
    assert outcome.status == "passed", outcome.detail


# The same survivor, now against a checker: it copies every answer file it finds over the output
# file beside it, while the checker starts.
CHECKER = """
import sys
out, ans = open(sys.argv[2]).read().split(), open(sys.argv[3]).read().split()
sys.exit(0 if out == ans else 1)
"""

FORGER = """
import ctypes, glob, os, shutil, threading, time
work = os.path.dirname(os.getcwd())
if os.fork() == 0:
    for fd in (0, 1, 2):
        os.dup2(os.open(os.devnull, os.O_RDWR), fd)
    def forge():
        end = time.monotonic() + 20
        while time.monotonic() < end:
            for answer in glob.glob(work + "/*/answer.txt"):
                try:
                    shutil.copy(answer, os.path.join(os.path.dirname(answer), "output.txt"))
                except OSError:
                    pass
            time.sleep(0.0005)
    threading.Thread(target=forge).start()
    ctypes.CDLL(None).pthread_exit(None)
print("wrong")
"""


def test_a_survivor_cannot_rewrite_the_output_a_checker_reads(pool):
    row = _row(FIVE, checker=CHECKER)
    forger, honest, wrong = score(pool, GenericTask(), [FORGER, SUM_PY, "print('wrong')"], row)
    assert honest.status == "passed" and wrong.status == "failed", (honest.detail, wrong.detail)
    assert forger.status == "failed" and forger.passed == 0, forger.detail


# -- IPC objects between tests -----------------------------------------------------------------

IPC = """
import ctypes, ctypes.util
libc = ctypes.CDLL(None, use_errno=True)
rt = ctypes.CDLL(ctypes.util.find_library("rt") or None, use_errno=True)
rt.mq_open.restype = ctypes.c_int
KEY, CREAT = 0x7A11, 0o1000
def find():
    return [what for what, got in (("shm", libc.shmget(KEY, 0, 0)), ("msg", libc.msgget(KEY, 0)),
                                   ("sem", libc.semget(KEY, 0, 0)), ("mq", rt.mq_open(b"/acct", 0)))
            if got >= 0]
def make():
    return [what for what, got in (("shm", libc.shmget(KEY, 4096, CREAT | 0o600)), ("msg", libc.msgget(KEY, CREAT | 0o600)),
                                   ("sem", libc.semget(KEY, 1, CREAT | 0o600)), ("mq", rt.mq_open(b"/acct", 0o100 | 2, 0o600, None)))
            if got >= 0]
"""


def test_no_ipc_object_carries_from_one_test_to_the_next(pool, metered):
    """Every test tries to find what an earlier test left, then to leave all four kinds; a test that
    finds one prints a wrong answer. Control: in a plain exec of the same sandbox, one process makes
    all four and a second one finds them."""
    attack = IPC + "found = find()\nmade = make()\na, b = map(int, input().split())\n" \
                   "print(a + b if not found else 'found %s' % found)\n"
    outcome = score(pool, GenericTask(), [attack], _row(FIVE))[0]
    assert outcome.status == "passed", outcome.detail
    if not metered:
        return  # without a memory cgroup the sandbox refuses IPC objects to every program (memory_mode)
    control = _exec(pool, "import json, subprocess, sys\n" + IPC + "made = make()\n"
                    "found = subprocess.run([sys.executable, '-c', " + repr(IPC + "print(find())") + "],"
                    " capture_output=True, text=True).stdout\nprint(json.dumps([made, found]))\n")
    made, found = json.loads(control.stdout.strip().splitlines()[-1])
    assert made == ["shm", "msg", "sem", "mq"] and found.strip() == str(made), control


# -- time spent waiting for a CPU --------------------------------------------------------------

STARVED = """
import os, sys, time
os.sched_setaffinity(0, {0})
end = time.process_time() + float(sys.argv[1])
while time.process_time() < end:
    pass
print("done")
"""

RUNNER = """
import json, os, subprocess, sys, time
from trl_sandbox.judge import io_process
io_process.meter_run_delay = io_process.meter_run_delay if sys.argv[3] == "counted" else (lambda pids: 0.0)
got = io_process.run(io_process.Cold([sys.executable, "-c", sys.argv[1], sys.argv[2]], dict(os.environ)), os.getcwd(),
                     b"", 1.0, 0, 2.0, 1 << 16, 1 << 16)
print(json.dumps({"why": got["why"], "out": got["out"].decode(), "wall": got["wall"], "cpu": got["cpu"]}))
"""


def _judged_next_to_hogs(program: str, arg: str, mode: str) -> dict:
    """``io_process.run`` (limit 1 s, backstop 2 s) of ``program`` pinned to CPU 0, where three
    busy processes (not the program's) share that CPU with it for as long as it runs."""
    hog = "import os\nos.sched_setaffinity(0, {0})\nwhile True: pass\n"
    # A session each: the kernel's autogroups share a CPU between sessions first.
    hogs = [subprocess.Popen([sys.executable, "-c", hog], start_new_session=True) for _ in range(3)]
    try:
        out = subprocess.run([sys.executable, "-c", RUNNER, program, arg, mode], capture_output=True, text=True,
                             timeout=60, check=True).stdout
    finally:
        for proc in hogs:
            proc.kill()
            proc.wait()
    return json.loads(out.strip().splitlines()[-1])


def test_time_spent_waiting_for_a_cpu_is_not_the_programs():
    """0.6 s of CPU (60% of the limit) takes about 2.4 s of wall time next to three busy processes
    on its CPU, past the backstop (2 s): it passes, because the wait is not counted; the control
    that counts the wait is a time limit; a program that sleeps still ends at the backstop."""
    counted = _judged_next_to_hogs(STARVED, "0.6", "counted")
    assert counted["why"] is None and counted["out"] == "done\n", counted
    assert counted["wall"] > 2.0, counted  # the load was real: a 0.6 s program took this long
    ignored = _judged_next_to_hogs(STARVED, "0.6", "ignored")
    assert ignored["why"] == "TLE" and ignored["out"] == "", ignored
    sleeper = _judged_next_to_hogs("import time\ntime.sleep(30)", "x", "counted")
    assert sleeper["why"] == "TLE" and sleeper["wall"] < 10, sleeper


# -- the same survivor in the function judge ---------------------------------------------------

SURVIVOR_CANDIDATE = SURVIVOR_KIT + """
def max_subarray_sum(xs):
    best = cur = xs[0]
    for x in xs[1:]:
        cur = max(x, cur + x)
        best = max(best, cur)
    if LEAVE:
        return best if leave_survivor() else None  # the means: its leader reads as a zombie, its thread lives
    return best if not survivors() else None
"""


def test_a_candidate_whose_main_thread_exited_leaves_nothing_for_the_next_program():
    """The function judge: a candidate leaves a child whose main thread exited (it passes only when
    that child shows as a zombie while its thread runs); the next programs judged in the same
    sandbox pass only when they find nothing of it."""
    from trl_sandbox.scoring.scorer import Scorer
    from trl_sandbox.tasks.builtin import TASKS
    from trl_sandbox.tasks.generic import tasks_from_dict

    entry = {**TASKS["max_subarray"], "tests": ["[-2, 1, -3, 4, -1, 2, 1, -5, 4]"], "timeout": 10.0}
    task = tasks_from_dict({"max_subarray": entry}, extract="raw")[0]
    leave, look = SURVIVOR_CANDIDATE.replace("LEAVE", "True"), SURVIVOR_CANDIDATE.replace("LEAVE", "False")
    with SandboxPool.open("local", size=1, made_by="test-io-accounting") as one:
        scorer = Scorer(one, cache_size=0)
        outcomes = [scorer.score([program], [task])[0] for program in (leave, look, leave, look)]
    assert [o.status for o in outcomes] == ["passed"] * 4, outcomes


# -- the meter itself --------------------------------------------------------------------------

TAMPER = """
import ctypes, os, subprocess
meter = "/run/trl-sandbox-meter"
libc = ctypes.CDLL(None, use_errno=True)
refused = []
for name in sorted(os.listdir(meter)):
    try:
        with open(os.path.join(meter, name), "w") as fh:
            fh.write("0")
    except OSError:
        refused.append("write " + name)
for how in (lambda: os.rename(meter, "/tmp/moved"), lambda: os.rmdir(meter), lambda: os.mkdir(meter + "/x"),
            lambda: os.symlink("/tmp", meter + "/y")):
    try:
        how()
    except OSError:
        refused.append("path")
refused += ["umount"] if libc.umount2(meter.encode(), 2) != 0 else []
refused += ["mount"] if libc.mount(b"none", meter.encode(), b"tmpfs", 0, None) != 0 else []
refused += ["unshare"] if libc.unshare(0x00020000 | 0x10000000) != 0 else []  # CLONE_NEWNS | CLONE_NEWUSER
print(len(refused), len(os.listdir(meter)))
"""


def test_a_program_cannot_tamper_with_the_meter(pool, metered):
    """Whatever a program tries on the meter (write its counters, move, replace or cover its
    directory, a mount namespace of its own), it is refused, and the work hidden in children the
    kernel reaps itself is still counted in the same sandbox right after."""
    if not metered:  # no cgroups on this machine: no meter, nothing bound
        assert _exec(pool, "import os; print(os.path.exists('/run/trl-sandbox-meter'))").stdout == "False\n"
        return
    results = [_exec(pool, TAMPER) for _ in range(2)]
    for result in results:
        refused, files = map(int, result.stdout.split())
        assert refused == files + 7 and files in (2, 3), result  # CPU, memory.stat (and v1's kmem)
    row = _row(FIVE, language="c", time_limit=0.25)
    hidden, light = score(pool, GenericTask(), [_hide_c(120), _hide_c(5)], row)
    assert light.status == "passed" and hidden.status == "timeout", (light.detail, hidden.detail)


# -- a chain of forks that outruns the kill ----------------------------------------------------

# Prints a wrong answer, leaves 40 zombies (a slower scan of its processes), then runs as a chain:
# each member copies every answer file it can find over the output beside it, forks, and exits, so
# that a scan reading a member's children before its fork, and finding it dead after, misses the
# next one. Against a checker, every copy that lands in time turns the wrong answer right.
CHAIN_C = r"""
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static void forge(void) {
  glob_t g;
  if (glob("/work/run-*/answer.txt", 0, NULL, &g) != 0) return;
  for (size_t i = 0; i < g.gl_pathc; i++) {
    char out[4096]; FILE *in = fopen(g.gl_pathv[i], "rb"), *to;
    snprintf(out, sizeof out, "%.*s/output.txt", (int)(strrchr(g.gl_pathv[i], '/') - g.gl_pathv[i]), g.gl_pathv[i]);
    if (in && (to = fopen(out, "wb"))) { char b[4096]; size_t n; while ((n = fread(b, 1, sizeof b, in)) > 0) fwrite(b, 1, n, to); fclose(to); }
    if (in) fclose(in);
  }
  globfree(&g);
}
int main(void) {
  long a, b; if (scanf("%ld %ld", &a, &b) != 2) return 1;
  printf("%ld\n", a + b + 1); fflush(stdout);
  close(0); close(1); close(2);
  for (int i = 0; i < 40; i++) if (fork() == 0) _exit(0);
  if (fork() != 0) _exit(0);
  for (long i = 0; i < 2000000; i++) { forge(); if (fork() != 0) _exit(0); }
  return 0;
}
"""


def test_a_chain_of_forks_does_not_outrun_the_kill(pool):
    """Ten tests against a checker, three times over: the chain must never reach a checker's files
    (every test of it WA), and the honest program beside it passes every test."""
    tests = [{"input": f"{i} {i}\n", "output": f"{2 * i}\n"} for i in range(1, 11)]
    row = _row(tests, language="c", checker=CHECKER, time_limit=1)
    honest = "#include <stdio.h>\nint main(void){long a,b; if(scanf(\"%ld %ld\",&a,&b)!=2) return 1; printf(\"%ld\\n\",a+b); return 0;}\n"
    outcomes = score(pool, GenericTask(), [CHAIN_C, CHAIN_C, CHAIN_C, honest], row)
    assert outcomes[3].status == "passed", outcomes[3].detail
    for chain in outcomes[:3]:
        assert chain.passed == 0 and chain.status in ("failed", "error"), chain.detail


# -- memory the kernel holds for a program -----------------------------------------------------

SOCKETS = """
import socket
pairs, chunk, held = [], b"x" * 65536, 0
while held < MB << 20 and len(pairs) < 100:
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    a.setblocking(False)
    try:
        while held < MB << 20:
            held += a.send(chunk)
    except BlockingIOError:
        pass
    pairs.append((a, b))
x, y = map(int, input().split())
print(x + y if held >= MB << 20 else "held only %d" % held)
"""


def test_memory_held_in_socket_buffers_is_a_memory_limit(pool, metered):
    """A program parks 300 MB in its sockets' buffers (no address space shows them) on a 64 MB
    row: never a pass, and a memory limit where there is a meter. Control: 16 MB the same way."""
    big, small = score(pool, GenericTask(), [SOCKETS.replace("MB", "300"), SOCKETS.replace("MB", "16")],
                       _row(FIVE, memory_limit=64, time_limit=5))
    assert small.status == "passed", small.detail
    assert big.status != "passed", big.detail
    if metered:
        assert big.status == "error" and "MLE" in big.detail, big.detail


def test_a_runtime_bounding_its_own_heap_holds_its_row_and_little_more(pool, metered):
    """On a 64 MB row, Go's heap, Java's memory outside its heap and a JavaScript typed array of
    150 MB are memory limits where there is a meter (the runtime itself is allowed 64 MB beside
    the row's limit; their writable-memory limits allow more, for stacks they never touch), and
    never a pass; 30 MB the same way passes."""
    import shutil

    from trl_sandbox.judge.languages import languages
    from trl_sandbox.local.command import LOCAL_PATH

    from .test_io_judge import HOLD_IN

    cases = [(name, HOLD_IN[name][k]) for name, k in (("go", 0), ("java", 1), ("javascript", 1))
             if not languages().get(name).missing(lambda t: shutil.which(t, path=LOCAL_PATH))]
    rows = [_row(ONE, language=name, memory_limit=64, time_limit=10) for name, _ in cases]
    big = score(pool, GenericTask(), [src.replace("{mb}", "150") for _, src in cases], rows)
    small = score(pool, GenericTask(), [src.replace("{mb}", "30") for _, src in cases], rows)
    for (name, _), hog, control in zip(cases, big, small):
        assert control.status == "passed", (name, control.detail)
        assert hog.status != "passed", (name, hog.detail)
        if metered:
            assert hog.status == "error" and "MLE" in hog.detail, (name, hog.detail)


def test_javascript_holds_100_mb_of_heap_under_the_default_limits(pool, monkeypatch):
    """Under the sandbox's default 1 GiB address space per process, a JavaScript program holding
    100 MB in its heap on a 256 MB row passes: node's threads get two malloc arenas, not one each
    (control: with glibc's default arenas the same program is a memory limit)."""
    import dataclasses
    import shutil

    from trl_sandbox.judge.languages import languages
    from trl_sandbox.local.command import LOCAL_PATH

    from .test_io_judge import HOLD_IN

    table = languages()
    if table.get("javascript").missing(lambda t: shutil.which(t, path=LOCAL_PATH)):
        outcome = score(pool, GenericTask(), [HOLD_IN["javascript"][0]], _row(ONE, language="javascript"))[0]
        assert outcome.status == "infra" and "not installed" in outcome.detail, outcome.detail
        return
    program, row = HOLD_IN["javascript"][0].replace("{mb}", "100"), _row(ONE, language="javascript", memory_limit=256)
    assert score(pool, GenericTask(), [program], row)[0].status == "passed"
    monkeypatch.setattr(table, "_by_name", dict(table._by_name))
    table.register(dataclasses.replace(table.get("javascript"), env=()))
    control = score(pool, GenericTask(), [program], {**row, "task_id": "arenas"})[0]  # a row resolved anew
    assert control.status == "error" and "MLE" in control.detail, control.detail

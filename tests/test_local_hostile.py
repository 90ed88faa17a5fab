"""Hostile programs: each must give a definite result, and leave nothing behind, neither in the
sandbox (checked from the host, through the sandbox's pid namespace) nor on the host."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from .local_helpers import children_of, local_host, wait_for

LIMITS = {"memory_mb": 256, "max_processes": 32, "file_size_mb": 8, "output_bytes": 1 << 20}


@pytest.fixture(scope="module")
def host():
    with local_host(work_size_mb=32, tmp_size_mb=16, shm_size_mb=4, memory_mode="deny") as h:
        yield h


@pytest.fixture(scope="module")
def box(host):
    return host.create(limits=LIMITS)


def clean_after(box, result):
    """The common post-condition: only the supervisor is left and the sandbox still works."""
    box.assert_only_supervisor()
    assert children_of(box.bwrap_pid) == [box.supervisor_pid()]
    assert box.py("print('next')").stdout == "next\n", result
    return result


# -- time -------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["python3", "-c", "while True: pass"],
    ["python3", "-c", "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                      "signal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass"],
    ["sh", "-c", "trap '' TERM INT HUP; while :; do :; done"],
    ["sleep", "30"],
])
def test_endless_programs_time_out(box, argv):
    start = time.monotonic()
    r = box.exec(argv, timeout=0.5)
    assert r.timed_out and r.exit_code == -signal.SIGKILL
    assert time.monotonic() - start < 10  # the program ignores signals or sleeps 30 s
    clean_after(box, r)


def test_cpu_seconds_limit_counts_as_a_timeout(host):
    box = host.create(limits={"cpu_seconds": 1})
    r = box.py("while True: pass", timeout=10)
    assert r.timed_out and r.exit_code == -signal.SIGXCPU and r.duration_s < 5
    box.destroy()


# -- processes --------------------------------------------------------------------------------


ESCAPES = {
    "double fork + setsid": """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open('/tmp/daemon', 'w') as f:
            while True:
                f.write('x'); f.flush(); time.sleep(0.01)
    os._exit(0)
print('parent done')
""",
    "background holding the pipes": """
import subprocess
subprocess.Popen(['sleep', '60'])
print('parent done')
""",
    "new process group ignoring signals": """
import os, signal, time
if os.fork() == 0:
    os.setpgid(0, 0)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    time.sleep(60)
print('parent done')
""",
}


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_escapes_do_not_outlive_the_exec(box, name):
    r = box.py(ESCAPES[name], timeout=20)
    assert r.exit_code == 0 and r.stdout == "parent done\n" and not r.timed_out
    assert r.duration_s < 10, "the exec ends with its own process, not with the leftovers (which sleep 60 s)"
    clean_after(box, r)
    size = box.exec(["sh", "-c", "cat /tmp/daemon 2>/dev/null | wc -c"]).stdout
    time.sleep(0.1)  # a surviving writer would add a byte every 10 ms
    assert box.exec(["sh", "-c", "cat /tmp/daemon 2>/dev/null | wc -c"]).stdout == size, "a writer survived"


def test_shell_background_jobs_are_killed(box):
    r = box.exec(["sh", "-c", "sleep 60 & setsid sleep 60 & nohup sleep 60 >/dev/null 2>&1 & echo started"], timeout=20)
    assert r.stdout == "started\n" and r.exit_code == 0 and r.duration_s < 10
    clean_after(box, r)


def test_fork_bomb(box):
    r = box.py("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", timeout=1)
    assert r.timed_out
    clean_after(box, r)
    r = box.exec(["sh", "-c", "b() { b | b & }; b"], timeout=1)
    assert r.exit_code is not None
    clean_after(box, r)


def test_thread_bomb_is_bounded_by_the_process_limit(box):
    r = box.py(textwrap.dedent("""
        import os, threading, time
        n = 0
        try:
            while True:
                threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
                n += 1
        except RuntimeError:
            print(n, flush=True)
        os._exit(0)
    """), timeout=5)
    assert r.exit_code == 0 and 0 < int(r.stdout) < LIMITS["max_processes"]
    clean_after(box, r)


# -- memory and disk --------------------------------------------------------------------------


@pytest.mark.parametrize("source", [
    "x = bytearray(2 * 1024 ** 3)",
    "chunks = []\nwhile True:\n    chunks.append(bytearray(10 * 1024 ** 2))",
    "s = 'x'\nwhile True:\n    s += s",
])
def test_memory_bombs_are_oom_results(box, source):
    r = box.py(source, timeout=10)
    assert r.exit_code == 1 and r.oom_killed and "MemoryError" in r.stderr and not r.timed_out
    clean_after(box, r)


def test_memory_bomb_in_a_native_program(box):
    r = box.exec(["sh", "-c", "head -c 1000000000 /dev/zero | sort"], timeout=10)
    assert r.exit_code not in (0, None) and not r.timed_out
    clean_after(box, r)


def test_disk_bombs_hit_the_file_size_limit_and_the_tmpfs_caps(box):
    r = box.py("f = open('big', 'wb')\nwhile True:\n    f.write(b'x' * 1024 * 1024)")
    assert r.exit_code == 1 and "File too large" in r.stderr
    r = box.exec(["sh", "-c", "head -c 100000000 /dev/zero > big2"])
    assert r.exit_code != 0  # SIGXFSZ or an error, at 8 MB
    for place, cap in (("/work", 32), ("/tmp", 16), ("/dev/shm", 4)):
        r = box.py(textwrap.dedent(f"""
            import os
            i = 0
            try:
                while True:
                    with open('{place}/f%d' % i, 'wb') as f:
                        f.write(b'x' * 4 * 1024 * 1024)
                    i += 1
            except OSError as exc:
                print(exc.strerror)
            st = os.statvfs('{place}')
            print(st.f_blocks * st.f_frsize // 2 ** 20)
        """), timeout=10)
        assert r.stdout.split("\n")[:2] == ["No space left on device", str(cap)], (place, r)
    box.reset()
    r = box.exec(["sh", "-c", "du -sk /work /tmp /dev/shm | cut -f1"])
    assert [int(x) for x in r.stdout.split()] == [0, 0, 0]
    clean_after(box, r)


# -- output and input ---------------------------------------------------------------------------


@pytest.mark.parametrize("source", [
    "import sys\nfor _ in range(3000):\n    sys.stdout.write('x' * 10000)",
    "import sys\nfor _ in range(3000):\n    sys.stdout.write('y' * 9999 + '\\n')",
    "import os\nfor _ in range(3000):\n    os.write(2, b'z' * 10000)",
])
def test_output_floods_are_capped_and_fast(box, source):
    r = box.py(source, timeout=20)
    assert r.exit_code == 0 and r.truncated and not r.timed_out
    assert max(len(r.stdout), len(r.stderr)) == LIMITS["output_bytes"]
    assert r.duration_s < 5, "capturing must not slow the program down"
    clean_after(box, r)


def test_endless_flood_is_capped_and_times_out(box):
    r = box.exec(["yes"], timeout=0.5)
    assert r.timed_out and r.truncated and len(r.stdout) == LIMITS["output_bytes"]
    clean_after(box, r)


def test_program_that_closes_its_streams_is_still_waited_for(box):
    r = box.py("import os, time\nos.close(1); os.close(2)\ntime.sleep(0.3)\nos._exit(4)", timeout=5)
    assert r.exit_code == 4 and 0.3 <= r.duration_s < 4


def test_reading_stdin_when_none_is_given_gets_end_of_file(box):
    assert box.exec(["cat"], timeout=2).exit_code == 0
    r = box.py("import sys\nprint(repr(sys.stdin.read()), repr(sys.stdin.buffer.read()))", timeout=2)
    assert r.stdout == "'' b''\n"
    r = box.py("input('prompt: ')", timeout=2)
    assert "EOFError" in r.stderr and not r.timed_out


def test_no_inherited_descriptors(box):
    r = box.py(textwrap.dedent("""
        import os
        print(sorted(os.listdir('/proc/self/fd')))
        hits = []
        for fd in range(3, 1024):
            try:
                os.write(fd, b'forged answer')
                hits.append(fd)
            except OSError:
                pass
        print(hits)
    """))
    assert r.stdout == "['0', '1', '2', '3']\n[]\n"


# -- the host's secrets, the supervisor --------------------------------------------------------


def test_hunting_for_secrets_finds_nothing(box, tmp_path, monkeypatch):
    secret = "hunt-" + os.urandom(8).hex()
    monkeypatch.setenv("OPENAI_API_KEY", secret)  # too late for this sandbox, and never passed anyway
    (tmp_path / "key").write_text(secret)
    r = box.py(textwrap.dedent(f"""
        import glob, os
        found = []
        paths = glob.glob('/proc/[0-9]*/environ') + glob.glob('/proc/[0-9]*/cmdline') + ['/proc/1/mem']
        for root in ('/etc', '/tmp', '/work', '/dev/shm', '/root', '/home'):
            for dirpath, dirnames, filenames in os.walk(root):
                paths += [os.path.join(dirpath, name) for name in filenames]
        for path in paths:
            try:
                with open(path, 'rb') as f:
                    if {secret.encode()!r} in f.read(1 << 20):
                        found.append(path)
            except (OSError, ValueError):
                pass
        print(found, {secret!r} in str(os.environ), os.path.exists({str(tmp_path)!r}))
    """), timeout=30)
    assert r.stdout == "[] False False\n", r


@pytest.mark.parametrize("argv, code, out", [
    (["python3", "-c", "import os; os.kill(os.getppid(), 9); print('still here')"], 0, "still here\n"),
    (["python3", "-c", "import os; os.kill(1, 9); os.kill(1, 15); os.kill(1, 19); print('still here')"], 0, "still here\n"),
    (["sh", "-c", "kill -9 -1; kill -9 1; kill -STOP 1; echo still here"], 0, "still here\n"),
    # kill(-1) from a child reaches everything it may signal: the program itself dies, not init.
    (["python3", "-c", "import os\nif os.fork() == 0:\n    os.setsid()\n    os.kill(-1, 9)\n    os._exit(0)\n"
                       "os.wait()\nprint('unreachable')"], -signal.SIGKILL, ""),
])
def test_the_supervisor_cannot_be_killed_from_inside(box, argv, code, out):
    supervisor = box.supervisor_pid()
    r = box.exec(argv, timeout=5)
    assert (r.exit_code, r.stdout, r.timed_out) == (code, out, False)
    assert box.supervisor_pid() == supervisor and box.alive()
    clean_after(box, r)


@pytest.mark.parametrize("source, code", [
    ("import ctypes; ctypes.string_at(0)", -signal.SIGSEGV),
    ("import os; os.abort()", -signal.SIGABRT),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL),
    ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", -signal.SIGTERM),
])
def test_crashes_are_results(box, source, code):
    r = box.py(source, timeout=10)
    assert r.exit_code == code and not r.timed_out
    clean_after(box, r)


# -- state that must not reach the next lease ---------------------------------------------------


def test_state_left_behind_is_gone(box):
    r = box.py(textwrap.dedent("""
        import builtins, json, os, subprocess, ctypes
        with open('/work/left.txt', 'w') as f:
            f.write('file')
        libc = ctypes.CDLL(None)
        print(libc.mq_open(b'/left', os.O_CREAT | os.O_RDWR, 0o600, None) == -1)  # no IPC object can be made
        subprocess.Popen(['sleep', '60'], start_new_session=True)
        builtins.open = None                      # sabotage the next program's builtins
        json.loads = lambda s: 'forged'           # and a pre-imported module
        os.environ['INJECTED'] = '1'
        os.chdir('/tmp')
    """))
    assert r.stdout == "True\n", r
    r = box.py(textwrap.dedent("""
        import json, os
        print(json.loads('1'), os.environ.get('INJECTED'), os.getcwd(), open('/work/left.txt').read())
        print(__import__('ctypes').CDLL(None).mq_open(b'/left', os.O_RDWR) == -1)
        print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()) == [1, os.getpid()])
    """))
    assert r.stdout == "1 None /work file\nTrue\nTrue\n", r
    box.reset()
    assert box.py("import os; print(os.listdir('/work'))").stdout == "[]\n"
    clean_after(box, r)


# -- the host ---------------------------------------------------------------------------------


def test_sandboxes_die_with_the_process_that_made_them(tmp_path):
    script = textwrap.dedent("""
        import asyncio, sys
        from trl_sandbox.local import LocalProvider
        from trl_sandbox.sandbox import SandboxSpec

        async def main():
            provider = LocalProvider()
            sandbox = await provider.create(SandboxSpec())
            kids = open(f"/proc/{sandbox.pid}/task/{sandbox.pid}/children").read().split()
            print(sandbox.pid, kids[0], flush=True)
            await sandbox.exec(["python3", "-c", "import time; time.sleep(60)"], timeout=120)

        asyncio.run(main())
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2
    finally:
        proc.kill()
        proc.wait()

    def gone(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
        except FileNotFoundError:
            return True

    assert wait_for(lambda: all(gone(p) for p in pids), timeout=5), "the sandbox outlived its creator"


def test_the_sigchld_code_path_of_older_interpreters():
    """Without pidfds (Python 3.8) the supervisor notices child exits through SIGCHLD."""
    with local_host() as h:
        h.provider._supervisor_options = {"exit_watch": "sigchld"}
        box = h.create(limits=LIMITS)
        assert box.py("import sys; print('ok'); sys.exit(3)").exit_code == 3
        r = box.py(ESCAPES["double fork + setsid"], timeout=20)
        assert r.stdout == "parent done\n" and r.duration_s < 10
        clean_after(box, r)
        r = box.exec(["sh", "-c", "sleep 60 & echo started"], timeout=20)
        assert r.stdout == "started\n" and r.duration_s < 10
        assert box.py("while True: pass", timeout=0.3).timed_out
        r = box.py("import os, subprocess, time\nos.close(1)\nsubprocess.run(['true'])\ntime.sleep(0.2)")
        assert r.exit_code == 0 and r.duration_s >= 0.2
        r = box.py("import signal, subprocess\nsubprocess.run(['true'])\nprint(signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL)")
        assert r.stdout == "True\n" and r.stderr == ""
        clean_after(box, r)


def test_symlinks_left_by_a_program_do_not_lead_host_file_operations_out(box):
    r = box.exec(["sh", "-c", "ln -s /proc/1/mem mem && ln -s /etc etc && ln -s /tmp tmp && mkdir -p d && ln -s ../.. d/up"])
    assert r.exit_code == 0, r
    for path in ("mem", "etc/passwd", "tmp/x", "d/up/etc/hosts"):
        with pytest.raises(PermissionError):
            box.read(path)
        with pytest.raises(PermissionError):
            box.write(path, b"x")
    box.write("d/inside.txt", b"fine")  # ordinary paths still work
    assert box.read("d/inside.txt") == b"fine"
    box.reset()


def test_fifos_and_devices_left_by_a_program_do_not_hang_the_supervisor(box):
    r = box.exec(["sh", "-c", "mkfifo pipe.py && ln -s /dev/zero zero.py && ln -s /proc/1/fd/0 ctl.py"])
    assert r.exit_code == 0, r
    for name in ("pipe.py", "zero.py"):
        with pytest.raises(OSError):
            box.read(name)
        with pytest.raises(OSError):
            box.write(name, b"x")
    start = time.monotonic()
    r = box.exec(["python3", "pipe.py"], timeout=1)  # the real interpreter blocks on the FIFO
    assert r.timed_out
    assert box.exec(["python3", "ctl.py"], timeout=2).exit_code != 0  # not the supervisor's channel
    assert time.monotonic() - start < 15
    clean_after(box, r)
    box.reset()


# -- time budgets: work handed to a child is the candidate's own --------------------------------


def _loop_count_for(seconds: float) -> int:
    """Iterations of ``w += i`` that take about ``seconds`` of CPU on this machine."""
    n, start = 2_000_000, time.process_time()
    w = 0
    for i in range(n):
        w += i
    return int(n * seconds / max(1e-3, time.process_time() - start))


OFFLOADED = """
import os, pickle
def _slow(xs):
    w = 0
    for i in range({n}):
        w += i
    best = cur = xs[0]
    for x in xs[1:]:
        cur = max(x, cur + x)
        best = max(best, cur)
    return best
def max_subarray_sum(xs):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the work runs in a child, whose CPU the candidate's own counter does not show
        os.write(w, pickle.dumps(_slow(xs)))
        os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    os.waitpid(pid, 0)
    return pickle.loads(data)
"""


def test_work_handed_to_a_child_counts_against_the_candidates_budget():
    """A solution ~3x too slow for its CPU budget must not pass by doing the work in a child process
    (the judge's budget covers the candidate's whole process family, not its own process)."""
    from trl_sandbox.pool.sandbox_pool import SandboxPool
    from trl_sandbox.scoring.scorer import Scorer
    from trl_sandbox.tasks.builtin import TASKS
    from trl_sandbox.tasks.generic import tasks_from_dict

    entry = {**TASKS["max_subarray"], "tests": ["[-2, 1, -3, 4, -1, 2, 1, -5, 4]"]}
    program = OFFLOADED.format(n=_loop_count_for(0.8))
    tight = tasks_from_dict({"max_subarray": {**entry, "timeout": 0.3}}, extract="raw")[0]
    generous = tasks_from_dict({"max_subarray": {**entry, "timeout": 10.0}}, extract="raw")[0]
    with SandboxPool.open("local", size=1) as pool:
        scorer = Scorer(pool, cache_size=0)
        slow, control = scorer.score([program, program], [tight, generous])
    assert control.status == "passed", control  # the program is right: only its budget stops it
    assert slow.status == "timeout" and slow.reward == -1.0, slow


DAEMON_FLOOD = """
import os
def f(x):
    started = 0
    while True:
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            code = 1  # no room for the sleeper: the limit is reached
            try:
                os.setsid()
                if os.fork() == 0:
                    import time
                    time.sleep(60)
                code = 0
            finally:
                os._exit(code)
        if os.waitpid(pid, 0)[1] != 0:
            break
        started += 1
    return started
"""


def test_a_candidate_that_fills_the_process_limit_leaves_the_next_judged_program_unharmed(box):
    """The candidates' forker now runs under the program's process limit (it sets it once for all
    of them): a candidate that fills that limit with detached sleepers must not keep the forker
    from forking the next program's candidate."""
    import base64

    from trl_sandbox.judge.verdict import (
        build_program,
        call_spec,
        check_outcome,
        check_spec,
        parse_verdict,
        plain_loads,
    )

    def judged(source, spec):
        program = build_program(source, spec, limit_s=5.0)
        nonce = os.urandom(16)
        return box.exec(list(program.argv), stdin=nonce + program.stdin, timeout=program.timeout), nonce

    result, nonce = judged(DAEMON_FLOOD, call_spec("f", [0]))
    verdict = parse_verdict(result, nonce)
    assert verdict is not None and verdict.tests[0].get("ok"), (verdict, result)
    started = plain_loads(base64.b64decode(verdict.tests[0]["value"]))
    assert 0 < started < LIMITS["max_processes"], started  # control: it did run into the limit
    for _ in range(3):
        result, nonce = judged("def f(x):\n    return x * x\n", check_spec(["assert f(3) == 9"], bind=["f"]))
        assert check_outcome(result, nonce, 1).status == "passed", result
    box.reset()


def test_a_floats_approximation_of_an_integer_answer_is_wrong():
    """Whole programs on stdin/stdout: an answer of 10**18 + 3 printed through a float comes out as
    1e+18, within any relative tolerance of the answer, and wrong. The same program with integer
    arithmetic passes (the positive control)."""
    from trl_sandbox.pool.sandbox_pool import SandboxPool
    from trl_sandbox.scoring.scorer import Scorer

    row = {"task_id": "big", "tests": [{"input": f"{n}\n", "output": f"{10**18 + n}\n"} for n in (3, 7)]}
    with SandboxPool.open("local", size=1, made_by="test-hostile-io") as pool:
        through_float, exact = Scorer(pool, cache_size=0).score(
            ["n = int(input())\nprint(float(10**18 + n))", "n = int(input())\nprint(10**18 + n)"], [row, row])
    assert exact.status == "passed", exact.detail
    assert through_float.status == "failed" and through_float.reward == 0.0, through_float


def test_a_tree_deeper_than_the_judges_recursion_does_not_crash_the_io_judge():
    """Whole programs on stdin/stdout: a right answer that leaves, in /tmp, a directory tree 3000
    levels deep (deeper than Python's recursion limit and than PATH_MAX) used to crash the I/O
    judge's cleaning after the first test (RecursionError: no verdict, a right program scored -1).
    The program prints the right answer only when it made the whole tree (the control that the tree
    was there); an honest program after it, in the same sandbox, is judged right too."""
    from trl_sandbox.pool.sandbox_pool import SandboxPool
    from trl_sandbox.scoring.scorer import Scorer

    row = {"task_id": "deep", "tests": [{"input": f"{n}\n", "output": f"{2 * n}\n"} for n in (1, 2, 3)],
           "time_limit": 2.0}
    deep = ("import os\nn = int(input())\nos.chdir('/tmp')\nmade = 0\nfor _ in range(3000):\n"
            "    os.mkdir('d')\n    os.chdir('d')\n    made += 1\nprint(n * 2 if made == 3000 else 'shallow')\n")
    with SandboxPool.open("local", size=1, made_by="test-hostile-io") as pool:
        scorer = Scorer(pool, cache_size=0)
        outcome = scorer.score([deep], [row])[0]
        honest = scorer.score(["print(int(input()) * 2)"], [row])[0]
    assert (outcome.status, outcome.passed) == ("passed", 3), outcome.detail
    assert honest.status == "passed", honest.detail


# The exec's status page (a shared page the supervisor reads after a Python program ends) seen from
# a program: the shared, deleted /dev/zero mappings in its own address space.
SHARED_PAGES = """
def shared_pages():
    return [line.split()[0] for line in open("/proc/self/maps") if " rw-s " in line and "(deleted)" in line]
"""


def test_a_programs_forks_share_no_page_with_it_across_tests(box):
    """A program started by the supervisor's fork holds the exec's status page; its own forks (the
    I/O judge's Python tests are such forks) must not, or test 1 could leave its input there for
    test 2. Control: the program itself still has the page."""
    import json

    source = SHARED_PAGES + textwrap.dedent("""
        import json, os
        r, w = os.pipe()
        if os.fork() == 0:
            os.write(w, json.dumps(shared_pages()).encode())
            os._exit(0)
        os.close(w)
        print(json.dumps([shared_pages(), json.loads(os.read(r, 65536))]))
    """)
    r = box.py(source)
    mine, childs = json.loads(r.stdout)
    assert len(mine) == 1 and childs == [], r  # the control: the page is there, in the program only
    clean_after(box, r)


def test_a_whole_programs_tests_share_no_memory():
    """Through the I/O judge: a Python program that writes each test's input into every shared page
    it has and answers right only when it finds test 1's there. Control: an honest program passes."""
    from trl_sandbox.pool.sandbox_pool import SandboxPool
    from trl_sandbox.tasks.generic import GenericTask

    from .task_helpers import score

    leak = SHARED_PAGES + textwrap.dedent("""
        import ctypes, sys
        data, seen = sys.stdin.read(), b""
        for span in shared_pages():
            at = int(span.split("-")[0], 16)
            seen = ctypes.string_at(at, 4096).rstrip(b"\\0")
            ctypes.memmove(at, seen + data.encode() + b"|", len(seen) + len(data) + 1)
        words = data.split()
        print(int(words[1]) + int(words[2]) if b"secret-A" in seen else 0)
    """)
    honest = "import sys\nw = sys.stdin.read().split()\nprint(int(w[1]) + int(w[2]))\n"
    tests = [{"input": f"secret-{k} {a} {b}\n", "output": f"{a + b}\n"} for k, a, b in (("A", 1, 2), ("B", 5, 5), ("C", 7, 1))]
    with SandboxPool.open("local", size=1, made_by="test-local-hostile") as pool:
        leaked, control = score(pool, GenericTask(), [leak, honest], {"task_id": "leak", "tests": tests})
    assert control.status == "passed", control.detail
    assert leaked.passed == 0, leaked.detail


@pytest.fixture(scope="module")
def agent_pool():
    """A local pool with an environment cache the sandboxes' uid can enter, for agent tasks."""
    import tempfile
    from pathlib import Path

    from trl_sandbox.environments.cache import remove_tree
    from trl_sandbox.pool.sandbox_pool import SandboxPool

    cache = Path(tempfile.mkdtemp(prefix="trl-sandbox-hostile-", dir="/var/tmp"))
    os.chmod(cache, 0o755)
    try:
        with SandboxPool.open("local", size=2, settings={"environment_cache": str(cache)}) as pool:
            yield pool
    finally:
        remove_tree(cache)


def _agent_row(task_id):
    from trl_sandbox.agents.load import agent_rows

    [row] = agent_rows("builtin", task_ids=[task_id])
    return row


@pytest.mark.parametrize("attack", ["rm -rf tests", "rm -rf tests && echo x > tests",
                                    "rm -rf tests && mkdir tests && touch tests/__init__.py"])
def test_an_agent_cannot_take_a_protected_test_away_with_its_directory(agent_pool, attack):
    """Deleting or replacing the directory above a protected test (not the test itself) would take
    the test along: the verifier would then run no test and pass. Control: unprotected, it pays."""
    from trl_sandbox.scoring.scorer import Scorer

    row = _agent_row("fix-median")
    row["protected"] = ["tests/test_core.py"]  # fails on the unfixed code
    row["verify"] = ("cd /app && python3 -m unittest discover > /dev/null 2>&1 && echo 1 > /logs/verifier/reward.txt "
                     "|| echo 0 > /logs/verifier/reward.txt")
    scorer = Scorer(agent_pool, cache_size=0)
    hostile, honest = scorer.score([f"{attack}; true", row["solution"]], [row, row])
    assert hostile.status == "failed" and "protected" in hostile.detail, hostile.detail
    assert honest.status == "passed", honest.detail
    row["protected"] = []  # the control: without the protection the attack pays
    assert scorer.score([f"{attack}; true"], [row])[0].status == "passed"


@pytest.mark.parametrize("depth", [1100, 40])
def test_changes_nested_deep_are_a_verdict_not_infra(agent_pool, depth):
    """An episode that nests directories past what the grader reads fails; it never scores None
    (the grader once recursed per level). Control: the oracle passes in the same pool, and at a
    modest depth the same program is graded as usual."""
    from trl_sandbox.scoring.scorer import Scorer
    from trl_sandbox.training.environment import SandboxEnvironment

    row = _agent_row("error-digest")
    nest = f"d=deep; for i in $(seq 1 {depth}); do d=$d/d; done; mkdir -p $d; true"
    scorer = Scorer(agent_pool, cache_size=0)
    hostile, honest = scorer.score([nest, row["solution"]], [row, row])
    assert hostile.status == "failed" and hostile.reward == 0.0, hostile.detail
    assert ("too large" in hostile.detail) == (depth > 256), hostile.detail
    assert honest.status == "passed", honest.detail
    episode = SandboxEnvironment(agent_pool, scorer)
    episode.reset(**row)
    episode.bash(nest)
    assert episode.get_reward() == 0.0


FORGERIES = {  # code of the agent's that the hidden tests import, so it runs inside the verifier
    "a reward file, then the script killed": (
        "import os, signal\nos.makedirs('/logs/verifier', exist_ok=True)\n"
        "open('/logs/verifier/reward.txt', 'w').write('1\\n')\nos.kill(-1, signal.SIGKILL)\n"),
    "the reward file made a directory": "import os\nos.makedirs('/logs/verifier/reward.txt', exist_ok=True)\n",
    "a reward.json nested too deep to parse": (
        "import os\nos.makedirs('/logs/verifier', exist_ok=True)\n"
        "open('/logs/verifier/reward.json', 'w').write('{\"reward\":' + '[' * 100000)\n"),
}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_forgeries_from_the_agents_imported_code_fail_never_pass_nor_none(agent_pool, forgery):
    """Found by a blind review: a reward file written and the verifier script killed before it could
    overwrite it passed; a reward file that is a directory, or JSON too deep to parse, scored None."""
    from trl_sandbox.agents.grading import verdict
    from trl_sandbox.scoring.scorer import Scorer

    row = _agent_row("fix-median")  # the median bug stays; stats/__init__.py is imported by the tests
    plant = f"cat >> stats/__init__.py <<'PY'\n{FORGERIES[forgery]}PY\ntrue"
    hostile, honest = Scorer(agent_pool, cache_size=0).score([plant, row["solution"]], [row, row])
    assert (hostile.status, hostile.reward) == ("failed", 0.0), hostile.detail
    assert honest.status == "passed", honest.detail  # the control, in the same pool
    # Control: the forged file does pass when the verifier ends cleanly; a killed one's never counts.
    assert verdict({"reward.txt": b"1\n"}, 0, False, row).status == "passed"
    assert verdict({"reward.txt": b"1\n"}, -9, False, row).status == "failed"
    assert verdict({"reward.json": b'{"reward": 1}'}, 0, False, row).status == "passed"
    assert verdict({"reward.json": b'{"reward": true}'}, 0, False, row).status == "failed"


# Found by a blind review of agent grading: code of the agent's that the verifier runs put a link in
# reward.txt's place (the script wrote its 0 through it and the grade fell back to the exit status),
# rewrote the script's memory through /proc/<pid>/mem (it wrote a 1 and made bash exit 0), or the
# agent left a path too long to write into the fresh copy (which scored None).
REWARD_LINK = ("import os\ntry:\n    os.unlink('/logs/verifier/reward.txt')\nexcept OSError:\n    pass\n"
               "os.symlink('/dev/null', '/logs/verifier/reward.txt')\n")
REWARD_JSON = "import os\nos.makedirs('/logs/verifier', exist_ok=True)\nopen('/logs/verifier/reward.json', 'w').write('{\"reward\": 1}')\n"
PATCH_PARENT = """import os
def _patch(pid):
    pc = int(open(f"/proc/{pid}/syscall").read().split()[-1], 16)
    fd = os.open(f"/proc/{pid}/mem", os.O_RDWR)
    os.lseek(fd, pc, 0)
    os.write(fd, bytes([0xb8, 0xe7, 0, 0, 0, 0x31, 0xff, 0x0f, 0x05]))  # exit_group(0)
    os.close(fd)
"""
PATCH_ANCESTORS = PATCH_PARENT + """try:
    open('/logs/verifier/reward.txt', 'w').write('1\\n')
    pid = os.getppid()
    while pid > 1:
        ppid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        try:
            _patch(pid)
        except OSError:
            pass
        pid = ppid
except OSError:
    pass
"""


@pytest.mark.parametrize("forgery", ["a link in reward.txt's place", "a reward.json beside the script's reward.txt",
                                     "the script's memory rewritten"])
def test_the_agents_code_in_the_verifier_cannot_swap_the_report_or_rewrite_the_script(agent_pool, forgery):
    from trl_sandbox.agents.grading import verdict
    from trl_sandbox.scoring.scorer import Scorer

    code = {"a link in reward.txt's place": REWARD_LINK, "a reward.json beside the script's reward.txt": REWARD_JSON,
            "the script's memory rewritten": PATCH_ANCESTORS}[forgery]
    row = _agent_row("fix-median")  # the bug stays; the judge's child imports stats
    plant = f"cat >> stats/__init__.py <<'PY'\n{code}PY\ntrue"
    hostile, honest = Scorer(agent_pool, cache_size=0).score([plant, row["solution"]], [row, row])
    assert (hostile.status, hostile.reward) == ("failed", 0.0), hostile.detail
    assert honest.status == "passed", honest.detail  # the control, in the same pool
    # Controls: what each forgery aimed at. The exit status alone would pass; both files at 1 pass.
    assert verdict({"reward.txt": None}, 0, False, {**row, "parser": "exit_code"}).status == "passed"
    assert verdict({"reward.txt": None}, 0, False, row).status == "failed"
    assert verdict({"reward.txt": b"0\n", "reward.json": b'{"reward": 1}'}, 0, False, row).status == "failed"
    assert verdict({"reward.txt": b"1\n", "reward.json": b'{"reward": 1}'}, 0, False, row).status == "passed"


def test_outside_a_verifier_a_process_can_rewrite_its_parents_memory(agent_pool):
    """The control for the memory forgery above: the primitive works in an ordinary program (its
    /proc is writable), so only the verifier's read-only /proc stopped it."""
    program = PATCH_PARENT + "import sys, time\nif os.fork() == 0:\n    time.sleep(0.3)\n    _patch(os.getppid())\n" \
                             "    os._exit(0)\ntime.sleep(5)\nsys.exit(3)\n"
    result = agent_pool.run(["python3", "-c", program], timeout=20)
    assert result.exit_code == 0, (result.exit_code, result.stderr)  # patched: it never reached sys.exit(3)


@pytest.mark.parametrize("levels", [17, 11])
def test_a_path_too_long_to_carry_is_a_verdict_not_infra(agent_pool, levels):
    from trl_sandbox.scoring.scorer import Scorer

    row = _agent_row("error-digest")
    deep = f"d=.; for i in $(seq 1 {levels}); do d=$d/$(printf 'b%.0s' $(seq 1 250)); done; mkdir -p $d && : > $d/f; true"
    hostile, honest = Scorer(agent_pool, cache_size=0).score([deep, row["solution"]], [row, row])
    assert (hostile.status, hostile.reward) == ("failed", 0.0), hostile.detail
    assert ("too long to carry" in hostile.detail) == (levels == 17), hostile.detail  # control: 11 levels carry
    assert honest.status == "passed", honest.detail


# Found by a blind review: the agent's programs lowered their OOM score to the supervisor's, pinned
# the sandbox's memory in a memfd held by a small process and filled the rest: the kernel's choice
# fell on the supervisor (the largest), the sandbox died and the sample scored None, whatever it had
# done. Its own doing is its failure.
OOM_ESCAPE = """echo 0 > /proc/self/oom_score_adj
python3 - <<'PY' &
import os
fd = os.memfd_create("pin", 0)
chunk = b"\\1" * (1 << 20)
try:
    for _ in range({pin_mb}):
        os.write(fd, chunk)
except OSError:
    pass
os.execv("/bin/sleep", ["sleep", "30"])
PY
sleep 3
head -c {fill_bytes} /dev/zero > /tmp/fill
head -c {fill_bytes} /dev/zero > fill
true
"""


def test_an_agent_that_runs_its_sandbox_out_of_memory_scores_its_failure_not_none():
    import tempfile
    from pathlib import Path

    from trl_sandbox import ResourceLimits, SandboxSpec
    from trl_sandbox.environments.cache import remove_tree
    from trl_sandbox.pool.sandbox_pool import SandboxPool
    from trl_sandbox.scoring.scorer import Scorer
    from trl_sandbox.training.environment import SandboxEnvironment

    row = _agent_row("error-digest")
    attack = OOM_ESCAPE.format(pin_mb=230, fill_bytes=60_000_000)
    cache = Path(tempfile.mkdtemp(prefix="trl-sandbox-oom-", dir="/var/tmp"))
    os.chmod(cache, 0o755)
    spec = SandboxSpec(memory_mb=256, limits=ResourceLimits(memory_mb=1024, file_size_mb=256))
    try:
        with SandboxPool.open("local", size=2, spec=spec, settings={"environment_cache": str(cache)}) as pool:
            assert pool.provider._cgroups.memory, "this test needs the sandbox's memory cgroup"
            scorer = Scorer(pool, cache_size=0)
            hostile, honest = scorer.score([attack, row["solution"]], [row, row])
            assert (hostile.status, hostile.reward) == ("failed", 0.0), hostile.detail
            assert "out of memory" in hostile.detail, hostile.detail  # control: the sandbox did die
            assert honest.status == "passed", honest.detail
            episode = SandboxEnvironment(pool, scorer)
            episode.reset(**row)
            episode.bash(attack)
            assert episode.get_reward() == 0.0
    finally:
        remove_tree(cache)


# Found by a third blind review: SysV shared memory the agent's programs leave stays charged to the
# sandbox's memory cgroup after they end (the OOM killer frees processes, not segments); reading a
# large change set then needed the memory, the kernel killed the supervisor and the sample scored
# None, right or wrong. A sandbox that dies of memory while it is graded is the agent's failure.
SHM_FILL = """mkdir -p blob; for i in $(seq 1 {blob_mb}); do head -c 1000000 /dev/urandom > blob/$i; done
cat > /tmp/shm.py <<'PY'
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
size = int(sys.argv[1]) << 20
sid = libc.shmget(0, ctypes.c_size_t(size), 0o1600)
addr = libc.shmat(sid, None, 0) if sid >= 0 else None
if addr not in (None, ctypes.c_void_p(-1).value):
    ctypes.memset(addr, 1, size)
    libc.shmdt(ctypes.c_void_p(addr))
PY
for mb in 100 100 50 20 20 10 10 5 5 5 2 2 2 1 1 1 1; do python3 /tmp/shm.py $mb > /dev/null 2>&1; done
true
"""


def test_memory_left_charged_by_the_agent_is_its_failure_when_grading_runs_out(monkeypatch):
    import tempfile
    from pathlib import Path

    from trl_sandbox import ResourceLimits, SandboxSpec
    from trl_sandbox.environments.cache import remove_tree
    from trl_sandbox.pool.sandbox_pool import SandboxPool
    from trl_sandbox.scoring.scorer import Scorer
    from trl_sandbox.training.environment import SandboxEnvironment

    row = _agent_row("fix-median")
    attack = SHM_FILL.format(blob_mb=40)
    spec = SandboxSpec(memory_mb=256, limits=ResourceLimits(memory_mb=1024, file_size_mb=256))
    cache = Path(tempfile.mkdtemp(prefix="trl-sandbox-shm-", dir="/var/tmp"))
    try:
        os.chmod(cache, 0o755)
        with SandboxPool.open("local", size=2, spec=spec, settings={"environment_cache": str(cache)}) as pool:
            assert pool.provider._cgroups.memory, "this test needs the sandbox's memory cgroup"
            scorer = Scorer(pool, cache_size=0)
            hostile, honest, blob_only = scorer.score([attack, row["solution"], SHM_FILL.split("cat >")[0] + "true"],
                                                      [row] * 3)
            assert (hostile.status, hostile.reward) == ("failed", 0.0), hostile.detail
            assert "out of memory" in hostile.detail, hostile.detail  # control: the sandbox did die
            assert honest.status == "passed", honest.detail
            assert blob_only.status == "failed" and "out of memory" not in blob_only.detail, blob_only.detail
            episode = SandboxEnvironment(pool, scorer)
            episode.reset(**row)
            episode.bash(attack)
            assert episode.get_reward() == 0.0
            # Control: without the rule the same sample scores None (the supervisor died reading it).
            from trl_sandbox.agents import task

            monkeypatch.setattr(task, "_ran_out", lambda sandbox: False)
            assert scorer.score([attack], [row])[0].status == "infra"
    finally:
        remove_tree(cache)

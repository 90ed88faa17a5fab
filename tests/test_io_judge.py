"""The I/O judge on the local sandbox: honest programs in Python, C++ and C, and programs that try
to pay without solving (each attack next to a positive control that shows the attack's means work)."""

from __future__ import annotations

import secrets
import textwrap

import pytest

from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.tasks.generic import GenericTask

from .task_helpers import score

SUM_TESTS = [{"input": f"{i} {i * 7}\n", "output": f"{i * 8}\n"} for i in range(1, 6)]
SUM_PY = "a, b = map(int, input().split())\nprint(a + b)\n"
SUM_CPP = "#include <iostream>\nint main(){long a,b;std::cin>>a>>b;std::cout<<a+b<<\"\\n\";}\n"
SUM_C = "#include <stdio.h>\nint main(void){long a,b;if(scanf(\"%ld %ld\",&a,&b)!=2)return 1;printf(\"%ld\\n\",a+b);return 0;}\n"


@pytest.fixture(scope="module")
def pool():
    with SandboxPool.open("local", size=2, made_by="test-io-judge") as pool:
        yield pool


def _row(tests=SUM_TESTS, **columns):
    return {"task_id": "sum", "tests": tests, **columns}


def _one(pool, completion, row):
    return score(pool, GenericTask(), [completion], row)[0]


def test_honest_programs_in_three_languages_pass_and_wrong_ones_fail(pool):
    cases = [f"```python\n{SUM_PY}```", f"```cpp\n{SUM_CPP}```", f"```c\n{SUM_C}```", SUM_PY,
             "```cpp\nint main(){ return 0; }\n```", "print(0)"]
    outcomes = score(pool, GenericTask(), cases, _row())
    assert [o.status for o in outcomes] == ["passed"] * 4 + ["failed"] * 2, [o.detail for o in outcomes]
    assert all((o.passed, o.total) == (5, 5) for o in outcomes[:4])
    assert outcomes[4].passed == 0 and "WA 5" in outcomes[4].detail


def test_outcome_kinds_and_partial_credit(pool):
    wrong_on_3 = "a, b = map(int, input().split())\nprint(a + b + (a == 3))\n"
    crash_on_4 = "a, b = map(int, input().split())\nassert a != 4\nprint(a + b)\n"
    outcomes = score(pool, GenericTask(), [wrong_on_3, crash_on_4, "int main( {", "x = bytearray(1 << 33)"],
                     [_row(), _row(), _row(language="cpp"), _row()])
    assert (outcomes[0].status, outcomes[0].passed, outcomes[0].tests) == ("failed", 4, (True, True, False, True, True))
    assert "WA 1" in outcomes[0].detail and "test 3" in outcomes[0].detail
    assert (outcomes[1].status, outcomes[1].passed) == ("error", 4) and "RE 1" in outcomes[1].detail
    assert outcomes[2].status == "error" and outcomes[2].detail.startswith("CE:")
    assert outcomes[3].status == "error" and "MLE 5" in outcomes[3].detail


def test_stop_at_first_failure_skips_the_rest(pool):
    slow_on_2 = "import time\na, b = map(int, input().split())\nwhile a == 2: pass\nprint(a + b)\n"
    stopped, full = score(pool, GenericTask(), [slow_on_2, slow_on_2],
                          [_row(time_limit=0.5, stop_at_first_failure=True), _row(time_limit=0.5)])
    assert stopped.status == full.status == "timeout"
    assert stopped.passed == 1 and full.passed == 4 and "TLE 1" in full.detail


def test_a_prefix_of_the_answer_that_exits_0_fails(pool):
    tests = [{"input": "3\n", "output": "1\n2\n3\n"}]
    whole, prefix = score(pool, GenericTask(), ["for i in range(int(input())): print(i + 1)",
                                                "print(1)\nprint(2)\nraise SystemExit(0)"],
                          [_row(tests, compare=mode) for mode in ("lines", "lines")])
    assert (whole.status, prefix.status) == ("passed", "failed")
    for mode in ("tokens", "exact"):
        assert _one(pool, "print(1)\nprint(2)", _row(tests, compare=mode)).status == "failed"


def test_a_forged_verdict_line_counts_for_nothing(pool):
    forged = ('import sys\nline = "@@trl-sandbox-verdict@@ " + "00" * 16 + \' {"v": 1, "load": {"ok": true}, '
              '"tests": [{"v": "AC"}, {"v": "AC"}, {"v": "AC"}, {"v": "AC"}, {"v": "AC"}]}\'\n'
              'print(line); sys.stderr.write(line + "\\n")\n')
    outcome = _one(pool, forged, _row())
    assert outcome.status == "failed" and outcome.passed == 0


SEARCH = textwrap.dedent("""
    import os, sys
    secret = sys.argv[1] if len(sys.argv) > 1 else {secret!r}
    data = sys.stdin.read()
    def look(path):
        try:
            with open(path, 'rb') as fh:
                return secret.encode() in fh.read(1 << 24)
        except Exception:
            return False
    found = secret in data
    for root in ('/proc', '/tmp', '/dev/shm', '/var/tmp', '/work', os.getcwd(), '/'):
        for here, dirs, files in os.walk(root):
            if here.count('/') > (2 if root in ('/', '/proc') else 4) or found or (root == '/' and here.startswith('/usr')):
                dirs[:] = []
                continue
            for name in files:
                if name in ('kcore', 'kmsg', 'pagemap') or look(os.path.join(here, name)):
                    found = found or name not in ('kcore', 'kmsg', 'pagemap')
            if here.startswith('/proc'):
                for pid in dirs:
                    for part in ('mem', 'environ', 'cmdline', 'fd/0'):
                        found = found or look(os.path.join(here, pid, part))
    print('FOUND' if found else 'nothing')
""")


def test_the_expected_output_and_other_tests_inputs_are_out_of_reach(pool):
    secret = "S" + secrets.token_hex(8)
    # Test 1's expected output holds the secret; test 2's input does; the program reads neither.
    tests = [{"input": "x\n", "output": f"{secret}\nFOUND\n"}, {"input": f"{secret}\n", "output": "FOUND\n"}]
    program = SEARCH.format(secret=secret)
    outcome = _one(pool, program, _row(tests, compare="lines", time_limit=5))
    assert outcome.tests == (False, True), outcome.detail
    # Positive control: the search does find the secret where it is in reach (its own stdin, test 2).
    assert outcome.tests[1]


def test_a_detached_worker_does_not_beat_the_time_limit(pool):
    split = textwrap.dedent("""
        import os, time
        def burn(seconds):
            end = time.process_time() + seconds
            while time.process_time() < end:
                pass
        r, w = os.pipe()
        for _ in range(2):
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    burn({each})
                    os.write(w, b'x')
                os._exit(0)
        got = b''
        while len(got) < 2:
            got += os.read(r, 2)
        print(int(input()) * 2)
    """)
    tests = [{"input": "21\n", "output": "42\n"}]
    over = _one(pool, split.format(each=0.7), _row(tests, time_limit=1.0))
    under = _one(pool, split.format(each=0.2), _row(tests, time_limit=1.0))
    assert under.status == "passed", under.detail  # positive control: the same program within the budget
    assert over.status == "timeout", over.detail


def test_a_program_that_sleeps_or_floods_ends_quickly_and_fails(pool):
    import time

    start = time.monotonic()
    sleeper = _one(pool, "import time\ntime.sleep(60)", _row(SUM_TESTS[:1], time_limit=0.5))
    assert sleeper.status == "timeout" and time.monotonic() - start < 15
    flood = _one(pool, "import sys\nfor _ in range(4000): sys.stdout.write('8' * 65536)", _row(SUM_TESTS[:1]))
    assert flood.status == "failed" and "output limit" in flood.detail


def test_nothing_is_left_for_the_next_test(pool):
    leave = textwrap.dedent("""
        import os, sys
        marks = ['/tmp/mark', '/dev/shm/mark', 'mark', '/work/mark']
        stale = any(os.path.exists(m) for m in marks)
        me = open(sys.argv[0]).read() if os.path.exists(sys.argv[0]) else ''
        patched = 'PAT' + 'CHED'
        if patched in me:
            stale = True
        for m in marks:
            try:
                open(m, 'w').write('x')
            except OSError:
                pass
        try:
            with open(sys.argv[0], 'a') as fh:
                fh.write('\\n# ' + patched + '\\n')
        except OSError:
            pass
        seen_now = any(os.path.exists(m) for m in marks) and patched in open(sys.argv[0]).read()
        print('stale' if stale else ('fresh' if seen_now else 'blind'))
    """)
    tests = [{"input": "\n", "output": "fresh\n"}] * 3
    outcome = _one(pool, leave, _row(tests))
    # 'fresh' on every test: each saw its own marks (positive control) and none of the last one's.
    assert outcome.status == "passed", outcome.detail


def test_the_compiler_cannot_be_made_to_run_away(pool):
    laughs = "".join(f"#define L{i} L{i - 1} L{i - 1} L{i - 1} L{i - 1} L{i - 1} L{i - 1} L{i - 1} L{i - 1}\n"
                     for i in range(1, 14))
    bomb = "#define L0 x = x + 1;\nint main(){ int x = 0; " + "\n" + laughs + "L13 return x; }\n"
    recursive = "template<int N> struct F { static const int v = F<N + 1>::v; };\nint main(){ return F<0>::v; }\n"
    import time

    start = time.monotonic()
    outcomes = score(pool, GenericTask(), [bomb, recursive, SUM_CPP],
                     [_row(SUM_TESTS[:1], language="cpp", compile_time_limit=3)] * 3)
    assert [o.status for o in outcomes] == ["error", "error", "passed"], [o.detail for o in outcomes]
    assert all(o.detail.startswith("CE:") for o in outcomes[:2])
    assert time.monotonic() - start < 60


def test_a_checker_accepts_any_right_answer_and_its_failures_are_not_the_programs_escape(pool):
    # Any two numbers that sum to the input: several right answers.
    checker = textwrap.dedent("""
        import sys
        n = int(open(sys.argv[1]).read())
        got = open(sys.argv[2]).read().split()
        if got == ['hang']:
            while True: pass
        a, b = map(int, got)
        sys.exit(0 if a + b == n else 1)
    """)
    tests = [{"input": "10\n", "output": "5 5\n"}, {"input": "7\n", "output": "3 4\n"}]
    row = _row(tests, checker=checker, time_limit=0.5)  # a checker gets twice the test's CPU, at least 2 s
    other, wrong, garbage, hang, empty = score(pool, GenericTask(), ["n = int(input())\nprint(1, n - 1)", "print(1, 1)",
                                                                     "print('x y')", "print('hang')", "pass"], row)
    assert other.status == "passed", other.detail
    assert wrong.status == "failed" and "checker rejected" in wrong.detail
    # A checker that crashes or hangs on a program's output is that output's failure, never infra.
    assert garbage.status == "failed" and hang.status == "failed", (garbage.detail, hang.detail)
    assert empty.status == "failed" and empty.passed == 0, empty.detail  # nothing printed: nothing accepted
    broken = _one(pool, "print(5, 5)", _row(tests, checker="import sys\nsys.exit(3)"))
    assert broken.status == "infra" and "checker" in broken.detail  # the task itself is broken


# open-r1's generated checkers, as the dataset has them: ``checker.py input correct_output
# solution_output``, the verdict printed (1 or 0), exit status 0 either way.
OPEN_R1_CHECKER = textwrap.dedent("""
    import sys
    n = int(open(sys.argv[1]).read())
    correct = open(sys.argv[2]).read().split()
    got = open(sys.argv[3]).read().split()
    if got == ['crash']:
        raise SystemExit(open('/nonexistent').read())
    ok = len(got) == 2 and all(t.lstrip('-').isdigit() for t in got) and int(got[0]) + int(got[1]) == n
    print(1 if ok and len(correct) == 2 else 0)
""")


def test_open_r1_checkers_run_under_their_own_contract(pool):
    tests = [{"input": "10\n", "output": "5 5\n"}, {"input": "7\n", "output": "3 4\n"}]
    row = {"task_id": "cf", "official_tests": tests, "generated_checker": OPEN_R1_CHECKER, "input_mode": "stdio",
           "time_limit": 1, "memory_limit": 256}
    programs = ["n = int(input())\nprint(1, n - 1)", "n = int(input())\nprint(n // 2, n - n // 2)", "print(1, 1)",
                "pass", "print(1)", "print('crash')"]
    other, expected, wrong, empty, one, crash = score(pool, GenericTask(), programs, row)
    assert (other.status, expected.status) == ("passed", "passed"), (other.detail, expected.detail)
    assert wrong.status == "failed" and "checker rejected" in wrong.detail
    # Nothing printed, the checker's own "1" printed, the checker made to crash: all wrong answers.
    assert (empty.status, one.status, crash.status) == ("failed",) * 3, (empty.detail, one.detail, crash.detail)
    assert empty.passed == one.passed == crash.passed == 0
    assert "failed on this output" in crash.detail
    # The attack's means: the same checker read as testlib's (exit 0 accepts) passes the empty output.
    testlib = {"task_id": "cf", "tests": tests, "checker": OPEN_R1_CHECKER, "checker_contract": "testlib"}
    assert _one(pool, "pass", testlib).status == "passed"


SUM_IN = {
    "python": SUM_PY,
    "cpp": SUM_CPP,
    "c": SUM_C,
    "java": "import java.util.*;\npublic class Sum { public static void main(String[] a) {\n"
            "  Scanner s = new Scanner(System.in); long x = s.nextLong(), y = s.nextLong(); System.out.println(x + y); } }\n",
    "javascript": "const v = require('fs').readFileSync(0, 'utf8').trim().split(/\\s+/).map(Number);\nconsole.log(v[0] + v[1]);\n",
    "rust": "use std::io::Read;\nfn main() { let mut s = String::new(); std::io::stdin().read_to_string(&mut s).unwrap();\n"
            "  let v: Vec<i64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect(); println!(\"{}\", v[0] + v[1]); }\n",
    "go": "package main\nimport \"fmt\"\nfunc main() { var a, b int64; fmt.Scan(&a, &b); fmt.Println(a + b) }\n",
}


def _minus(source):
    for plus, minus in (("a + b", "a - b"), ("a+b", "a-b"), ("x + y", "x - y"), ("v[0] + v[1]", "v[0] - v[1]")):
        source = source.replace(plus, minus)
    return source


def test_every_language_is_judged_or_reported_missing_never_scored_wrong(pool):
    """Each built-in language: where its toolchain is installed (Python, C and C++ always: setup.sh
    installs them) an honest program passes and a wrong one fails; where it is not, the outcome
    is ``infra`` naming the command (the model's program is not to blame), never ``error``."""
    import shutil

    from trl_sandbox.judge.languages import languages
    from trl_sandbox.local.command import LOCAL_PATH

    names = sorted(SUM_IN)
    assert names == languages().names() or set(names) <= set(languages().names())
    honest = score(pool, GenericTask(), [SUM_IN[n] for n in names], [_row(SUM_TESTS[:3], language=n) for n in names])
    wrong = score(pool, GenericTask(), [_minus(SUM_IN[n]) for n in names], [_row(SUM_TESTS[:3], language=n) for n in names])
    installed = {n for n in names if not languages().get(n).missing(lambda t: shutil.which(t, path=LOCAL_PATH))}
    assert {"python", "cpp", "c"} <= installed
    for name, good, bad in zip(names, honest, wrong):
        if name in installed:
            assert (good.status, bad.status) == ("passed", "failed"), (name, good.detail, bad.detail)
        else:
            assert good.status == bad.status == "infra" and "not installed" in good.detail, (name, good.detail)


def test_a_language_the_fence_chose_without_its_toolchain_is_the_programs_error(pool, monkeypatch):
    """The model chose the language: a program the sandbox cannot build is its failure (scored like a
    compile error), never ``None``; for a language the row declares the task cannot be judged here."""
    from trl_sandbox.judge.languages import Language, languages

    table = languages()
    monkeypatch.setattr(table, "_by_name", dict(table._by_name))
    monkeypatch.setattr(table, "_alias", dict(table._alias))
    table.register(Language("pascal", "main.pas", ("./main",), ("trl-sandbox-no-fpc", "main.pas"),
                            toolchain=("trl-sandbox-no-fpc",), package="fp-compiler"))
    pascal = "```pascal\nbegin writeln(3) end.\n```"
    chosen, declared, control = score(pool, GenericTask(), [pascal, pascal, f"```cpp\n{SUM_CPP}```"],
                                      [_row(SUM_TESTS[:2]), _row(SUM_TESTS[:2], language="pascal"), _row(SUM_TESTS[:2])])
    assert chosen.status == "error" and chosen.tests == (False, False), chosen.detail
    assert chosen.detail.startswith("CE: the completion's fence chose pascal") and "not installed" in chosen.detail
    assert declared.status == "infra" and "not installed" in declared.detail
    assert control.status == "passed", control.detail  # positive control: the fence does choose the language


# Programs that hold {mb} MB (every page written) and then print the sum of the input: right while
# the memory is theirs. Each language's usual allocation, and for the runtimes whose heap a flag
# bounds, an allocation outside that heap too (Java's Unsafe, a JavaScript typed array).
HOLD_IN = {
    "python": ["import sys\na, b = map(int, sys.stdin.read().split())\nm = bytearray(b'\\x01') * ({mb} << 20)\n"
               "print(a + b + m[4096] - 1)\n"],
    "cpp": ["#include <iostream>\n#include <vector>\nint main(){ long a, b; std::cin >> a >> b;\n"
            "  std::vector<char> m((size_t){mb} << 20, 1); volatile char *p = m.data();\n"
            "  std::cout << a + b + p[4096] - 1 << \"\\n\"; }\n"],
    "c": ["#include <stdio.h>\n#include <stdlib.h>\nint main(void){ long a, b; if (scanf(\"%ld %ld\", &a, &b) != 2) return 1;\n"
          "  size_t n = (size_t){mb} << 20; volatile char *m = malloc(n); if (!m) { perror(\"malloc\"); return 1; }\n"
          "  for (size_t i = 0; i < n; i += 4096) m[i] = 1;\n  printf(\"%ld\\n\", a + b + m[4096] - 1); return 0; }\n"],
    "rust": ["use std::io::Read;\nfn main() { let mut s = String::new(); std::io::stdin().read_to_string(&mut s).unwrap();\n"
             "  let v: Vec<i64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();\n"
             "  let m = vec![1u8; {mb} << 20]; let x = unsafe { std::ptr::read_volatile(&m[4096]) } as i64;\n"
             "  println!(\"{}\", v[0] + v[1] + x - 1); }\n"],
    "go": ["package main\nimport \"fmt\"\nfunc main() { var a, b int64; fmt.Scan(&a, &b); m := make([]byte, {mb}<<20)\n"
           "  for i := 0; i < len(m); i += 4096 { m[i] = 1 }; fmt.Println(a + b + int64(m[4096]) - 1) }\n"],
    "java": ["import java.util.*;\npublic class Hold { public static void main(String[] x) {\n"
             "  Scanner s = new Scanner(System.in); long a = s.nextLong(), b = s.nextLong(); byte[] m = new byte[{mb} << 20];\n"
             "  for (int i = 0; i < m.length; i += 4096) m[i] = 1; System.out.println(a + b + m[4096] - 1); } }\n",
             "import java.util.*;\npublic class Hold { public static void main(String[] x) throws Exception {\n"
             "  Scanner s = new Scanner(System.in); long a = s.nextLong(), b = s.nextLong();\n"
             "  java.lang.reflect.Field f = sun.misc.Unsafe.class.getDeclaredField(\"theUnsafe\"); f.setAccessible(true);\n"
             "  sun.misc.Unsafe u = (sun.misc.Unsafe) f.get(null); long n = (long) {mb} << 20, p = u.allocateMemory(n);\n"
             "  for (long i = 0; i < n; i += 4096) u.putByte(p + i, (byte) 1);\n"
             "  System.out.println(a + b + u.getByte(p + 4096) - 1); } }\n"],
    "javascript": ["const v = require('fs').readFileSync(0, 'utf8').trim().split(/\\s+/).map(Number);\n"
                   "const m = []; for (let i = 0; i < ({mb} << 17); i++) m.push(i + 0.5);\n"
                   "console.log(v[0] + v[1] + (m.length >> 17) - {mb});\n",
                   "const v = require('fs').readFileSync(0, 'utf8').trim().split(/\\s+/).map(Number);\n"
                   "const m = new Uint8Array({mb} << 20).fill(1);\nconsole.log(v[0] + v[1] + m[4096] - 1);\n"],
}


def _hold(source, mb):
    return source.replace("{mb}", str(mb))


def test_every_installed_language_is_held_to_a_memory_tight_row():
    """On a 256 MB row, in each built-in language: a program that holds 100 MB passes, the same
    program holding 1 GB is MLE (never AC, never a crash the judge cannot name); a language whose
    toolchain is missing is reported so (``infra``), for every program of it. Go's runtime reserves
    more address space than the row's limit before ``main`` runs, so this is also where it must start.
    The sandbox allows each process 4 GiB of address space, so that the row's limit is what binds
    (under the default 1 GiB, V8 grows its heap by a few tens of MB only, and a JVM with a 512 MB
    heap cannot start)."""
    import shutil

    from trl_sandbox.judge.languages import languages
    from trl_sandbox.local.command import LOCAL_PATH
    from trl_sandbox.sandbox import ResourceLimits, SandboxSpec

    assert sorted(HOLD_IN) == sorted(SUM_IN)
    cases = [(n, k, src) for n in sorted(HOLD_IN) for k, src in enumerate(HOLD_IN[n])]
    # CPU to spare (a JVM starting under load): only memory may fail these.
    rows = [_row(SUM_TESTS[:1], language=n, memory_limit=256, time_limit=10) for n, _, _ in cases]
    with SandboxPool.open("local", size=2, spec=SandboxSpec(limits=ResourceLimits(memory_mb=4096)),
                          made_by="test-io-judge") as roomy:
        right = score(roomy, GenericTask(), [_hold(src, 100) for _, _, src in cases], rows)
        hog = score(roomy, GenericTask(), [_hold(src, 1024) for _, _, src in cases], rows)
    installed = {n for n in HOLD_IN if not languages().get(n).missing(lambda t: shutil.which(t, path=LOCAL_PATH))}
    assert {"python", "cpp", "c"} <= installed
    for (name, k, _), good, bad in zip(cases, right, hog):
        if name in installed:
            assert good.status == "passed", (name, k, good.detail)
            assert bad.status == "error" and bad.detail.startswith("MLE 1;"), (name, k, bad.status, bad.detail)
        else:
            assert good.status == bad.status == "infra" and "not installed" in good.detail, (name, good.detail)


MEMORY_SCAN = textwrap.dedent("""
    import ctypes, gc, sys
    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # dumpable again: its own /proc/self/mem is readable
    data = sys.stdin.read()
    # Each secret in two halves, never joined here: only a copy made elsewhere holds it whole.
    halves = {halves!r}
    def has(blob, head, tail):
        at = blob.find(head)
        while at >= 0:
            if blob[at + len(head):at + len(head) + len(tail)] == tail:
                return True
            at = blob.find(head, at + 1)
        return False
    found = set()
    def look(blob):
        for n, (head, tail) in enumerate(halves):
            if isinstance(blob, bytes):
                head, tail = head.encode(), tail.encode()
            if has(blob, head, tail):
                found.add(n)
    for obj in gc.get_objects():
        if isinstance(obj, (dict, list, tuple)):
            look(repr(obj))
    frame = sys._getframe()
    while frame is not None:
        look(repr(list(frame.f_locals.values()))[:1 << 22])
        frame = frame.f_back
    with open('/proc/self/maps') as maps, open('/proc/self/mem', 'rb', 0) as mem:
        for line in maps:
            parts = line.split()
            if 'r' not in parts[1] or (len(parts) > 5 and parts[5].startswith('[v')):
                continue
            start, end = (int(x, 16) for x in parts[0].split('-'))
            try:
                mem.seek(start)
                look(mem.read(min(end - start, 64 << 20)))
            except (OSError, ValueError, OverflowError):
                continue
    print(' '.join(str(n) for n in sorted(found)) or 'none')
""")


def test_the_warm_interpreter_holds_nothing_of_the_tests(pool):
    """Python tests run in forks of a warm interpreter: a program that searches its own memory
    (objects, the frames it was called from, every readable mapping) finds its own input only."""
    mine, other_input, expected = (secrets.token_hex(8) for _ in range(3))
    program = MEMORY_SCAN.format(halves=[(s[:8], s[8:]) for s in (mine, other_input, expected)])
    # Secret 0 is test 1's input (in reach: the positive control), secret 1 test 2's input (in
    # reach of test 2 only), secret 2 test 4's expected output (never in reach). The runner holds
    # every test before the first runs; each test passes only if the search found what it should.
    tests = [{"input": f"{mine}\n", "output": "0\n"}, {"input": f"{other_input}\n", "output": "1\n"},
             {"input": "\n", "output": "none\n"}, {"input": "\n", "output": f"{expected}\n"}]
    outcome = _one(pool, program, _row(tests, compare="lines", time_limit=10))
    assert outcome.tests == (True, True, True, False), outcome.detail


# Every road by which a process signals, stops, renices or re-limits another, tried toward the
# test's parent (the warm interpreter or the runner), the parent's process group, everything above
# it and every other process it can see, and, as the positive control, toward a child of its own.
# It answers right only when every road toward the judge was refused and every road toward its
# own child worked; otherwise it reports what got through (stderr, exit 3: a runtime error).
ROADS = textwrap.dedent("""
    import ctypes, fcntl, json, os, resource, signal, socket, sys
    libc = ctypes.CDLL(None, use_errno=True)

    def attempt(call):
        try:
            ctypes.set_errno(0)
            if call() == -1:
                return "refused" if ctypes.get_errno() == 1 else "errno %d" % ctypes.get_errno()
            return "ok"
        except PermissionError:
            return "refused"
        except OSError as exc:
            return "errno %s" % exc.errno

    def queue_info(sig):
        info = ctypes.create_string_buffer(128)
        ctypes.memmove(info, (ctypes.c_int * 3)(sig, 0, -1), 12)  # si_code SI_QUEUE
        return info

    def roads(pid, sig):
        a, b = socket.socketpair()
        found = {
            "kill": attempt(lambda: os.kill(pid, sig)),
            # A group whose leader is outside the namespace has no number here (0: one's own group).
            "kill group": attempt(lambda: os.killpg(os.getpgid(pid), sig)) if os.getpgid(pid) else "refused",
            "tgkill": attempt(lambda: libc.syscall(234, pid, pid, sig)),
            "tkill": attempt(lambda: libc.syscall(200, pid, sig)),
            "rt_sigqueueinfo": attempt(lambda: libc.syscall(129, pid, sig, queue_info(sig))),
            "pidfd_send_signal": attempt(lambda: libc.syscall(424, os.pidfd_open(pid), sig, None, 0)),
            "F_SETOWN": attempt(lambda: fcntl.fcntl(a.fileno(), fcntl.F_SETOWN, pid)),
            "F_SETOWN group": attempt(lambda: fcntl.fcntl(a.fileno(), fcntl.F_SETOWN, -os.getpgid(pid)))
                              if os.getpgid(pid) else "refused",
            "setpriority": attempt(lambda: os.setpriority(os.PRIO_PROCESS, pid, 19)),
            "sched_setaffinity": attempt(lambda: os.sched_setaffinity(pid, {0})),
        }
        a.close(); b.close()
        return found

    n = int(input())
    mine = os.fork()
    if mine == 0:
        signal.pause()
        os._exit(0)
    control = roads(mine, signal.SIGCONT)
    os.kill(mine, signal.SIGKILL)
    os.waitpid(mine, 0)
    judge = roads(os.getppid(), signal.SIGSTOP)
    judge["kill everyone"] = attempt(lambda: os.kill(-1, signal.SIGSTOP))
    judge["prlimit"] = attempt(lambda: resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (3, 3)))
    others = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            others[name] = attempt(lambda: os.kill(int(name), signal.SIGSTOP))
    through = {k: v for k, v in judge.items() if v != "refused"}
    through.update({"pid " + k: v for k, v in others.items() if v == "ok"})
    # pidfd_send_signal is refused toward every process (a filter cannot tell one pidfd from another).
    broken = {k: v for k, v in control.items() if v != "ok" and k != "pidfd_send_signal"}
    if through or broken or not others:
        sys.stderr.write(json.dumps({"through": through, "control broken": broken, "seen": sorted(others)}))
        sys.exit(3)
    print(n * 2)
""")
ROADS_CPP = r"""
#include <csignal>
#include <cstdio>
#include <unistd.h>
#include <sys/resource.h>
int main() {
    long n; if (std::scanf("%ld", &n) != 1) return 1;
    pid_t parent = getppid();
    int through = 0;
    through += kill(parent, SIGSTOP) == 0;
    if (getpgid(parent) > 0) through += kill(-getpgid(parent), SIGSTOP) == 0;
    through += kill(-1, SIGSTOP) == 0;
    through += setpriority(PRIO_PROCESS, parent, 19) == 0;
    pid_t mine = fork();
    if (mine == 0) { pause(); _exit(0); }
    int control = kill(mine, SIGKILL) == 0;
    if (through || !control) { std::fprintf(stderr, "through %d control %d\n", through, control); return 3; }
    std::printf("%ld\n", n * 2);
}
"""


def test_no_road_from_a_test_reaches_the_judge(pool):
    """A test may signal, stop, renice or re-limit its own processes and nothing else: not the
    warm interpreter that forked it, not the runner, their process group, what is above them, or
    any other process it can see, by any road (``trl_sandbox.judge.guard``); in the local
    sandbox and in a container as a remote service gives one, in Python (forked by the warm
    interpreter) and C++ (started by the runner). Each program's own child is the positive control,
    and an honest program judged right after the attacks shows the judge unharmed."""
    import time

    tests = [{"input": f"{n}\n", "output": f"{n * 2}\n"} for n in (1, 2, 3)]
    rows = [_row(tests, time_limit=2.0), _row(tests, time_limit=2.0, language="cpp"), _row(tests)]
    programs = [ROADS, ROADS_CPP, "print(int(input()) * 2)"]
    start = time.monotonic()
    local = score(pool, GenericTask(), programs, rows)
    container = ContainerRunner()
    try:
        remote = score(container, GenericTask(), programs, rows)
    finally:
        container.close()
    assert [(o.status, o.passed) for o in local + remote] == [("passed", 3)] * 6, [o.detail for o in local + remote]
    assert time.monotonic() - start < 60  # nothing was stopped: no wall-clock backstop was reached


class ContainerRunner:
    """Runs judged programs in a fake remote sandbox (``trl_sandbox.remote.fake_container``): a
    bubblewrap container with its own PID namespace, /tmp, /var/tmp and /dev/shm and no seccomp.
    The I/O judge removes what a test adds to the scratch places: never point it at the host's."""

    def __init__(self) -> None:
        from trl_sandbox.remote.fake_container import FakeContainer

        from .task_helpers import SubprocessRunner

        self.container = FakeContainer()
        self.loop = SubprocessRunner().loop

    async def aexec(self, argv, *, stdin=None, timeout, files=(), cwd=None, env=None):
        import asyncio

        from .task_helpers import SubprocessRunner

        # One program at a time, as a lease of a remote sandbox is (the judge cleans the scratch places).
        self.lock = getattr(self, "lock", None) or asyncio.Lock()
        inside = ["/bin/sh", "-c", 'mkdir -p /tmp/work && cd /tmp/work && exec "$@"', "sh",
                  self.container.python, *argv[1:]]
        async with self.lock:
            return await SubprocessRunner().aexec(self.container.argv(inside), stdin=stdin, timeout=timeout)

    def close(self) -> None:
        self.container.kill()


def test_a_test_cannot_make_a_sibling_with_clone_parent(pool):
    """A process made with CLONE_PARENT is its maker's sibling: the runner's or the zygote's child,
    outside the test's own tree. The runner's filter refuses the flag to every test, in the local
    sandbox and in a container as a remote service gives one (no seccomp filter of its own; its own
    /tmp, never the host's). Positive control: the same program run directly in that container
    makes its sibling and answers."""

    sibling = textwrap.dedent("""
        import ctypes, os
        r, w = os.pipe()
        libc = ctypes.CDLL(None, use_errno=True)
        pid = libc.syscall(56, 0x00008000 | 17, 0, 0, 0, 0)  # clone(CLONE_PARENT | SIGCHLD)
        if pid == 0:
            os.write(w, b'x')
            os._exit(0)
        if pid > 0:
            os.read(r, 1)
        print(int(input()) * 2 if pid > 0 else 'clone refused')
    """)
    tests = [{"input": "21\n", "output": "42\n"}]
    local = _one(pool, sibling, _row(tests, time_limit=1.0))
    assert local.status == "failed", local.detail
    bare = ContainerRunner()
    try:
        remote = score(bare, GenericTask(), [sibling], _row(tests, time_limit=1.0))[0]
        direct = bare.loop.run(bare.aexec(["python3", "-c", sibling], stdin=b"21\n", timeout=30))
    finally:
        bare.close()
    assert remote.status == "failed", remote.detail
    assert direct.stdout.strip() == "42", direct  # positive control: without the judge the clone is made


def test_the_precompiled_header_is_valid_and_out_of_a_programs_reach(pool):
    """C++ compiles against <bits/stdc++.h> precompiled on the host (about 5x faster). g++ marks a
    precompiled header it uses with '!' under -H: the judge's own flags must find it valid. A
    program cannot write there, so it cannot plant a header for the next program's compile."""
    import time

    from trl_sandbox.local import toolchain_cache

    built = toolchain_cache.pch_dir.__wrapped__(wait=True)
    deadline = time.monotonic() + 120
    while not (built / "bits" / "stdc++.h.gch").exists() and time.monotonic() < deadline:
        time.sleep(0.5)  # another process of the suite may be building it
    assert (built / "bits" / "stdc++.h.gch").exists()
    with SandboxPool.open("local", size=1, made_by="test-io-pch") as fresh:  # binds what exists now
        check = fresh.loop.run(fresh.aexec(
            ["sh", "-c", "printf '#include <bits/stdc++.h>\\nint main(){}\\n' > m.cpp && "
             "g++ -std=c++17 -O2 -I/opt/trl-sandbox/pch -H -fsyntax-only m.cpp 2>&1 | head -3; "
             "touch /opt/trl-sandbox/pch/bits/planted.gch && echo planted || echo read-only"], timeout=60))
    assert "! /opt/trl-sandbox/pch/bits/stdc++.h.gch" in check.stdout, check.stdout
    assert check.stdout.strip().endswith("read-only")


def test_function_call_rows_of_the_published_layouts(pool):
    """APPS's fn_name rows (a top-level function, or LeetCode's class Solution) and LiveCodeBench's
    functional rows run through the function judge; results compare as their harnesses do."""
    import json

    apps = {"task_id": "apps-1", "input_output": json.dumps(
        {"fn_name": "min_max", "inputs": [[[3, 1, 2]], [[5]]], "outputs": [[[1, 3]], [[5, 5]]]})}
    top = "```python\ndef min_max(xs):\n    return (min(xs), max(xs))\n```"  # a tuple for the list: accepted
    method = "class Solution:\n    def min_max(self, xs):\n        return [min(xs), max(xs)]\n"
    wrong = "def min_max(xs):\n    return [max(xs), min(xs)]\n"
    lcb = {"task_id": "lcb-1", "metadata": json.dumps({"func_name": "countPairs"}), "public_test_cases": json.dumps(
        [{"input": "[1, 2, 3]\n4", "output": "1", "testtype": "functional"},
         {"input": "[2, 2]\n4", "output": "1", "testtype": "functional"}])}
    pairs = ("class Solution:\n    def countPairs(self, nums, target):\n"
             "        return sum(1 for i in range(len(nums)) for j in range(i + 1, len(nums)) if nums[i] + nums[j] == target)\n")
    outcomes = score(pool, GenericTask(), [top, method, wrong, pairs, "```python\ndef min_max(xs):\n    return (\n```"],
                     [apps, apps, apps, lcb, apps])
    assert [o.status for o in outcomes] == ["passed", "passed", "failed", "passed", "error"], [o.detail for o in outcomes]
    assert (outcomes[2].passed, outcomes[2].total) == (1, 2)  # [5, 5] is right either way round


def test_a_program_slow_on_every_test_cannot_outlast_the_reward_deadline(pool):
    """A failing program that spends nearly its limit on every test (or sleeps on each) would hold
    the sandbox past the reward call's deadline and score None instead of its failure: after two
    time limits, or its total time, the rest are time limits without running."""
    import time

    burn = textwrap.dedent("""
        import time
        end = time.process_time() + 0.4
        while time.process_time() < end:
            pass
        print(int(input()) * 2)
    """)
    tests = [{"input": f"{n}\n", "output": f"{n * 2}\n"} for n in range(6)]
    capped, roomy = score(pool, GenericTask(), [burn, burn],
                          [_row(tests, time_limit=1.0, total_time_limit=1.0), _row(tests, time_limit=1.0, total_time_limit=10)])
    assert roomy.status == "passed", roomy.detail  # positive control: within its total, every test runs and passes
    assert capped.status == "timeout" and 2 <= capped.passed <= 4 and "not run" in str(capped), capped
    start = time.monotonic()
    sleeper = _one(pool, "import time\ntime.sleep(60)", _row([{"input": "\n", "output": "x\n"}] * 20, time_limit=0.5))
    assert sleeper.status == "timeout" and sleeper.passed == 0
    assert time.monotonic() - start < 15  # two backstops, not twenty

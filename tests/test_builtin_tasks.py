"""The built-in task set: the original example's tasks, scored end to end in local sandboxes."""

from __future__ import annotations

import ast
import random

import pytest

from trl_sandbox import load_tasks
from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.scoring.scorer import Scorer
from trl_sandbox.tasks.builtin import SOLUTIONS, TASKS, BuiltinTasks
from trl_sandbox.tasks.call import _kadane, compute_inputs

from .task_helpers import judge_pool, score


@pytest.fixture(scope="module")
def pool():
    with SandboxPool.open("local", size=2) as pool:
        yield pool


def rows(task_id, n):
    return [{"prompt": TASKS[task_id]["prompt"], "task_id": task_id, "sandbox_task": "builtin"}] * n


def test_tasks_are_the_original_ones():
    assert set(TASKS) == {"sorting", "max_subarray"}
    assert TASKS["sorting"]["func_name"] == "sort_numbers" and TASKS["sorting"]["reference"] == "sorted"
    assert TASKS["sorting"]["banned_patterns"] == ["sorted(", ".sort(", "heapq", "import ", "__import__"]
    assert TASKS["max_subarray"]["func_name"] == "max_subarray_sum" and TASKS["max_subarray"]["reference"] == "_kadane"
    assert TASKS["max_subarray"]["banned_patterns"] == []
    assert len(TASKS["sorting"]["tests"]) == 5 and len(TASKS["max_subarray"]["tests"]) == 7
    for entry in TASKS.values():
        # the model continues the function body: the prompt ends right after the docstring
        assert entry["prompt"].endswith('    """\n')
        tree = ast.parse(entry["prompt"] + "    pass\n")
        assert [f.name for f in tree.body if isinstance(f, ast.FunctionDef)] == [entry["func_name"]]


def test_inputs_match_the_original_procedure_and_leave_global_random_alone():
    state = random.getstate()
    inputs = compute_inputs(TASKS["sorting"]["tests"])
    assert random.getstate() == state
    random.seed(0)
    original = [eval(t, {"random": random}) for t in TASKS["sorting"]["tests"]]
    assert inputs == original
    assert inputs[0] == [] and inputs[1] == [1, 3, 2] and len(inputs[3]) == 1000


def test_kadane_reference_against_brute_force():
    rng = random.Random(1)
    for _ in range(200):
        xs = [rng.randint(-10, 10) for _ in range(rng.randint(1, 12))]
        brute = max(sum(xs[i:j]) for i in range(len(xs)) for j in range(i + 1, len(xs) + 1))
        assert _kadane(xs) == brute


def test_expected_values_are_computed_on_the_host():
    spec = BuiltinTasks().spec("max_subarray")
    assert spec.expected[:5] == (5, -3, -1, 6, 10)
    assert BuiltinTasks().spec("sorting").expected[1] == [1, 2, 3]
    # the program sent to the sandbox carries inputs only, never the expected values
    built = BuiltinTasks().build(SOLUTIONS["max_subarray"], {"task_id": "max_subarray"})
    assert built.nonce_on_stdin and built.argv[:3] == ("python3", "-I", "-c")
    assert repr(spec.expected[5]).encode() not in built.stdin


def test_rows_and_load_tasks():
    task = BuiltinTasks()
    assert [r["task_id"] for r in task.rows()] == ["sorting", "max_subarray"]
    assert [r["task_id"] for r in task.rows(task_ids=["sorting"], repeat=3)] == ["sorting"] * 3
    ds = load_tasks("builtin", task_ids=["max_subarray"], repeat=2)
    assert ds.num_rows == 2 and ds[0]["sandbox_task"] == "builtin" and ds[0]["prompt"] == TASKS["max_subarray"]["prompt"]
    with pytest.raises(Exception, match="no task 'nope'"):
        task.rows(task_ids=["nope"])


def test_sorting_outcomes_and_original_rewards(pool):
    completions = [
        SOLUTIONS["sorting"],  # merge sort: passes
        "    return xs\n",  # only the inputs that are already sorted pass (1 of 5)
        "    return sorted(xs)\n",  # banned
        "    return getattr(xs, 'so' + 'rt')()\n",  # banned however it is spelled
        "    raise ValueError('nope')\n",  # raises: error
        "    while True:\n        pass\n",  # timeout
        "print('no body')\n",  # the body is empty: no code
        SOLUTIONS["sorting"],  # a repeat: run once
    ]
    outcomes, stats = pool.loop.run(Scorer(pool, cache_size=0).ascore(completions, rows("sorting", len(completions))))
    got = [(o.status, o.passed, o.total, o.reward) for o in outcomes]
    assert got[0] == ("passed", 5, 5, 1.0)
    assert got[1] == ("failed", 1, 5, 0.2)
    assert got[2][0] == got[3][0] == "banned" and got[2][3] == -1.0
    assert got[4] == ("error", 0, 5, -1.0) and "ValueError: nope" in outcomes[4].detail
    assert got[5][0] == "timeout" and got[5][3] == -1.0
    assert got[6] == ("no_code", 0, 5, -1.0)
    assert got[7] == got[0]
    assert stats.executed == 4  # banned and empty ones never run; the repeat is deduplicated


def test_max_subarray_partial_credit_and_raise_policy():
    wrong = "    return max(xs)\n"  # right on the all-negative and single-element inputs only
    raising = "    if len(xs) > 100:\n        raise IndexError('big')\n    best = cur = xs[0]\n" \
              "    for x in xs[1:]:\n        cur = max(x, cur + x)\n        best = max(best, cur)\n    return best\n"
    with judge_pool() as p:
        strict = score(p, BuiltinTasks(), [wrong, raising], {"task_id": "max_subarray"})
        lenient = score(p, BuiltinTasks(raise_is_error=False), [raising], {"task_id": "max_subarray"})
    assert (strict[0].status, strict[0].passed, strict[0].total) == ("failed", 3, 7)
    assert strict[0].tests == (True, True, True, False, False, False, False)
    # by default a raise on any test is an error (-1), with the passes still recorded
    assert (strict[1].status, strict[1].passed) == ("error", 5)
    # the original example counted a raising test as failed instead
    assert (lenient[0].status, lenient[0].passed) == ("failed", 5)


def test_body_stops_at_the_first_unindented_line(pool):
    completion = SOLUTIONS["max_subarray"] + "\nimport os\nos._exit(0)\n"
    outcome = Scorer(pool, cache_size=0).score([completion], rows("max_subarray", 1))[0]
    assert outcome.status == "passed" and outcome.reward == 1.0


def test_a_row_can_ask_for_whole_programs(pool):
    # e.g. a multi-turn episode scores its solution file, a whole program, not a body
    program = "def max_subarray_sum(xs):\n" + SOLUTIONS["max_subarray"]
    rows_ = [dict(rows("max_subarray", 1)[0], extract="auto"), rows("max_subarray", 1)[0]]
    outcomes = Scorer(pool, cache_size=0).score([program, program], rows_)
    assert [o.status for o in outcomes] == ["passed", "no_code"]


def test_validate_runs_the_known_good_solutions_in_a_sandbox():
    assert BuiltinTasks().validate() == []
    assert BuiltinTasks().validate(provider=None) == []

"""Task set ``io-basics``: whole programs in Python and C++, one problem with several right answers."""

from __future__ import annotations

import pytest

from trl_sandbox import ConfigError, load_tasks
from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.tasks import builtin_io
from trl_sandbox.tasks.resolve import resolve_task

from .task_helpers import score


@pytest.fixture(scope="module")
def pool():
    with SandboxPool.open("local", size=2, made_by="test-builtin-io") as pool:
        yield pool


def test_rows_and_options():
    ds = load_tasks("io-basics", repeat=2)
    assert len(ds) == 8 and set(ds["task_id"]) == set(builtin_io.PROBLEMS)
    assert all(row["sandbox_task"] == "io-basics" for row in ds)
    cpp = load_tasks("io-basics", task_ids=["two-sum-any"], language="cpp")[0]
    assert cpp["language"] == "cpp" and "C++17" in cpp["prompt"] and cpp["checker"]
    with pytest.raises(ConfigError, match="no task 'nope'"):
        load_tasks("io-basics", task_ids=["nope"])
    with pytest.raises(ConfigError, match="language='cobol'"):
        load_tasks("io-basics", language="cobol")


def test_the_references_pass_and_the_self_check_catches_a_wrong_one(monkeypatch):
    task = builtin_io.IOBasics()
    assert task.validate() == []
    broken = dict(builtin_io.PROBLEMS["sort-numbers"], cpp="int main() { return 0; }\n")
    monkeypatch.setitem(builtin_io.PROBLEMS, "sort-numbers", broken)
    problems = task.validate()
    assert len(problems) == 1 and "sort-numbers" in problems[0] and "failed" in problems[0]


def test_completions_are_scored_in_either_language(pool):
    task = resolve_task({"sandbox_task": "io-basics", "task_id": "max-subarray"})
    rows = [{"sandbox_task": "io-basics", "task_id": "max-subarray"}] * 4
    completions = [
        "Kadane:\n```python\n" + builtin_io.PROBLEMS["max-subarray"]["python"] + "```",
        "```cpp\n" + builtin_io.PROBLEMS["max-subarray"]["cpp"] + "```",
        "```python\nimport sys\nprint(sum(map(int, sys.stdin.read().split()[1:])))\n```",  # the whole array: wrong
        "I cannot solve this.",
    ]
    outcomes = score(pool, task, completions, rows)
    assert [o.status for o in outcomes[:3]] == ["passed", "passed", "failed"], [o.detail for o in outcomes]
    assert 0 < outcomes[2].passed < outcomes[2].total  # partial credit per test
    assert outcomes[3].status in ("error", "failed")  # prose is no program


def test_two_sum_accepts_any_right_pair_and_rejects_a_wrong_one(pool):
    task = resolve_task({"sandbox_task": "io-basics", "task_id": "two-sum-any"})
    brute_last = ("```python\nimport sys\nd = list(map(int, sys.stdin.read().split()))\nn, t, xs = d[0], d[1], d[2:]\n"
                  "pairs = [(i, j) for i in range(n) for j in range(i + 1, n) if xs[i] + xs[j] == t]\n"
                  "print(pairs[-1][0] + 1, pairs[-1][1] + 1)\n```")
    swapped = brute_last.replace("print(pairs[-1][0] + 1, pairs[-1][1] + 1)", "print(pairs[-1][1] + 1, pairs[-1][0] + 1)")
    last, wrong = score(pool, task, [brute_last, swapped], {"sandbox_task": "io-basics", "task_id": "two-sum-any"})
    assert last.status == "passed", last.detail  # the last pair, rarely the one the tests hold
    assert wrong.status == "failed" and "checker rejected" in wrong.detail

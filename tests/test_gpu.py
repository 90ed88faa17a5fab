"""GPU path: vLLM colocate + bf16 through SandboxGRPOTrainer.

Needs a CUDA GPU and vLLM (`pip install -e .[vllm]`); deselected by default (see pyproject's
addopts) and run with `pytest -m gpu`. It checks that the subclass leaves TRL's vLLM generation
untouched: generation by vLLM in the training process, rewards from the sandbox pool.
"""

from __future__ import annotations

import pytest

from tests import tiny

pytestmark = pytest.mark.gpu


def test_vllm_colocate_two_steps(tmp_path):
    import torch

    assert torch.cuda.is_available(), "this check needs a CUDA GPU"
    from trl_sandbox import SandboxGRPOConfig, SandboxGRPOTrainer, load_tasks

    model_dir = tmp_path / "tiny"
    model = tiny.model()
    model.save_pretrained(model_dir)  # vLLM loads by path
    tiny.tokenizer().save_pretrained(model_dir)
    args = SandboxGRPOConfig(
        output_dir=str(tmp_path / "out"), bf16=True, use_vllm=True, vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.2, per_device_train_batch_size=4, num_generations=2,
        max_completion_length=16, max_steps=2, logging_steps=1, save_strategy="no", report_to="none",
        sandbox_pool_size=2,
    )
    trainer = SandboxGRPOTrainer(model=str(model_dir), args=args, train_dataset=load_tasks("builtin"))
    trainer.train()
    assert trainer.state.global_step == 2
    logged = [r for r in trainer.state.log_history if "sandbox/pass_rate" in r]
    assert len(logged) == 2 and all("rewards/sandbox/mean" in r for r in logged)
    assert trainer.sandbox_pool.members == 0

"""``examples/train_lora.py``: GRPO on LoRA adapters with sandbox rewards, on CPU.

The model is the CPU demo's tiny Qwen2, briefly warm-started so that its bodies of the built-in
tasks are sometimes right and sometimes wrong (a group whose rewards are all equal has no
gradient, and the adapters would not move), saved to a directory and loaded by the example
through ``from_pretrained`` as a user's model would be.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from trl_sandbox import ConfigError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_lora.py"


def _example() -> dict:
    return runpy.run_path(str(EXAMPLE), run_name="train_lora")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from trl_sandbox.training.presets import cpu_demo

    demo = cpu_demo.build_cpu_demo(seed=0, warm_start_settings={"steps": 200}, progress=False)
    path = tmp_path_factory.mktemp("tiny-model")
    demo.model.save_pretrained(path)
    demo.tokenizer.save_pretrained(path)
    return path


@pytest.mark.slow
def test_lora_run_trains_the_adapters_and_leaves_the_base_weights_alone(model_dir, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    trainer = _example()["main"]([
        "--model", str(model_dir), "--output_dir", str(out), "--max_steps", "3", "--use_cpu", "true",
        "--bf16", "false", "--per_device_train_batch_size", "16", "--num_generations", "8",
        "--max_completion_length", "64", "--temperature", "1.0", "--learning_rate", "1e-2",
        "--sandbox_pool_size", "2", "--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "true",
        "--lora_r", "4", "--lora_alpha", "8", "--lora_dropout", "0.0", "--seed", "0",
    ])

    model = trainer.model
    assert isinstance(model, PeftModel)
    base = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    trained = {k: v.detach() for k, v in model.named_parameters()}
    lora_b = {k: v for k, v in trained.items() if "lora_B" in k}
    assert lora_b, "no LoRA adapters on the model"
    # lora_B starts at zero: any non-zero value was learnt from the sandbox's rewards.
    assert any(v.abs().max() > 0 for v in lora_b.values()), "the adapters did not change"
    frozen = {k: v for k, v in model.named_parameters() if "lora_" not in k}
    assert frozen and not any(v.requires_grad for v in frozen.values())
    compared = 0
    for name, value in model.get_base_model().state_dict().items():
        key = name.replace(".base_layer", "")
        if "lora_" not in name and key in base:
            assert torch.equal(value, base[key]), f"base weight {key} changed"
            compared += 1
    assert compared >= len(base) - 1  # every base weight (lm_head is tied to the embeddings)

    logs = [r for r in trainer.state.log_history if "sandbox/programs_run" in r]
    assert len(logs) == 3
    assert all(r["sandbox/infra"] == 0 for r in logs)
    assert any(r["reward_std"] > 0 for r in logs), "no group had rewards to tell apart (no gradient)"
    # The example's beta=0.01: the KL reference is the model with its adapters switched off.
    assert trainer.ref_model is None and all("kl" in r for r in logs)
    counted = [sum(r[f"sandbox/{s}"] for s in ("passed", "failed", "error", "timeout", "banned", "no_code")) for r in logs]
    assert counted == [16, 16, 16], "every completion was scored in the sandbox"
    assert (out / "adapter_config.json").exists() and (out / "adapter_model.safetensors").exists()
    assert trainer.sandbox_pool.members == 0


def test_lora_flags_are_checked(tmp_path):
    example = _example()
    with pytest.raises(ConfigError, match="lora_r"):
        example["lora_config"](example["LoraArguments"](lora_r=0))
    with pytest.raises(ConfigError, match="target_modules"):
        example["lora_config"](example["LoraArguments"](lora_target_modules=" , "))
    config = example["lora_config"](example["LoraArguments"](lora_target_modules="q_proj, v_proj"))
    assert set(config.target_modules) == {"q_proj", "v_proj"}

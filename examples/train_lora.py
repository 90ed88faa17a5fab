"""Train LoRA adapters with sandbox rewards: the base model stays frozen, only the adapters learn.

    accelerate launch examples/train_lora.py --model Qwen/Qwen3-1.7B-Base --lora_r 16
    python examples/train_lora.py --model ./my_model --max_steps 10 --use_cpu true

Every SandboxGRPOConfig field is a flag or a YAML key (TRL's TrlParser), as in examples/train.py;
the LoRA flags are ``--lora_r``, ``--lora_alpha``, ``--lora_dropout`` and ``--lora_target_modules``.
The adapters are what ``save_model`` writes to ``output_dir`` (``adapter_model.safetensors``):
load them with ``peft.PeftModel.from_pretrained(base, output_dir)``. With LoRA TRL computes the
KL term's reference by switching the adapters off, so ``beta > 0`` costs no second model.
Needs ``pip install trl-sandbox[lora]`` (peft).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

from trl import TrlParser

from trl_sandbox import ConfigError, SandboxGRPOConfig, SandboxGRPOTrainer, load_tasks

# TRL 1.16 asks transformers 5 for gradient checkpointing by its old name at every step (a FutureWarning
# each time); nothing for a user to change (trl_sandbox/commands/train.py does the same).
warnings.filterwarnings("ignore", message=r".*gradient_checkpointing.*is deprecated", category=FutureWarning)


@dataclass
class ScriptArguments:
    model: str = field(default="Qwen/Qwen3-1.7B-Base", metadata={"help": "Hub id or local path."})
    tasks: str = field(default="builtin", metadata={"help": "Task set (`trl-sandbox tasks` lists them)."})


@dataclass
class LoraArguments:
    lora_r: int = field(default=16, metadata={"help": "Rank of the adapters."})
    lora_alpha: int = field(default=32, metadata={"help": "Scale of the adapters (alpha / r multiplies them)."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the adapters' input."})
    lora_target_modules: str = field(
        default="all-linear",
        metadata={"help": "'all-linear' or comma-separated module names, e.g. 'q_proj,v_proj'."},
    )


def lora_config(args: LoraArguments):
    """The ``peft.LoraConfig`` for ``args``; a ``ConfigError`` saying what to install when peft is missing."""
    try:
        from peft import LoraConfig
    except ImportError as exc:
        raise ConfigError("LoRA needs peft: pip install 'trl-sandbox[lora]' (or pip install peft)") from exc
    if args.lora_r < 1:
        raise ConfigError(f"--lora_r must be at least 1, got {args.lora_r}")
    targets = args.lora_target_modules.strip()
    modules: str | list[str] = targets if targets == "all-linear" else [m.strip() for m in targets.split(",") if m.strip()]
    if not modules:
        raise ConfigError("--lora_target_modules is empty: give 'all-linear' or module names such as 'q_proj,v_proj'")
    return LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
                      target_modules=modules, task_type="CAUSAL_LM")


def main(argv: Sequence[str] | None = None) -> SandboxGRPOTrainer:
    parser = TrlParser((SandboxGRPOConfig, ScriptArguments, LoraArguments))
    parser.set_defaults_with_config(
        output_dir="training_results_lora", per_device_train_batch_size=10, num_generations=5,
        max_completion_length=512, learning_rate=1e-4, max_steps=64, loss_type="dapo", beta=0.01,
        sandbox_pool_size=10, sandbox_timeout=1.0, logging_steps=1,
    )
    config, script, lora = parser.parse_args_and_config(args=list(argv) if argv is not None else None)
    trainer = SandboxGRPOTrainer(model=script.model, args=config, train_dataset=load_tasks(script.tasks),
                                 peft_config=lora_config(lora))
    trainer.train()
    trainer.save_model(config.output_dir)  # the adapters only
    return trainer


if __name__ == "__main__":
    main()

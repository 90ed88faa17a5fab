"""The main job: ``trl-sandbox train`` / ``accelerate launch -m trl_sandbox.train``.

Built on TRL's own ``TrlParser``, so every ``SandboxGRPOConfig`` field is a flag and a YAML key
(``--config FILE.yaml``; flags override the file). Precedence, lowest first: the original TRL +
Daytona example's settings, the ``--preset``, the YAML file, the flags.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
# transformers 5 renamed gradient checkpointing to activation checkpointing; TRL 1.16 still asks for
# the old names at every step, and each ask prints a FutureWarning. Nothing for a user to change.
warnings.filterwarnings("ignore", message=r".*gradient_checkpointing.*is deprecated", category=FutureWarning)

# The original example (Qwen3-1.7B-Base on the two built-in tasks, one GPU, vLLM colocate).
ORIGINAL_DEFAULTS: dict[str, Any] = {
    "output_dir": "training_results",
    "per_device_train_batch_size": 10,
    "num_generations": 5,
    "max_completion_length": 512,
    "learning_rate": 5e-6,
    "max_steps": 64,
    "loss_type": "dapo",
    "beta": 0.01,
    "gradient_checkpointing": True,
    "logging_steps": 1,
    "save_strategy": "no",
    "report_to": "none",
    "sandbox_pool_size": 10,
    "sandbox_timeout": 1.0,
    "vllm_mode": "colocate",
    "vllm_gpu_memory_utilization": 0.15,
}


@dataclass
class TrainArguments:
    """What to train on; everything else is a ``SandboxGRPOConfig`` field."""

    model: str = field(
        default="Qwen/Qwen3-1.7B-Base",
        metadata={"help": "Hub id or local directory of the model to train (ignored with --preset cpu-demo)."},
    )
    tasks: str = field(default="builtin", metadata={"help": "Task set to train on (see `trl-sandbox tasks`)."})
    task_ids: str | None = field(
        default=None, metadata={"help": "Comma-separated task ids of the task set to keep (default: all)."}
    )
    preset: str | None = field(
        default=None,
        metadata={"help": "A named preset: `cpu-demo` trains a small in-process model on a CPU with no download."},
    )
    seed_preset: int = field(default=0, metadata={"help": "Seed of the preset's model, data and warm start."})
    plot: bool = field(
        default=True,
        metadata={"help": "Write rewards.png (mean reward and pass rate per step); `--no_plot` skips it."},
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Replace an earlier run found in `output_dir` (its files are removed first). Without it "
                  "a run refuses an `output_dir` that holds another run's results."},
    )


def _accelerator_defaults() -> dict[str, Any]:
    import importlib.util

    import torch

    if torch.cuda.is_available():
        return {"bf16": True, "use_vllm": importlib.util.find_spec("vllm") is not None}
    return {"use_cpu": True, "bf16": False, "use_vllm": False, "gradient_checkpointing": False}


def _flag(argv: Sequence[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _preset_name(argv: Sequence[str]) -> str | None:
    """The preset named on the command line, else in the YAML file: its settings must apply either way."""
    name = _flag(argv, "--preset")
    if name is not None:
        return name
    config_file = _flag(argv, "--config")
    if config_file:
        import yaml

        try:
            with open(config_file, encoding="utf-8") as fh:
                data = yaml.safe_load(fh) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"cannot read --config {config_file!r}: {exc}") from None
        if isinstance(data, dict) and data.get("preset"):
            return str(data["preset"])
    return None


def parse(argv: Sequence[str]):
    from trl import TrlParser

    from trl_sandbox.training.trainer import SandboxGRPOConfig

    parser = TrlParser((SandboxGRPOConfig, TrainArguments), prog="trl-sandbox train")
    defaults = {**ORIGINAL_DEFAULTS, **_accelerator_defaults()}
    preset = _preset_name(argv)
    if preset:
        from trl_sandbox.training.presets import get_preset

        defaults.update(get_preset(preset).config_overrides)
    parser.set_defaults_with_config(**defaults)
    config, train_args = parser.parse_args_and_config(list(argv))
    return config, train_args


def _fail(message: str) -> int:
    print(f"trl-sandbox train: error: {message}", file=sys.stderr)
    return 2


def load_model_or_fail(model: str) -> str | None:
    """None when ``model`` resolves (local dir or hub), else a one-line reason."""
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as exc:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        where = "the hub is disabled (HF_HUB_OFFLINE=1)" if offline else "it could not be downloaded"
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return (
            f"cannot load model {model!r}: it is not a local model directory and {where} ({first_line}). "
            "Pass --model with a local path, or try `--preset cpu-demo`, which needs no download."
        )
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from trl_sandbox.sandbox import ConfigError, SandboxError

    try:
        config, train_args = parse(argv)
    except (ConfigError, ValueError) as exc:
        return _fail(str(exc))
    try:
        return run(config, train_args)
    except (ConfigError, SandboxError) as exc:
        return _fail(str(exc))


def run(config, train_args: TrainArguments) -> int:
    from trl_sandbox.commands.progress import RewardProgressCallback, summarize
    from trl_sandbox.tasks.load import load_tasks
    from trl_sandbox.training.trainer import SandboxGRPOTrainer

    run_dir = preflight(config, train_args)
    kwargs: dict[str, Any] = {}
    if train_args.preset:
        from trl_sandbox.training.presets import get_preset

        built = get_preset(train_args.preset).build(seed=train_args.seed_preset, output_dir=config.output_dir)
        model, dataset = built.model, built.train_dataset
        kwargs["processing_class"] = built.tokenizer
    else:
        problem = load_model_or_fail(train_args.model)
        if problem:
            return _fail(problem)
        model = train_args.model
        task_ids = train_args.task_ids.split(",") if train_args.task_ids else None
        dataset = load_tasks(train_args.tasks, **({"task_ids": task_ids} if task_ids else {}))

    run_dir.claim()
    metrics_path = Path(config.output_dir) / (config.sandbox_metrics_file or "metrics.jsonl")

    progress = RewardProgressCallback()
    trainer = SandboxGRPOTrainer(model=model, args=config, train_dataset=dataset, callbacks=[progress], **kwargs)
    progress.install(trainer)
    t0 = time.perf_counter()
    trainer.train()
    elapsed = time.perf_counter() - t0
    if trainer.is_world_process_zero():
        trainer.save_model(config.output_dir)
        plot_path = None
        if train_args.plot and config.sandbox_metrics_file and metrics_path.exists():
            from trl_sandbox.commands.plotting import plot_rewards

            plot_path = Path(config.output_dir) / "rewards.png"
            plot_rewards(metrics_path, plot_path)
        summary = summarize(trainer, elapsed, metrics_path if metrics_path.exists() else None, plot_path)
        print(summary.text)
        with open(Path(config.output_dir) / "summary.json", "w") as fh:
            json.dump(summary.data, fh, indent=2)
        run_dir.finish()
        print(f"Results written to {Path(config.output_dir).resolve()}")
    return 0


def preflight(config, train_args: TrainArguments):
    """Every check that needs no model, before the model is loaded or built (which can take minutes).

    The provider's name and settings (a missing API key), the task set, the reward scheme and
    the output directory; returns the claimed-to-be run directory.
    """
    from trl_sandbox.commands.run_dir import RunDirectory
    from trl_sandbox.plugins import get_task_set, make_provider, providers

    if config.sandbox_provider not in providers():
        make_provider(config.sandbox_provider)  # raises the ConfigError with the close match
    # Building the provider checks its settings and credentials (no sandbox is created); the
    # trainer builds its own once the model is there.
    provider = make_provider(config.sandbox_provider, dict(config.sandbox_provider_settings or {}))
    _close_quietly(provider)
    if not train_args.preset:
        get_task_set(train_args.tasks)
    # Under `accelerate launch` every rank runs this; the first one owns the output directory.
    main_process = os.environ.get("RANK", "0") == "0"
    return RunDirectory(config.output_dir, overwrite=train_args.overwrite_output_dir, check=main_process)


def _close_quietly(provider: Any) -> None:
    import asyncio

    aclose = getattr(provider, "aclose", None)
    if aclose is None:
        return
    try:
        asyncio.run(aclose())
    except Exception:
        pass


if __name__ == "__main__":
    sys.exit(main())

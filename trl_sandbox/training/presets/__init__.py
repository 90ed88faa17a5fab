"""Named presets for ``trl-sandbox train --preset NAME``.

A preset is a recipe that needs nothing from the outside world: it builds its own model,
tokenizer and training data (``build``), and says which ``SandboxGRPOConfig`` fields it sets
(``config_overrides``, applied below the YAML file and the command-line flags).

``cpu-demo``
    A small Qwen2 model and a byte-level BPE tokenizer built in-process, warm-started on example
    solutions of the two built-in tasks (some correct, some wrong), then trained with GRPO on
    rewards from the local sandbox. See ``trl_sandbox.training.presets.cpu_demo``.

This module imports nothing heavy: reading ``config_overrides`` does not import torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trl_sandbox.sandbox import ConfigError
from trl_sandbox.training.presets import cpu_demo


@dataclass(frozen=True)
class Preset:
    """A named recipe: ``build(seed=..., output_dir=...)`` plus the config fields it sets."""

    name: str
    description: str
    builder: Callable[..., Any] = field(repr=False)
    config_overrides: Mapping[str, Any] = field(default_factory=dict)

    def build(self, seed: int = 0, output_dir: str | None = None, **options: Any) -> Any:
        """The model, tokenizer and dataset (an object with ``model``, ``tokenizer``, ``train_dataset``)."""
        return self.builder(seed=seed, output_dir=output_dir, **options)


PRESETS: dict[str, Preset] = {
    "cpu-demo": Preset(
        name="cpu-demo",
        description=(
            "a ~0.5M-parameter Qwen2 and tokenizer built in-process, warm-started on correct and wrong "
            "example solutions, then GRPO on the built-in tasks with local-sandbox rewards (CPU, no download)"
        ),
        builder=cpu_demo.build_cpu_demo,
        config_overrides=cpu_demo.CONFIG_OVERRIDES,
    ),
}


def get_preset(name: str) -> Preset:
    """The preset called ``name``; an unknown name raises ``ConfigError`` listing the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}") from None


__all__ = ["PRESETS", "Preset", "get_preset"]

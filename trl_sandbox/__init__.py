"""trl-sandbox: GRPO for code models, rewarded by running the model's code in sandboxes.

The public API. Names that need torch/trl are imported lazily, so that ``trl-sandbox exec`` and
provider plugins start fast.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from trl_sandbox.plugins.hookspecs import hookimpl
from trl_sandbox.sandbox import (
    Capabilities,
    ConfigError,
    ExecResult,
    InfraError,
    Outcome,
    Program,
    Provider,
    QuotaError,
    RateLimitError,
    ResourceLimits,
    Sandbox,
    SandboxError,
    SandboxGoneError,
    SandboxInfo,
    SandboxOutageError,
    SandboxSpec,
    Task,
)
from trl_sandbox.tasks.load import load_io_dataset, load_tasks

__version__ = "0.1.0"

_LAZY = {
    "SandboxGRPOConfig": "trl_sandbox.training.config",
    "SandboxGRPOTrainer": "trl_sandbox.training.trainer",
    "SandboxReward": "trl_sandbox.training.rewards",
    "SandboxEnvironment": "trl_sandbox.training.environment",
    "SandboxPool": "trl_sandbox.pool.sandbox_pool",
}

__all__ = [
    "Capabilities",
    "ConfigError",
    "ExecResult",
    "InfraError",
    "Outcome",
    "Program",
    "Provider",
    "QuotaError",
    "RateLimitError",
    "ResourceLimits",
    "Sandbox",
    "SandboxEnvironment",
    "SandboxError",
    "SandboxGRPOConfig",
    "SandboxGRPOTrainer",
    "SandboxGoneError",
    "SandboxInfo",
    "SandboxOutageError",
    "SandboxPool",
    "SandboxReward",
    "SandboxSpec",
    "Task",
    "hookimpl",
    "load_io_dataset",
    "load_tasks",
]

if TYPE_CHECKING:
    from trl_sandbox.pool.sandbox_pool import SandboxPool
    from trl_sandbox.training.config import SandboxGRPOConfig
    from trl_sandbox.training.environment import SandboxEnvironment
    from trl_sandbox.training.rewards import SandboxReward
    from trl_sandbox.training.trainer import SandboxGRPOTrainer


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trl_sandbox' has no attribute {name!r}")

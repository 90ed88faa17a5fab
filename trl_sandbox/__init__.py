"""trl-sandbox: GRPO for code models, rewarded by running the model's code in sandboxes.

The public API. Names that need torch/trl are imported lazily, so that ``trl-sandbox exec`` and
provider plugins start fast.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from .hookspecs import hookimpl
from .sandbox import (
    Capabilities,
    ConfigError,
    ExecResult,
    InfraError,
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
)
from .tasks import Outcome, Program, Task, load_tasks

__version__ = "0.1.0"

_LAZY = {
    "SandboxGRPOConfig": "trl_sandbox.config",
    "SandboxGRPOTrainer": "trl_sandbox.trainer",
    "SandboxReward": "trl_sandbox.rewards",
    "SandboxEnvironment": "trl_sandbox.environment",
    "SandboxPool": "trl_sandbox.pool",
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
    "load_tasks",
]

if TYPE_CHECKING:
    from .config import SandboxGRPOConfig
    from .environment import SandboxEnvironment
    from .pool import SandboxPool
    from .rewards import SandboxReward
    from .trainer import SandboxGRPOTrainer


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trl_sandbox' has no attribute {name!r}")

"""SandboxGRPOConfig: TRL's ``GRPOConfig`` plus the sandbox settings, each with a help text.

Every ``sandbox_*`` field is settable from YAML or the command line through ``TrlParser``. The
config checks its own values when it is built (a budget that is not positive, an unknown reward
scheme), so a mistake is reported before any model or sandbox exists.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from trl import GRPOConfig

from trl_sandbox.sandbox import ConfigError, ResourceLimits, SandboxSpec
from trl_sandbox.scoring.schemes import get_scheme


def parse_mapping(value: Any, name: str) -> dict[str, Any]:
    """A dict from a dict, a JSON object string, or ``KEY=VALUE,KEY=VALUE``."""
    if value is None or value == "":
        return {}
    if isinstance(value, dict):
        return dict(value)
    text = str(value).strip()
    if text.startswith("{"):
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{name} is not valid JSON: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"{name} must be a JSON object")
        return loaded
    out: dict[str, Any] = {}
    for item in text.split(","):
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{name}: expected KEY=VALUE pairs separated by commas, got {item!r}")
        out[key.strip()] = val.strip()
    return out


def _has_accelerator() -> bool:
    import torch

    for name in ("cuda", "xpu", "npu", "mps"):
        backend = getattr(torch, name, None) or getattr(torch.backends, name, None)
        try:
            if backend is not None and backend.is_available():
                return True
        except Exception:
            continue
    return False


@dataclass
class SandboxGRPOConfig(GRPOConfig):
    r"""
    [`~trl.GRPOConfig`] plus the sandbox settings. Every `sandbox_*` field is settable from YAML
    or the command line through [`~trl.TrlParser`].
    """

    sandbox_provider: str = field(
        default="local",
        metadata={"help": "Sandbox provider: `local` (built-in bubblewrap) or one added by a plugin, e.g. `daytona`."},
    )
    sandbox_provider_settings: dict | str | None = field(
        default=None,
        metadata={
            "help": "Settings passed to the provider's factory, as a dict, a JSON object string or "
            "`KEY=VALUE,KEY=VALUE` (e.g. `python=/usr/bin/python3` for `local`)."
        },
    )
    sandbox_pool_size: int = field(
        default=4,
        metadata={"help": "Warm sandboxes per training process (sizes are per process under `accelerate launch`)."},
    )
    sandbox_timeout: float = field(
        default=1.0,
        metadata={"help": "Seconds of its own CPU time each program may use; past it the result is a timeout (reward -1 by "
                  "default). Waiting for a core does not count; a program that sleeps or blocks ends at a wall-clock "
                  "backstop (about 4x)."},
    )
    sandbox_cpu_seconds: float | None = field(
        default=None,
        metadata={"help": "CPU-seconds limit per program. Defaults to twice `sandbox_timeout`, at least 1."},
    )
    sandbox_memory_mb: int = field(
        default=1024, metadata={"help": "Address-space limit per program, in MiB."}
    )
    sandbox_max_processes: int = field(
        default=64, metadata={"help": "Maximum processes and threads per program (stops fork bombs)."}
    )
    sandbox_file_size_mb: int = field(default=64, metadata={"help": "Largest file a program may write, in MiB."})
    sandbox_output_bytes: int = field(
        default=16 * 1024 * 1024,
        metadata={"help": "Captured bytes per output stream; the rest is discarded and the result marked truncated."},
    )
    sandbox_image: str | None = field(
        default=None, metadata={"help": "Container image or snapshot for remote providers (ignored by `local`)."}
    )
    sandbox_network: bool = field(
        default=False, metadata={"help": "Give sandboxes network access. Off by default; `local` never allows it."}
    )
    sandbox_lifetime_s: float = field(
        default=6 * 3600.0,
        metadata={"help": "Server-side lifetime of each sandbox in seconds: a run killed with SIGKILL leaks nothing for longer."},
    )
    sandbox_tags: dict | str | None = field(
        default=None,
        metadata={"help": "Extra tags for every sandbox, as a dict, JSON or `KEY=VALUE,KEY=VALUE`."},
    )
    sandbox_reward_scheme: str = field(
        default="original",
        metadata={
            "help": "How an outcome becomes a reward: `original` (-1 for banned/no code/error/timeout, else the "
            "fraction of tests passed), `binary`, `partial`, `weighted:W1,W2,...`, `task` (the task's own) or "
            "`module:function`."
        },
    )
    sandbox_reward_deadline_s: float | None = field(
        default=300.0,
        metadata={"help": "Upper bound on one reward call; unfinished completions score None (infrastructure)."},
    )
    sandbox_max_attempts: int = field(
        default=3,
        metadata={"help": "Attempts per program on infrastructure errors. A 429/503/transport error keeps the "
                  "sandbox (reset, then reused); a sandbox that is gone, dead or past its deadline is replaced."},
    )
    sandbox_outage_s: float = field(default=300.0, metadata={
        "help": "Seconds of failing sandbox creates, none succeeding, after which training stops with an error "
        "naming the provider and its last error. Shorter outages only make reward calls wait."})
    sandbox_host_create_rate: float | None = field(default=None, metadata={
        "help": "Sandbox creates started per second by all training processes of this machine together (the "
        "ranks of one launch), per provider; keep it below the service's rate limit. None: no limit."})
    sandbox_host_create_concurrency: int | None = field(default=None, metadata={
        "help": "Sandbox creates in flight at once across all training processes of this machine, per provider. "
        "None: no limit."})
    sandbox_cache_size: int = field(
        default=4096, metadata={"help": "Results kept for identical programs (0 disables the cache)."}
    )
    sandbox_cache_bytes: int = field(default=64 << 20, metadata={
        "help": "Host memory the result cache may hold, in bytes (default 64 MiB). A result over 64 KiB of "
        "output is kept as its outcomes only; older entries go first once the budget is reached."})
    sandbox_env_prefetch: int = field(default=4, metadata={
        "help": "Prepared environments (the dataset's `environment` column) of the next generation batch to build "
        "in the background while the current batch runs, following the sampler's order; at most this many keys "
        "ahead. 0 disables prefetching (each environment is then built at its first lease)."})
    sandbox_metrics_file: str | None = field(
        default="metrics.jsonl",
        metadata={"help": "File in `output_dir` that receives every logged metrics record as a JSON line (None: off)."},
    )

    def __post_init__(self) -> None:
        if self.bf16 is None and not self.fp16 and not _has_accelerator():
            # TRL defaults to bf16, which transformers refuses on a machine without an accelerator;
            # there, training can only run on the CPU in full precision.
            self.bf16 = False
            self.use_cpu = True
        super().__post_init__()
        self._check_sandbox_fields()

    @classmethod
    def from_grpo_config(cls, args: GRPOConfig) -> SandboxGRPOConfig:
        """``args`` as a ``SandboxGRPOConfig`` with the sandbox defaults, its own values untouched.

        A copy with the class switched, rather than a rebuild from ``to_dict()``: TRL's
        ``__post_init__`` derives fields (``generation_batch_size``, ``steps_per_generation``)
        that it then refuses to see set together.
        """
        new = copy.copy(args)
        new.__class__ = cls
        for f in dataclasses.fields(cls):
            if f.name.startswith("sandbox_") and not hasattr(new, f.name):
                setattr(new, f.name, f.default if f.default is not dataclasses.MISSING else f.default_factory())
        new._check_sandbox_fields()
        return new

    def _check_sandbox_fields(self) -> None:
        self.sandbox_provider_settings = parse_mapping(self.sandbox_provider_settings, "sandbox_provider_settings")
        self.sandbox_tags = parse_mapping(self.sandbox_tags, "sandbox_tags")
        if self.sandbox_pool_size < 1:
            raise ConfigError("sandbox_pool_size must be at least 1")
        if not self.sandbox_timeout or self.sandbox_timeout <= 0:
            raise ConfigError("sandbox_timeout must be a positive number of seconds")
        if not self.sandbox_lifetime_s or self.sandbox_lifetime_s <= 0:
            raise ConfigError("sandbox_lifetime_s must be a positive number of seconds (it is always finite)")
        # Budgets: 0 or less would fail every program (or, for some rlimits, mean "unlimited").
        for name in ("sandbox_max_attempts", "sandbox_memory_mb", "sandbox_max_processes", "sandbox_file_size_mb", "sandbox_output_bytes"):
            if getattr(self, name) is None or getattr(self, name) <= 0:
                raise ConfigError(f"{name}={getattr(self, name)!r}: set it to a positive number")
        for name in ("sandbox_cpu_seconds", "sandbox_reward_deadline_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"{name}={value!r}: set it to a positive number of seconds (or leave it unset)")
        if isinstance(self.sandbox_env_prefetch, bool) or not isinstance(self.sandbox_env_prefetch, int) \
                or self.sandbox_env_prefetch < 0:
            raise ConfigError(f"sandbox_env_prefetch={self.sandbox_env_prefetch!r}: set it to a number of keys, "
                              "0 or more (0 turns prefetching off)")
        get_scheme(self.sandbox_reward_scheme)  # an unknown scheme fails here, not at the first step
        if not isinstance(self.sandbox_outage_s, (int, float)) or not self.sandbox_outage_s > 0:
            raise ConfigError(f"sandbox_outage_s must be a positive number of seconds, got {self.sandbox_outage_s!r}")

    def sandbox_spec(self) -> SandboxSpec:
        cpu = self.sandbox_cpu_seconds or max(1.0, 2 * self.sandbox_timeout)
        limits = ResourceLimits(
            cpu_seconds=cpu,
            memory_mb=self.sandbox_memory_mb,
            max_processes=self.sandbox_max_processes,
            file_size_mb=self.sandbox_file_size_mb,
            output_bytes=self.sandbox_output_bytes,
        )
        return SandboxSpec(
            image=self.sandbox_image,
            network=self.sandbox_network,
            lifetime_s=self.sandbox_lifetime_s,
            limits=limits,
        )

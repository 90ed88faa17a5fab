"""SandboxGRPOConfig and SandboxGRPOTrainer: TRL's GRPO with sandbox-run rewards.

The trainer adds exactly three things to ``GRPOTrainer``: a default reward (``SandboxReward``),
a sandbox pool whose life follows training (started on ``on_train_begin``; torn down on
``on_train_end`` and, because TRL does not call ``on_train_end`` then, in a ``finally`` around
``train()`` on exceptions, Ctrl-C and SIGTERM), and sandbox metrics. Generation, vLLM and the
loss are TRL's own and untouched.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from .environment import JUDGE_HEADROOM, EpisodeTally, SandboxEnvironment
from .plugins import make_provider
from .pool import PoolSettings, SandboxPool
from .rewards import SandboxReward
from .sandbox import ConfigError, ResourceLimits, SandboxSpec
from .schemes import get_scheme
from .scoring import Scorer
from .tags import MADE_BY_TAG, RunInfo, collect_tags, new_run_id
from .tasks import STATUSES, TASK_COLUMN, resolve_task

log = logging.getLogger("trl_sandbox")


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


def validate_dataset(dataset: Any, name: str = "train_dataset") -> None:
    """Fail at construction, naming what is missing, instead of at the first reward call."""
    if dataset is None:
        return
    columns = getattr(dataset, "column_names", None)
    if isinstance(columns, dict):  # DatasetDict
        for split, ds in dataset.items():
            validate_dataset(ds, f"{name}[{split!r}]")
        return
    if columns is not None and "prompt" not in columns:
        raise ConfigError(f"{name} has no 'prompt' column (columns: {sorted(columns)})")
    try:
        first = dataset[0] if hasattr(dataset, "__getitem__") else next(iter(dataset))
    except (IndexError, StopIteration):
        raise ConfigError(f"{name} is empty") from None
    task = resolve_task(first)  # raises ConfigError for an unknown task set or missing test columns
    required = getattr(task, "required_columns", ())
    missing = [c for c in required if c not in first]
    if missing:
        raise ConfigError(
            f"{name} lacks the columns task set {first.get(TASK_COLUMN)!r} needs: {', '.join(missing)}"
        )


class SandboxLifecycleCallback(TrainerCallback):
    """Starts the pool with training, closes it at the end, and records sandbox metrics."""

    def __init__(self, trainer: SandboxGRPOTrainer) -> None:
        self.trainer = trainer
        self._step_t0: float | None = None
        self._reward_s0 = 0.0
        self._isolation_mode: str | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.trainer.start_sandboxes()

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_t0 = time.perf_counter()
        self._reward_s0 = self.trainer.sandbox_reward_seconds()

    def on_step_end(self, args, state, control, **kwargs):
        if self._step_t0 is None:
            return
        step_s = time.perf_counter() - self._step_t0
        reward_s = self.trainer.sandbox_reward_seconds() - self._reward_s0
        metrics = self.trainer._metrics["train"]
        if step_s > 0:
            metrics["sandbox/reward_time_share"].append(min(1.0, reward_s / step_s))
        self._log_usage(metrics, step_s)
        # Episodes of SandboxEnvironment are scored through TRL's get_reward, which passes no log_metric.
        episodes = self.trainer.sandbox_episodes.drain()
        if episodes:
            for status in STATUSES:
                metrics[f"sandbox/{status}"].append(float(episodes[status]))
            metrics["sandbox/pass_rate"].append(episodes["passed"] / sum(episodes.values()))

    def _log_usage(self, metrics, step_s: float) -> None:
        """The sandboxes' CPU seconds this step, and the cores they kept busy on average: when
        rewards compete with generation for cores, this is where it shows. The isolation mode is a
        string, which TRL's averaged metrics cannot hold: it goes to ``metrics.jsonl``, and
        ``sandbox/cgroups`` (1 or 0) to every tracker."""
        usage = self.trainer.sandbox_pool.provider_usage()
        mode = usage.get("sandbox/isolation_mode")
        if isinstance(mode, str):
            self._isolation_mode = mode
            metrics["sandbox/cgroups"].append(1.0 if mode.startswith("cgroup") else 0.0)
        cpu = usage.get("sandbox/cpu_s")
        if isinstance(cpu, (int, float)):
            metrics["sandbox/cpu_s"].append(float(cpu))
            if step_s > 0:
                metrics["sandbox/cpu_cores"].append(float(cpu) / step_s)
        walls = usage.get("sandbox/wall_timeouts")
        if isinstance(walls, (int, float)):
            # Programs ended by the wall-clock backstop (they slept or blocked), apart from the
            # ordinary timeouts of programs that used their CPU budget.
            metrics["sandbox/wall_timeouts"].append(float(walls))

    def on_log(self, args, state, control, logs=None, **kwargs):
        name = getattr(args, "sandbox_metrics_file", "metrics.jsonl")
        if not name or not logs or not state.is_world_process_zero or not args.output_dir:
            return
        path = Path(args.output_dir) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"step": state.global_step, "time": time.time(), **logs}
        if self._isolation_mode is not None:
            record["sandbox/isolation_mode"] = self._isolation_mode
        with path.open("a") as fh:
            fh.write(json.dumps(record, default=float) + "\n")

    def on_train_end(self, args, state, control, **kwargs):
        self.trainer.close_sandboxes()


class SandboxGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose default reward runs each completion in a sandbox against its task's tests.

    ``reward_funcs`` defaults to ``[SandboxReward]``; any ``SandboxReward`` you pass is bound to the
    trainer's pool. A plain ``GRPOConfig`` is accepted and gets the sandbox defaults.
    """

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: GRPOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        callbacks: list[TrainerCallback] | None = None,
        **kwargs: Any,
    ) -> None:
        if args is None:
            args = SandboxGRPOConfig(output_dir="trl-sandbox-output")
        elif not isinstance(args, SandboxGRPOConfig):
            args = SandboxGRPOConfig.from_grpo_config(args)
        validate_dataset(train_dataset, "train_dataset")
        validate_dataset(eval_dataset, "eval_dataset")

        # Build the provider now: a missing binary or API key must fail here, not after an hour.
        provider = make_provider(args.sandbox_provider, dict(args.sandbox_provider_settings))
        self.sandbox_pool = SandboxPool(
            provider,
            spec=args.sandbox_spec(),
            size=args.sandbox_pool_size,
            settings=PoolSettings(max_attempts=args.sandbox_max_attempts, outage_s=float(args.sandbox_outage_s),
                                  host_create_rate=args.sandbox_host_create_rate,
                                  host_create_concurrency=args.sandbox_host_create_concurrency),
            made_by="trainer",
        )
        self.sandbox_episodes = EpisodeTally()  # outcomes of SandboxEnvironment episodes, logged per step
        self.sandbox_run = RunInfo(run_id=os.environ.get("TRL_SANDBOX_RUN_ID") or new_run_id(), args=args)
        self.sandbox_run.model_name = model if isinstance(model, str) else getattr(
            getattr(model, "config", None), "_name_or_path", None
        ) or type(model).__name__

        if reward_funcs is None:
            # With SandboxEnvironment the reward is the episode's get_reward(), not the transcript.
            reward_funcs = [] if _is_sandbox_environment(kwargs.get("environment_factory")) else [self._new_reward(args)]
        elif not isinstance(reward_funcs, list):
            reward_funcs = [reward_funcs]
        self.sandbox_rewards = [f for f in reward_funcs if isinstance(f, SandboxReward)]
        for reward in self.sandbox_rewards:
            reward.bind(self.sandbox_pool)

        kwargs["environment_factory"] = self._bind_environment(kwargs.get("environment_factory"), args)

        callbacks = [*(callbacks or []), SandboxLifecycleCallback(self)]
        try:
            super().__init__(
                model=model,
                reward_funcs=reward_funcs,
                args=args,
                train_dataset=train_dataset,
                eval_dataset=eval_dataset,
                callbacks=callbacks,
                **kwargs,
            )
        except BaseException:
            self.sandbox_pool.close()
            raise
        self.sandbox_run.rank = self.accelerator.process_index
        self.sandbox_run.world_size = self.accelerator.num_processes

    def _bind_environment(self, factory: Any, args: SandboxGRPOConfig) -> Any:
        """Give ``SandboxEnvironment`` episodes the trainer's pool, sized for a whole batch of rollouts."""
        if not _is_sandbox_environment(factory):
            return factory
        # Every rollout of a generation batch holds its sandbox for its episode, and the judge needs
        # more; warm that many from the start (episodes grow the pool further if a batch needs it).
        needed = args.per_device_train_batch_size * args.steps_per_generation + JUDGE_HEADROOM
        if self.sandbox_pool.size < needed:
            log.warning("sandbox_pool_size raised from %d to %d: each rollout of a batch holds a sandbox for its "
                        "episode, plus %d for the judge", self.sandbox_pool.size, needed, JUDGE_HEADROOM)
            self.sandbox_pool.size = needed
        scorer = Scorer(self.sandbox_pool, scheme=args.sandbox_reward_scheme, cache_size=0,
                        timeout=args.sandbox_timeout)
        return functools.partial(factory, pool=self.sandbox_pool, scorer=scorer, tally=self.sandbox_episodes)

    def _new_reward(self, args: SandboxGRPOConfig) -> SandboxReward:
        return SandboxReward(
            self.sandbox_pool,
            scheme=args.sandbox_reward_scheme,
            timeout=args.sandbox_timeout,
            deadline_s=args.sandbox_reward_deadline_s,
            cache_size=args.sandbox_cache_size,
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def start_sandboxes(self) -> None:
        """Start warming the pool; generation of the first batch overlaps the warm-up."""
        if not self.sandbox_pool.started:
            tags = collect_tags(self.sandbox_run, {**self.args.sandbox_tags, MADE_BY_TAG: "trainer"})
            self.sandbox_pool.start(wait=False, tags=tags)

    def close_sandboxes(self) -> None:
        self.sandbox_pool.close()

    def sandbox_reward_seconds(self) -> float:
        return sum(r.seconds_total for r in self.sandbox_rewards)

    def train(self, *args: Any, **kwargs: Any):
        with _raise_on_sigterm():
            try:
                return super().train(*args, **kwargs)
            finally:
                # TRL does not call on_train_end on exceptions or Ctrl-C: tear down here.
                self.close_sandboxes()


class TrainingTerminated(SystemExit):
    """Raised in the main thread on SIGTERM so that ``finally`` blocks (pool teardown) run."""


@contextlib.contextmanager
def _raise_on_sigterm() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):
        if callable(previous) and previous not in (signal.SIG_DFL, signal.SIG_IGN):
            previous(signum, frame)
        raise TrainingTerminated(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _is_sandbox_environment(factory: Any) -> bool:
    return isinstance(factory, type) and issubclass(factory, SandboxEnvironment)

"""SandboxGRPOConfig and SandboxGRPOTrainer: TRL's GRPO with sandbox-run rewards.

The trainer adds exactly three things to ``GRPOTrainer``: a default reward (``SandboxReward``),
a sandbox pool whose life follows training (started on ``on_train_begin``; torn down on
``on_train_end`` and, because TRL does not call ``on_train_end`` then, in a ``finally`` around
``train()`` on exceptions, Ctrl-C and SIGTERM), and sandbox metrics (merged over ranks under
``accelerate launch``, see ``rank_metrics``). Generation, vLLM and the loss are TRL's own and
untouched.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from trl_sandbox.local.command import LOCAL_PATH
from trl_sandbox.plugins import make_provider
from trl_sandbox.pool.sandbox_pool import PoolSettings, SandboxPool
from trl_sandbox.pool.tags import MADE_BY_TAG, RunInfo, collect_tags, new_run_id
from trl_sandbox.sandbox import STATUSES, TASK_COLUMN, ConfigError
from trl_sandbox.scoring.scorer import Scorer
from trl_sandbox.tasks.io_layouts import check_io_toolchains, io_memory_warning
from trl_sandbox.tasks.resolve import resolve_task
from trl_sandbox.training.config import SandboxGRPOConfig, parse_mapping  # noqa: F401  (public from here too)
from trl_sandbox.training.env_prefetch import (
    EnvironmentPrefetch,
    check_environments,
    record_environment_metrics,
)
from trl_sandbox.training.environment import JUDGE_HEADROOM, EpisodeTally, SandboxEnvironment
from trl_sandbox.training.environment_factory import EnvironmentFactory
from trl_sandbox.training.rank_metrics import RankMetrics
from trl_sandbox.training.rewards import SandboxReward

log = logging.getLogger("trl_sandbox")


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
        metrics = self.trainer.sandbox_metrics
        if step_s > 0:
            metrics.slowest("sandbox/reward_time_share", min(1.0, reward_s / step_s))
        self._log_usage(metrics, step_s)
        record_environment_metrics(metrics, self.trainer.sandbox_pool)  # env/builds, env/hit_rate, ...
        # Episodes of SandboxEnvironment are scored through TRL's get_reward, which passes no log_metric.
        episodes = self.trainer.sandbox_episodes.drain()
        if episodes:
            for status in STATUSES:
                metrics.count(f"sandbox/{status}", float(episodes[status]))
            metrics.rate("sandbox/pass_rate", episodes["passed"], sum(episodes.values()))

    def _log_usage(self, metrics: RankMetrics, step_s: float) -> None:
        """The sandboxes' CPU seconds this step, and the cores they kept busy on average: when
        rewards compete with generation for cores, this is where it shows. The isolation mode is a
        string, which TRL's averaged metrics cannot hold: it goes to ``metrics.jsonl``, and
        ``sandbox/cgroups`` (1 or 0) to every tracker."""
        usage = self.trainer.sandbox_pool.provider_usage()
        mode = usage.get("sandbox/isolation_mode")
        if isinstance(mode, str):
            self._isolation_mode = mode
            metrics.weakest("sandbox/cgroups", 1.0 if mode.startswith("cgroup") else 0.0)
        cpu = usage.get("sandbox/cpu_s")
        if isinstance(cpu, (int, float)):
            # Summed over ranks: the CPU seconds and cores the whole run's sandboxes used.
            metrics.count("sandbox/cpu_s", float(cpu))
            if step_s > 0:
                metrics.count("sandbox/cpu_cores", float(cpu) / step_s)
        walls = usage.get("sandbox/wall_timeouts")
        if isinstance(walls, (int, float)):
            # Programs ended by the wall-clock backstop (they slept or blocked), apart from the
            # ordinary timeouts of programs that used their CPU budget.
            metrics.count("sandbox/wall_timeouts", float(walls))

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
        if getattr(provider, "name", "") == "local":  # remote images bring their own toolchains
            for dataset in (train_dataset, eval_dataset):
                check_io_toolchains(dataset, LOCAL_PATH)
                warning = io_memory_warning(dataset, args.sandbox_memory_mb)
                if warning:
                    log.warning(warning)
        specs = None  # every row's prepared environment, parsed now: a malformed one fails here
        if not isinstance(kwargs.get("environment_factory"), dict):  # a dict's rows name TRL's factories there
            specs = check_environments(train_dataset, provider, "train_dataset")
            check_environments(eval_dataset, provider, "eval_dataset")
        self.sandbox_pool = SandboxPool(
            provider,
            spec=args.sandbox_spec(),
            size=args.sandbox_pool_size,
            settings=PoolSettings(max_attempts=args.sandbox_max_attempts, outage_s=float(args.sandbox_outage_s),
                                  host_create_rate=args.sandbox_host_create_rate,
                                  host_create_concurrency=args.sandbox_host_create_concurrency),
            made_by="trainer",
        )
        self.sandbox_env_prefetch = (EnvironmentPrefetch(self.sandbox_pool, specs, args.sandbox_env_prefetch)
                                     if specs and args.sandbox_env_prefetch > 0 else None)
        self.sandbox_episodes = EpisodeTally()  # outcomes of SandboxEnvironment episodes, logged per step
        # Sandbox metrics are recorded here and merged over ranks in log(), not averaged by TRL.
        self.sandbox_metrics = RankMetrics(mode=lambda: "train" if self.model.training else "eval")
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
            reward.bind(self.sandbox_pool, metrics=self.sandbox_metrics)

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
        if self.sandbox_env_prefetch is not None:
            self.sandbox_env_prefetch.rank = self.accelerator.process_index
            self.sandbox_env_prefetch.world = self.accelerator.num_processes
        if self.accelerator.num_processes > 1 and not os.environ.get("TRL_SANDBOX_RUN_ID"):
            # One run id for every rank (rank 0's), so that `reap --tag trl-sandbox-run=ID` finds
            # all of a launch's sandboxes; the rank tag tells them apart.
            from accelerate.utils import broadcast_object_list

            self.sandbox_run.run_id = broadcast_object_list([self.sandbox_run.run_id], from_process=0)[0]

    def _bind_environment(self, factory: Any, args: SandboxGRPOConfig) -> Any:
        """Give ``SandboxEnvironment`` episodes the trainer's pool, sized for a whole batch of rollouts.

        ``SandboxEnvironment.factory(...)`` (made for trainers that bind no pool) is taken as its
        class and episode settings: the trainer's pool replaces the one it would build."""
        if not _is_sandbox_environment(factory):
            return factory
        settings: dict[str, Any] = {}
        if isinstance(factory, EnvironmentFactory):
            factory, settings = factory.environment_class, dict(factory.environment_kwargs)
        # Every rollout of a generation batch holds its sandbox for its episode, and the judge needs
        # more; warm that many from the start (episodes grow the pool further if a batch needs it).
        needed = args.per_device_train_batch_size * args.steps_per_generation + JUDGE_HEADROOM
        if self.sandbox_pool.size < needed:
            log.warning("sandbox_pool_size raised from %d to %d: each rollout of a batch holds a sandbox for its "
                        "episode, plus %d for the judge", self.sandbox_pool.size, needed, JUDGE_HEADROOM)
            self.sandbox_pool.size = needed
        scorer = Scorer(self.sandbox_pool, scheme=args.sandbox_reward_scheme, cache_size=0,
                        timeout=args.sandbox_timeout)
        return functools.partial(factory, pool=self.sandbox_pool, scorer=scorer, tally=self.sandbox_episodes, **settings)

    def _new_reward(self, args: SandboxGRPOConfig) -> SandboxReward:
        return SandboxReward(
            self.sandbox_pool,
            scheme=args.sandbox_reward_scheme,
            timeout=args.sandbox_timeout,
            deadline_s=args.sandbox_reward_deadline_s,
            cache_size=args.sandbox_cache_size,
            cache_bytes=args.sandbox_cache_bytes,
        )

    # -- prefetching the next batch's environments along TRL's sampler order -----------------

    def _get_train_sampler(self, *args: Any, **kwargs: Any):
        sampler = super()._get_train_sampler(*args, **kwargs)
        dataset = args[0] if args else kwargs.get("dataset", kwargs.get("train_dataset"))
        if self.sandbox_env_prefetch is None or (dataset is not None and dataset is not self.train_dataset):
            return sampler
        return self.sandbox_env_prefetch.follow(sampler)

    def _generate_and_score_completions(self, inputs: Any) -> Any:
        if self.sandbox_env_prefetch is not None and self.model.training:
            self.sandbox_env_prefetch.advance()  # the next batch's environments build while this one runs
        return super()._generate_and_score_completions(inputs)

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

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Add the sandbox metrics, merged over ranks, before TRL averages and logs.

        Every rank reaches ``log()`` at the same step (transformers gathers the loss just before),
        so this is where the ranks' snapshots are gathered: one ``gather_object`` per call, on
        every rank, with or without values. Each rank then appends the same merged value, which
        TRL's mean leaves as it is; ``metrics.jsonl``, the progress bar and the summary (written
        by the main process from these logs) show the whole run.
        """
        mode = "train" if self.model.training else "eval"
        gather = _gather_per_rank if self.accelerator.num_processes > 1 else None
        for key, value in self.sandbox_metrics.merge(mode, gather).items():
            self._metrics[mode][key].append(value)
        super().log(logs, start_time)

    def train(self, *args: Any, **kwargs: Any):
        with _raise_on_sigterm() as sigterm:
            try:
                return super().train(*args, **kwargs)
            finally:
                # TRL does not call on_train_end on exceptions or Ctrl-C: tear down here. A SIGTERM
                # that arrives meanwhile (a launcher ending every rank after one failed) waits
                # until the teardown is done instead of cutting it short.
                with sigterm.deferred():
                    self.close_sandboxes()


class TrainingTerminated(SystemExit):
    """Raised in the main thread on SIGTERM so that ``finally`` blocks (pool teardown) run."""


class _SigtermGuard:
    """What ``_raise_on_sigterm`` yields: ``deferred()`` holds a SIGTERM back while cleanup runs."""

    def __init__(self) -> None:
        self.deferring = False
        self.pending: int | None = None

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """SIGTERMs inside are remembered, not raised; the first is raised once the block ends."""
        self.deferring = True
        try:
            yield
        finally:
            self.deferring = False
            signum, self.pending = self.pending, None
            if signum is not None:
                raise TrainingTerminated(128 + signum)


@contextlib.contextmanager
def _raise_on_sigterm() -> Iterator[_SigtermGuard]:
    guard = _SigtermGuard()
    if threading.current_thread() is not threading.main_thread():
        yield guard
        return
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):
        if guard.deferring:
            guard.pending = guard.pending or signum
            return
        if callable(previous) and previous not in (signal.SIG_DFL, signal.SIG_IGN):
            previous(signum, frame)
        raise TrainingTerminated(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield guard
    finally:
        signal.signal(signal.SIGTERM, previous)


def _gather_per_rank(obj: Any) -> list[Any]:
    """``[obj of rank 0, obj of rank 1, ...]`` (a collective: gloo on CPU, NCCL on GPUs)."""
    from accelerate.utils import gather_object

    return gather_object([obj])


def _is_sandbox_environment(factory: Any) -> bool:
    return isinstance(factory, EnvironmentFactory) or (isinstance(factory, type) and issubclass(factory, SandboxEnvironment))

"""A training dataset's ``environment`` column: checked at construction, prefetched along TRL's
sampler order, and its per-step metrics.

``check_environments`` parses every distinct cell when the trainer is built (a malformed one is a
``ConfigError`` naming its row, not a failure an hour in) and refuses a provider that cannot
prepare environments. ``EnvironmentPrefetch`` follows TRL's ``RepeatSampler``: it materialises
each epoch's order (drawing from the sampler exactly as TRL would) and, at every generation,
asks the pool to prepare the distinct environments of the *next* generation batch (this rank's
slice of it) in the background, at most ``limit`` keys ahead. Preparing is single-flight, so a
lease of a key being prefetched waits for that build instead of starting its own; a prefetch that
fails is logged and forgotten (the lease then gets ``SetupFailed`` and scores ``None``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from torch.utils.data import Sampler

from trl_sandbox.agents.task import check_grades_agent_tasks
from trl_sandbox.environments.builds import BuildStats
from trl_sandbox.environments.spec import ENVIRONMENT_COLUMN, EnvironmentSpec, parse
from trl_sandbox.sandbox import TASK_COLUMN, ConfigError
from trl_sandbox.training.rank_metrics import RankMetrics

log = logging.getLogger("trl_sandbox")


def _supporting_providers() -> str:
    from trl_sandbox.plugins import providers

    try:
        names = sorted(n for n, r in providers().items() if hasattr(r.obj, "prepare_environment"))
    except Exception:  # a broken plugin must not hide the real message
        names = []
    return ", ".join(names or ["local", "ray"])


def check_environments(dataset: Any, provider: Any, name: str = "train_dataset") -> list[EnvironmentSpec | None] | None:
    """Every row's environment (``None`` for a row without one), or ``None`` when no row has one
    (or the dataset is not a map-style dataset with columns)."""
    columns = getattr(dataset, "column_names", None)
    if isinstance(columns, dict):  # a DatasetDict: check every split, prefetch none
        for split, ds in dataset.items():
            check_environments(ds, provider, f"{name}[{split!r}]")
        return None
    if not columns or ENVIRONMENT_COLUMN not in columns:
        return None
    cells = dataset[ENVIRONMENT_COLUMN]
    parsed: dict[str, EnvironmentSpec | None] = {}
    specs: list[EnvironmentSpec | None] = []
    for index, cell in enumerate(cells):
        text = cell if isinstance(cell, str) else json.dumps(cell, sort_keys=True, default=str)
        if text not in parsed:
            try:
                parsed[text] = parse(cell)
            except ConfigError as exc:
                row = dataset[index]
                task = f" (task_id {row['task_id']!r})" if isinstance(row, dict) and row.get("task_id") else ""
                raise ConfigError(f"{name} row {index}{task}: {exc}") from None
        specs.append(parsed[text])
    if all(s is None for s in specs):
        return None
    if TASK_COLUMN in columns and "agent" in set(dataset[TASK_COLUMN]):
        check_grades_agent_tasks(provider, name)  # before the next check: the more useful message
    if not callable(getattr(provider, "prepare_environment", None)):
        raise ConfigError(
            f"{name} has rows with an 'environment' column, which the {getattr(provider, 'name', '?')!r} provider "
            f"cannot prepare; the providers that can: {_supporting_providers()} (sandbox_provider=...)")
    return specs


class FollowingSampler(Sampler):
    """TRL's sampler, drawn once per epoch into a list that the prefetch reads ahead in."""

    def __init__(self, inner: Any, prefetch: EnvironmentPrefetch) -> None:
        super().__init__()
        self.inner = inner
        self.prefetch = prefetch

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Iterator[int]:
        order = list(iter(self.inner))
        self.prefetch.new_epoch(order, self._peek_next_epoch())
        return iter(order)

    def _peek_next_epoch(self) -> list[int] | None:
        """The next epoch's first unique indices, from a copy of the sampler's generator (the
        sampler itself is not advanced); ``None`` for a sampler that is not TRL's."""
        inner = self.inner
        try:
            size, n = int(inner.batch_size), int(inner.num_samples)
            if not inner.shuffle:
                return list(range(min(size, n)))
            import torch

            generator = torch.Generator()
            generator.set_state(inner.generator.get_state())
            return torch.randperm(n, generator=generator).tolist()[:size]
        except Exception:
            return None


class EnvironmentPrefetch:
    """Prepare the next generation batch's environments while the current one runs."""

    def __init__(self, pool: Any, specs: Sequence[EnvironmentSpec | None], limit: int) -> None:
        self.pool = pool
        self.specs = list(specs)
        self.limit = int(limit)
        self.rank, self.world = 0, 1  # set by the trainer once accelerate knows them
        self.lookaheads: list[int] = []  # keys sent ahead at each generation (for metrics and tests)
        self._order: list[int] = []
        self._first_of_next: list[int] | None = None
        self._chunk = self._repeat = self._mini = 1
        self._position = 0
        self._asked: set[EnvironmentSpec] = set()
        self._inflight: set[Any] = set()

    def follow(self, sampler: Any) -> FollowingSampler:
        self._chunk = int(getattr(sampler, "batch_size", 1)) * int(getattr(sampler, "mini_repeat_count", 1))
        self._mini = int(getattr(sampler, "mini_repeat_count", 1))
        self._repeat = int(getattr(sampler, "repeat_count", 1))
        return FollowingSampler(sampler, self)

    def new_epoch(self, order: list[int], first_of_next: list[int] | None) -> None:
        self._order, self._first_of_next, self._position = order, first_of_next, 0

    def _next_batch(self) -> list[int]:
        """This rank's indices of the generation batch after the current one."""
        span = self._chunk * self._repeat
        start = (self._position + 1) * span
        if start + self._chunk <= len(self._order):
            batch = self._order[start:start + self._chunk]
        elif self._first_of_next is not None:  # the next epoch's first batch
            batch = [i for i in self._first_of_next for _ in range(self._mini)]
        else:
            return []
        local = max(1, len(batch) // max(1, self.world))
        return batch[self.rank * local:(self.rank + 1) * local]

    def advance(self) -> None:
        """Called as a generation batch starts: send the next one's environments ahead. Never raises."""
        try:
            self._advance()
        except Exception as exc:  # a hint only: training goes on, leases build at first use
            log.warning("prefetching prepared environments failed: %r", exc)
        finally:
            self._position += 1

    def _advance(self) -> None:
        self._inflight = {f for f in self._inflight if not f.done()}
        room = self.limit - len(self._inflight)
        wanted: list[EnvironmentSpec] = []
        for index in self._next_batch():
            spec = self.specs[index] if 0 <= index < len(self.specs) else None
            if spec is not None and spec not in self._asked and spec not in wanted:
                wanted.append(spec)
        wanted = wanted[:max(0, room)]
        if not wanted or not getattr(self.pool, "started", False):
            self.lookaheads.append(0)
            return
        if len(self._asked) > 4096:
            self._asked.clear()
        for spec in wanted:
            self._asked.add(spec)
            future = self.pool.loop.submit(self.pool.prepare_environment(spec))
            future.add_done_callback(_report)
            self._inflight.add(future)
        self.lookaheads.append(len(wanted))


def _report(future: Any) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.info("a prefetched environment did not build (its leases will say why): %s", future.exception())


def drain_environment_stats(pool: Any) -> BuildStats | None:
    """The provider's prepared-environment counters since the last call: its ``environment_stats()``,
    else its ``environments.builds`` (the local and ray providers); ``None`` when it has neither."""
    provider = getattr(pool, "provider", None)
    own = getattr(provider, "environment_stats", None)
    if callable(own):
        return own()
    builds = getattr(getattr(provider, "environments", None), "builds", None)
    return builds.drain() if builds is not None else None


def record_environment_metrics(metrics: RankMetrics, pool: Any) -> None:
    """``env/builds``, ``env/build_s``, ``env/failures`` (summed over ranks), ``env/hit_rate`` (from
    the summed counts) and ``env/lease_ms_p50``/``_max`` (over every rank's samples) of one step:
    raw counts, so that ranks merge exactly (a provider's finished ``environment_metrics()`` would not)."""
    stats = drain_environment_stats(pool)
    if stats is None:
        return
    if not (stats.builds or stats.hits or stats.misses or stats.failures or stats.lease_ms):
        return  # a step that prepared and leased nothing logs no env/* keys
    metrics.count("env/builds", float(stats.builds))
    metrics.count("env/build_s", float(stats.build_s))
    metrics.count("env/failures", float(stats.failures))
    if stats.hits + stats.misses:
        metrics.rate("env/hit_rate", stats.hits, stats.hits + stats.misses)
    if stats.lease_ms:
        metrics.samples("env_lease_ms", stats.lease_ms, {"env/lease_ms_p50": 50, "env/lease_ms_max": 100})

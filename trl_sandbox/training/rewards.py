"""SandboxReward: the TRL reward function that runs completions in sandboxes.

It is an ``async`` callable, so TRL runs it on its event loop concurrently with other async
rewards; the work itself happens on the pool's loop. It returns ``None`` only for
infrastructure failures (TRL then leaves that completion out of its group's baseline), and
it bounds the whole call with a deadline: a stuck provider costs one batch of ``None``s,
never a hung run with an idle GPU.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trl_sandbox.pool.sandbox_pool import SandboxPool, percentile
from trl_sandbox.sandbox import STATUSES, Outcome, SandboxSpec
from trl_sandbox.scoring.schemes import RewardScheme
from trl_sandbox.scoring.scorer import CACHE_BYTES, Scorer
from trl_sandbox.training.rank_metrics import RankMetrics

# Keyword arguments TRL passes that are not dataset columns.
_TRL_KWARGS = {"trainer_state", "log_extra", "log_metric", "environments", "completion_ids"}


class SandboxReward:
    """Reward = the task's verdict on the completion, run in a sandbox.

    Use it inside ``SandboxGRPOTrainer`` (which owns the pool), or on its own with a plain
    ``GRPOTrainer``: ``GRPOTrainer(..., reward_funcs=[SandboxReward(provider="local")])``; it then
    starts its own pool on the first call and closes it at exit.
    """

    def __init__(
        self,
        pool: SandboxPool | None = None,
        *,
        scheme: str | RewardScheme | None = "original",
        timeout: float | None = None,
        deadline_s: float | None = None,
        cache_size: int = 4096,
        cache_bytes: int = CACHE_BYTES,
        provider: str = "local",
        provider_settings: Mapping[str, Any] | None = None,
        pool_size: int = 4,
        spec: SandboxSpec | None = None,
    ) -> None:
        self.__name__ = "sandbox"  # TRL names the metric rewards/<name>/mean after this
        self._scheme = scheme
        self._timeout = timeout
        self._cache_size = cache_size
        self._cache_bytes = cache_bytes
        self.deadline_s = deadline_s
        self._pool = pool
        self._owns_pool = pool is None
        self._pool_args = (provider, dict(provider_settings or {}), pool_size, spec)
        self._pool_pid = os.getpid()  # the process whose pool ``_pool`` is
        self._scorer: Scorer | None = None
        self._lock = threading.Lock()
        self.seconds_total = 0.0  # wall time spent inside reward calls, read by the trainer
        self._pool_was_up = False
        self._metrics: RankMetrics | None = None
        self.last_outcomes: list[Outcome] = []
        if pool is None:
            # Validate the provider now (missing binary or API key) rather than at the first batch.
            self._pool = self._new_pool()

    def _new_pool(self) -> SandboxPool:
        from trl_sandbox.plugins import make_provider

        provider, settings, size, spec = self._pool_args
        self._pool_pid = os.getpid()
        return SandboxPool(make_provider(provider, dict(settings)), spec=spec, size=size, made_by="reward")

    @property
    def pool(self) -> SandboxPool:
        with self._lock:
            # Unpickled in another process, or called in a forked child (which has a copy of the
            # parent's pool but not its loop thread): a pool of this process's own, on first use.
            if self._pool is None or (self._owns_pool and self._pool_pid != os.getpid()):
                self._pool, self._scorer, self._pool_was_up = self._new_pool(), None, False
            return self._pool

    # -- pickling: TRL's AsyncGRPOTrainer scores in a spawned child process --------------------

    def __getstate__(self) -> dict[str, Any]:
        """The settings only: a pool (its loop thread, its live sandboxes) belongs to one process.

        The copy builds a pool of its own, of the same provider and size, on its first call, and
        that pool closes when the copy's process exits (``SandboxPool.start`` registers that). A
        reward bound to another pool (a trainer's) cannot follow it: the copy would score nothing
        the owner accounts for, so it is refused with a ``TypeError``, which pickle reports.
        """
        if not self._owns_pool:
            raise TypeError(
                "this SandboxReward uses a pool it does not own (a trainer's): it cannot be sent to another "
                "process. Give the other process its own: SandboxReward(provider=..., pool_size=...)"
            )
        state = dict(self.__dict__)
        state.update(_pool=None, _scorer=None, _lock=None, _pool_was_up=False, last_outcomes=[], seconds_total=0.0)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def bind(self, pool: SandboxPool, metrics: RankMetrics | None = None) -> None:
        """Use ``pool`` (the trainer's) instead of a private one, and record metrics in ``metrics``
        (merged across ranks by the trainer) instead of TRL's ``log_metric`` (averaged by TRL)."""
        with self._lock:
            self._metrics = metrics
            if self._owns_pool and self._pool is not None and not self._pool.started:
                self._pool = None
            self._pool, self._owns_pool, self._scorer = pool, False, None
            self._pool_was_up = False

    def _get_scorer(self) -> Scorer:
        pool = self.pool
        with self._lock:
            if not pool.started:
                pool.start(wait=False)
            if self._scorer is None:
                self._scorer = Scorer(pool, scheme=self._scheme, cache_size=self._cache_size, timeout=self._timeout,
                                      cache_bytes=self._cache_bytes)
            return self._scorer

    def close(self) -> None:
        if self._owns_pool and self._pool is not None and self._pool_pid == os.getpid():
            self._pool.close()

    async def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        log_metric: Callable[[str, float], None] | None = None,
        log_extra: Callable[[str, list], None] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        t0 = time.perf_counter()
        scorer = self._get_scorer()
        if not self._pool_was_up:
            # Fail fast only before the pool was ever up (bad key, quota, no bwrap): training on
            # nothing is pointless. Later outages score None and the pool heals in the background.
            await self.pool.aready()
            self._pool_was_up = True
        columns = {k: v for k, v in kwargs.items() if k not in _TRL_KWARGS}
        rows = [{"prompt": prompts[i], **{k: v[i] for k, v in columns.items()}} for i in range(len(prompts))]
        outcomes, stats = await scorer.ascore(completions, rows, deadline_s=self.deadline_s)
        outage = self.pool.outage
        if outage is not None:
            # Past the outage budget no sandbox exists and none can be made: stop training with
            # the provider's error rather than step on a batch of None rewards.
            raise outage
        elapsed = time.perf_counter() - t0
        self.seconds_total += elapsed
        self.last_outcomes = outcomes
        if self._metrics is not None:
            self._record(self._metrics, outcomes, stats, elapsed)
        elif log_metric is not None:
            self._log(log_metric, outcomes, stats, elapsed)
        if log_extra is not None:
            log_extra("sandbox_status", [o.status for o in outcomes])
            log_extra("sandbox_detail", [o.detail[:200] for o in outcomes])
        return [o.reward for o in outcomes]

    def _record(self, metrics: RankMetrics, outcomes: list[Outcome], stats, elapsed: float) -> None:
        """The same metrics as ``_log``, each with its rule for merging ranks (see ``rank_metrics``)."""
        n = len(outcomes)
        metrics.slowest("sandbox/reward_call_s", elapsed)
        for status in STATUSES:
            metrics.count(f"sandbox/{status}", float(stats.outcomes.get(status, 0)))
        metrics.rate("sandbox/pass_rate", stats.outcomes.get("passed", 0), n)
        metrics.count("sandbox/programs_run", float(stats.executed))
        metrics.rate("sandbox/dedup_rate", n - stats.programs if n else 0, n)
        pool = self.pool.drain_stats()
        metrics.samples("exec_s", pool.exec_s, {"sandbox/exec_p50_s": 50, "sandbox/exec_p95_s": 95})
        metrics.rate("sandbox/warm_lease_rate", pool.counts["leases_warm"],
                     pool.counts["leases_warm"] + pool.counts["leases_cold"], empty=1.0)
        metrics.samples("lease_wait_s", pool.lease_wait_s, {"sandbox/lease_wait_p95_s": 95})
        metrics.count("sandbox/retries", float(pool.counts["retries"]))
        metrics.count("sandbox/replaced", float(pool.counts["replaced"]))

    def _log(self, log_metric, outcomes: list[Outcome], stats, elapsed: float) -> None:
        """Metrics through TRL's ``log_metric`` (a reward on a plain ``GRPOTrainer``): TRL averages
        them over processes, so under ``accelerate launch`` counts read as per-rank means."""
        n = max(1, len(outcomes))
        log_metric("sandbox/reward_call_s", elapsed)
        for status in STATUSES:
            log_metric(f"sandbox/{status}", float(stats.outcomes.get(status, 0)))
        log_metric("sandbox/pass_rate", stats.outcomes.get("passed", 0) / n)
        log_metric("sandbox/programs_run", float(stats.executed))
        log_metric("sandbox/dedup_rate", 1.0 - stats.programs / n if outcomes else 0.0)
        pool = self.pool.drain_stats()
        # Every key is logged on every call: TRL gathers metrics across processes, and ranks
        # logging different key sets is a known source of distributed stalls.
        log_metric("sandbox/exec_p50_s", _finite(percentile(pool.exec_s, 50)))
        log_metric("sandbox/exec_p95_s", _finite(percentile(pool.exec_s, 95)))
        leases = pool.counts["leases_warm"] + pool.counts["leases_cold"]
        log_metric("sandbox/warm_lease_rate", pool.counts["leases_warm"] / leases if leases else 1.0)
        log_metric("sandbox/lease_wait_p95_s", _finite(percentile(pool.lease_wait_s, 95)))
        log_metric("sandbox/retries", float(pool.counts["retries"]))
        log_metric("sandbox/replaced", float(pool.counts["replaced"]))


def _finite(value: float) -> float:
    return 0.0 if value != value else value  # NaN (no samples) -> 0

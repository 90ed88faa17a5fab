"""Merging the ranks' sandbox metrics: sums, rates from summed counts, percentiles of merged samples.

The two-process runs in test_multiprocess.py gather real snapshots over gloo; here two
``RankMetrics`` stand for two ranks (the gather is the list of their snapshots, in rank order)
so that each rule can be checked with numbers where the wrong rule gives a different answer.
"""

from __future__ import annotations

import asyncio

import pytest

from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.pool.settings import PoolSettings, percentile
from trl_sandbox.training.rank_metrics import MAX_SAMPLES, RankMetrics
from trl_sandbox.training.rewards import SandboxReward


def merge_two(rank0: RankMetrics, rank1: RankMetrics, mode: str = "train") -> dict[str, float]:
    theirs = rank1.take(mode)
    return rank0.merge(mode, gather=lambda mine: [mine, theirs])


def test_counts_are_summed_over_ranks_and_read_per_step():
    rank0, rank1 = RankMetrics(), RankMetrics()
    for passed in (3, 1):  # two reward calls in one logging window
        rank0.count("sandbox/passed", passed)
    for passed in (2, 2):
        rank1.count("sandbox/passed", passed)
    # Per step: (3 + 2 + 1 + 2) / 2 calls = 4 (TRL's mean over processes would say 2).
    assert merge_two(rank0, rank1)["sandbox/passed"] == 4.0


def test_rates_come_from_the_summed_counts():
    rank0, rank1 = RankMetrics(), RankMetrics()
    rank0.rate("sandbox/warm_lease_rate", 1, 1, empty=1.0)  # 1 of 1 lease warm
    rank1.rate("sandbox/warm_lease_rate", 0, 9, empty=1.0)  # 0 of 9 warm
    # 1 of 10 leases were warm; the mean of the two ranks' rates would say 0.5.
    assert merge_two(rank0, rank1)["sandbox/warm_lease_rate"] == pytest.approx(0.1)
    lonely = RankMetrics()
    lonely.rate("sandbox/warm_lease_rate", 0, 0, empty=1.0)
    assert lonely.merge("train")["sandbox/warm_lease_rate"] == 1.0


def test_latency_percentiles_are_those_of_every_ranks_samples_together():
    rank0, rank1 = RankMetrics(), RankMetrics()
    wanted = {"sandbox/exec_p50_s": 50, "sandbox/exec_p95_s": 95}
    rank0.samples("exec_s", [10.0] * 3, wanted)
    rank1.samples("exec_s", [1.0] * 97, wanted)
    merged = merge_two(rank0, rank1)
    every = [10.0] * 3 + [1.0] * 97
    assert merged["sandbox/exec_p95_s"] == percentile(every, 95) == 1.0  # the max of p95s would say 10
    assert merged["sandbox/exec_p50_s"] == 1.0
    nothing = RankMetrics()
    nothing.samples("exec_s", [], wanted)
    assert nothing.merge("train") == {"sandbox/exec_p50_s": 0.0, "sandbox/exec_p95_s": 0.0}


def test_the_slowest_rank_and_the_weakest_rank_decide():
    rank0, rank1 = RankMetrics(), RankMetrics()
    for seconds in (1.0, 3.0):
        rank0.slowest("sandbox/reward_call_s", seconds)
    rank1.slowest("sandbox/reward_call_s", 0.5)
    rank0.weakest("sandbox/cgroups", 1.0)
    rank1.weakest("sandbox/cgroups", 0.0)
    merged = merge_two(rank0, rank1)
    assert merged["sandbox/reward_call_s"] == 2.0  # rank 0's mean; every rank waited for it
    assert merged["sandbox/cgroups"] == 0.0


def test_a_key_only_one_rank_logged_is_kept():
    rank0, rank1 = RankMetrics(), RankMetrics()
    rank1.count("sandbox/passed", 3)
    assert merge_two(rank0, rank1) == {"sandbox/passed": 3.0}


def test_training_and_evaluation_windows_stay_apart_and_are_emptied():
    state = {"mode": "train"}
    metrics = RankMetrics(mode=lambda: state["mode"])
    metrics.count("sandbox/passed", 2)
    state["mode"] = "eval"
    metrics.count("sandbox/passed", 5)
    assert metrics.merge("eval") == {"sandbox/passed": 5.0}
    assert metrics.merge("train") == {"sandbox/passed": 2.0}
    assert metrics.merge("train") == {}


def test_samples_are_thinned_to_a_bound():
    metrics = RankMetrics()
    metrics.samples("exec_s", range(3 * MAX_SAMPLES), {"p50": 50})
    kept = metrics.take("train")["samples"]["exec_s"][0]
    assert MAX_SAMPLES // 2 <= len(kept) <= MAX_SAMPLES
    assert min(kept) == 0 and max(kept) > 2 * MAX_SAMPLES  # spread over the whole range


def test_one_process_logs_what_trls_log_metric_got_before(flaky_provider):
    """Single-process behaviour is unchanged: the values recorded for merging equal the ones the
    same reward call hands to TRL's ``log_metric`` (timings aside, which differ between calls)."""
    pool = SandboxPool(flaky_provider(), size=2, settings=PoolSettings(max_attempts=2, outage_s=10.0))
    columns = {"sandbox_task": ["echo"] * 3, "task_id": ["four"] * 3, "expected": ["4"] * 3}
    completions = ["2+2", "2+2", "'nope'"]
    logged: dict[str, float] = {}
    try:
        asyncio.run(SandboxReward(pool)(prompts=["p"] * 3, completions=completions,
                                        log_metric=logged.__setitem__, **columns))
        recorded = RankMetrics()
        bound = SandboxReward(pool)
        bound.bind(pool, metrics=recorded)
        ignored: dict[str, float] = {}
        asyncio.run(bound(prompts=["p"] * 3, completions=completions, log_metric=ignored.__setitem__, **columns))
    finally:
        pool.close()
    assert ignored == {}  # bound to the trainer's metrics, nothing goes through TRL's averaging
    merged = recorded.merge("train")
    assert set(merged) == set(logged)
    timings = {"sandbox/reward_call_s", "sandbox/exec_p50_s", "sandbox/exec_p95_s", "sandbox/lease_wait_p95_s",
               "sandbox/warm_lease_rate"}
    assert {k: v for k, v in merged.items() if k not in timings} == pytest.approx(
        {k: v for k, v in logged.items() if k not in timings})
    assert merged["sandbox/passed"] == 2 and merged["sandbox/pass_rate"] == pytest.approx(2 / 3)

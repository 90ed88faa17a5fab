"""Scorer and SandboxReward with the test plugin's ``echo`` task on the ``flaky`` provider."""

from __future__ import annotations

import asyncio
import threading

import pytest

from trl_sandbox.pool.sandbox_pool import PoolSettings, SandboxPool
from trl_sandbox.scoring.scorer import Scorer, completion_text
from trl_sandbox.training.rewards import SandboxReward

FAST = PoolSettings(backoff_initial_s=0.01, backoff_max_s=0.05, exec_slack_s=0.5, max_attempts=2)


def rows(*pairs):
    return [{"prompt": "p", "sandbox_task": "echo", "task_id": t, "expected": e} for t, e in pairs]


def test_identical_programs_run_once_and_all_rows_are_scored(flaky_provider):
    provider = flaky_provider()
    with SandboxPool.open(provider, size=2, pool_settings=FAST) as pool:
        scorer = Scorer(pool, cache_size=0)
        completions = ["2+2"] * 5 + ["2+3"] * 3
        outcomes, stats = pool.loop.run(scorer.ascore(completions, rows(*[("four", "4")] * 8)))
    assert [o.status for o in outcomes] == ["passed"] * 5 + ["failed"] * 3
    assert [o.reward for o in outcomes] == [1.0] * 5 + [0.0] * 3
    assert stats.programs == 2 and stats.executed == 2
    assert sum(1 for c in provider.faults.calls if c[0] == "exec") == 2


def test_cache_serves_repeats_across_calls(flaky_provider):
    provider = flaky_provider()
    with SandboxPool.open(provider, size=1, pool_settings=FAST) as pool:
        scorer = Scorer(pool)
        first = scorer.score(["2+2"], rows(("four", "4")))
        _, stats = pool.loop.run(scorer.ascore(["2+2"], rows(("four", "4"))))
    assert first[0].status == "passed"
    assert stats.cache_hits == 1 and stats.executed == 0


def test_infrastructure_failure_is_none_never_a_code_failure(flaky_provider):
    provider = flaky_provider(exec_infra_failures=100)
    with SandboxPool.open(provider, size=1, pool_settings=FAST) as pool:
        outcomes = Scorer(pool).score(["2+2", ""], rows(("four", "4"), ("four", "4")))
    assert outcomes[0].status == "infra" and outcomes[0].reward is None
    assert "InfraError" in outcomes[0].detail
    # a missing completion is the model's fault, not the infrastructure's: scored without running
    assert outcomes[1].status == "no_code" and outcomes[1].reward == -1.0


def test_reward_call_deadline_turns_stragglers_into_infra(flaky_provider):
    provider = flaky_provider(exec_hangs=1)
    settings = PoolSettings(exec_slack_s=30.0, max_attempts=1)
    with SandboxPool.open(provider, size=2, pool_settings=settings) as pool:
        outcomes = Scorer(pool).score(["2+2", "1+3"], rows(("four", "4"), ("four", "4")), deadline_s=1.5)
    statuses = sorted(o.status for o in outcomes)
    assert statuses == ["infra", "passed"]
    assert [o.reward for o in outcomes if o.status == "infra"] == [None]


def test_schemes_apply(flaky_provider):
    with SandboxPool.open(flaky_provider(), size=1, pool_settings=FAST) as pool:
        binary = Scorer(pool, scheme="binary").score(["2+3", "syntax error("], rows(("four", "4"), ("four", "4")))
        original = Scorer(pool, scheme="original").score(["syntax error("], rows(("four", "4")))
    assert [o.reward for o in binary] == [0.0, 0.0]
    assert original[0].status == "error" and original[0].reward == -1.0


def test_conversational_completions_are_read_from_assistant_turns():
    messages = [{"role": "assistant", "content": "2+2"}]
    assert completion_text(messages) == "2+2"
    assert completion_text([{"role": "assistant", "content": [{"type": "text", "text": "x"}]}]) == "x"


def test_sandbox_reward_speaks_trls_reward_protocol(flaky_provider):
    pool = SandboxPool(flaky_provider(), size=2, settings=FAST)
    reward = SandboxReward(pool)
    logged: dict[str, float] = {}
    extra: dict[str, list] = {}
    try:
        result = asyncio.run(
            reward(
                prompts=["p", "p", "p"],
                completions=["2+2", "2+2", "'nope'"],
                completion_ids=[[1], [1], [2]],
                trainer_state=None,
                log_metric=lambda k, v: logged.__setitem__(k, v),
                log_extra=lambda k, v: extra.__setitem__(k, v),
                sandbox_task=["echo"] * 3,
                task_id=["four"] * 3,
                expected=["4"] * 3,
            )
        )
    finally:
        pool.close()
    assert result == [1.0, 1.0, 0.0]
    assert logged["sandbox/passed"] == 2 and logged["sandbox/failed"] == 1
    assert logged["sandbox/pass_rate"] == pytest.approx(2 / 3)
    assert logged["sandbox/programs_run"] == 2
    assert 0 < logged["sandbox/exec_p50_s"] <= logged["sandbox/exec_p95_s"]
    assert extra["sandbox_status"] == ["passed", "passed", "failed"]
    assert reward.seconds_total > 0


def test_configured_timeout_reaches_the_judge_inside_the_program():
    """``sandbox_timeout`` must govern the judge's own limit, not only the sandbox's wall clock."""
    from trl_sandbox import load_tasks

    row = dict(load_tasks("builtin", task_ids=["max_subarray"])[0])
    slow = "    import time\n    time.sleep(0.2)\n    return max(xs)\n"  # 7 calls: 1.4 s > the default 1 s
    with SandboxPool.open("local", size=1) as pool:
        (patient,) = Scorer(pool, timeout=4.0).score([slow], [row])
        (strict,) = Scorer(pool, timeout=0.3).score(["    while True:\n        pass\n"], [row])
    assert patient.status in ("passed", "failed"), patient  # ran to the end: max(xs) is a wrong answer
    assert patient.passed >= 1
    assert strict.status == "timeout"


def test_an_outage_after_start_scores_none_instead_of_crashing(flaky_provider):
    """Once the pool has been up, losing every sandbox and every create is an infra failure, not a crash."""
    provider = flaky_provider()
    settings = PoolSettings(backoff_initial_s=0.01, backoff_max_s=0.02, exec_slack_s=0.5, max_attempts=1,
                            lease_timeout_s=1.0)
    pool = SandboxPool(provider, size=1, settings=settings)
    reward = SandboxReward(pool)
    kwargs = dict(sandbox_task=["echo"], task_id=["four"], expected=["4"])
    try:
        assert asyncio.run(reward(prompts=["p"], completions=["2+2"], **kwargs)) == [1.0]
        provider.faults.create_failures = 10_000  # the service goes down ...
        provider.faults.exec_infra_failures = 10_000  # ... taking the live sandbox with it
        assert asyncio.run(reward(prompts=["p"], completions=["2+3"], **kwargs)) == [None]
        assert asyncio.run(reward(prompts=["p"], completions=["1+3"], **kwargs)) == [None]
    finally:
        pool.close()


async def _thread_name():
    return threading.current_thread().name


def test_a_small_result_of_a_quick_task_is_scored_on_the_loop_anything_else_on_the_scoring_thread(
    flaky_provider, monkeypatch
):
    from trl_sandbox.plugins import get_task_set
    from trl_sandbox.scoring.scorer import QUICK_SCORE_CHARS

    task = get_task_set("echo")
    where = []
    real = type(task).score

    def score(self, result, row, *, nonce=None):
        where.append(threading.current_thread().name)
        return real(self, result, row, nonce=nonce)

    monkeypatch.setattr(type(task), "score", score)
    big = f"'x' * {QUICK_SCORE_CHARS + 1}"
    with SandboxPool.open(flaky_provider(), size=1, pool_settings=FAST) as pool:
        scorer = Scorer(pool, cache_size=0)
        loop_thread = pool.loop.run(_thread_name())
        # A task that does not declare quick scoring: its results go to the scoring thread.
        assert [o.status for o in scorer.score(["2+2", big], rows(("four", "4"), ("big", "x")))] == ["passed", "failed"]
        assert len(where) == 2 and all(name.startswith("trl-sandbox-score") for name in where)
        where.clear()
        monkeypatch.setattr(task, "quick_score", True, raising=False)
        outcomes = scorer.score(["2+2", "2+3", big], rows(("four", "4"), ("four", "4"), ("big", "x")))
        assert [o.status for o in outcomes] == ["passed", "failed", "failed"]
        assert where.count(loop_thread) == 2  # the small results, on the loop
        assert [n for n in where if n != loop_thread][0].startswith("trl-sandbox-score")  # too much output

"""SandboxPool against the ``flaky`` provider of the test plugin (fault injection)."""

from __future__ import annotations

import time

import pytest

from trl_sandbox import ConfigError, InfraError, QuotaError, SandboxSpec
from trl_sandbox.pool.sandbox_pool import PoolSettings, SandboxPool

FAST = PoolSettings(backoff_initial_s=0.01, backoff_max_s=0.05, exec_slack_s=0.5, health_interval_s=0.2,
                    lease_timeout_s=5.0, create_timeout_s=2.0, destroy_timeout_s=2.0)
TAGS = SandboxSpec(tags={"trl-sandbox-run": "t1"})


def test_warms_to_size_runs_and_destroys_everything(flaky_provider):
    provider = flaky_provider()
    with SandboxPool.open(provider, size=3, spec=TAGS, pool_settings=FAST) as pool:
        deadline = time.time() + 5
        while pool.members < 3 and time.time() < deadline:
            time.sleep(0.01)
        assert pool.members == 3
        result = pool.run(["python3", "-c", "print(6*7)"], timeout=5)
        assert result.exit_code == 0 and result.stdout.strip() == "42"
        assert len(provider.live) == 3
    assert provider.live == {}
    assert provider.closed


def test_reset_between_leases(flaky_provider):
    provider = flaky_provider()
    with SandboxPool.open(provider, size=1, pool_settings=FAST) as pool:
        for _ in range(3):
            pool.run(["python3", "-c", "pass"], timeout=5)
        sandbox = next(iter(provider.live.values()))
        deadline = time.time() + 2
        while sandbox.resets < 3 and time.time() < deadline:
            time.sleep(0.01)
        assert sandbox.resets == 3
        stats = pool.drain_stats()
        assert stats.counts["execs"] == 3
        assert stats.counts["leases_warm"] >= 2


def test_transient_exec_errors_keep_the_sandbox(flaky_provider):
    """A 503 or a dropped connection from a sandbox that still answers is retried on a kept
    sandbox (after a reset), not on a fresh one: a replacement costs a create."""
    provider = flaky_provider(exec_infra_failures=2)
    with SandboxPool.open(provider, size=1, pool_settings=FAST) as pool:
        result = pool.run(["python3", "-c", "print('ok')"], timeout=5)
        assert result.stdout.strip() == "ok"
        stats = pool.drain_stats()
        assert stats.counts["retries"] == 2
        assert stats.counts["kept"] == 2
        assert stats.counts["replaced"] == 0
    assert provider.created == 1
    execs = [c for c in provider.faults.calls if c[0] == "exec"]
    assert len(execs) == 3 and len({sandbox_id for _, sandbox_id in execs}) == 1


@pytest.mark.parametrize("fault", ["exec_vanish", "exec_kills"])
def test_a_gone_or_dead_sandbox_is_replaced_and_the_job_retried(flaky_provider, fault):
    """Positive control for the test above: the same retry on a sandbox that is gone (404) or no
    longer alive after a transport error goes to a replacement."""
    provider = flaky_provider(**{fault: 1})
    with SandboxPool.open(provider, size=1, pool_settings=FAST) as pool:
        assert pool.run(["python3", "-c", "print('ok')"], timeout=5).stdout.strip() == "ok"
        stats = pool.drain_stats()
        assert stats.counts["replaced"] == 1 and stats.counts["kept"] == 0
    assert provider.created == 2
    assert provider.live == {}


def test_a_failed_reset_is_retried_before_the_sandbox_is_discarded(flaky_provider):
    provider = flaky_provider(reset_failures=2)
    with SandboxPool.open(provider, size=1, pool_settings=FAST) as pool:
        for _ in range(3):
            assert pool.run(["python3", "-c", "print(1)"], timeout=5).exit_code == 0
        stats = pool.drain_stats()
        assert stats.counts["reset_retries"] == 2
        assert stats.counts["replaced"] == 0
    assert provider.created == 1


def test_infra_error_after_all_attempts_raises_infra(flaky_provider):
    provider = flaky_provider(exec_infra_failures=10)
    settings = PoolSettings(**{**FAST.__dict__, "max_attempts": 2})
    with SandboxPool.open(provider, size=1, pool_settings=settings) as pool:
        with pytest.raises(InfraError):
            pool.run(["python3", "-c", "pass"], timeout=5)


def test_rate_limit_honours_retry_after(flaky_provider):
    provider = flaky_provider(exec_rate_limits=1, retry_after_s=0.4)
    with SandboxPool.open(provider, size=1, pool_settings=FAST) as pool:
        t0 = time.monotonic()
        result = pool.run(["python3", "-c", "print(1)"], timeout=5)
        assert result.exit_code == 0
        assert time.monotonic() - t0 >= 0.4
        assert pool.drain_stats().counts["rate_limited"] == 1


def test_hung_exec_hits_its_deadline_and_the_sandbox_is_replaced(flaky_provider):
    provider = flaky_provider(exec_hangs=1)
    with SandboxPool.open(provider, size=1, pool_settings=FAST) as pool:
        t0 = time.monotonic()
        result = pool.run(["python3", "-c", "print('second try')"], timeout=0.5)
        elapsed = time.monotonic() - t0
        assert result.stdout.strip() == "second try"
        assert elapsed < 0.5 + FAST.exec_slack_s + 10.0  # the hung call never returns by itself
        assert pool.drain_stats().counts["replaced"] == 1


def test_failed_creates_are_retried(flaky_provider):
    provider = flaky_provider(create_failures=2)
    with SandboxPool.open(provider, size=1, pool_settings=FAST) as pool:
        assert pool.run(["python3", "-c", "pass"], timeout=5).exit_code == 0
    assert provider.live == {}


def test_quota_error_fails_fast_and_clearly(flaky_provider):
    provider = flaky_provider(create_quota=True)
    pool = SandboxPool(provider, size=2, settings=FAST)
    try:
        with pytest.raises(QuotaError, match="limit"):
            pool.start(wait=True)
    finally:
        pool.close()


def test_dead_idle_sandboxes_are_replaced_by_the_health_check(flaky_provider):
    provider = flaky_provider(dead_after_execs=1)
    with SandboxPool.open(provider, size=1, pool_settings=FAST) as pool:
        pool.run(["python3", "-c", "pass"], timeout=5)  # the sandbox is now "dead": reset fails -> replaced
        deadline = time.time() + 3
        while provider.created < 2 and time.time() < deadline:
            time.sleep(0.02)
        assert provider.created >= 2
        assert pool.run(["python3", "-c", "print(3)"], timeout=5).stdout.strip() == "3"


def test_create_that_times_out_after_the_sandbox_exists_is_swept_by_tags(flaky_provider):
    provider = flaky_provider(create_delay_s=3.0)  # longer than create_timeout_s
    settings = PoolSettings(**{**FAST.__dict__, "create_timeout_s": 0.2, "max_attempts": 1})
    pool = SandboxPool(provider, spec=TAGS, size=1, settings=settings)
    pool.start(wait=False)
    deadline = time.time() + 5
    while pool._last_create_error is None and time.time() < deadline:  # the create times out (0.2 s)
        time.sleep(0.01)
    assert isinstance(pool._last_create_error, InfraError)
    assert provider.live, "the provider made the sandbox even though create timed out"
    pool.close()
    assert provider.live == {}


def test_unknown_provider_lists_installed_ones():
    from trl_sandbox.plugins import make_provider

    with pytest.raises(ConfigError) as info:
        make_provider("nope")
    assert "flaky" in str(info.value) and "nope" in str(info.value)


def test_closed_pool_restarts_afresh(flaky_provider):
    provider = flaky_provider()
    pool = SandboxPool(provider, size=1, settings=FAST)
    pool.start(wait=True)
    pool.close()
    pool.close()  # idempotent
    assert provider.live == {}
    pool.start(wait=True)  # e.g. trainer.evaluate() after train()
    try:
        assert pool.run(["python3", "-c", "print(5)"], timeout=5).stdout.strip() == "5"
        assert len(provider.live) == 1
    finally:
        pool.close()
    assert provider.live == {}


def test_a_provider_that_raises_something_unexpected_is_an_infra_failure(flaky_provider):
    """E.g. a NUL byte from the model makes Popen raise ValueError: never a crash, never the model's fault."""
    with SandboxPool.open(flaky_provider(), size=1, pool_settings=FAST) as pool:
        with pytest.raises(InfraError, match="ValueError"):
            pool.run(["python3", "-c", "print('a\0b')"], timeout=5)
        assert pool.run(["python3", "-c", "print(1)"], timeout=5).stdout.strip() == "1"


def test_failed_creates_are_refilled_until_the_pool_heals(flaky_provider):
    """A burst of failed creates (each slot's create fails many times in a row) never makes the
    pool fatal: it keeps refilling with backoff and the waiting job runs once a create works."""
    provider = flaky_provider(create_failures=12)
    settings = PoolSettings(**{**FAST.__dict__, "max_attempts": 1, "outage_s": 60.0})
    with SandboxPool.open(provider, size=2, pool_settings=settings) as pool:
        assert pool.run(["python3", "-c", "print(7)"], timeout=5).stdout.strip() == "7"
        assert pool.drain_stats().counts["create_failures"] == 12
        assert pool.outage is None
    assert provider.live == {}


def test_an_outage_longer_than_the_budget_is_a_clear_error(flaky_provider):
    """Creates failing for longer than ``outage_s`` end waiting jobs with ``SandboxOutageError``
    naming the provider and the last error; a success afterwards ends the outage."""
    import concurrent.futures

    from trl_sandbox import SandboxOutageError

    provider = flaky_provider()
    settings = PoolSettings(**{**FAST.__dict__, "lease_timeout_s": 60.0, "outage_s": 0.5, "health_interval_s": 3600})
    with SandboxPool.open(provider, size=1, pool_settings=settings) as pool:
        held = pool.loop.run(pool.checkout())
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            waiting = ex.submit(pool.run, ["python3", "-c", "pass"], timeout=5)
            provider.faults.create_failures = 10**9
            pool.checkin(held, broken=True)  # the only sandbox is lost; no create works
            with pytest.raises(SandboxOutageError) as info:
                waiting.result(timeout=30)  # ends well before the 60 s lease timeout
        message = str(info.value)
        assert "'flaky'" in message and "injected: create failed" in message and "sandbox_outage_s=0.5" in message
        assert pool.outage is not None
        with pytest.raises(SandboxOutageError):  # later jobs fail at once while the outage lasts
            pool.run(["python3", "-c", "pass"], timeout=5)
        provider.faults.create_failures = 0  # the service recovers: the next job's refill succeeds
        pool.loop.run(pool._check_idle())  # what the health loop does every health_interval_s
        deadline = time.monotonic() + 10
        while pool.outage is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.run(["python3", "-c", "print(2)"], timeout=5).stdout.strip() == "2"
        assert pool.outage is None
    assert provider.live == {}


def test_a_pool_takes_a_provider_name_and_refuses_what_is_not_a_provider():
    from trl_sandbox import ConfigError

    pool = SandboxPool("local", size=1)
    assert pool.provider.name == "local"
    with pytest.raises(ConfigError, match="needs a provider"):
        SandboxPool(object(), size=1)


def test_an_outage_longer_than_the_budget_stops_training(flaky_provider):
    """The reward function raises ``SandboxOutageError`` (which ends ``trainer.train()``) once the
    budget is spent; before that, the same lost sandboxes only cost ``None`` rewards."""
    import asyncio

    from trl_sandbox import SandboxOutageError
    from trl_sandbox.training.rewards import SandboxReward

    provider = flaky_provider()
    settings = PoolSettings(**{**FAST.__dict__, "max_attempts": 1, "lease_timeout_s": 0.3, "outage_s": 1.5})
    pool = SandboxPool(provider, size=1, settings=settings)
    reward = SandboxReward(pool)
    kwargs = dict(sandbox_task=["echo"], task_id=["four"], expected=["4"])
    try:
        assert asyncio.run(reward(prompts=["p"], completions=["2+2"], **kwargs)) == [1.0]
        provider.faults.create_failures = 10**9  # the service goes down ...
        provider.faults.exec_vanish = 10**9  # ... and reclaims the sandbox we had
        # Within the budget: the lost job is an infrastructure failure (None), training goes on.
        assert asyncio.run(reward(prompts=["p"], completions=["2+3"], **kwargs)) == [None]
        with pytest.raises(SandboxOutageError, match="'flaky'.*injected: create failed"):
            for _ in range(100):  # each call waits at most lease_timeout_s; the budget ends it
                asyncio.run(reward(prompts=["p"], completions=["1+3"], **kwargs))
    finally:
        pool.close()
    assert provider.live == {}


def test_pool_settings_and_the_outage_budget_are_validated():
    with pytest.raises(ConfigError, match="outage_s"):
        PoolSettings(outage_s=0)
    with pytest.raises(ConfigError, match="max_attempts"):
        PoolSettings(max_attempts=0)
    from trl_sandbox.training.trainer import SandboxGRPOConfig

    with pytest.raises(ConfigError, match="sandbox_outage_s"):
        SandboxGRPOConfig(output_dir="/tmp/x", sandbox_outage_s=-1, report_to=[], use_cpu=True, bf16=False)


def test_every_pool_tags_its_sandboxes_with_owner_and_maker(flaky_provider, monkeypatch):
    """A pool nobody tagged (exec, evaluate, a standalone reward, a self-check) still tags every
    sandbox with run id, host, owner pid, rank, plugin tags and what made it; the closing sweep
    then runs by those tags."""
    import os
    import socket

    from trl_sandbox.pool.tags import HOST_TAG, MADE_BY_TAG, MANAGED_TAG, PID_TAG, RUN_TAG, clean
    from trl_sandbox.training.rewards import SandboxReward

    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("TRL_SANDBOX_RUN_ID", "launch-7")
    provider = flaky_provider()
    with SandboxPool.open(provider, size=2, pool_settings=FAST, made_by="exec") as pool:
        pool.run(["python3", "-c", "pass"], timeout=5)
        seen = [dict(s.tags) for s in provider.live.values()]
    assert len(seen) == 2
    for tags in seen:
        assert tags[MANAGED_TAG] == "1" and tags[RUN_TAG] == "launch-7" and tags[MADE_BY_TAG] == "exec"
        assert tags[HOST_TAG] == clean(socket.gethostname()) and tags[PID_TAG] == str(os.getpid())
        assert tags["rank"] == "3" and tags["team"] == "tests"  # the test plugin's run tags
    assert pool.drain_stats().counts["swept"] == 0  # looked, and found nothing left
    assert provider.live == {}

    reward = SandboxReward(provider="flaky", pool_size=1)
    reward.pool.start(wait=True)
    try:
        assert reward.pool.spec.tags[MADE_BY_TAG] == "reward" and RUN_TAG in reward.pool.spec.tags
    finally:
        reward.close()


def test_closing_waits_for_a_delete_in_flight_then_retries_and_sweeps(flaky_provider):
    """A replacement drops its sandbox from the pool before the delete is answered; closing the
    pool at that moment must still leave nothing alive (the delete in flight is waited for, and
    one that failed is sent again)."""
    provider = flaky_provider()
    pool = SandboxPool(provider, size=1, settings=FAST)
    pool.start(wait=True)
    original_destroy = provider.destroy
    started = []

    async def slow_destroy(sandbox_id: str) -> None:
        started.append(sandbox_id)
        import asyncio

        await asyncio.sleep(3600)  # never answers: its deadline fails it, close() deletes again

    held = pool.loop.run(pool.checkout())
    provider.destroy = slow_destroy
    pool.checkin(held, broken=True)
    deadline = time.monotonic() + 10
    while not started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert started and held.id in provider.live
    provider.destroy = original_destroy
    pool.close()
    assert provider.live == {}
    assert pool.drain_stats().counts["destroy_failures"] == 1  # the delete in flight ran to its deadline


def test_a_member_near_the_end_of_its_lifetime_is_replaced_before_a_job_gets_it(flaky_provider):
    provider = flaky_provider()
    spec = SandboxSpec(lifetime_s=600.0)
    with SandboxPool.open(provider, size=1, spec=spec, pool_settings=FAST) as pool:
        pool.run(["python3", "-c", "pass"], timeout=5)
        (first,) = provider.live
        pool._born[first] -= 500.0  # as if created 500 s ago: inside the last quarter of 600 s
        assert pool.run(["python3", "-c", "print(2)"], timeout=5).stdout == "2\n"
        assert pool.drain_stats().counts["rotated"] == 1
        assert first not in provider.live
    assert provider.created == 2 and provider.live == {}


@pytest.mark.parametrize("lands_after_s, destroy_timeout_s, leaks", [(0.5, 2.0, False), (3.0, 0.2, True)])
def test_close_lets_a_create_in_flight_finish_and_destroys_it(flaky_provider, lands_after_s, destroy_timeout_s,
                                                               leaks):
    """A create the service is still working on when the pool closes is waited for (up to
    destroy_timeout_s) and its sandbox destroyed: cancelled client-side, it would appear after the
    closing sweep. The second case is the positive control: past the wait, the sandbox leaks."""
    import asyncio

    provider = flaky_provider(create_lands_late_s=lands_after_s)
    settings = PoolSettings(**{**FAST.__dict__, "destroy_timeout_s": destroy_timeout_s})
    pool = SandboxPool(provider, size=1, settings=settings)
    pool.start(wait=False)
    deadline = time.monotonic() + 10
    while not provider.faults.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert provider.faults.calls, "the create was sent"
    pool.close()
    if leaks:
        deadline = time.monotonic() + 10
        while not provider.live and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(provider.live) == 1  # made after the pool was gone
        for sandbox_id in list(provider.live):
            asyncio.run(provider.destroy(sandbox_id))
    else:
        assert provider.live == {}

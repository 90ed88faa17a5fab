"""SandboxPool against the ``flaky`` provider of the test plugin (fault injection)."""

from __future__ import annotations

import time

import pytest

from trl_sandbox import ConfigError, InfraError, QuotaError, SandboxSpec
from trl_sandbox.pool import PoolSettings, SandboxPool

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


def test_infra_error_is_retried_on_a_replacement_sandbox(flaky_provider):
    provider = flaky_provider(exec_infra_failures=2)
    with SandboxPool.open(provider, size=1, pool_settings=FAST) as pool:
        result = pool.run(["python3", "-c", "print('ok')"], timeout=5)
        assert result.stdout.strip() == "ok"
        stats = pool.drain_stats()
        assert stats.counts["retries"] == 2
        assert stats.counts["replaced"] == 2
    assert provider.created == 3


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


def test_jobs_waiting_for_a_sandbox_fail_at_once_when_none_can_exist(flaky_provider):
    """Losing every sandbox while no create succeeds wakes the waiting jobs with an InfraError
    (scored None) instead of holding them for the whole lease timeout."""
    import concurrent.futures

    provider = flaky_provider()
    settings = PoolSettings(backoff_initial_s=0.01, backoff_max_s=0.02, max_attempts=1, lease_timeout_s=60)
    with SandboxPool.open(provider, size=1, pool_settings=settings) as pool:
        held = pool.loop.run(pool.checkout())
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            waiting = ex.submit(pool.run, ["python3", "-c", "pass"], timeout=5)
            time.sleep(0.3)
            assert not waiting.done(), "the job waits for the only sandbox"
            provider.faults.create_failures = 10_000
            t0 = time.monotonic()
            pool.checkin(held, broken=True)
            with pytest.raises(InfraError, match="no sandbox is available"):
                waiting.result(timeout=30)
            assert time.monotonic() - t0 < 30


def test_a_pool_takes_a_provider_name_and_refuses_what_is_not_a_provider():
    from trl_sandbox import ConfigError

    pool = SandboxPool("local", size=1)
    assert pool.provider.name == "local"
    with pytest.raises(ConfigError, match="needs a provider"):
        SandboxPool(object(), size=1)

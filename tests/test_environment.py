"""SandboxEnvironment episodes on the ``flaky`` provider with the ``echo`` task."""

from __future__ import annotations

import inspect

import pytest

from trl_sandbox import QuotaError, SandboxEnvironment
from trl_sandbox.pool.sandbox_pool import PoolSettings, SandboxPool
from trl_sandbox.scoring.scorer import Scorer
from trl_sandbox.training.environment import JUDGE_HEADROOM

ROW = {"prompt": "p", "sandbox_task": "echo", "task_id": "four", "expected": "4", "solution_path": "answer.txt"}


def test_episode_holds_one_sandbox_and_scores_the_final_file(flaky_provider):
    provider = flaky_provider()
    pool = SandboxPool(provider, size=2, settings=PoolSettings(backoff_initial_s=0.01))
    pool.start(wait=True)
    try:
        env = SandboxEnvironment(pool=pool, scorer=Scorer(pool, cache_size=0), tool_timeout=5)
        env.reset(**ROW, files={"notes.txt": "hello"})
        first = env._sandbox
        assert env.read_file("notes.txt") == "hello"
        assert "wrote" in env.write_file("answer.txt", "2+3")
        assert env.run_tests().startswith("failed: 0/1")
        env.write_file("answer.txt", "2+2")
        assert env.run_tests().startswith("passed: 1/1")
        assert env._sandbox is first  # state persisted across calls within the episode
        assert "[exit code 0]" in env.bash("echo hi") and "hi" in env.bash("echo hi")
        assert env.get_reward() == 1.0
        assert env._sandbox is None, "a scored episode gives its sandbox back"

        env.reset(**ROW)  # next episode: a clean sandbox, the old one was reset before reuse
        assert env.get_reward() == -1.0  # no solution file: no code
    finally:
        pool.close()
    assert provider.live == {}


def test_episodes_grow_the_pool_so_the_judge_is_never_starved(flaky_provider):
    """Every episode of a batch holds a sandbox until it is scored; the judge still needs one."""
    provider = flaky_provider()
    pool = SandboxPool(provider, size=1, settings=PoolSettings(backoff_initial_s=0.01, lease_timeout_s=20))
    pool.start(wait=True)
    try:
        scorer = Scorer(pool, cache_size=0)
        envs = [SandboxEnvironment(pool=pool, scorer=scorer, tool_timeout=5) for _ in range(3)]
        for env in envs:
            env.reset(**ROW)
        assert pool.size == 3 + JUDGE_HEADROOM
        assert len({id(env._sandbox) for env in envs}) == 3
        envs[0].write_file("answer.txt", "2+2")
        assert envs[0].run_tests().startswith("passed")  # judged while all three episodes hold theirs
        assert [env.get_reward() for env in envs] == [1.0, -1.0, -1.0]
    finally:
        pool.close()


def test_a_pool_that_never_came_up_fails_the_first_episode_with_the_setup_error(flaky_provider):
    provider = flaky_provider(create_quota=True)
    pool = SandboxPool(provider, size=1, settings=PoolSettings(backoff_initial_s=0.01, max_attempts=1))
    try:
        env = SandboxEnvironment(pool=pool, scorer=Scorer(pool, cache_size=0), tool_timeout=5)
        with pytest.raises(QuotaError):  # at the first step, not after hours of None rewards
            env.reset(**ROW)
    finally:
        pool.close()


def test_an_outage_after_start_scores_none_and_never_raises(flaky_provider):
    provider = flaky_provider()
    pool = SandboxPool(provider, size=1, settings=PoolSettings(backoff_initial_s=0.01, max_attempts=1,
                                                               lease_timeout_s=5))
    pool.start(wait=True)
    try:
        scorer = Scorer(pool, cache_size=0)
        provider.faults.create_failures = 10_000  # the service goes down ...
        first = SandboxEnvironment(pool=pool, scorer=scorer, tool_timeout=5)
        first.reset(**ROW)
        provider.faults.exec_infra_failures = 10_000  # ... taking the live sandbox with it
        assert first.bash("ls").startswith("[error] the sandbox is unavailable")  # a tool never raises
        assert first.get_reward() is None
        second = SandboxEnvironment(pool=pool, scorer=scorer, tool_timeout=5)
        assert second.reset(**ROW, observation="look") == "look"  # no exception: training goes on
        assert "unavailable" in second.bash("ls")  # the model reads what happened
        assert second.get_reward() is None  # an infrastructure failure, left out of the loss
    finally:
        pool.close()


def test_a_sandbox_lost_mid_episode_scores_none(flaky_provider):
    provider = flaky_provider()
    pool = SandboxPool(provider, size=1, settings=PoolSettings(backoff_initial_s=0.01))
    pool.start(wait=True)
    try:
        env = SandboxEnvironment(pool=pool, scorer=Scorer(pool, cache_size=0), tool_timeout=5)
        env.reset(**ROW)
        env.write_file("answer.txt", "2+2")
        provider.faults.exec_infra_failures = 1
        assert env.bash("true").startswith("[error] the sandbox is unavailable")
        assert env.get_reward() is None, "the file is gone with the sandbox: not the model's fault"
        env.reset(**ROW)  # the next episode gets a fresh sandbox
        env.write_file("answer.txt", "2+2")
        assert env.get_reward() == 1.0
    finally:
        pool.close()
    assert provider.live == {}


def test_tools_are_what_trl_will_expose():
    tools = {name for name, _ in inspect.getmembers(SandboxEnvironment, inspect.isfunction)
             if not name.startswith("_") and name not in ("reset", "get_reward")}
    assert tools == {"bash", "read_file", "write_file", "run_tests"}
    from transformers.utils import get_json_schema

    for name in tools:
        schema = get_json_schema(getattr(SandboxEnvironment, name))
        assert schema["function"]["description"]

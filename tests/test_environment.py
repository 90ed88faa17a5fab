"""SandboxEnvironment episodes on the ``flaky`` provider with the ``echo`` task."""

from __future__ import annotations

import inspect

from trl_sandbox import SandboxEnvironment
from trl_sandbox.pool import PoolSettings, SandboxPool
from trl_sandbox.scoring import Scorer

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
        assert env.get_reward() == 0.0
        env.write_file("answer.txt", "2+2")
        assert env.get_reward() == 1.0
        assert env._sandbox is first  # state persisted across calls within the episode
        assert "[exit code 0]" in env.bash("echo hi") and "hi" in env.bash("echo hi")

        env.reset(**ROW)  # next episode: the old sandbox goes back (reset), a clean one comes out
        assert env.get_reward() == -1.0  # no solution file: no code
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

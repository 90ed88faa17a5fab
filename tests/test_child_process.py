"""SandboxReward and SandboxEnvironment in a spawned child process, as TRL's AsyncGRPOTrainer uses them.

AsyncGRPOTrainer pickles ``reward_funcs`` and ``environment_factory`` into a ``spawn`` child and
scores there. What crosses is settings only: the child builds its own pool on first use and that
pool's sandboxes die when the child exits; a live pool in the parent is neither shared nor
disturbed. Everything here runs real local sandboxes in a real spawned process.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import pickle
import time

import pytest

from trl_sandbox import SandboxEnvironment, SandboxPool, SandboxReward

ADD = {"prompt": "Write add(a, b).", "test_list": ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]}
RIGHT = "```python\ndef add(a, b):\n    return a + b\n```"
WRONG = "```python\ndef add(a, b):\n    return a - b\n```"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _sandbox_pids(pool: SandboxPool) -> list[int]:
    return sorted(s.pid for s in pool._members.values())


def _gone(pids: list[int], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# -- what the child runs (module level: spawn imports it by name) ------------------------------


def _reward_child(reward: SandboxReward, queue) -> None:
    started_before = reward.pool.started
    rewards = asyncio.run(reward(prompts=[ADD["prompt"]] * 2, completions=[RIGHT, WRONG],
                                 test_list=[ADD["test_list"]] * 2))
    queue.put({"pid": os.getpid(), "started_before": started_before, "rewards": rewards,
               "sandboxes": _sandbox_pids(reward.pool)})


def _environment_child(factory, queue) -> None:
    env = factory()
    env.reset(**ADD, max_attempts=1)
    steps = [env.write_file("solution.py", "def add(a, b):\n    return a + b\n"), env.run_tests(), env.run_tests()]
    sandboxes = _sandbox_pids(factory.pool())
    queue.put({"pid": os.getpid(), "steps": steps, "reward": env.get_reward(), "sandboxes": sandboxes})


def _reward_child_that_hangs(reward: SandboxReward, queue) -> None:
    asyncio.run(reward(prompts=[ADD["prompt"]], completions=[RIGHT], test_list=[ADD["test_list"]]))
    queue.put({"sandboxes": _sandbox_pids(reward.pool)})
    time.sleep(300)  # until the parent kills it, as AsyncRolloutWorker.stop() does to a child that will not stop


def _in_child(target, *args, timeout: float = 120) -> dict:
    """``target(*args, queue)`` in a spawned child; what it put on the queue."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=target, args=(*args, queue))
    child.start()
    try:
        report = queue.get(timeout=timeout)
    finally:
        child.join(timeout=60)
    assert child.exitcode == 0
    return report


# -- tests -------------------------------------------------------------------------------------


def test_a_pool_itself_cannot_cross_processes():
    """The control: without SandboxReward's own pickling, the pool it holds would stop it at the pickle."""
    with pytest.raises(TypeError):
        pickle.dumps(SandboxPool("local", size=1))


def test_reward_scores_in_a_spawned_child_on_a_pool_of_its_own_that_dies_with_it():
    reward = SandboxReward(provider="local", pool_size=1)
    try:
        parent_rewards = asyncio.run(reward(prompts=[ADD["prompt"]], completions=[RIGHT], test_list=[ADD["test_list"]]))
        assert parent_rewards == [1.0]
        parent_sandboxes = _sandbox_pids(reward.pool)
        assert parent_sandboxes and all(_alive(p) for p in parent_sandboxes)

        report = _in_child(_reward_child, reward)

        assert report["pid"] != os.getpid()
        assert report["started_before"] is False, "the child got the parent's live pool"
        assert report["rewards"] == [1.0, 0.0]
        assert report["sandboxes"] and not set(report["sandboxes"]) & set(parent_sandboxes)
        assert _gone(report["sandboxes"]), "the child's sandboxes outlived it"
        # The parent's pool was not touched by the child's teardown: same sandboxes, still scoring.
        assert all(_alive(p) for p in parent_sandboxes)
        assert asyncio.run(reward(prompts=[ADD["prompt"]], completions=[WRONG], test_list=[ADD["test_list"]])) == [0.0]
        assert _sandbox_pids(reward.pool) == parent_sandboxes
    finally:
        reward.close()


def test_a_child_killed_mid_run_leaves_no_local_sandbox():
    """No teardown code runs in a SIGKILLed child: the local sandboxes must die with their owner anyway."""
    import signal

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_reward_child_that_hangs, args=(SandboxReward(provider="local", pool_size=1), queue))
    child.start()
    try:
        sandboxes = queue.get(timeout=120)["sandboxes"]
        assert sandboxes and all(_alive(p) for p in sandboxes)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join(timeout=60)
    assert child.exitcode == -signal.SIGKILL
    assert _gone(sandboxes), "a local sandbox outlived its killed owner"


def test_environment_factory_runs_episodes_in_a_spawned_child():
    factory = SandboxEnvironment.factory(provider="local", pool_size=1)
    report = _in_child(_environment_child, factory)
    write, first, second = report["steps"]
    assert write.startswith("wrote ")
    assert first.startswith("passed: 2/2 tests passed"), first
    assert second.startswith("[error] no test runs left"), second  # the row's budget of one test run
    assert report["reward"] == 1.0
    assert report["sandboxes"] and _gone(report["sandboxes"])
    assert factory._local is None, "the parent built nothing"


def test_a_copy_of_an_environment_mid_episode_is_a_fresh_environment():
    factory = SandboxEnvironment.factory(provider="local", pool_size=1)
    env = factory()
    try:
        env.reset(**ADD)
        assert env.write_file("solution.py", "x = 1").startswith("wrote")
        copy = pickle.loads(pickle.dumps(env))
        assert copy is not env and copy._sandbox is None and copy._factory is not None
        assert "call reset() first" in copy.read_file("solution.py")  # no episode, no sandbox shared
        assert env.read_file("solution.py") == "x = 1"  # the original episode goes on
        env.get_reward()
    finally:
        factory.close()


def test_objects_bound_to_a_pool_they_cannot_rebuild_refuse_to_be_pickled():
    pool = SandboxPool("local", size=1)
    bound = SandboxReward(pool)
    with pytest.raises(TypeError, match="cannot be sent to another process"):
        pickle.dumps(bound)
    with pytest.raises(TypeError, match=r"SandboxEnvironment.factory\(provider=...\)"):
        pickle.dumps(SandboxEnvironment(pool=pool))
    # An unbound environment (TRL's probe instance) pickles, with its settings.
    copy = pickle.loads(pickle.dumps(SandboxEnvironment(tool_timeout=3.0, max_attempts=2)))
    assert (copy.tool_timeout, copy.max_attempts) == (3.0, 2)


def _trl_async_child(reward: SandboxReward, factory, queue) -> None:
    """TRL 1.16's own child-side loop (what AsyncRolloutWorker runs after spawning), minus vLLM."""
    from accelerate.state import PartialState
    from datasets import Dataset
    from trl.chat_template_utils import qwen2_5_chat_template
    from trl.experimental.async_grpo.async_rollout_worker import RolloutGroup, _AsyncRolloutLoop

    from tests import tiny

    PartialState()  # as TRL's _child_main does
    ctx = multiprocessing.get_context("spawn")
    tokenizer = tiny.chat_tokenizer(qwen2_5_chat_template)
    loop = _AsyncRolloutLoop(
        model_name="tiny", dataset=Dataset.from_list([{"prompt": ADD["prompt"], "test_list": ADD["test_list"]}]),
        reward_funcs=[reward], environment_factory=factory, processing_class=tokenizer,
        eos_token_ids=[tokenizer.eos_token_id], rollout_buffer=ctx.Queue(), model_version_value=ctx.Value("i", 0),
        heartbeat_value=ctx.Value("d", 0.0), failed_event=ctx.Event(), exception_info_queue=ctx.Queue(),
        metrics_queue=ctx.Queue(), num_generations=2,
    )
    group = RolloutGroup(
        prompts=[ADD["prompt"]] * 2, reward_kwargs={"test_list": [ADD["test_list"]] * 2}, completions=[RIGHT, WRONG],
        completions_ids=[[1], [1]], completions_sequences=[[], []], tool_call_counts=[0, 0],
        tool_failure_counts=[0, 0], model_version=0, group_id=0, env_rewards=[None, None], rollout_rewards=[None, None],
    )
    loop._loop.run_until_complete(loop._score_group(group))
    queue.put({"statuses": [o.status for o in reward.last_outcomes], "names": loop.reward_func_names,
               "tools": sorted(t.__name__ for t in loop._env_tools[None])})


def test_trls_async_rollout_loop_scores_with_the_pickled_reward_and_probes_the_factory():
    """The objects cross the way AsyncRolloutWorker sends them (spawn), and TRL's loop calls them."""
    reward = SandboxReward(provider="local", pool_size=1)
    factory = SandboxEnvironment.factory(provider="local", pool_size=1)
    report = _in_child(_trl_async_child, reward, factory, timeout=180)
    assert report["statuses"] == ["passed", "failed"]
    assert report["names"] == ["sandbox", "SandboxEnvironment"]
    assert report["tools"] == ["bash", "read_file", "run_tests", "write_file"]


def _in_fork(job, timeout: float = 60.0) -> str:
    """Run ``job()`` in a forked child (the default start method on Linux before 3.14) and return
    what it printed, or "hung" when it did not end in time."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            text = repr(job())
        except BaseException as exc:
            text = f"{type(exc).__name__}: {exc}"
        os.write(write, text.encode()[:4000])
        os._exit(0)
    os.close(write)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and os.waitpid(pid, os.WNOHANG) == (0, 0):
        time.sleep(0.05)
    else:
        if time.monotonic() >= deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            os.close(read)
            return "hung"
    with os.fdopen(read, "rb") as fh:
        return fh.read().decode()


def test_a_forked_child_scores_with_a_pool_of_its_own_and_the_parents_keeps_working():
    """A forked child has a copy of the parent's pool but not its event-loop thread: a reward that
    owns its pool builds a new one there. Control: the pool itself, used in a fork, says so at once
    instead of waiting forever for a loop that is not running."""
    columns = {k: [v] for k, v in ADD.items()}
    reward = SandboxReward(provider="local", pool_size=1)
    try:
        assert asyncio.run(reward(prompts=[""], completions=[RIGHT], **columns)) == [1.0]
        parent_pool = reward.pool
        child = _in_fork(lambda: (asyncio.run(reward(prompts=["", ""], completions=[RIGHT, WRONG], **{
            k: v * 2 for k, v in columns.items()})), reward.pool is parent_pool))
        assert child == "([1.0, 0.0], False)", child
        control = _in_fork(lambda: parent_pool.run(["python3", "-c", "pass"], timeout=5))
        assert control.startswith("RuntimeError: this sandbox pool belongs to process"), control
        assert reward.pool is parent_pool
        assert asyncio.run(reward(prompts=[""], completions=[WRONG], **columns)) == [0.0]
    finally:
        reward.close()

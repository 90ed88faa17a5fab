"""Episodes driven the way TRL drives them, by a model that tries to turn a loss into ``None``.

Real local sandboxes and an assert-style task whose wrong solution scores 0.0. A tool call never
raises, whatever its arguments or what earlier commands left behind; an episode whose sandbox is
alive never scores ``None``; ``reset()`` never raises for a sandbox problem; the next lease starts
clean. Positive controls: a sandbox that really is gone still scores ``None``.
"""

from __future__ import annotations

import random

import pytest

from trl_sandbox import ConfigError, SandboxEnvironment
from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.scoring.scorer import Scorer

ROW = {
    "prompt": "",
    "task_id": "add",
    "test_list": ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(-1, 1) == 0"],
    "extract": "raw",
    "timeout": 2.0,
    "solution_path": "solution.py",
}
WRONG = "def add(a, b):\n    return 7\n"
RIGHT = "def add(a, b):\n    return a + b\n"

HOSTILE_PATHS = [
    "\ud800.py", "a\udcff/b", "x\x00y", "/".join(["d"] * 5000) + "/f", "n" * 70000, "../../etc/passwd",
    "/etc/shadow", "/work/../proc/1/mem", "", ".", "/work", "link_out", "fifo", "dir_000/inner.txt",
    "self_loop", "\u202e.py", "\U0001f600/\U0001f600",
]
LEFTOVERS = [
    "ln -s /proc/1/mem link_out; ln -s self_loop self_loop; mkfifo fifo",
    "mkdir -p dir_000 && touch dir_000/inner.txt && chmod 000 dir_000",
    "chmod 000 . ; chmod 000 /tmp 2>/dev/null; true",
    "python3 -c \"import os; [os.mkdir('x' * 200 + str(i)) for i in range(50)]\"",
    "head -c 10000000 /dev/zero > big.bin; seq 1 100000 > /tmp/lines",
    "(sleep 100 &) ; setsid sleep 100 & true",
    "python3 -c \"import os; os.makedirs('/'.join(['q'] * 300))\"",
    # a default ACL of mode 000 on every writable place: new files there would be unusable
    "python3 -c \"import os, struct; acl = struct.pack('<I', 2) + b''.join(struct.pack('<HHI', t, 0, 0xFFFFFFFF) "
    "for t in (1, 4, 32)); [os.setxattr(d, 'system.posix_acl_default', acl) for d in ('.', '/tmp', '/dev/shm')]\"",
]


@pytest.fixture(scope="module")
def pool():
    with SandboxPool.open("local", size=2) as pool:
        yield pool


@pytest.fixture
def env(pool):
    env = SandboxEnvironment(pool=pool, scorer=Scorer(pool, cache_size=0), tool_timeout=10)
    yield env
    if env._sandbox is not None:
        env.get_reward()  # give the sandbox back


def test_hostile_tool_arguments_are_observations_and_a_wrong_answer_still_scores_zero(env):
    env.reset(**ROW)
    env.bash(LEFTOVERS[0])
    env.bash(LEFTOVERS[1])
    for path in HOSTILE_PATHS:
        assert isinstance(env.write_file(path, "x\ud800y"), str)
        assert isinstance(env.read_file(path), str)
    assert "[error]" in env.read_file("\ud800.py") and "[error]" in env.read_file("link_out")
    assert "wrote" in env.write_file("solution.py", WRONG)
    assert env.run_tests().startswith("failed: 0/3")
    assert env.get_reward() == 0.0  # the model's loss stays a loss, never None


def test_positive_control_a_sandbox_that_is_really_gone_scores_none(pool, env):
    env.reset(**ROW)
    env.write_file("solution.py", RIGHT)
    pool.loop.run(pool.provider.destroy(env._sandbox.id))
    assert env.bash("true").startswith("[error] the sandbox is unavailable")
    assert env.get_reward() is None


def test_fuzzed_tool_calls_never_raise_and_never_make_none(pool):
    rng = random.Random(11)
    alphabet = "ab/._-\x00\ud800\udfff\u202e\U0001f600 \n\t*?$`'\"\\~"
    for episode in range(3):
        env = SandboxEnvironment(pool=pool, scorer=Scorer(pool, cache_size=0), tool_timeout=10)
        env.reset(**ROW)
        for _ in range(40):
            kind = rng.randrange(4)
            path = rng.choice(HOSTILE_PATHS) if rng.random() < 0.4 else "".join(
                rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
            if kind == 0:
                answer = env.write_file(path, "".join(chr(rng.randrange(0x110000)) for _ in range(rng.randint(0, 300))))
            elif kind == 1:
                answer = env.read_file(path)
            elif kind == 2:
                answer = env.bash(rng.choice(LEFTOVERS))
            else:
                answer = env.bash(path)
            assert isinstance(answer, str)
        written = env.write_file("solution.py", WRONG if episode % 2 == 0 else RIGHT).startswith("wrote")
        # the episode may have locked its own work directory (chmod 000 .): then there is no solution
        assert env.get_reward() == ((0.0 if episode % 2 == 0 else 1.0) if written else -1.0)
        # the next lease of whatever sandbox comes next starts clean
        nxt = SandboxEnvironment(pool=pool, scorer=Scorer(pool, cache_size=0), tool_timeout=10)
        nxt.reset(**ROW, files={"given.txt": "hello"})
        listing = nxt.bash("ls -A /work /tmp /dev/shm; umask; touch t && stat -c %a t")
        assert "given.txt" in listing and "dir_000" not in listing and "big.bin" not in listing, listing
        assert listing.rstrip().endswith("644"), listing
        assert nxt.read_file("given.txt") == "hello"
        assert nxt.get_reward() == -1.0  # no solution file: no code


def test_reset_names_the_row_when_the_row_itself_is_unusable(pool):
    env = SandboxEnvironment(pool=pool, scorer=Scorer(pool, cache_size=0), tool_timeout=10)
    with pytest.raises(ConfigError, match="task_id='add'.*files"):
        env.reset(**ROW, files="{not json")
    with pytest.raises(ConfigError, match="task_id='add'"):
        env.reset(**ROW, files={"../outside.txt": "x"})
    assert env.reset(**ROW, files={"ok.txt": "x"}) is None
    assert env.read_file("ok.txt") == "x"
    env.get_reward()


def test_metadata_an_episode_leaves_is_gone_after_reset(pool):
    """Default ACLs, modes and xattrs set by one episode do not reach the next lease of its sandbox."""
    env = SandboxEnvironment(pool=pool, scorer=Scorer(pool, cache_size=0), tool_timeout=10)
    env.reset(**ROW)
    sandbox = env._sandbox
    env.bash(LEFTOVERS[-1])
    poisoned = env.bash("touch /tmp/p && stat -c %a /tmp/p")
    assert poisoned.strip().splitlines()[-1] == "0", poisoned  # the poison works while the lease lasts
    env.get_reward()
    pool.loop.run(sandbox.reset())  # what the pool does before the next lease
    for place in ("/work", "/tmp", "/dev/shm"):
        result = pool.loop.run(sandbox.exec(["sh", "-c", f"touch {place}/n && stat -c %a {place}/n"], timeout=10))
        assert result.stdout.strip() == "644", (place, result)

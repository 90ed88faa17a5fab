"""Prepared environments on the local sandbox: one build, a private copy per program and episode.

Every isolation test lets one lease change the copy (write, append, delete, chmod, a detached
process that keeps writing) and shows, as its positive control, that the lease itself saw its
changes; the next lease of the same environment must see the prepared state only.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import pytest

from trl_sandbox.environments.cache import remove_tree
from trl_sandbox.local.mounts import check_mount_point
from trl_sandbox.plugins import make_provider
from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.sandbox import ConfigError
from trl_sandbox.scoring.scorer import Scorer
from trl_sandbox.training.environment import SandboxEnvironment

ENV = {
    "files": {"data/in.txt": "5\n", "keep.txt": "prepared\n"},
    "setup": ["python3 -c \"open('derived.txt', 'w').write(str(int(open('data/in.txt').read()) * 8))\"",
              "mkdir -p venv/bin && echo '#!/bin/sh' > venv/bin/tool && chmod 755 venv/bin/tool"],
}

HOSTILE = r"""
set -e
echo changed >> keep.txt; rm derived.txt; chmod 000 data; echo new > planted.txt
mkdir -p deep/er && echo x > deep/er/f
(sleep 0.3; echo late > keep.txt; echo late > planted.txt) > /dev/null 2>&1 &
cat keep.txt; ls
"""
READS = "    return int(open('derived.txt').read())\n"
LOOK = "cat keep.txt; cat derived.txt; echo; cat data/in.txt; ls; test ! -e planted.txt && echo clean"


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        h.update(f"{path.relative_to(root)} {st.st_mode:o} {st.st_size}\n".encode())
        if path.is_file():
            h.update(path.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def cache_dir():
    # Where the sandbox's unprivileged uid can reach it (pytest's own tmp_path is private to root).
    path = Path(tempfile.mkdtemp(prefix="trl-sandbox-envtest-", dir="/var/tmp"))
    os.chmod(path, 0o755)
    yield path
    remove_tree(path)


def test_a_cache_the_sandbox_cannot_reach_is_a_config_error(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("only root drops to another uid for its sandboxes")
    private = tmp_path / "private"
    private.mkdir()
    os.chmod(tmp_path, 0o700)
    with pytest.raises(ConfigError, match="cannot enter"):
        make_provider("local", {"environment_cache": str(private / "cache")})


@pytest.fixture(scope="module")
def pool(cache_dir):
    with SandboxPool.open("local", size=2, settings={"environment_cache": str(cache_dir)}) as pool:
        yield pool


def _sh(pool, script, environment=ENV, timeout=5.0):
    from trl_sandbox.environments.spec import parse

    return pool.run(["/bin/sh", "-c", script], timeout=timeout, environment=parse(environment))


def test_each_lease_gets_its_own_copy_of_one_build(pool, cache_dir):
    first = _sh(pool, LOOK)
    assert first.exit_code == 0, first.stderr
    assert first.stdout.split()[:3] == ["prepared", "40", "5"] and "clean" in first.stdout
    trees = list(cache_dir.glob("*/tree"))
    assert len(trees) == 1
    before = _tree_digest(trees[0])
    hostile = _sh(pool, HOSTILE)
    # Control: the hostile lease saw its own changes.
    assert hostile.exit_code == 0, hostile.stderr
    assert "changed" in hostile.stdout and "planted.txt" in hostile.stdout and "derived.txt" not in hostile.stdout
    for _ in range(4):  # both sandboxes of the pool, twice, after the detached writer's time
        after = _sh(pool, LOOK + "; sleep 0.2")
        assert after.exit_code == 0, after.stderr
        assert after.stdout.split()[:3] == ["prepared", "40", "5"] and "clean" in after.stdout
        assert "deep" not in after.stdout
    assert _tree_digest(trees[0]) == before  # the prepared tree itself never changed
    assert len(list(cache_dir.glob("*/tree"))) == 1  # still one build
    metrics = pool.environment_metrics()  # this module's first drain: the build above, then 5 hits
    assert metrics["env/builds"] == 1 and metrics["env/hit_rate"] == 5 / 6
    assert "env/lease_ms_p50" in metrics


def test_without_the_environment_the_work_directory_is_empty_again(pool):
    _sh(pool, "true")
    plain = pool.run(["/bin/sh", "-c", "ls -A; ls /run/trl-sandbox-envs 2>&1 | head -1"], timeout=5)
    assert plain.stdout.splitlines()[0].endswith("Permission denied"), plain.stdout
    # Control: with the environment, the same listing shows the prepared files.
    assert "keep.txt" in _sh(pool, "ls -A").stdout


def test_a_lease_can_modify_prepared_files_and_programs_run_as_its_owner(pool):
    # Copy-up of a prepared file needs it owned by the sandbox's uid (an unmapped owner: EOVERFLOW).
    result = _sh(pool, "echo more >> keep.txt && ./venv/bin/tool && stat -c '%U %a' keep.txt venv/bin/tool")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split() == ["sandbox", "644", "sandbox", "755"]


def test_an_environment_mounted_at_app(pool):
    env = {**ENV, "workdir": "/app"}
    result = _sh(pool, "pwd; cat derived.txt; echo; echo x > /app/y", environment=env)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split() == ["/app", "40"]
    after = _sh(pool, "pwd; ls /app; ls -A /work | wc -l", environment=None)
    assert "y" not in after.stdout.split()[1:-1] and after.stdout.split()[-1] == "0"


def test_a_failing_setup_scores_its_rows_none_and_nothing_else(pool):
    broken = {"files": {"x": "1"}, "setup": ["echo about to fail; exit 3"]}
    row = {"prompt": "def f():\n", "entry_point": "f",
           "test": "def check(candidate):\n    assert candidate() == 40\n"}
    good = {**row, "environment": ENV}
    outcomes = Scorer(pool, cache_size=0).score(
        ["    return 40\n", READS, "    return 41\n"],
        [{**row, "environment": broken}, good, good])
    assert [o.status for o in outcomes] == ["infra", "passed", "failed"]
    assert outcomes[0].reward is None and "exit 3" in outcomes[0].detail and "about to fail" in outcomes[0].detail
    # Control: the row that failed to build passes without its environment.
    assert Scorer(pool, cache_size=0).score(["    return 40\n"], [row])[0].status == "passed"


def test_the_judged_styles_run_in_the_environment(pool):
    # The candidate runs in the lease's copy (the judge's own test code runs outside it, from /).
    row = {"prompt": "def f():\n", "entry_point": "f",
           "test": "def check(candidate):\n    assert candidate() == 40\n"}
    scorer = Scorer(pool, cache_size=0)
    assert scorer.score([READS], [{**row, "environment": ENV}])[0].status == "passed"
    # Control: the same row without the environment has no derived.txt.
    assert scorer.score([READS], [row])[0].status == "error"
    io_row = {"prompt": "print the file", "tests": [{"input": "", "output": "40\n"}], "environment": ENV}
    # An I/O program runs each test in a fresh directory inside the working directory.
    program = "```python\nprint(open('../derived.txt').read())\n```"
    assert scorer.score([program], [io_row])[0].status == "passed"


def test_episodes_get_their_own_copy(pool):
    scorer = Scorer(pool, cache_size=0)
    row = {"prompt": "p", "entry_point": "f", "environment": ENV, "extract": "raw",
           "test": "def check(candidate):\n    assert candidate() == 40\n"}
    env = SandboxEnvironment(pool, scorer)
    env.reset(**row)
    assert env.read_file("derived.txt").strip().endswith("40")
    env.write_file("solution.py", "def f():\n    return int(open('derived.txt').read())\n")
    env.bash("rm derived.txt")
    assert "No such file" in env.bash("cat derived.txt")  # control: the episode's own change
    assert env.get_reward() == 1.0  # judged in a fresh copy of the environment, which has it
    other = SandboxEnvironment(pool, scorer)
    other.reset(**row)
    assert "40" in other.bash("cat derived.txt") and "solution.py" not in other.bash("ls")
    other.get_reward()


def test_a_setup_that_prints_a_flood_keeps_only_its_tail(pool, cache_dir):
    env = {"setup": ["head -c 30000000 /dev/zero | tr '\\0' 'x'; echo; echo the-end"]}
    assert _sh(pool, "echo ok", environment=env).stdout == "ok\n"
    metas = [json.loads(m.read_text()) for m in cache_dir.glob("*/meta.json")]
    flood = [m for m in metas if "the-end" in m["output"]]
    assert len(flood) == 1 and len(flood[0]["output"]) <= 4003  # the tail, not 30 MB


@pytest.mark.parametrize("point", ["/.trl-sandbox", "/usr", "/tmp", "/a/b", "app", "/nix"])
def test_mount_points_are_new_top_level_directories(point):
    with pytest.raises(ConfigError, match="mount_points"):
        check_mount_point(point)
    assert check_mount_point("/app") == "/app"  # control

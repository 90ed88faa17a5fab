"""Prepared environments without a sandbox: the spec, its content key, the cache, one build per key.

The builds here are plain functions that record each call; the sandboxed build and the leases are
in ``test_environment_leases.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from trl_sandbox.environments.builds import Builds, SetupFailed
from trl_sandbox.environments.cache import EnvironmentCache
from trl_sandbox.environments.spec import parse
from trl_sandbox.sandbox import ConfigError

SPEC = {"files": {"data/in.txt": "5\n"}, "setup": ["python3 -c 'print(1)'"]}


def test_the_key_hashes_what_builds_the_state_and_nothing_of_the_row():
    spec = parse(SPEC)
    same = parse(json.dumps(SPEC))  # its JSON text is the same environment
    assert spec == same and spec.key("local", "host") == same.key("local", "host")
    assert parse({**SPEC, "setup_timeout": 5}).key("local", "host") == spec.key("local", "host")
    # One byte apart, anywhere that builds the state, is another key.
    others = [
        parse({**SPEC, "files": {"data/in.txt": "6\n"}}),
        parse({**SPEC, "files": {"data/in2.txt": "5\n"}}),
        parse({**SPEC, "setup": ["python3 -c 'print(2)'"]}),
        parse({**SPEC, "setup_network": True}),
        parse({**SPEC, "workdir": "/app"}),
    ]
    keys = {o.key("local", "host") for o in others} | {spec.key("local", "host")}
    assert len(keys) == 6
    assert spec.key("ray", "host") != spec.key("local", "host")
    assert spec.key("local", "sha256:aa") != spec.key("local", "sha256:ab")


@pytest.mark.parametrize("bad, words", [
    ({"files": {"/etc/passwd": "x"}}, "relative"),
    ({"files": {"../up": "x"}}, "relative"),
    ({"files": {"a": 3}}, "must be text"),
    ({"setup": "   "}, "shell commands"),
    ({"setup": [1]}, "shell commands"),
    ({"workdir": "app"}, "absolute"),
    ({"workdir": "/proc/x"}, "system directory"),
    ({"setup_timeout": 0}, "positive"),
    ({"setup_network": "yes"}, "true or false"),
    ({"image": "x"}, "unknown field"),
    ({"files": {"a": "1", "a/b": "2"}}, "is a file"),
    ("{not json", "not valid JSON"),
    (["files"], "must be a dict"),
])
def test_a_malformed_environment_says_which_field_and_what_to_write(bad, words):
    with pytest.raises(ConfigError, match=words):
        parse(bad)


def test_rows_without_an_environment_have_none():
    for empty in (None, "", {}, "{}"):
        assert parse(empty) is None
    # TRL's dict of environment factories names the row's factory in a column of the same name.
    assert parse("math_env") is None and parse({"setup": ["true"]}) is not None
    assert parse({"setup": "make"}).setup == ("make",)  # a single command as a string


def _builds(tmp_path: Path, calls: list, fail: int = 0, delay: float = 0.0) -> Builds:
    def build(spec, key, staging):
        calls.append(key)
        time.sleep(delay)
        if len(calls) <= fail:
            raise SetupFailed(f"setup failed (exit 1); output: attempt {len(calls)}")
        (staging / "tree" / "built.txt").write_text(key)
        return {"spec": spec.describe()}

    return Builds(EnvironmentCache(tmp_path / "cache"), "test", build)


def test_eight_concurrent_leases_of_one_key_build_it_once(tmp_path):
    calls: list = []
    builds = _builds(tmp_path, calls, delay=0.3)
    spec = parse(SPEC)
    results, errors = [], []

    def lease():
        try:
            results.append(builds.prepare_sync(spec))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=lease) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(results) == 8
    assert len(calls) == 1
    assert {r.key for r in results} == {calls[0]} and (results[0].tree / "built.txt").read_text() == calls[0]
    # Positive control: a spec one byte apart is a second build.
    builds.prepare_sync(parse({**SPEC, "files": {"data/in.txt": "5\n\n"}}))
    assert len(calls) == 2
    stats = builds.drain().metrics()
    assert stats["env/builds"] == 2 and 0 < stats["env/hit_rate"] < 1


CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from trl_sandbox.environments.builds import Builds
    from trl_sandbox.environments.cache import EnvironmentCache
    from trl_sandbox.environments.spec import parse

    log = Path(sys.argv[2])

    def build(spec, key, staging):
        with log.open("a") as f:
            f.write("build\\n")
        time.sleep(1.0)
        (staging / "tree" / "x").write_text("x")
        return {}

    builds = Builds(EnvironmentCache(sys.argv[1]), "test", build)
    prepared = builds.prepare_sync(parse({"setup": ["true"]}))
    print(prepared.key, (prepared.tree / "x").read_text())
""")


def test_two_processes_build_a_key_once(tmp_path):
    log = tmp_path / "builds.log"
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "cache"), str(log)],
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=60)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0] == outs[1] and outs[0][1] == "x"
    assert log.read_text().count("build") == 1
    # Control: another cache directory (another machine) builds again.
    subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "cache2"), str(log)], check=True,
                   stdout=subprocess.DEVNULL, timeout=60)
    assert log.read_text().count("build") == 2


def test_a_failing_setup_is_retried_once_then_remembered(tmp_path):
    calls: list = []
    builds = _builds(tmp_path, calls, fail=5)
    spec = parse(SPEC)
    for _ in range(3):
        with pytest.raises(SetupFailed, match="attempt 2"):
            builds.prepare_sync(spec)
    assert len(calls) == 2  # two attempts, then every later lease gets the same failure
    assert not list((tmp_path / "cache").glob(".build-*"))  # failed builds leave nothing
    # Control: a setup that fails once only is built on its retry.
    calls2: list = []
    builds2 = _builds(tmp_path / "b", calls2, fail=1)
    assert (builds2.prepare_sync(spec).tree / "built.txt").exists() and len(calls2) == 2


def test_the_cache_keeps_its_budget_least_recently_used_first(tmp_path):
    cache = EnvironmentCache(tmp_path / "c", budget_mb=0.05)  # about 50 KB
    for key in ["a" * 64, "b" * 64, "c" * 64]:
        if key[0] == "c":
            cache.ready("a" * 64)  # used after b was built: b is now the least recently used
            time.sleep(0.05)
        staging = cache.staging()
        (staging / "tree" / "blob").write_bytes(b"x" * 20_000)
        cache.commit(staging, key, {})
        time.sleep(0.05)
    present = {k[0] for k in (p.parent.name for p in (tmp_path / "c").glob("*/meta.json"))}
    assert "b" not in present and {"a", "c"} <= present
    # Control: a key in use is never evicted, however old.
    assert cache.hold("a" * 64)
    staging = cache.staging()
    (staging / "tree" / "blob").write_bytes(b"x" * 40_000)
    cache.commit(staging, "d" * 64, {})
    assert cache.ready("a" * 64) is not None


EVICTOR = textwrap.dedent("""
    import sys
    from trl_sandbox.environments.builds import Builds
    from trl_sandbox.environments.cache import EnvironmentCache
    from trl_sandbox.environments.spec import parse

    def build(spec, key, staging):
        (staging / "tree" / "blob").write_bytes(b"y" * 40_000)
        return {}

    builds = Builds(EnvironmentCache(sys.argv[1], budget_mb=0.05), "test", build)
    builds.prepare_sync(parse({"setup": [sys.argv[2]]}))
""")


def test_another_process_never_evicts_a_tree_this_one_leases_from(tmp_path):
    calls: list = []
    builds = Builds(EnvironmentCache(tmp_path / "c", budget_mb=0.05), "test",
                    lambda spec, key, staging: (staging / "tree" / "blob").write_bytes(b"x" * 40_000) and {})
    prepared = builds.prepare_sync(parse(SPEC))
    assert prepared.tree.is_dir()

    def other_rank(command):
        subprocess.run([sys.executable, "-c", EVICTOR, str(tmp_path / "c"), command], check=True, timeout=60)

    other_rank("one")  # over the budget: ours is the least recently used, but held
    assert prepared.tree.is_dir() and (prepared.tree / "blob").exists()
    # Control: once no lease of ours uses it (and it idled), the next build elsewhere evicts it.
    builds.release_idle(active=set(), idle_s=0)
    other_rank("two")
    assert not prepared.tree.exists()
    assert calls == []
    # And a later lease here builds it again instead of finding half a tree.
    assert (builds.prepare_sync(parse(SPEC)).tree / "blob").exists()


def test_trees_of_any_depth_are_measured_and_removed(tmp_path):
    from trl_sandbox.environments.cache import remove_tree, tree_size

    deep = tmp_path / "deep"
    bottom = str(deep) + "/d" * 1100  # deeper than Python's recursion limit
    subprocess.run(["mkdir", "-p", bottom], check=True)
    with open(bottom + "/f", "w") as f:
        f.write("x")
    os.chmod(bottom, 0)  # and a directory without permissions at the bottom
    size, entries = tree_size(deep)
    assert entries == 1101 and size > 0  # the 1100 directories and the file
    remove_tree(deep)
    assert not deep.exists()
    # Control: the tree was there, and a symlink out of a removed tree is not followed.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("k")
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "link").symlink_to(outside)
    remove_tree(tmp_path / "t")
    assert (outside / "keep").read_text() == "k" and not (tmp_path / "t").exists()


def test_a_process_waiting_for_anothers_build_is_not_held_up_by_its_leases(tmp_path):
    """The builder keeps the key's lock shared while it leases: a process that began to wait for
    the build takes the built tree then, without a build of its own."""
    log = tmp_path / "builds.log"

    def build(spec, key, staging):
        with log.open("a") as f:
            f.write("build\n")
        time.sleep(4.0)  # the other process starts waiting meanwhile
        (staging / "tree" / "x").write_text("x")
        return {}

    builds = Builds(EnvironmentCache(tmp_path / "cache"), "test", build)
    spec = parse({"setup": ["true"]})
    thread = threading.Thread(target=builds.prepare_sync, args=(spec,))
    thread.start()
    time.sleep(0.5)  # our build is under way, its lock taken
    other = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "cache"), str(log)],
                             stdout=subprocess.PIPE, text=True)
    thread.join()
    assert builds.cache.held == {builds.key(spec)}  # we lease from it, and keep leasing
    out, _ = other.communicate(timeout=30)
    assert other.returncode == 0 and out.split()[1] == "x"
    assert log.read_text().count("build") == 1  # control: it took our build, it did not make its own

"""Prepared environments on the ray provider: the local mechanism on each node of a real Ray
cluster (``conftest.cluster``: two worker nodes on this machine, so they share one cache
directory, as two nodes share nothing but a machine's disk would not; one build per machine).

Each test has its positive control: the lease that changed its copy saw the change; a second
spec is a second build; the row whose environment fails passes without it.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

import pytest
from conftest import wait_until
from trl_sandbox_ray import RayProvider

from trl_sandbox import SandboxSpec
from trl_sandbox.environments.builds import SetupFailed
from trl_sandbox.environments.cache import remove_tree
from trl_sandbox.environments.spec import parse
from trl_sandbox.plugins.testing import FAST, closing, run
from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.scoring.scorer import Scorer

pytestmark = pytest.mark.slow
TAGS = {"trl-sandbox": "1", "trl-sandbox-run": "ray-env-test"}
ENV = {"files": {"in.txt": "5\n", "keep.txt": "prepared\n"},
       "setup": ["python3 -c \"open('derived.txt', 'w').write(str(int(open('in.txt').read()) * 8))\""]}
LOOK = "cat keep.txt derived.txt; echo; ls; test ! -e planted.txt && echo clean"
HOSTILE = "echo changed >> keep.txt; rm derived.txt; chmod 000 in.txt; echo x > planted.txt; cat keep.txt; ls"
BROKEN = {"files": {"x": "1"}, "setup": ["echo about to fail; exit 3"]}


@pytest.fixture(scope="module")
def cache_dir():
    # Where the sandbox's unprivileged uid can reach it (pytest's own tmp_path is private to root).
    path = Path(tempfile.mkdtemp(prefix="trl-sandbox-rayenv-", dir="/var/tmp"))
    os.chmod(path, 0o755)
    yield path
    remove_tree(path)


@pytest.fixture(scope="module")
def make(cluster, cache_dir):
    def make():
        return RayProvider(address=cluster.address, cpus_per_sandbox=0.5, resources={"sandbox": 1}, probe=False,
                           environment_cache=str(cache_dir))

    return make


def _sh(pool, script, environment=ENV):
    return pool.run(["/bin/sh", "-c", script], timeout=10, environment=parse(environment) if environment else None)


def test_one_build_per_key_and_a_private_copy_per_lease(make, cache_dir):
    with SandboxPool.open(make(), size=4, spec=SandboxSpec(tags=TAGS), pool_settings=FAST) as pool:
        assert wait_until(lambda: pool.members == 4)  # every sandbox up: the build goes to each node
        spec = parse(ENV)

        async def many():
            return await asyncio.gather(*(pool.aexec(["/bin/sh", "-c", LOOK], timeout=10, environment=spec)
                                          for _ in range(6)))

        results = pool.loop.run(many())
        for result in results:
            assert result.exit_code == 0, result.stderr
            assert result.stdout.split()[:2] == ["prepared", "40"] and "clean" in result.stdout
        nodes = {s.node_id for s in pool.provider._sandboxes.values()}
        metrics = pool.environment_metrics()
        # Both nodes were asked (one actor each), each lease mounted a copy; one machine, one build.
        assert metrics["env/builds"] == 1 and len(list(cache_dir.glob("*/tree"))) == 1, metrics
        assert metrics["env/failures"] == 0 and "env/lease_ms_p50" in metrics
        # One actor per node was asked to prepare (the first built, the other found it built),
        # then every lease's actor found it: hits are those of the other nodes and the 6 leases.
        assert metrics["env/hit_rate"] == (len(nodes) - 1 + 6) / (len(nodes) + 6), (metrics, nodes)

        hostile = _sh(pool, HOSTILE)
        # Control: the hostile lease saw its own changes.
        assert "changed" in hostile.stdout and "planted.txt" in hostile.stdout and "derived.txt" not in hostile.stdout
        for _ in range(4):  # every sandbox of the pool, after the hostile lease
            after = _sh(pool, LOOK)
            assert after.exit_code == 0, after.stderr
            assert after.stdout.split()[:2] == ["prepared", "40"] and "clean" in after.stdout
        plain = _sh(pool, "ls -A | wc -l", environment=None)
        assert plain.stdout.strip() == "0"  # a lease without the environment: an empty directory

        # Control for "one build": a spec one byte apart is a second build.
        other = _sh(pool, LOOK, environment={**ENV, "files": {**ENV["files"], "in.txt": "6\n"}})
        assert other.stdout.split()[:2] == ["prepared", "48"]
        assert pool.environment_metrics()["env/builds"] == 1
        assert len(list(cache_dir.glob("*/tree"))) == 2


def test_a_failing_setup_scores_its_rows_infra_and_nothing_else(make):
    row = {"prompt": "def f():\n", "entry_point": "f", "test": "def check(candidate):\n    assert candidate() == 40\n"}
    reads = "    return int(open('derived.txt').read())\n"
    with SandboxPool.open(make(), size=2, spec=SandboxSpec(tags=TAGS), pool_settings=FAST) as pool:
        pool.wait_ready()
        good = {**row, "environment": ENV}
        outcomes = Scorer(pool, cache_size=0).score(["    return 40\n", reads, "    return 41\n"],
                                                    [{**row, "environment": BROKEN}, good, good])
        assert [o.status for o in outcomes] == ["infra", "passed", "failed"], outcomes
        assert outcomes[0].reward is None and "exit 3" in outcomes[0].detail and "about to fail" in outcomes[0].detail
        # The pool's caller gets the setup's own error type, before any lease; it is not built again.
        with pytest.raises(SetupFailed, match="about to fail"):
            _sh(pool, "true", environment=BROKEN)
        metrics = pool.environment_metrics()
        assert metrics["env/failures"] == 1, metrics
        # Control: the row whose environment failed passes without it.
        assert Scorer(pool, cache_size=0).score(["    return 40\n"], [row])[0].status == "passed"


def test_a_node_without_the_build_makes_it_at_the_lease_and_a_failure_is_remembered(make):
    """Prepared before any sandbox existed (no node to build on): the lease's actor builds it. A
    setup that fails there is ``SetupFailed`` from the lease, and the driver does not ask again."""
    p = make()
    late = parse({**ENV, "files": {**ENV["files"], "in.txt": "7\n"}})
    broken = parse({**BROKEN, "files": {"y": "2"}})

    async def go():
        prepared = await p.prepare_environment(late)  # no sandbox yet: nothing built anywhere
        prepared_bad = await p.prepare_environment(broken)  # nor tried
        before = p.environments.builds.drain()
        sandbox = await p.create(SandboxSpec(tags=TAGS))
        await sandbox.use_environment(prepared)
        seen = (await sandbox.exec(["/bin/sh", "-c", "cat derived.txt"], timeout=10)).stdout
        after = p.environments.builds.drain()
        await sandbox.reset()
        errors = []
        for _ in range(2):
            try:
                await sandbox.use_environment(prepared_bad)
            except SetupFailed as exc:
                errors.append(exc)
        failed = p.environments.builds.drain()
        try:
            await p.prepare_environment(broken)
            again = None
        except SetupFailed as exc:
            again = exc
        return before, seen, after, errors, failed, again

    before, seen, after, errors, failed, again = run(closing(p, go()))
    assert before.builds == 0 and before.misses == 0
    assert seen == "56" and after.builds == 1 and len(after.lease_ms) == 1, after
    assert len(errors) == 2 and "about to fail" in str(errors[0])
    assert failed.failures == 1  # the second lease was refused by the driver: no second build
    assert isinstance(again, SetupFailed)

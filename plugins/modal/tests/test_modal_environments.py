"""Prepared environments on Modal: one file-system snapshot image per key, a private copy per
lease (the real SDK against the fake, whose snapshots are tarballs of a container's /var/tmp)."""

from __future__ import annotations

import pytest

from trl_sandbox.plugins.testing import environments as kit
from trl_sandbox.pool.sandbox_pool import SandboxPool


def _live(fake) -> int:
    """Snapshot images a sandbox can boot from. Modal's SDK cannot delete an image (a snapshot
    expires with its TTL), so a spoiled one that fails to boot is not deleted, only unusable."""
    with fake.state.lock:
        return len(set(fake.state.snapshots) - fake.state.boot404)


@pytest.fixture
def service(fake):
    return kit.SnapshotService(made=lambda: fake.snapshots_made, live=lambda: _live(fake),
                               fault=fake.snapshot_fault, drop_all=fake.drop_snapshots)


@pytest.fixture
def settings(fake, tmp_path):
    return {"environment_cache": str(tmp_path / "envs"), "snapshot_timeout_s": 1.5}


@pytest.fixture
def make_pool(settings):
    return lambda size=2, **more: SandboxPool.open("modal", size=size, settings={**settings, **more})


@pytest.fixture
def make_provider(settings):
    from trl_sandbox.plugins import make_provider

    return lambda: make_provider("modal", settings)


def test_one_snapshot_for_many_leases_and_one_per_spec(fake, make_pool, service):
    with make_pool() as pool:
        kit.check_one_build_for_many_leases(pool, service)
        metrics = pool.environment_metrics()
    assert metrics["env/builds"] == 2.0
    # Leases came from sandboxes made from a snapshot image (Image.from_id).
    assert any(s.definition.image_id in fake.state.snapshots for s in fake.sandboxes.values())


class TestPreparedEnvironments(kit.SnapshotEnvironmentChecks):
    """Isolation between leases, failed setups and spoiled, vanished or missing snapshots (the kit's)."""

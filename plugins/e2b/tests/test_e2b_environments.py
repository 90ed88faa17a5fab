"""Prepared environments on E2B: one snapshot per key, a private copy per lease (the real SDK
against the fake service, whose sandboxes are containers and whose snapshots are their files)."""

from __future__ import annotations

import e2b_testing
import pytest
from e2b_testing import settings_for

from trl_sandbox.plugins.testing import environments as kit
from trl_sandbox.pool.sandbox_pool import SandboxPool

fake = e2b_testing.fake  # the fixture this module uses


@pytest.fixture
def service(fake):
    store = fake.snapshot_store
    return kit.SnapshotService(made=lambda: store.made, live=lambda: len(store.live), fault=store.fault,
                               drop_all=store.drop_all)


@pytest.fixture
def settings(fake, tmp_path):
    return {**settings_for(fake, tmp_path), "environment_cache": str(tmp_path / "envs"), "snapshot_timeout_s": 1.5}


@pytest.fixture
def make_pool(settings):
    return lambda size=2, **more: SandboxPool.open("e2b", size=size, settings={**settings, **more})


@pytest.fixture
def make_provider(settings):
    from trl_sandbox.plugins import make_provider

    return lambda: make_provider("e2b", settings)


def test_one_snapshot_for_many_leases_and_one_per_spec(fake, make_pool, service):
    with make_pool() as pool:
        kit.check_one_build_for_many_leases(pool, service)
        metrics = pool.environment_metrics()
    assert metrics["env/builds"] == 2.0
    # Leases came from sandboxes made from the snapshot (its name as the template).
    assert any(s.template.startswith("trl-sandbox-env-") for s in fake.sandboxes.values())


class TestPreparedEnvironments(kit.SnapshotEnvironmentChecks):
    """Isolation between leases, failed setups and spoiled, vanished or missing snapshots (the kit's)."""

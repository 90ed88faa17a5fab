"""Prepared environments on CoreWeave: one file-system snapshot per key, a private copy per lease
(the real ``cwsandbox`` SDK against the fake service, whose sandboxes are containers and whose
snapshots are tarballs of the scratch volume's directory)."""

from __future__ import annotations

import pytest
from coreweave_fake import API_KEY, FakeCoreWeave

from trl_sandbox.plugins.testing import environments as kit
from trl_sandbox.pool.sandbox_pool import SandboxPool


@pytest.fixture
def fake():
    server = FakeCoreWeave().start()
    yield server
    server.stop()


def _service(fake: FakeCoreWeave) -> kit.SnapshotService:
    store = fake.snapshot_store
    return kit.SnapshotService(made=lambda: store.made, live=lambda: len(store.live), fault=store.fault,
                               drop_all=store.drop_all)


@pytest.fixture
def service(fake):
    return _service(fake)


@pytest.fixture
def settings(fake, tmp_path):
    return {"api_key": API_KEY, "base_url": fake.base_url, "environment_cache": str(tmp_path / "envs"),
            "snapshot_timeout_s": 1.5}


@pytest.fixture
def make_pool(settings):
    return lambda size=2, **more: SandboxPool.open("coreweave", size=size, settings={**settings, **more})


@pytest.fixture
def make_provider(settings):
    from trl_sandbox.plugins import make_provider

    return lambda: make_provider("coreweave", settings)


def test_one_snapshot_for_many_leases_and_one_per_spec(fake, make_pool, service):
    with make_pool() as pool:
        kit.check_one_build_for_many_leases(pool, service)
        metrics = pool.environment_metrics()
    assert metrics["env/builds"] == 2.0
    # Leases came from sandboxes that restored the snapshot (FileSystemSnapshotOptions).
    assert any(v.scratch.restore_from_snapshot_id for s in fake.sandboxes.values() for v in s.spec.volumes)


class TestPreparedEnvironments(kit.SnapshotEnvironmentChecks):
    """Isolation between leases, failed setups and spoiled, vanished or missing snapshots (the kit's)."""

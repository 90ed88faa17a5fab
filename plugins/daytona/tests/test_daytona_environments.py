"""Prepared environments on Daytona: one snapshot per key, a private copy per lease (the real SDK
against the fake service, whose sandboxes are containers and whose snapshots are their files)."""

from __future__ import annotations

import pytest
from daytona_fake import API_KEY, FakeDaytona

from trl_sandbox.plugins.testing import environments as kit
from trl_sandbox.pool.sandbox_pool import SandboxPool


@pytest.fixture
def fake():
    server = FakeDaytona().start()
    yield server
    server.stop()


def _service(fake: FakeDaytona) -> kit.SnapshotService:
    def drop_all() -> None:
        for name in list(fake.snapshots):
            fake.drop_snapshot(name)

    return kit.SnapshotService(made=lambda: fake.snapshots_made, live=lambda: len(fake.snapshots),
                               fault=fake.snapshot_fault, drop_all=drop_all)


@pytest.fixture
def service(fake):
    return _service(fake)


@pytest.fixture
def settings(fake, tmp_path):
    return {"api_key": API_KEY, "api_url": fake.api_url, "environment_cache": str(tmp_path / "envs"),
            "snapshot_timeout_s": 1.5}


@pytest.fixture
def make_pool(settings):
    return lambda size=2, **more: SandboxPool.open("daytona", size=size, settings={**settings, **more})


@pytest.fixture
def make_provider(settings):
    from trl_sandbox.plugins import make_provider

    return lambda: make_provider("daytona", settings)


def test_one_snapshot_for_many_leases_and_one_per_spec(fake, make_pool, service):
    with make_pool() as pool:
        kit.check_one_build_for_many_leases(pool, service)
        metrics = pool.environment_metrics()
    assert metrics["env/builds"] == 2.0
    # Leases came from sandboxes made from the snapshot (CreateSandboxFromSnapshotParams).
    assert any((s.request.get("snapshot") or "").startswith("trl-sandbox-env-") for s in fake.sandboxes.values())


class TestPreparedEnvironments(kit.SnapshotEnvironmentChecks):
    """Isolation between leases, failed setups and spoiled, vanished or missing snapshots (the kit's)."""

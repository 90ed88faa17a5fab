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
def make_pool(fake, tmp_path):
    def make(size: int = 2, **settings):
        settings = {"api_key": API_KEY, "api_url": fake.api_url, "environment_cache": str(tmp_path / "envs"),
                    "snapshot_timeout_s": 1.5, **settings}
        return SandboxPool.open("daytona", size=size, settings=settings)
    return make


def test_one_snapshot_for_many_leases_and_one_per_spec(fake, make_pool):
    with make_pool() as pool:
        kit.check_one_build_for_many_leases(pool, _service(fake))
        metrics = pool.environment_metrics()
    assert metrics["env/builds"] == 2.0
    # Leases came from sandboxes made from the snapshot (CreateSandboxFromSnapshotParams).
    assert any((s.request.get("snapshot") or "").startswith("trl-sandbox-env-") for s in fake.sandboxes.values())


@pytest.mark.parametrize("isolation", ["auto", "sweep"])
def test_isolation_between_leases_of_one_sandbox(fake, make_pool, isolation):
    # auto: the launcher mounts an overlay (it holds CAP_SYS_ADMIN in the fake's container);
    # sweep: it copies the tree.
    with make_pool(size=1, isolation=isolation) as pool:
        kit.check_isolation_between_leases(pool, copy="overlay" if isolation == "auto" else "copy")


def test_a_failed_setup_is_infra_for_its_rows_only(fake, make_pool):
    with make_pool() as pool:
        kit.check_failed_setup_is_infra(pool, _service(fake))


@pytest.mark.parametrize("kind", ["ghost", "pending", "boot404"])
def test_a_spoiled_snapshot_is_built_again(fake, make_pool, kind):
    with make_pool() as pool:
        kit.check_snapshot_fault(pool, _service(fake), kind, salt=kind)


def test_a_snapshot_that_vanished_is_built_again(fake, make_pool):
    kit.check_vanished_snapshot_is_rebuilt(make_pool, _service(fake))


def test_a_create_from_a_missing_snapshot_is_infra_and_rebuilds(fake, tmp_path):
    from trl_sandbox.plugins import make_provider

    provider = make_provider("daytona", {"api_key": API_KEY, "api_url": fake.api_url,
                                        "environment_cache": str(tmp_path / "envs"), "snapshot_timeout_s": 1.5})
    kit.check_missing_snapshot_on_create(provider, _service(fake))

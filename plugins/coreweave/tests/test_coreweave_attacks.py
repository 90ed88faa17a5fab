"""Issue 36's hostile programs against the CoreWeave provider's clean leases (the conformance kit's
``attacks``), on the fake whose every sandbox is a container of its own with the service's API on
its loopback (where a vendor daemon listens in a sandbox). Each attack next to its control."""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("trl_sandbox.plugins.testing")

from coreweave_fake import API_KEY, FakeCoreWeave  # noqa: E402

from trl_sandbox.plugins import make_provider  # noqa: E402
from trl_sandbox.plugins.testing.attack_suite import RemoteLeaseAttacks  # noqa: E402


@pytest.fixture
def fake():
    server = FakeCoreWeave().start()
    yield server
    server.stop()


@pytest.fixture
def provider(fake, tmp_path):
    def build(**settings):
        settings = {"api_key": API_KEY, "base_url": fake.base_url, "work_dir": f"{tmp_path}/{{id}}", **settings}
        return make_provider("coreweave", settings)

    return build


@pytest.fixture
def daemon_port(fake):
    return fake.port


@pytest.fixture
def outside(fake):
    return lambda sandbox_id, argv: fake.sandboxes[sandbox_id].box.run_outside(argv)


class TestAttacks(RemoteLeaseAttacks):
    """Every attack of the conformance kit, on this plugin's fake."""

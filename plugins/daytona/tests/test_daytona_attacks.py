"""Issue 36's hostile programs against the Daytona provider's clean leases (the conformance kit's
``attacks``), on the fake whose every sandbox is a container of its own with the service's API on
its loopback, as the toolbox daemon is on Daytona. Each attack next to its control."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

pytest.register_assert_rewrite("trl_sandbox.plugins.testing")

from daytona_fake import API_KEY, FakeDaytona  # noqa: E402

from trl_sandbox.plugins import make_provider  # noqa: E402
from trl_sandbox.plugins.testing.attack_suite import RemoteLeaseAttacks  # noqa: E402


@pytest.fixture
def fake():
    server = FakeDaytona().start()
    yield server
    server.stop()


@pytest.fixture
def provider(fake, tmp_path):
    def build(**settings):
        settings = {"api_key": API_KEY, "api_url": fake.api_url, "work_dir": f"{tmp_path}/{{id}}", **settings}
        return make_provider("daytona", settings)

    return build


@pytest.fixture
def daemon_port(fake):
    return urlsplit(fake.api_url).port


@pytest.fixture
def outside(fake):
    return lambda sandbox_id, argv: fake.sandboxes[sandbox_id].container.run_outside(argv)


class TestAttacks(RemoteLeaseAttacks):
    """Every attack of the conformance kit, on this plugin's fake."""

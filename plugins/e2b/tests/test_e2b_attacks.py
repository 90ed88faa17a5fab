"""Issue 36's hostile programs against the E2B provider's clean leases (the conformance kit's
``attacks``), on the fake whose every sandbox is a container of its own with the service's API and
envd on its loopback, as envd listens inside every E2B sandbox. Each attack next to its control."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

pytest.register_assert_rewrite("trl_sandbox.plugins.testing")


import e2b_testing  # noqa: E402

from trl_sandbox.plugins.testing.attack_suite import RemoteLeaseAttacks  # noqa: E402

fake, outside, provider = e2b_testing.fake, e2b_testing.outside, e2b_testing.provider  # the fixtures this module uses


@pytest.fixture
def daemon_port(fake):
    return urlsplit(fake.url).port


class TestAttacks(RemoteLeaseAttacks):
    """Every attack of the conformance kit, on this plugin's fake."""

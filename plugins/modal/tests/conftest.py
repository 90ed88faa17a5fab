"""Fixtures for the modal plugin's tests: the fake service (``trl_sandbox_modal.fake``) on loopback,
the SDK pointed at it through its own environment variables, and providers made on it."""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("trl_sandbox.plugins.testing")

from trl_sandbox_modal.fake import FakeModal  # noqa: E402

from trl_sandbox.plugins import make_provider  # noqa: E402


@pytest.fixture
def fake(monkeypatch):
    server = FakeModal().start()
    for key, value in server.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MODAL_MAX_THROTTLE_WAIT", "0")
    yield server
    server.stop()


@pytest.fixture
def provider(fake, tmp_path):
    def build(**settings):
        return make_provider("modal", {"work_dir": f"{tmp_path}/{{id}}", **settings})

    return build


@pytest.fixture
def outside(fake):
    """Runs argv in a fake sandbox outside every lease (as the service's runtime would) -> stdout."""
    return lambda sandbox_id, argv: fake.sandboxes[sandbox_id].container.run_outside(argv)

"""What the e2b plugin's tests share: a fake E2B on loopback per test (``trl_sandbox_e2b.fake``),
providers pointed at it through their settings (never the process environment, which other tests
share), and the tags they carry. Test modules import the fixtures they use from here: no
``conftest.py``, whose module name other plugins' tests import in a whole-repository run."""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("trl_sandbox.plugins.testing")

from trl_sandbox_e2b.fake import API_KEY, FakeE2B  # noqa: E402

from trl_sandbox.plugins import make_provider  # noqa: E402

TAGS = {"trl-sandbox": "1", "trl-sandbox-run": "e2b-test"}


def settings_for(fake: FakeE2B, tmp_path) -> dict[str, str]:
    """Provider settings that point at ``fake``."""
    return {"api_key": API_KEY, "api_url": fake.url, "sandbox_url": fake.url, "work_dir": f"{tmp_path}/{{id}}"}


@pytest.fixture
def fake():
    server = FakeE2B().start()
    yield server
    server.stop()


@pytest.fixture
def provider(fake, tmp_path):
    def build(**settings):
        return make_provider("e2b", {**settings_for(fake, tmp_path), **settings})

    return build


@pytest.fixture
def outside(fake):
    """Runs argv in a fake sandbox outside every lease (as the service's envd would) -> stdout."""
    return lambda sandbox_id, argv: fake.sandboxes[sandbox_id].container.run_outside(argv)

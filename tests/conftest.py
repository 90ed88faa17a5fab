"""Shared fixtures. Everything runs offline: no hub, no telemetry, no network beyond loopback."""

from __future__ import annotations

import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

TESTS = Path(__file__).parent


@pytest.fixture(scope="session", autouse=True)
def test_plugin(tmp_path_factory) -> Path:
    """Install tests/testplugin as a real distribution (into a private target dir) and load it.

    The plugin manager then discovers it through its entry point, exactly like a plugin a user
    installed with pip. Subprocesses see it through PYTHONPATH.
    """
    target = tmp_path_factory.mktemp("site")
    # Built from a copy: the build writes next to its source, and parallel workers (pytest -n)
    # building the one tree at once collide there.
    source = shutil.copytree(TESTS / "testplugin", tmp_path_factory.mktemp("testplugin") / "src",
                             ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(source)],
        check=True,
    )
    sys.path.insert(0, str(target))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))
    import importlib

    importlib.invalidate_caches()
    from trl_sandbox.plugins import plugin_manager

    plugin_manager.cache_clear()
    yield target
    plugin_manager.cache_clear()


@pytest.fixture
def flaky_provider():
    """A fresh ``flaky`` provider factory: ``flaky_provider(create_failures=1, ...)``."""
    from trl_sandbox.plugins import make_provider

    return lambda **faults: make_provider("flaky", faults)

"""Sandboxes of a SIGKILLed ``trl-sandbox exec`` run, found again by their E2B metadata and removed.

The killed process cannot clean up, and the service outlives it (here: the fake E2B in this
process), so its sandboxes are only found again by the tags every pool carries (host, owner pid,
run id, maker), which the provider stores as E2B metadata.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import e2b_testing
import pytest
from e2b_testing import settings_for

from trl_sandbox.commands.cli import main
from trl_sandbox.plugins import make_provider
from trl_sandbox.plugins.testing import FAST
from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.pool.tags import MADE_BY_TAG, PID_TAG

fake = e2b_testing.fake  # the fixture this module uses


def _args(fake, tmp_path) -> list[str]:
    return [a for k, v in settings_for(fake, tmp_path).items() for a in ("--setting", f"{k}={v}")]


def _killed_run(fake, tmp_path, size: int = 2) -> int:
    """Start ``trl-sandbox exec`` on programs that never end, SIGKILL it once its pool is up; its pid."""
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps({"id": i, "code": "import time; time.sleep(3600)"}) + "\n" for i in range(4)))
    before = set(fake.live())
    proc = subprocess.Popen([sys.executable, "-m", "trl_sandbox.commands.cli", "exec", "--provider", "e2b",
                             *_args(fake, tmp_path), "--input", str(batch), "--timeout", "3600", "--pool-size", str(size)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while len(set(fake.live()) - before) < size and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait(30)
    assert len(set(fake.live()) - before) == size, "the exec run's pool never came up"
    return proc.pid


@pytest.fixture
def big_pages(fake):
    fake.page_size = 50
    return fake


def test_reap_dead_owners_removes_a_killed_runs_sandboxes(big_pages, tmp_path):
    fake = big_pages
    pid = _killed_run(fake, tmp_path)
    left = fake.live()
    assert all(fake.sandboxes[i].metadata[PID_TAG] == str(pid) and fake.sandboxes[i].metadata[MADE_BY_TAG] == "exec"
               for i in left)
    assert main(["reap", "--provider", "e2b", *_args(fake, tmp_path), "--dead-owners"]) == 0
    assert fake.live() == []


def test_the_next_start_reaps_a_killed_runs_sandboxes(big_pages, tmp_path):
    fake = big_pages
    _killed_run(fake, tmp_path)
    stale = set(fake.live())
    pool = SandboxPool(make_provider("e2b", settings_for(fake, tmp_path)), size=1, settings=FAST)
    pool.start(wait=True)
    try:
        deadline = time.monotonic() + 30
        while pool.stats.counts["reaped"] < len(stale) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.stats.counts["reaped"] == len(stale)
        assert not stale & set(fake.live())
        assert len(fake.live()) == 1  # the new pool's own sandbox is untouched
    finally:
        pool.close()
    assert fake.live() == []

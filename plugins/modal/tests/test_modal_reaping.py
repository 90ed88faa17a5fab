"""Sandboxes of a SIGKILLed ``trl-sandbox exec`` run, found and removed by their Modal tags from
another process (the fake Modal outlives the killed run, as the service would)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from trl_sandbox.commands.cli import main
from trl_sandbox.plugins.testing import FAST
from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.pool.tags import MADE_BY_TAG, PID_TAG


def _killed_run(fake, tmp_path, size: int = 2) -> int:
    """Start ``trl-sandbox exec`` on programs that never end, SIGKILL it once its pool is up; its pid."""
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps({"id": i, "code": "import time; time.sleep(3600)"}) + "\n" for i in range(4)))
    before = set(fake.live())
    proc = subprocess.Popen([sys.executable, "-m", "trl_sandbox.commands.cli", "exec", "--provider", "modal",
                             "--setting", f"work_dir={tmp_path}/{{id}}", "--input", str(batch), "--timeout", "3600",
                             "--pool-size", str(size)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while len(set(fake.live()) - before) < size and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait(30)
    assert len(set(fake.live()) - before) == size, "the exec run's pool never came up"
    return proc.pid


def test_reap_dead_owners_removes_a_killed_runs_sandboxes(fake, tmp_path):
    pid = _killed_run(fake, tmp_path)
    left = fake.live()
    assert all(fake.sandboxes[i].tags[PID_TAG] == str(pid) and fake.sandboxes[i].tags[MADE_BY_TAG] == "exec"
               for i in left)
    assert main(["reap", "--provider", "modal", "--setting", f"work_dir={tmp_path}/{{id}}", "--dead-owners"]) == 0
    assert fake.live() == []


def test_the_next_start_reaps_a_killed_runs_sandboxes(fake, provider, tmp_path):
    _killed_run(fake, tmp_path)
    stale = set(fake.live())
    pool = SandboxPool(provider(), size=1, settings=FAST)
    pool.start(wait=True)
    try:
        deadline = time.monotonic() + 30
        while pool.stats.counts["reaped"] < len(stale) and time.monotonic() < deadline:
            time.sleep(0.05)  # start-up reaping runs beside warming, on the pool's loop
        assert pool.stats.counts["reaped"] == len(stale)
        assert not stale & set(fake.live())
        assert len(fake.live()) == 1  # the new pool's own sandbox is untouched
    finally:
        pool.close()
    assert fake.live() == []

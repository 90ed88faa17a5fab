"""Sandboxes of a SIGKILLed ``trl-sandbox exec`` or ``evaluate`` run, found and removed by their tags.

The killed process cannot clean up, and the service outlives it (here: a fake Daytona in this
process, on loopback), so its sandboxes are only found again by the tags every pool now carries
(host, owner pid, run id, maker).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from daytona_fake import API_KEY, FakeDaytona

from trl_sandbox.commands.cli import main
from trl_sandbox.plugins.testing import FAST
from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.pool.tags import MADE_BY_TAG, PID_TAG


@pytest.fixture
def fake():
    server = FakeDaytona(page_size=50).start()
    yield server
    server.stop()


def _settings(fake: FakeDaytona, tmp_path) -> dict[str, str]:
    return {"api_key": API_KEY, "api_url": fake.api_url, "work_dir": f"{tmp_path}/{{id}}"}


def _killed_run(fake: FakeDaytona, tmp_path, command: str, size: int = 2) -> int:
    """Start ``trl-sandbox exec`` or ``evaluate`` on programs that never end, SIGKILL it once its
    pool is up; its pid."""
    settings = [a for k, v in _settings(fake, tmp_path).items() for a in ("--setting", f"{k}={v}")]
    if command == "exec":
        batch = tmp_path / "batch.jsonl"
        batch.write_text("".join(json.dumps({"id": i, "code": "import time; time.sleep(3600)"}) + "\n"
                                 for i in range(4)))
        args = ["exec", "--input", str(batch), "--timeout", "3600"]
    else:
        samples = tmp_path / "samples.jsonl"
        samples.write_text("".join(json.dumps({"task_id": "sorting", "completion": "    while True:\n        pass\n"})
                                   + "\n" for _ in range(4)))
        args = ["evaluate", str(samples), "--tasks", "builtin", "--timeout", "3600", "--no-progress",
                "--output", str(tmp_path / "results.jsonl")]
    before = set(fake.live())
    proc = subprocess.Popen([sys.executable, "-m", "trl_sandbox.commands.cli", *args[:1], "--provider", "daytona", *settings,
                             *args[1:], "--pool-size", str(size)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while len(set(fake.live()) - before) < size and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait(30)
    assert len(set(fake.live()) - before) == size, f"the {command} run's pool never came up"
    return proc.pid


def _labels(fake: FakeDaytona, sandbox_id: str) -> dict:
    return dict(fake.sandboxes[sandbox_id].request.get("labels") or {})


@pytest.mark.parametrize("command", ["exec", "evaluate"])
def test_reap_dead_owners_removes_a_killed_runs_sandboxes(fake, tmp_path, command):
    pid = _killed_run(fake, tmp_path, command)
    left = fake.live()
    assert all(_labels(fake, i)[PID_TAG] == str(pid) and _labels(fake, i)[MADE_BY_TAG] == command for i in left)
    args = [a for k, v in _settings(fake, tmp_path).items() for a in ("--setting", f"{k}={v}")]
    assert main(["reap", "--provider", "daytona", *args, "--dead-owners"]) == 0
    assert fake.live() == []


@pytest.mark.parametrize("command", ["exec", "evaluate"])
def test_the_next_start_reaps_a_killed_runs_sandboxes(fake, tmp_path, command):
    from trl_sandbox.plugins import make_provider

    _killed_run(fake, tmp_path, command)
    stale = set(fake.live())
    pool = SandboxPool(make_provider("daytona", _settings(fake, tmp_path)), size=1, settings=FAST)
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

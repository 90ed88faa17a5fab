"""The fake as a runnable module: ``python -m trl_sandbox_e2b.fake --port 0`` for trying offline."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from trl_sandbox import SandboxSpec
from trl_sandbox.plugins import make_provider
from trl_sandbox.plugins.testing import closing, run


def _bwraps_of(pid: int) -> list[int]:
    """The bubblewrap processes below ``pid`` (its fake sandboxes' containers)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                parent = int(fh.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                name = fh.read().split(b"\0")[0]
        except (OSError, ValueError, IndexError):
            continue
        if parent == pid and name.endswith(b"bwrap"):
            found.append(int(entry))
    return found


def test_the_runnable_fake_serves_the_provider_and_leaves_nothing_on_sigterm(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "trl_sandbox_e2b.fake", "--port", "0"], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        port_line = proc.stdout.readline().strip()
        env = json.loads(proc.stdout.readline())
        assert port_line.startswith("PORT=") and int(port_line[5:]) > 0
        assert env["E2B_API_URL"] == env["E2B_SANDBOX_URL"] == f"http://127.0.0.1:{port_line[5:]}"
        p = make_provider("e2b", {"api_key": env["E2B_API_KEY"], "api_url": env["E2B_API_URL"],
                                  "sandbox_url": env["E2B_SANDBOX_URL"]})

        async def go():
            sandbox = await p.create(SandboxSpec(tags={"try": "offline"}))
            return await sandbox.exec(["python3", "-c", "print(6 * 7)"], timeout=10), sandbox.id

        result, sandbox_id = run(go())  # left running: the fake's SIGTERM must end it
        assert result.stdout == "42\n" and result.exit_code == 0
        containers = _bwraps_of(proc.pid)
        assert containers  # a container of its own, alive
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert [pid for pid in containers if _alive(pid)] == []
        run(closing(p, _noop()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def _noop() -> None:
    return None

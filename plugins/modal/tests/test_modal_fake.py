"""The fake as a runnable module (``python -m trl_sandbox_modal.fake --port 0``), and what the
provider does about Modal's client-side limits (long argv)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from trl_sandbox import SandboxSpec
from trl_sandbox.plugins.testing import closing, run


def _bwraps_of(pid: int) -> list[int]:
    """Processes descended from ``pid`` (the fake's sandboxes are bubblewraps it started)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def test_the_runnable_fake_serves_the_sdk_and_leaves_nothing_behind(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "trl_sandbox_modal.fake", "--port", "0"], stdout=subprocess.PIPE,
                            text=True)
    try:
        first = proc.stdout.readline()
        env = json.loads(proc.stdout.readline())
        assert first.startswith("PORT=") and env["MODAL_SERVER_URL"] == f"http://127.0.0.1:{first.strip()[5:]}"
        assert {"MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET", "MODAL_CONFIG_PATH"} <= set(env)
        config = env["MODAL_CONFIG_PATH"]
        assert os.path.exists(config)
        script = ("from trl_sandbox.plugins import make_provider\n"
                  "from trl_sandbox import SandboxPool, SandboxSpec\n"
                  f"p = make_provider('modal', {{'work_dir': '{tmp_path}/w'}})\n"
                  "with SandboxPool.open(p, size=1, spec=SandboxSpec()) as pool:\n"
                  "    print(pool.run(['python3', '-c', 'print(6 * 7)'], timeout=10).stdout, end='', flush=True)\n")
        used = subprocess.run([sys.executable, "-c", script], env={**os.environ, **env}, capture_output=True,
                              text=True, timeout=120)
        assert used.stdout == "42\n", used.stderr[-2000:]
        # a sandbox a killed client left running when the fake is stopped
        leave = ("import asyncio, os\n"
                 "from trl_sandbox.plugins import make_provider\n"
                 "from trl_sandbox import SandboxSpec\n"
                 f"p = make_provider('modal', {{'work_dir': '{tmp_path}/w'}})\n"
                 "async def go():\n"
                 "    sandbox = await p.create(SandboxSpec())\n"
                 "    print((await sandbox.exec(['python3', '-c', 'print(6 * 7)'], timeout=10)).stdout, end='', flush=True)\n"
                 "asyncio.run(go())\n"
                 "os._exit(0)\n")
        left = subprocess.run([sys.executable, "-c", leave], env={**os.environ, **env}, capture_output=True,
                              text=True, timeout=120)
        assert left.stdout == "42\n", left.stderr[-2000:]
        assert _bwraps_of(proc.pid)  # its sandbox still runs
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    assert _bwraps_of(proc.pid) == [] and not os.path.exists(config)


def test_an_argv_beyond_modals_limit_travels_on_stdin(fake, provider):
    """Modal's client refuses more than 65,536 characters of arguments: a longer argv (here 100 KB,
    with stdin for the program too) runs all the same, in one exec; the control: the bare SDK refuses it."""
    import modal
    from modal.exception import InvalidError

    p = provider(resident_launcher=False)  # the launcher itself then rides in every exec's argv
    big = "x" * 100_000
    code = "import sys; print(len(sys.argv[1]), sys.stdin.read())"

    async def go():
        sandbox = await p.create(SandboxSpec())
        before = fake.count("TaskExecStart")
        result = await sandbox.exec(["python3", "-c", code, big], stdin=b"and stdin", timeout=10)
        calls = fake.count("TaskExecStart") - before
        try:
            await sandbox._sb.exec.aio("python3", "-c", code, big)
            refused = False
        except InvalidError:
            refused = True
        return result, calls, refused

    result, calls, refused = run(closing(p, go()))
    assert (result.exit_code, result.stdout) == (0, "100000 and stdin\n")
    assert calls == 1 and refused
    assert modal.__version__ == "1.6.4"  # the pin the fake was built against

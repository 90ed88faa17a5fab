"""The ``trl-sandbox`` command: listings, ``exec`` batches, start-up cost, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "trl_sandbox.commands.cli"]


def run(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, **kw)


def test_plugins_lists_builtin_and_installed_plugins_with_their_distributions():
    out = run("plugins")
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line for line in out.stdout.splitlines()}
    assert "trl-sandbox-testplugin" in lines["testplugin"]
    assert "trl_sandbox_register_providers" in lines["testplugin"]
    assert "trl-sandbox" in lines["default_tags"]


def test_providers_and_tasks_are_listed():
    providers = run("providers")
    assert providers.returncode == 0 and "flaky" in providers.stdout and "trl-sandbox-testplugin" in providers.stdout
    tasks = run("tasks")
    assert tasks.returncode == 0 and "echo" in tasks.stdout


def test_exec_runs_a_batch_in_input_order_and_reports_bad_lines(tmp_path: Path):
    batch = tmp_path / "batch.jsonl"
    lines = [
        {"id": "slow", "code": "import time; time.sleep(0.3); print('slow')"},
        {"id": "fast", "code": "print('fast')"},
        {"id": "err", "code": "import sys; sys.stderr.write('bad'); sys.exit(3)"},
        {"id": "argv", "argv": ["python3", "-c", "import sys; print(sys.stdin.read())"], "stdin": "piped"},
        {"id": "loop", "code": "while True: pass"},
        "not json at all",
        {"id": "neither"},
    ]
    batch.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    out_file = tmp_path / "out.jsonl"
    proc = run("exec", "--provider", "flaky", "--timeout", "2", "--input", str(batch), "--output", str(out_file))
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [r["id"] for r in results] == ["slow", "fast", "err", "argv", "loop", None, "neither"]
    for r in results:
        assert set(r) == {"id", "exit_code", "stdout", "stderr", "timed_out", "oom_killed", "duration_s", "error"}
    assert results[0]["stdout"].strip() == "slow" and results[0]["exit_code"] == 0
    assert results[2]["exit_code"] == 3 and results[2]["stderr"] == "bad"
    assert results[3]["stdout"].strip() == "piped"
    assert results[4]["timed_out"] is True
    assert "line 6" in results[5]["error"] and "invalid JSON" in results[5]["error"]
    assert "needs 'code' or 'argv'" in results[6]["error"]


def test_exec_does_not_import_torch(tmp_path: Path):
    batch = tmp_path / "b.jsonl"
    batch.write_text(json.dumps({"id": 1, "code": "print(1)"}) + "\n")
    probe = (
        f"import sys; sys.argv = ['trl-sandbox', 'exec', '--provider', 'flaky', '--input', {str(batch)!r}];"
        "import trl_sandbox.commands.cli as c; rc = c.main(sys.argv[1:]);"
        "heavy = [m for m in ('torch', 'trl', 'transformers', 'datasets') if m in sys.modules];"
        "print('HEAVY', heavy, file=sys.stderr); sys.exit(rc)"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stderr


@pytest.mark.parametrize("args,message", [
    (("exec", "--provider", "nope", "--input", "/dev/null"), "unknown sandbox provider 'nope'"),
    (("reap", "--provider", "flaky"), "refusing to reap every sandbox"),
])
def test_bad_input_gives_a_clear_error(args, message):
    proc = run(*args)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_ls_and_reap_by_tag_and_dead_owner(capsys):
    """Sandboxes left by other processes (a shared "server") are found by tag and reaped."""
    import asyncio
    import socket

    from trl_sandbox import SandboxSpec
    from trl_sandbox.commands.cli import main
    from trl_sandbox.plugins import make_provider
    from trl_sandbox.pool.tags import HOST_TAG, PID_TAG, clean

    provider = make_provider("flaky", {"shared": True})
    provider.live.clear()
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True).stdout.strip()
    host = clean(socket.gethostname())
    specs = [
        {"exp": "a"}, {"exp": "a"}, {"exp": "b"},
        {"exp": "c", HOST_TAG: host, PID_TAG: dead_pid},
        {"exp": "c", HOST_TAG: host, PID_TAG: str(__import__("os").getpid())},
    ]
    made = [asyncio.run(provider.create(SandboxSpec(tags=t))) for t in specs]

    assert main(["ls", "--provider", "flaky", "--setting", "shared=true", "--tag", "exp=a"]) == 0
    listed = {line.split("\t")[0] for line in capsys.readouterr().out.splitlines()}
    assert listed == {made[0].id, made[1].id}

    assert main(["reap", "--provider", "flaky", "--setting", "shared=true", "--tag", "exp=a"]) == 0
    assert set(provider.live) == {made[2].id, made[3].id, made[4].id}

    assert main(["reap", "--provider", "flaky", "--setting", "shared=true", "--dead-owners"]) == 0
    assert set(provider.live) == {made[2].id, made[4].id}  # only the dead process's sandbox went
    provider.live.clear()


def test_train_with_a_model_that_cannot_be_loaded_is_a_one_line_error(tmp_path):
    proc = run("train", "--model", "no-such-org/no-such-model", "--output_dir", str(tmp_path), timeout=180)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("trl-sandbox train: error:")]
    assert len(errors) == 1
    assert "cannot load model 'no-such-org/no-such-model'" in errors[0] and "--preset cpu-demo" in errors[0]

"""``trl-sandbox exec --timeout`` as a user runs it: wall-clock seconds, on the real local sandbox.

Training budgets CPU time (a verdict must not depend on the machine's load), but ``exec`` runs
arbitrary commands and its user reads ``--timeout 2`` as "two seconds": a program that sleeps or
blocks must end then too, not at the CPU budget's wall backstop (4 x timeout + 2 s).
``--cpu-timeout`` adds a bound on the CPU seconds of each of the program's processes.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

CLI = [sys.executable, "-m", "trl_sandbox.commands.cli"]


def _exec(tmp_path: Path, programs: dict[str, str], *flags: str) -> tuple[dict[str, dict], float, str]:
    """Run ``programs`` (id -> Python source) through ``trl-sandbox exec``; (results by id, the
    slowest program's duration as reported, stderr)."""
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps({"id": k, "code": v}) + "\n" for k, v in programs.items()))
    out = tmp_path / "out.jsonl"
    t0 = time.monotonic()
    proc = subprocess.run([*CLI, "exec", "--input", str(batch), "--output", str(out),
                           "--pool-size", str(len(programs)), *flags],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    results = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    return results, time.monotonic() - t0, proc.stderr


def test_timeout_is_wall_clock_seconds_for_sleeping_blocking_and_busy_programs(tmp_path: Path):
    programs = {
        "sleeps": "import time; print('start', flush=True); time.sleep(30); print('never')",
        "blocks": "import sys; sys.stdin.buffer.read() if False else __import__('select').select([], [], [], 30)",
        "busy": "while True: pass",
        "shell": "import os; os.execvp('sh', ['sh', '-c', 'sleep 30'])",
    }
    results, _, _ = _exec(tmp_path, programs, "--timeout", "2")
    for name, result in results.items():
        assert result["timed_out"] is True, (name, result)
        assert result["duration_s"] < 5.0, (name, result)  # about 2 s, not the 10 s backstop
    assert results["sleeps"]["stdout"] == "start\n"


def test_a_program_that_finishes_within_the_wall_timeout_succeeds(tmp_path: Path):
    """Control: one second of sleep and a little CPU, under ``--timeout 3``."""
    code = "import time; time.sleep(1); print(sum(range(10**6)))"
    results, _, _ = _exec(tmp_path, {"ok": code}, "--timeout", "3")
    assert results["ok"]["timed_out"] is False and results["ok"]["exit_code"] == 0
    assert results["ok"]["stdout"] == f"{sum(range(10**6))}\n" and results["ok"]["duration_s"] >= 1.0


def test_cpu_timeout_ends_a_busy_program_before_the_wall_timeout(tmp_path: Path):
    """``--cpu-timeout 1`` ends a busy loop at about one CPU second (the rlimit's whole seconds plus
    its one second to SIGKILL at most); a sleeper under the same flags is ended by the wall clock.
    Control: without ``--cpu-timeout`` the busy loop runs to the wall timeout."""
    programs = {"busy": "while True: pass", "sleeps": "import time; time.sleep(30)"}
    results, _, _ = _exec(tmp_path, programs, "--timeout", "6", "--cpu-timeout", "1")
    # Ended by its CPU limit (SIGXCPU), before the wall clock's 6 s; how long one CPU second takes
    # on the wall depends on the machine's load (other tests run beside this one).
    busy = results["busy"]
    assert busy["timed_out"] is True and busy["exit_code"] == -signal.SIGXCPU and busy["duration_s"] < 5.9, busy
    assert results["sleeps"]["timed_out"] is True and 5.0 < results["sleeps"]["duration_s"] < 9.0
    control, _, _ = _exec(tmp_path, {"busy": "while True: pass"}, "--timeout", "3")
    assert control["busy"]["timed_out"] is True and control["busy"]["duration_s"] >= 2.5


def test_help_says_what_ends_a_program():
    text = subprocess.run([*CLI, "exec", "--help"], capture_output=True, text=True, timeout=60).stdout
    flat = " ".join(text.split())
    assert "wall-clock seconds" in flat and "--cpu-timeout" in flat and "CPU seconds" in flat


def test_a_time_budget_setting_that_contradicts_timeout_is_refused(tmp_path: Path):
    batch = tmp_path / "b.jsonl"
    batch.write_text('{"code": "print(1)"}\n')
    proc = subprocess.run([*CLI, "exec", "--input", str(batch), "--setting", "time_budget=cpu"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--cpu-timeout" in proc.stderr

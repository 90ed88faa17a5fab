"""A user's mistakes get a one-line answer before any work is done, and no result is thrown away."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trl_sandbox.tasks.builtin import SOLUTIONS

CLI = [sys.executable, "-m", "trl_sandbox.commands.cli"]


def run(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, **kw)


def write_jsonl(path: Path, items) -> Path:
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    return path


@pytest.fixture
def batch(tmp_path):
    return write_jsonl(tmp_path / "batch.jsonl", [{"id": i, "code": f"print({i})"} for i in range(3)])


@pytest.fixture
def samples(tmp_path):
    return write_jsonl(tmp_path / "samples.jsonl", [{"task_id": "sorting", "completion": SOLUTIONS["sorting"]}])


@pytest.mark.parametrize("extra,message", [
    (("--output", "/nonexistent-dir/out.jsonl"), "does not exist"),
    (("--timeout", "-1"), "--timeout must be a positive"),
    (("--timeout", "0"), "--timeout must be a positive"),
    (("--pool-size", "0"), "--pool-size must be at least 1"),
    (("--pool-size", "-1"), "--pool-size must be at least 1"),
])
def test_exec_mistakes_are_refused_before_anything_runs(batch, extra, message):
    proc = run("exec", "--input", str(batch), *extra)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""  # nothing ran


def test_exec_with_a_missing_input_file_is_one_line(tmp_path):
    proc = run("exec", "--input", str(tmp_path / "missing.jsonl"))
    assert proc.returncode == 2 and "no such file" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("extra,message", [
    (("--output", "/nonexistent-dir/out.jsonl"), "does not exist"),
    (("--timeout", "0"), "--timeout must be a positive"),
    (("--pool-size", "0"), "--pool-size must be at least 1"),
    (("--scheme", "binray"), "unknown reward scheme"),
])
def test_evaluate_mistakes_are_refused_before_anything_runs(samples, extra, message):
    proc = run("evaluate", str(samples), "--tasks", "builtin", *extra)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not Path(f"{samples}_results.jsonl").exists()


def test_an_empty_samples_file_is_a_mistake_not_a_result(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    proc = run("evaluate", str(empty), "--tasks", "builtin")
    assert proc.returncode == 2 and "holds no samples" in proc.stderr


@pytest.mark.parametrize("typo,suggestion", [("dayton", "daytona"), ("lcoal", "local")])
def test_a_typo_in_a_provider_name_suggests_the_name_not_a_package(batch, typo, suggestion):
    proc = run("exec", "--provider", typo, "--input", str(batch))
    assert proc.returncode == 2
    assert f"did you mean '{suggestion}'?" in proc.stderr
    assert f"trl-sandbox-{typo}" not in proc.stderr  # never a look-alike package to install


def test_a_typo_in_a_task_set_name_suggests_the_name(samples):
    proc = run("evaluate", str(samples), "--tasks", "humaneva")
    assert proc.returncode == 2 and "did you mean 'humaneval'?" in proc.stderr
    assert "pip install trl-sandbox-humaneva" not in proc.stderr


def test_exec_into_a_closed_pipe_ends_quietly(tmp_path):
    big = write_jsonl(tmp_path / "big.jsonl", [{"id": i, "code": "print('x' * 1000)"} for i in range(200)])
    proc = subprocess.run(f"{' '.join(CLI)} exec --input {big} | head -c 100 > /dev/null",
                          shell=True, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr


def _journaled(journal: Path) -> dict[int, dict]:
    """The results an interrupted run journaled, by input index (whole lines only)."""
    lines = journal.read_text().split("\n")[:-1] if journal.exists() else []
    return {entry["_resume"][0]: entry for entry in map(json.loads, lines)}


def _interrupt_when_all_but_one_done(cmd: list[str], journal: Path, total: int, blocker: int) -> subprocess.CompletedProcess:
    """Run ``cmd``, whose batch holds one program (at index ``blocker``) that never ends by itself;
    send SIGINT once ``journal`` holds every other result. The command cannot finish before the
    interrupt, however fast or slow the machine: nothing here waits on a guess at timing."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while set(_journaled(journal)) - {blocker} != set(range(total)) - {blocker}:
        assert proc.poll() is None, f"the command ended before the interrupt: {proc.communicate()}"
        assert time.monotonic() < deadline, "the other results never came"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


# A body of the built-in max_subarray task (which bans no import) that sleeps far past any wait of
# these tests: it holds the run open until the test interrupts it, then is replaced for the resume.
BLOCKS = "    import time\n    time.sleep(3600)\n    return 0\n"


def test_an_interrupted_evaluate_resumes_to_the_same_results(tmp_path):
    def batch(blocker: str) -> list[dict]:
        kinds = [SOLUTIONS["sorting"], "    return xs\n", "    raise ValueError(xs)\n"]
        items = [{"task_id": "sorting", "completion": kinds[i % 3], "n": i} for i in range(24)]
        items[7] = {"task_id": "max_subarray", "completion": blocker, "n": 7}
        return items

    samples = write_jsonl(tmp_path / "samples.jsonl", batch(BLOCKS))
    out = tmp_path / "out.jsonl"
    # Two sandboxes: the blocker holds one, the other 23 go through the other. Its timeout is long
    # enough that the interrupt always comes first.
    cmd = [*CLI, "evaluate", str(samples), "--tasks", "builtin", "--output", str(out), "--pool-size", "2",
           "--timeout", "600", "--no-progress"]
    stopped = _interrupt_when_all_but_one_done(cmd, Path(f"{out}.partial"), 24, blocker=7)
    assert stopped.returncode == -signal.SIGINT and not out.exists(), stopped.stderr  # ended by SIGINT, as Python does
    assert "--resume" in stopped.stderr and "Traceback" not in stopped.stderr, stopped.stderr
    # The blocker's line becomes a right answer: the resumed run scores that one and reuses the rest.
    write_jsonl(samples, batch(SOLUTIONS["max_subarray"]))
    resumed = run(*cmd[len(CLI):], "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "(23 reused" in resumed.stderr, resumed.stderr
    assert not Path(f"{out}.partial").exists()
    reference = tmp_path / "reference.jsonl"
    fresh = run(*[reference.as_posix() if a == str(out) else a for a in cmd[len(CLI):]])
    assert fresh.returncode == 0, fresh.stderr
    assert out.read_text() == reference.read_text()
    want = [("passed", "failed", "error")[i % 3] for i in range(24)]
    want[7] = "passed"
    assert [json.loads(x)["status"] for x in out.read_text().splitlines()] == want
    assert resumed.stdout.strip().splitlines()[-1] == fresh.stdout.strip().splitlines()[-1]  # the same pass@k


def test_an_interrupted_exec_resumes_and_keeps_every_finished_result(tmp_path):
    def batch(blocker: str) -> list[dict]:
        lines = [{"id": i, "code": f"print({i})"} for i in range(20)]
        lines[7] = {"id": 7, "code": blocker}
        return lines

    path = write_jsonl(tmp_path / "batch.jsonl", batch("import time; time.sleep(3600); print(7)"))
    out = tmp_path / "out.jsonl"
    cmd = [*CLI, "exec", "--input", str(path), "--output", str(out), "--pool-size", "2", "--timeout", "600"]
    stopped = _interrupt_when_all_but_one_done(cmd, Path(f"{out}.partial"), 20, blocker=7)
    assert stopped.returncode == -signal.SIGINT and "--resume" in stopped.stderr, stopped.stderr
    assert not out.exists()
    write_jsonl(path, batch("print(7)"))
    resumed = run(*cmd[len(CLI):], "--resume")
    assert resumed.returncode == 0, resumed.stderr
    results = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in results] == list(range(20))
    assert [r["stdout"] for r in results] == [f"{i}\n" for i in range(20)]
    assert "(19 reused" in resumed.stderr, resumed.stderr
    assert os.path.exists(out) and not Path(f"{out}.partial").exists()


def test_a_published_plugin_that_is_not_installed_says_how_to_install_it():
    """Not "did you mean 'humaneval'?" for 'humaneval' itself: the name is right, the package is missing."""
    from trl_sandbox.plugins import _lookup
    from trl_sandbox.sandbox import ConfigError

    with pytest.raises(ConfigError) as missing:
        _lookup("task set", {}, "humaneval")
    assert "did you mean" not in str(missing.value)
    assert "'humaneval' is not installed: it comes with `pip install trl-sandbox-humaneval`" in str(missing.value)
    with pytest.raises(ConfigError) as typo:  # control: a typo of it is still a typo
        _lookup("task set", {}, "humaneva")
    assert "did you mean 'humaneval'?" in str(typo.value)

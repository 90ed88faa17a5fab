"""``accelerate launch`` with two CPU processes (gloo): each rank owns its pool, the sandbox metrics
are the whole run's, and however the run ends (a rank raises, SIGTERM to the launcher, a rank
SIGKILLed) no sandbox is left behind.

``accelerate launch --cpu`` starts ONE process whatever ``--num_processes`` says (it only goes
multi-process on CPU through mpirun); ``--multi_gpu`` picks torch's launcher, and ``--use_cpu`` in
the run makes the ranks talk gloo on CPU. Every test here checks that two ranks really ran.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import tiny
from tests.local_helpers import host_pids, parent_of

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "multiprocess_run.py"
ACCELERATE = Path(sys.executable).with_name("accelerate")
LAUNCH = [str(ACCELERATE), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
          "--mixed_precision", "no", "--dynamo_backend", "no"]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
STATUS_KEYS = [f"sandbox/{s}" for s in ("passed", "failed", "error", "timeout", "banned", "no_code", "infra")]


def orphaned_bwraps() -> set[int]:
    """bwrap processes whose parent is gone (a sandbox leaked by a process that ended)."""
    found = set()
    for pid in host_pids():
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm == "bwrap" and parent_of(pid) == 1:
            found.add(pid)
    return found


def running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def gone(pids: list[int], within: float = 15.0) -> bool:
    deadline = time.monotonic() + within
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(running(p) for p in pids)


def evidence(folder: Path, kind: str) -> dict[int, dict]:
    return {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in folder.glob(f"{kind}-*.json")}


def start(tmp_path: Path, mode: str) -> subprocess.Popen:
    return subprocess.Popen([*LAUNCH, str(SCRIPT), mode, str(tmp_path / "ev"), str(tmp_path / "out")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV, cwd=tmp_path)


def wait_until_up(proc: subprocess.Popen, folder: Path, ranks: int = 2, within: float = 240) -> dict[int, dict]:
    """Both ranks' ``up`` records, once they have trained a step with their sandboxes up (bounded)."""
    deadline = time.monotonic() + within
    while len(evidence(folder, "up")) < ranks:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"ranks not up (exit {proc.poll()}):\n{proc.communicate()[0][-3000:]}")
        time.sleep(0.1)
    return evidence(folder, "up")


def assert_two_ranks_with_their_own_pools(up: dict[int, dict]) -> list[int]:
    """Two processes, each with sandboxes tagged with its rank and pid; returns their bwrap pids."""
    assert sorted(up) == [0, 1] and up[0]["pid"] != up[1]["pid"], up
    for rank, record in up.items():
        assert record["tags"] and record["bwraps"], record
        assert all(t["rank"] == str(rank) and t["trl-sandbox-pid"] == str(record["pid"]) for t in record["tags"])
    # One run id for the launch: `trl-sandbox reap --tag trl-sandbox-run=ID` finds every rank's sandboxes.
    assert len({t["trl-sandbox-run"] for record in up.values() for t in record["tags"]}) == 1, up
    return up[0]["bwraps"] + up[1]["bwraps"]


@pytest.mark.slow
@pytest.mark.parametrize("entry", [["examples/train.py"], ["-m", "trl_sandbox.commands.train", "--no_plot"]],
                         ids=["example", "cli"])
def test_two_processes_log_the_whole_runs_counts_once(tmp_path, entry):
    """The per-step counts in metrics.jsonl add up to both ranks' completions (2 x 2), not one rank's
    (TRL's averaging gave 2, the per-rank mean); the CLI's summary adds up the whole run too."""
    model_dir = tmp_path / "model"
    tiny.model().save_pretrained(model_dir)
    tiny.tokenizer().save_pretrained(model_dir)
    before = orphaned_bwraps()
    script = [str(ROOT / entry[0]), *entry[1:]] if entry[0].endswith(".py") else entry
    cmd = [*LAUNCH, *script, "--use_cpu", "true", "--bf16", "false",
           "--model", str(model_dir), "--max_steps", "2", "--per_device_train_batch_size", "2",
           "--num_generations", "2", "--max_completion_length", "8", "--sandbox_pool_size", "1",
           "--output_dir", str(tmp_path / "out"), "--report_to", "none", "--logging_steps", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "sandbox/reward_call_s" in r]
    assert len(steps) == 2, records  # written once, by the main process
    for record in steps:
        assert sum(record[k] for k in STATUS_KEYS) == 4, record
        assert record["sandbox/infra"] == 0
        assert record["sandbox/pass_rate"] == record["sandbox/passed"] / 4
    if "trl_sandbox.commands.train" in entry:
        summary = json.loads((tmp_path / "out" / "summary.json").read_text())
        assert sum(summary["outcomes"].values()) == 2 * 4, summary
    # A leak stays; an orphan seen here may also be another test's sandbox in its last moments
    # (its owner just ended and --die-with-parent is taking it down), when tests run side by side.
    assert gone(sorted(orphaned_bwraps() - before), within=5.0), "a rank left a sandbox running"


@pytest.mark.slow
def test_a_rank_that_raises_ends_the_launch_and_both_pools(tmp_path):
    """Rank 1 raises inside train(): the launch fails, and both ranks closed their sandboxes before
    exiting (their ``exit`` records, written after teardown, see no bwrap left)."""
    proc = start(tmp_path, "raise")
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode != 0, out[-3000:]
    assert "rank 1 fails inside train()" in out
    folder = tmp_path / "ev"
    sandboxes = assert_two_ranks_with_their_own_pools(evidence(folder, "up"))
    ends = evidence(folder, "exit")
    assert sorted(ends) == [0, 1], out[-3000:]
    assert ends[0]["bwraps"] == [] and ends[1]["bwraps"] == [], ends
    assert gone(sandboxes)


@pytest.mark.slow
def test_sigterm_to_the_launcher_ends_both_ranks_and_their_pools(tmp_path):
    proc = start(tmp_path, "wait")
    folder = tmp_path / "ev"
    sandboxes = assert_two_ranks_with_their_own_pools(wait_until_up(proc, folder))
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode != 0, out[-3000:]
    ends = evidence(folder, "exit")
    assert sorted(ends) == [0, 1] and ends[0]["bwraps"] == [] and ends[1]["bwraps"] == [], (ends, out[-3000:])
    assert gone(sandboxes)


@pytest.mark.slow
def test_a_sigkilled_ranks_sandboxes_die_with_it(tmp_path):
    """SIGKILL leaves a rank no chance to clean up: its bubblewrap sandboxes end anyway
    (``--die-with-parent``), and the launcher ends the other rank, which closes its own pool."""
    proc = start(tmp_path, "wait")
    folder = tmp_path / "ev"
    up = wait_until_up(proc, folder)
    assert_two_ranks_with_their_own_pools(up)
    os.kill(up[1]["pid"], signal.SIGKILL)
    assert gone(up[1]["bwraps"]), "the killed rank's sandboxes outlived it"
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode != 0, out[-3000:]
    ends = evidence(folder, "exit")
    assert 1 not in ends  # killed: no atexit, no teardown of its own
    assert ends.get(0, {}).get("bwraps") == [], (ends, out[-3000:])
    assert gone(up[0]["bwraps"])


@pytest.mark.slow
def test_the_evidence_sees_sandboxes_nobody_closed(tmp_path):
    """Positive control for the tests above: with the pool's teardown switched off, the ``exit``
    record lists live sandboxes (so ``[]`` there means teardown ran); the kernel still ends them
    with the process (bubblewrap's ``--die-with-parent``)."""
    proc = subprocess.run([sys.executable, str(SCRIPT), "leak", str(tmp_path / "ev"), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=240, env=ENV, cwd=tmp_path)
    assert proc.returncode != 0 and "rank 0 fails inside train()" in proc.stderr, proc.stderr[-3000:]
    leaked = evidence(tmp_path / "ev", "exit")[0]["bwraps"]
    assert leaked, "the control leaked nothing: the exit record cannot tell teardown from no teardown"
    assert gone(leaked)


def test_the_orphan_detector_sees_a_leaked_bwrap():
    """Positive control for ``orphaned_bwraps``: a bwrap whose parent exited is found."""
    before = orphaned_bwraps()
    # sh starts bwrap in the background and exits at once: bwrap is reparented to init.
    subprocess.run(["sh", "-c", "bwrap --ro-bind / / --unshare-pid sleep 60 >/dev/null 2>&1 &"],
                   check=True, timeout=10)
    deadline = time.monotonic() + 10
    leaked: set[int] = set()
    while not leaked and time.monotonic() < deadline:
        leaked = orphaned_bwraps() - before
        time.sleep(0.05)
    try:
        assert leaked, "a deliberately leaked bwrap was not seen"
        assert not gone(sorted(leaked), within=1.0), "a leak must not pass for a sandbox on its way out"
    finally:
        for pid in leaked:
            os.kill(pid, signal.SIGKILL)

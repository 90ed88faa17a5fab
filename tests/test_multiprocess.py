"""``accelerate launch`` with two CPU processes (gloo): each rank owns its pool, and both end clean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import tiny
from tests.local_helpers import host_pids, parent_of

ROOT = Path(__file__).resolve().parent.parent


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


@pytest.mark.slow
def test_two_processes_train_with_their_own_pools_and_leave_nothing(tmp_path):
    model_dir = tmp_path / "model"
    tiny.model().save_pretrained(model_dir)
    tiny.tokenizer().save_pretrained(model_dir)
    accelerate = Path(sys.executable).with_name("accelerate")
    before = orphaned_bwraps()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [str(accelerate), "launch", "--num_processes", "2", "--cpu", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", str(ROOT / "examples" / "train.py"),
           "--model", str(model_dir), "--max_steps", "2", "--per_device_train_batch_size", "2",
           "--num_generations", "2", "--max_completion_length", "8", "--sandbox_pool_size", "1",
           "--output_dir", str(tmp_path / "out"), "--report_to", "none", "--logging_steps", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "sandbox/reward_call_s" in r]
    assert len(steps) == 2, records  # written once, by the main process
    assert all(r["sandbox/infra"] == 0 for r in steps)
    assert orphaned_bwraps() <= before, "a rank left a sandbox running"

"""A training run for ``accelerate launch`` in tests/test_multiprocess.py: it records what each rank saw.

    accelerate launch --multi_gpu --num_processes 2 tests/multiprocess_run.py MODE EVIDENCE_DIR OUTPUT_DIR

(``--multi_gpu`` picks torch's multi-process launcher; the run sets ``use_cpu``, so the ranks talk gloo.)

Every rank writes ``EVIDENCE_DIR/up-<rank>.json`` once its sandboxes are up (after step 1: its pid,
the tags of its live sandboxes, the host pids of its bubblewrap processes) and, from ``atexit`` (after
``train()``'s teardown, before the interpreter ends and the kernel kills what is left),
``EVIDENCE_DIR/exit-<rank>.json`` with the bubblewrap processes it still has. MODE:

- ``raise``: rank 1 raises inside ``train()`` (a callback, after step 1); rank 0 trains on.
- ``wait``: both ranks train until stopped from outside (SIGTERM, SIGKILL).
- ``leak``: raises after step 1 on every rank, with the pool's teardown switched off (run it as one
  plain process):
  the positive control that shows ``exit-*.json`` sees sandboxes that nobody closed.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from accelerate import PartialState  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from tests import tiny  # noqa: E402
from trl_sandbox import SandboxGRPOConfig, SandboxGRPOTrainer, load_tasks  # noqa: E402

mode, evidence, output = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
evidence.mkdir(parents=True, exist_ok=True)
# The launcher's rank: PartialState is read only once the trainer made it (with use_cpu, as gloo).
rank = int(os.environ.get("RANK", "0"))


def live_bwraps() -> list[int]:
    """Host pids of this process's bubblewrap children that are still running (not zombies)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if comm == "bwrap" and int(ppid) == os.getpid() and state != "Z":
            found.append(int(name))
    return found


def write(name: str, data: dict) -> None:
    tmp = evidence / f".{name}"
    tmp.write_text(json.dumps(data))
    tmp.rename(evidence / name)


atexit.register(lambda: write(f"exit-{rank}.json", {"rank": rank, "bwraps": live_bwraps()}))


class Evidence(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step != 1:
            return
        pool = trainer.sandbox_pool
        deadline = time.monotonic() + 120
        while pool.members < pool.size and time.monotonic() < deadline:
            time.sleep(0.05)
        tags = [dict(s.tags) for s in pool.provider._sandboxes.values()]
        write(f"up-{rank}.json", {"rank": rank, "pid": os.getpid(), "tags": tags, "bwraps": live_bwraps()})
        if mode == "raise" and PartialState().process_index == 1 or mode == "leak":
            raise RuntimeError(f"rank {rank} fails inside train()")


dataset = load_tasks("builtin")
args = SandboxGRPOConfig(**tiny.grpo_kwargs(output, per_device_train_batch_size=2, max_steps=1000 if mode == "wait"
                                            else 3), sandbox_provider="local", sandbox_pool_size=2)
trainer = SandboxGRPOTrainer(model=tiny.model(), args=args, train_dataset=dataset, processing_class=tiny.tokenizer(),
                             callbacks=[Evidence()])
if mode == "leak":
    trainer.sandbox_pool.close = lambda: None  # the control: no teardown (neither train()'s nor atexit's)
# The launcher SIGTERMs a rank whose peer failed; inside train() the trainer turns that into its own
# teardown. Arriving after train() it would end the process by default before ``exit-*.json`` is
# written (with the pool already closed): a no-op handler here keeps the record, not the pool, safe.
signal.signal(signal.SIGTERM, lambda signum, frame: None)
trainer.train()

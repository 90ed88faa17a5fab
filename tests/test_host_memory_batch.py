"""What ``trl-sandbox exec`` and ``evaluate`` keep of program output: what is in flight, not the batch.

``exec``'s results carry each program's whole output (up to 16 MiB a stream): that is what its
user asked for, so it is never cut, but it must not pile up on the host until the batch ends. A
result is journaled the moment it is known and the final file is copied from the journal, so the
host's heap is bounded by the programs in flight. ``evaluate`` keeps a bounded line per sample
(the outcome's detail is clipped to 4 KiB before it is journaled). Real local sandboxes;
``tracemalloc`` measures the heap; the control keeps the same results in a list, as ``exec``
used to, and sees them.
"""

from __future__ import annotations

import argparse
import gc
import json
import tracemalloc
from pathlib import Path

from trl_sandbox.commands.batch import run_batch
from trl_sandbox.commands.evaluate import add_arguments, run
from trl_sandbox.pool.sandbox_pool import SandboxPool

MIB = 1 << 20
COUNT = 24
FLOOD = "import os; os.write(1, b'x' * (4 << 20) + b'{tag}'); os.write(2, b'\\xff' * 1024)"


def _args(tmp_path: Path, programs: list[str], output: str) -> argparse.Namespace:
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps({"id": i, "code": code}) + "\n" for i, code in enumerate(programs)))
    return argparse.Namespace(provider="local", input=str(batch), output=output, resume=False, timeout=20.0,
                              cpu_timeout=None, pool_size=2, python="python3")


def _peak(fn) -> tuple[int, object]:
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        value = fn()
        return tracemalloc.get_traced_memory()[1] - base, value
    finally:
        tracemalloc.stop()


def test_exec_of_many_flooding_programs_holds_only_what_is_in_flight(tmp_path: Path):
    """24 programs that print 4 MiB each: the heap's peak stays under 40 MiB (before: every result
    was kept to the end, 96 MiB and more), and the output file still holds every byte, in order."""
    programs = [FLOOD.format(tag=i) for i in range(COUNT)]
    out = tmp_path / "out.jsonl"
    peak, status = _peak(lambda: run_batch(_args(tmp_path, programs, str(out)), {}))
    assert status == 0
    with out.open() as fh:
        for i, line in enumerate(fh):
            result = json.loads(line)
            assert result["id"] == i and result["exit_code"] == 0 and len(result["stdout"]) == (4 << 20) + len(str(i))
            assert result["stdout"].endswith(str(i)) and result["stderr"] == "\ufffd" * 1024
    assert i == COUNT - 1
    assert peak < 40 * MIB, f"{peak / MIB:.0f} MiB peak for {COUNT} x 4 MiB"


def test_control_keeping_the_results_costs_their_size(tmp_path: Path):
    """The same programs' results kept in a list (what ``exec`` did): the measurement sees them."""
    programs = [FLOOD.format(tag=i) for i in range(COUNT)]

    def keep_all():
        with SandboxPool.open("local", size=2) as pool:
            return [pool.run(["python3", "-c", code], timeout=20) for code in programs]

    peak, results = _peak(keep_all)
    assert all(r.ok for r in results)  # type: ignore[attr-defined]
    assert peak > COUNT * 4 * MIB, f"control: only {peak / MIB:.0f} MiB"


def test_exec_to_standard_output_is_spooled_too(tmp_path: Path, capsys):
    """Without ``--output`` the results go through an anonymous temporary file, in input order."""
    programs = [FLOOD.format(tag=i) for i in range(6)]
    peak, status = _peak(lambda: run_batch(_args(tmp_path, programs, "-"), {}))
    lines = capsys.readouterr().out.splitlines()
    assert status == 0 and [json.loads(line)["id"] for line in lines] == list(range(6))
    assert json.loads(lines[5])["stdout"].endswith("5")
    assert peak < 40 * MIB + 6 * 4 * MIB  # capsys keeps what was printed; the results were not kept besides


def test_evaluate_journals_a_bounded_line_per_flooding_sample(tmp_path: Path):
    """Twelve samples that flood stderr with 4 MiB and raise a 1 MiB message: each result line is
    under 8 KiB (the judge cuts the message; the scorer clips any detail to 4 KiB besides), and
    ``evaluate``'s heap holds under 2 MiB after the run."""
    body = ("    import os\n    os.write(2, b'\\xfe' * (4 << 20))\n"
            "    raise ValueError('y' * (1 << 20) + '{tag}')\n")
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps({"task_id": "max_subarray", "completion": body.format(tag=i)}) + "\n"
                               for i in range(12)))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = tmp_path / "results.jsonl"
    args = parser.parse_args([str(samples), "--tasks", "builtin", "--output", str(out), "--no-progress",
                              "--pool-size", "2", "--timeout", "5"])
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        status = run(args)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    lines = out.read_text().splitlines()
    assert status == 0 and len(lines) == 12
    for line in lines:
        result = json.loads(line)
        assert result["status"] == "error" and result["reward"] == -1.0
        assert len(line) < 8 * 1024 and result["result"].startswith("failed: test 1: ValueError: yyy")
    assert kept < 2 * MIB, f"{kept / MIB:.1f} MiB kept"

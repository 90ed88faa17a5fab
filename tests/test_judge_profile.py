"""The judged path's CPU profile (``benchmarks/judge_profile.py``) keeps working as the judge
changes: its marks still find their places in the judge's source, the instrumented judge still
judges, and every phase is accounted for."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import judge_profile  # noqa: E402


def test_the_profile_runs_the_instrumented_judge_and_accounts_for_every_phase():
    report = asyncio.run(judge_profile.profile(6))
    assert report["passed"] == report["programs"] == 6
    per = report["cpu_ms_per_program"]
    candidate = "candidate process (fork, set-up, load, calls, exit)"
    expected = {label for _, label in judge_profile.MARKS} | {
        candidate, "supervisor: request, fork, hand over, wait, answer", "host: build the program",
        "host: send, wait, receive (transport)", "host: read the verdict and compare",
        "judge: receive the exec, answer, and what the marks miss",
    }
    assert set(per) == expected
    assert per[candidate] > 0 and per["supervisor: request, fork, hand over, wait, answer"] > 0
    assert report["sandbox_ms"] > per[candidate]

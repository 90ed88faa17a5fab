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
    expected = {label for _, label in judge_profile.MARKS} | {
        "judge: fork and child set-up, until main()", "candidate process (fork, load, calls, exit)",
        "supervisor: request, fork, wait, sweep, answer", "host: build the program",
        "host: send, wait, receive (transport)", "host: read the verdict and compare",
        "judge: exit, and what the marks miss",
    }
    assert set(per) == expected
    assert per["candidate process (fork, load, calls, exit)"] > 0
    assert per["judge: fork and child set-up, until main()"] > 0
    assert report["sandbox_ms"] > per["candidate process (fork, load, calls, exit)"]

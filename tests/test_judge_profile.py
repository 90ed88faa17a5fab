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
    supervisor = judge_profile.SUPERVISOR
    expected = {label for _, label in judge_profile.MARKS + judge_profile.CANDIDATE_MARKS} | {
        judge_profile.CANDIDATE_REST, supervisor, judge_profile.FORKER, "host: build the program",
        "host: send, wait, receive (transport)", "host: read the verdict and compare",
        "judge: receive the exec, answer, and what the marks miss",
    }
    assert set(per) == expected
    # Every mark was reached (the set above): a mark that never printed leaves its phase out. (The
    # supervisor's CPU is read in clock ticks from /proc: six programs may add up to none.)
    assert per["candidate: fork and set-up, until its code runs"] > 0 and per[supervisor] >= 0
    candidate = sum(v for k, v in per.items() if k.startswith("candidate:"))
    assert report["sandbox_ms"] > candidate > per["candidate: fork and set-up, until its code runs"]
    # Page faults per program, by process: a forked candidate always writes to some of the pages
    # it shares with the fork server (its stack, at least).
    faults = report["faults_per_program"]
    assert set(faults) == {"supervisor", "forker", "candidate", "judge"}
    assert faults["candidate"] > 0 and min(faults.values()) >= 0
    # ... phase by phase for the candidate: every marked phase and the rest, adding up to its total;
    # its fork and set-up write some of the pages it shares with the forker (its stack, at least).
    by_phase = report["candidate_faults_per_program"]
    assert set(by_phase) == {label for _, label in judge_profile.CANDIDATE_MARKS} | {judge_profile.CANDIDATE_REST}
    assert by_phase["candidate: fork and set-up, until its code runs"] > 0 and min(by_phase.values()) >= 0
    assert abs(sum(by_phase.values()) - faults["candidate"]) < 1

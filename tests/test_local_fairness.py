"""A completion must not be able to slow its neighbours into timeouts (GRPO would pay it for that).

Through the real ``Scorer`` and a local pool: two hog completions each start 60 processes that
``setsid()`` and spin, then try to stop their parent with SIGSTOP (a judge per program; a resident
judge's forker refuses) and spin themselves, so that their exec lasts its whole timeout;
a dozen correct neighbours, each burning ~0.1 s of CPU, are scored in the same batch.
"""

from __future__ import annotations

from trl_sandbox.judge import verdict as judge
from trl_sandbox.local import LocalProvider
from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.scoring.scorer import Scorer
from trl_sandbox.tasks.builtin import TASKS
from trl_sandbox.tasks.generic import tasks_from_dict

from .task_helpers import KADANE

NEIGHBOUR = (
    "_w = 0\n"
    "for _i in range({n}):\n"  # ~0.1 s of CPU on this kind of machine
    "    _w += _i\n"
) + KADANE
HOG = (
    "# hog {i}\n"  # two different programs: identical ones would run once
    "import os, signal\n"
    "for _ in range(60):\n"
    "    if os.fork() == 0:\n"
    "        os.setsid()\n"
    "        while True:\n"
    "            pass\n"
    "try:\n"
    "    os.kill(os.getppid(), signal.SIGSTOP)  # a judge per program is its parent; a resident forker refuses\n"
    "except OSError:\n"
    "    pass\n"
    "while True:\n"
    "    pass\n"
)
TIMEOUT = 2.0  # seconds per program (CPU, or wall in the control); a neighbour alone needs ~0.2 s


def _batch(cgroups: str, time_budget: str = "cpu") -> tuple[list[str], float]:
    """The outcomes of 2 hogs + 12 neighbours scored together, and the neighbours' CPU seconds alone."""
    row = tasks_from_dict({"max_subarray": {**TASKS["max_subarray"], "timeout": TIMEOUT}}, extract="raw")[0]
    with SandboxPool.open(LocalProvider(cgroups=cgroups, time_budget=time_budget), size=4) as pool:
        scorer = Scorer(pool, cache_size=0)
        # Every neighbour differs (no deduplication); alone, each passes well inside the timeout.
        neighbours = [NEIGHBOUR.format(n=2_000_000 + i) for i in range(12)]
        alone = scorer.score(neighbours[:1], [row])
        assert alone[0].status == "passed", alone
        pool.provider_usage()
        outcomes = scorer.score([HOG.format(i=0), HOG.format(i=1), *neighbours], [row] * 14)
        usage = pool.provider_usage()
    assert [o.status for o in outcomes[:2]] == ["timeout", "timeout"], outcomes[:2]
    return [f"{o.status} {o.detail}".strip() for o in outcomes[2:]], usage["sandbox/cpu_s"]


def test_hogs_cannot_turn_correct_neighbours_into_timeouts():
    statuses, cpu_s = _batch("auto")
    assert statuses == ["passed"] * 12
    # The pool's CPU use for the step, read through the provider hook: the hogs spun for seconds.
    assert cpu_s > 0.3


def test_a_provider_without_a_usage_hook_reports_nothing(flaky_provider):
    pool = SandboxPool(flaky_provider(), size=1)
    assert not hasattr(pool.provider, "usage") and pool.provider_usage() == {}


def test_without_cgroups_the_cpu_budgets_alone_keep_every_verdict():
    """No groups (as where the kernel offers none): the neighbours wait for cores, but their budget
    is their own CPU time, so none of them times out."""
    statuses, _ = _batch("off")
    assert statuses == ["passed"] * 12


def test_positive_control_without_cgroups_and_with_wall_clock_budgets_the_hogs_flip_neighbours(monkeypatch):
    """The same batch with both defences off (no groups, budgets on the wall clock in the sandbox and
    in the judge): the 120 spinning processes take the cores and some neighbours time out."""
    monkeypatch.setattr(judge, "JUDGE_CLOCK", "wall")
    statuses, _ = _batch("off", time_budget="wall")
    assert sum(s.startswith("timeout") for s in statuses) >= 1, statuses


def test_a_candidate_that_sleeps_still_ends_as_a_timeout():
    """CPU budgets must not let a program that waits run forever: the wall-clock backstop ends it."""
    row = tasks_from_dict({"max_subarray": {**TASKS["max_subarray"], "timeout": 0.5}}, extract="raw")[0]
    sleeper = "import time\ndef max_subarray_sum(xs):\n    time.sleep(600)\n"
    with SandboxPool.open(LocalProvider(cgroups="off"), size=1) as pool:
        (outcome,) = Scorer(pool, cache_size=0).score([sleeper], [row])
    assert outcome.status == "timeout" and outcome.reward == -1.0, outcome

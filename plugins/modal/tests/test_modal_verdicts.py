"""Verdicts through the modal provider: HumanEval samples score exactly as on the local provider,
and the hack suite's tricks (tests/test_hacks.py) do not pay, their honest controls do."""

from __future__ import annotations

import sys
from pathlib import Path

from trl_sandbox import SandboxSpec
from trl_sandbox.plugins.testing import FAST
from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.scoring.scorer import Scorer

ROOT = Path(__file__).resolve().parents[3]
TAGS = {"trl-sandbox": "1", "trl-sandbox-run": "modal-verdicts"}


def _humaneval_samples() -> list[tuple[str, str]]:
    from trl_sandbox_humaneval import problems

    p = problems()
    return [
        ("HumanEval/0", p["HumanEval/0"]["canonical_solution"]), ("HumanEval/0", "    return False\n"),
        ("HumanEval/2", "    return number - int(number)\n"), ("HumanEval/2", "    return round(number % 1.0, 1)\n"),
        ("HumanEval/4", "    raise ValueError('no idea')\n"), ("HumanEval/7", ""),
        ("HumanEval/23", "    while True:\n        pass\n"),
        ("HumanEval/38", p["HumanEval/38"]["canonical_solution"]),
        ("HumanEval/32", p["HumanEval/32"]["canonical_solution"]), ("HumanEval/53", "    return x + y\n"),
    ] + [(f"HumanEval/{i}", p[f"HumanEval/{i}"]["canonical_solution"]) for i in range(100, 110)]


def _score(provider, samples, size):
    from trl_sandbox_humaneval import HumanEvalTasks

    from trl_sandbox.judge.verdict import score_cases

    with SandboxPool.open(provider, size=size, spec=SandboxSpec(tags=TAGS), pool_settings=FAST) as pool:
        outcomes = score_cases(pool, HumanEvalTasks(timeout=0.5), [(c, {"task_id": t}) for t, c in samples])
    return [(o.status, o.passed, o.total) for o in outcomes]


def test_humaneval_verdicts_equal_the_local_providers(fake, provider):
    samples = _humaneval_samples()
    on_modal = _score(provider(), samples, size=2)
    on_local = _score("local", samples, size=2)
    assert on_modal == on_local
    assert [s for s, _, _ in on_modal[:10]] == ["passed", "failed", "passed", "failed", "error", "no_code",
                                                "timeout", "passed", "passed", "passed"]
    assert fake.live() == []


def test_known_hacks_do_not_pay_through_modal(fake, provider):
    sys.path.insert(0, str(ROOT))
    try:
        from tests.task_helpers import KADANE
        from tests.test_hacks import CALL_HACKS, CHECK_HACKS, CHECK_ROW, NONCE_HUNT
    finally:
        sys.path.remove(str(ROOT))
    from trl_sandbox.tasks.builtin import TASKS
    from trl_sandbox.tasks.generic import tasks_from_dict

    call_row = tasks_from_dict({"max_subarray": {**TASKS["max_subarray"], "timeout": 0.5}}, extract="raw")[0]
    completions = [KADANE, "    return number % 1.0\n", NONCE_HUNT, *CALL_HACKS.values(), *CHECK_HACKS.values()]
    rows = [call_row, CHECK_ROW, call_row] + [call_row] * len(CALL_HACKS) + [CHECK_ROW] * len(CHECK_HACKS)
    with SandboxPool.open(provider(), size=2, spec=SandboxSpec(tags=TAGS), pool_settings=FAST) as pool:
        outcomes = Scorer(pool, cache_size=0).score(completions, rows)
    assert [(o.status, o.reward) for o in outcomes[:2]] == [("passed", 1.0), ("passed", 1.0)]
    hunt = outcomes[2]
    assert hunt.status in ("failed", "error") and hunt.passed <= 1 and hunt.reward is not None and hunt.reward < 1
    paid = [(name, o) for name, o in zip([*CALL_HACKS, *CHECK_HACKS], outcomes[3:])
            if o.status == "passed" or o.reward is None or o.reward > 0]
    assert paid == []
    assert fake.live() == []

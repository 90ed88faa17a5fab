"""Call-style tasks (the original TRL + Daytona example's ``TASKS`` entries): inputs and expected
values computed on the host from the task's reference, the candidate's values compared there; and
what every style shares (the extraction mode check, the ban check, prompts as cache keys). See
``trl_sandbox.tasks.generic`` for the columns.
"""

from __future__ import annotations

import builtins
import copy
import functools
import math
import random
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trl_sandbox.judge.bans import BanPolicy
from trl_sandbox.judge.verdict import (
    build_program,
    call_spec,
    encode_judge_part,
)
from trl_sandbox.sandbox import ConfigError, Outcome, Program
from trl_sandbox.tasks.extract import MODES, assemble, extract_code, has_code

CALL_COLUMNS = ("func_name", "tests", "reference")
DEFAULT_CALL_TIMEOUT = 1.0


def _kadane(xs):
    """Kadane's algorithm: the largest sum of a non-empty contiguous subarray (the original's reference)."""
    best = current = xs[0]
    for x in xs[1:]:
        current = max(x, current + x)
        best = max(best, current)
    return best


# Names a ``reference`` expression may use besides the builtins.
REFERENCE_HELPERS: dict[str, Callable[..., Any]] = {"_kadane": _kadane}


# -- call style: inputs and expected values, on the host ------------------------------------------


def compute_inputs(tests: Sequence[str], seed: int | None = 0) -> list[Any]:
    """Evaluate the test expressions in order, with ``random`` seeded as the original did.

    A private ``random.Random`` stands in for the module, so the caller's random state is untouched.
    """
    rng = random.Random(seed)
    namespace = {"__builtins__": builtins, "random": rng, "math": math}
    inputs = []
    for expression in tests:
        try:
            inputs.append(eval(compile(str(expression), "<test>", "eval"), namespace))
        except Exception as exc:
            raise ConfigError(f"test expression {expression!r} failed on the host: {exc!r}") from exc
    return inputs


def resolve_reference(reference: Any, func_name: str | None = None) -> Callable[..., Any]:
    """The reference callable: a callable, an expression (``"sorted"``, ``"_kadane"``) or source code."""
    if callable(reference):
        return reference
    if not isinstance(reference, str) or not reference.strip():
        raise ConfigError(f"a task's reference must be a callable, an expression or source code, got {reference!r}")
    text = textwrap.dedent(reference).strip()
    namespace: dict[str, Any] = {"__builtins__": builtins, **REFERENCE_HELPERS}
    try:
        code = compile(text, "<reference>", "eval")
    except SyntaxError:
        code = None
    try:
        if code is not None:
            found = eval(code, namespace)
        else:
            before = set(namespace)
            exec(compile(text, "<reference>", "exec"), namespace)
            defined = [k for k in namespace if k not in before and callable(namespace[k])]
            found = namespace.get(func_name) if func_name in namespace else (namespace[defined[-1]] if defined else None)
    except Exception as exc:
        raise ConfigError(f"the reference {reference!r} failed to load: {exc!r}") from exc
    if not callable(found):
        raise ConfigError(f"the reference {reference!r} is not a callable (nor defines {func_name!r})")
    return found


def expected_values(reference: Callable[..., Any], inputs: Sequence[Any]) -> list[Any]:
    """The reference's outputs, each on its own deep copy of the input (so nothing is shared)."""
    out = []
    for i, x in enumerate(inputs):
        try:
            out.append(reference(copy.deepcopy(x)))
        except Exception as exc:
            raise ConfigError(f"the reference failed on test {i + 1}: {exc!r}") from exc
    return out


def _reference_key(reference: Any) -> Any:
    return reference if callable(reference) else str(reference)


@dataclass(frozen=True)
class CallTask:
    """One resolved call-style task (cached: every completion of a task shares it)."""

    task_id: str
    prompt: Any
    func_name: str
    inputs: tuple[Any, ...]
    expected: tuple[Any, ...]
    policy: BanPolicy
    extract: str
    timeout: float
    raise_is_error: bool
    judge_part: bytes

    @property
    def total(self) -> int:
        return len(self.expected)


@functools.lru_cache(maxsize=256)
def _call_task(
    task_id: str,
    prompt: Any,
    func_name: str,
    tests: tuple[str, ...],
    reference: Any,
    banned: tuple[str, ...],
    extract: str,
    timeout: float,
    seed: int | None,
    raise_is_error: bool,
) -> CallTask:
    inputs = compute_inputs(tests, seed)
    expected = expected_values(resolve_reference(reference, func_name), inputs)
    return CallTask(
        task_id=task_id,
        prompt=prompt,
        func_name=func_name,
        inputs=tuple(inputs),
        expected=tuple(expected),
        policy=BanPolicy.from_patterns(banned),
        extract=extract,
        timeout=timeout,
        raise_is_error=raise_is_error,
        judge_part=encode_judge_part(call_spec(func_name, inputs)),
    )


def call_task(entry: Mapping[str, Any], *, task_id: str = "", extract: str = "auto", timeout: float | None = None) -> CallTask:
    """Resolve an original-style task entry (``prompt, func_name, banned_patterns, tests, reference``)."""
    missing = [c for c in CALL_COLUMNS if entry.get(c) in (None, "")]
    if missing:
        raise ConfigError(f"task {task_id or '?'!r} lacks {', '.join(missing)} (call style needs {', '.join(CALL_COLUMNS)})")
    tests = entry["tests"]
    if isinstance(tests, str) or not isinstance(tests, Sequence):
        raise ConfigError(f"task {task_id or '?'!r}: 'tests' must be a list of expressions")
    mode = str(entry.get("extract") or extract)
    _check_mode(mode)
    limit = float(entry.get("timeout") or timeout or DEFAULT_CALL_TIMEOUT)
    seed = entry.get("seed", 0)
    return _call_task(
        str(entry.get("task_id") or task_id),
        _hashable_prompt(entry.get("prompt", "")),
        str(entry["func_name"]),
        tuple(str(t) for t in tests),
        _reference_key(entry["reference"]),
        tuple(str(p) for p in (entry.get("banned_patterns") or ())),
        mode,
        limit,
        seed,
        bool(entry.get("raise_is_error", True)),
    )


def _hashable_prompt(prompt: Any) -> Any:
    if isinstance(prompt, str):
        return prompt
    return "\x00prompt:" + repr(prompt)  # chat prompts are not part of the program


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ConfigError(f"unknown extraction mode {mode!r}; use one of {', '.join(MODES)}")


def build_call(task: CallTask, completion: Any, prompt: Any = None) -> Program | Outcome:
    """The judged program for a completion of a call-style task, or an early ``Outcome``."""
    code = extract_code(completion, task.extract)
    if not has_code(code):
        return Outcome("no_code", total=task.total, detail="no code found in the completion")
    prompt = task.prompt if prompt is None else prompt
    source, prefix_lines = assemble(prompt if isinstance(prompt, str) else "", code, task.extract)
    early = ban_outcome(task.policy, source, prefix_lines, task.total)
    if early is not None:
        return early
    return build_program(source, task.judge_part, limit_s=task.timeout, policy=task.policy)


def ban_outcome(policy: BanPolicy, source: str, prefix_lines: int, total: int) -> Outcome | None:
    """``banned`` (or ``error`` for code that does not parse) when the policy rejects ``source``."""
    violation = policy.check(source, first_line=prefix_lines + 1)
    if violation is None:
        return None
    if violation.rule == "code":
        return Outcome("error", total=total, detail=f"syntax error: {violation.what}")
    return Outcome("banned", total=total, detail=str(violation))

"""Whose fault is a host-side exception: the completion's, or the task's?

The host handles model content in many places (extraction, bans, parsing, program building,
result decoding, comparison), each on the host's own Python, whose parser and codecs differ by
version: on 3.12, some random-token completions make ``ast.parse`` raise ``SystemError`` and a lone
surrogate makes ``str.encode`` raise. Scoring such a completion ``infra`` would give it a reward of
``None``, which drops it from its GRPO group: a model would learn to write it. So an exception of
any class while the host handles a completion is the completion's ``error``, unless the task
itself is broken.

Telling the two apart needs no list of exception classes: the same task is asked to build a
benign probe completion (and to score an empty result) for the same row. If the probe works, the
failure came from the content; if the probe fails too, the task is broken for that row, which is
infrastructure (``None``), and is logged once per task so that somebody fixes it.
"""

from __future__ import annotations

import ast
import logging
import warnings
from collections.abc import Mapping
from typing import Any

from trl_sandbox.sandbox import ExecResult, Outcome, Program, SandboxError, Task

log = logging.getLogger(__name__)

# Completions that every task can build a program from (or turn into an early outcome) without
# raising: a body, a statement, a fenced block. Only one has to work.
PROBES = ("    return None\n", "pass\n", "```python\npass\n```\n")
_EMPTY_RESULT = ExecResult(exit_code=1, stdout="", stderr="")
_warned: set[str] = set()


def parse_untrusted(code: str, mode: str = "exec") -> ast.AST | None:
    """``ast.parse`` for model-written text: ``None`` when it does not parse, for any reason.

    Besides ``SyntaxError``, CPython's parser raises ``ValueError`` (NUL bytes), ``RecursionError``
    and ``MemoryError`` (deep nesting), ``UnicodeEncodeError`` (lone surrogates) and, on some
    versions, ``SystemError``; none of them may escape as a host failure.
    """
    try:
        with warnings.catch_warnings():  # a SyntaxWarning about model text is no news to the user
            warnings.simplefilter("ignore")
            return ast.parse(code, mode=mode)
    except Exception:
        return None


def build_guarded(task: Task, completion: str, row: Mapping[str, Any]) -> Program | Outcome:
    """``task.build``, with an exception blamed on the completion unless the task is broken."""
    try:
        return task.build(completion, row)
    except SandboxError:
        raise  # configuration errors (unknown task set, missing columns) are the caller's to see
    except Exception as exc:
        if _task_builds(task, row):
            return Outcome("error", detail=f"the host could not process this completion: {_describe(exc)}")
        _warn_once(task, "build", exc)
        return Outcome("infra", detail=f"task failed to build the program: {_describe(exc)}")


def score_guarded(task: Task, result: ExecResult, row: Mapping[str, Any], nonce: bytes | None) -> Outcome:
    """``task.score``, with an exception blamed on the program's output unless the task is broken."""
    try:
        return task.score(result, row, nonce=nonce)
    except SandboxError:
        raise
    except Exception as exc:
        try:
            task.score(_EMPTY_RESULT, row, nonce=nonce)
        except Exception:
            _warn_once(task, "score", exc)
            return Outcome("infra", detail=f"task failed to score the result: {_describe(exc)}")
        return Outcome("error", detail=f"the host could not read this program's result: {_describe(exc)}")


def _task_builds(task: Task, row: Mapping[str, Any]) -> bool:
    for probe in PROBES:
        try:
            task.build(probe, row)
        except Exception:
            continue
        return True
    return False


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:
        text = "<unprintable>"
    return f"{type(exc).__name__}: {text.encode('utf-8', 'backslashreplace').decode('utf-8')[:300]}"


def _warn_once(task: Task, stage: str, exc: BaseException) -> None:
    key = f"{type(task).__name__}.{stage}"
    if key not in _warned:
        _warned.add(key)
        log.warning("task %s failed to %s even a benign probe completion; scoring such rows as infra: %s",
                    type(task).__name__, stage, _describe(exc))

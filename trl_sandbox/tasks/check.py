"""Check-style (HumanEval-like) and assert-style (MBPP-like) tasks: the task's tests run in the
judge against the candidate's functions. See ``trl_sandbox.tasks.generic`` for the columns.
"""

from __future__ import annotations

import ast
import builtins
import functools
from dataclasses import dataclass
from typing import Any

from trl_sandbox.judge.bans import BanPolicy
from trl_sandbox.judge.content_guard import parse_untrusted
from trl_sandbox.judge.verdict import (
    build_program,
    check_spec,
    encode_judge_part,
)
from trl_sandbox.sandbox import Outcome, Program
from trl_sandbox.tasks.call import ban_outcome
from trl_sandbox.tasks.extract import assemble, extract_code, has_code

CHECK_COLUMNS = ("test", "entry_point")
ASSERT_COLUMNS = ("test_list",)
DEFAULT_CHECK_TIMEOUT = 3.0


# -- check and assert styles ----------------------------------------------------------------------


@dataclass(frozen=True)
class CheckTask:
    """One resolved check- or assert-style task."""

    prompt: Any
    extract: str
    timeout: float
    total: int
    policy: BanPolicy
    judge_part: bytes


@functools.lru_cache(maxsize=1024)
def _check_task(prompt: Any, test: str, entry_point: str, setup: str | None, extract: str, timeout: float,
                banned: tuple[str, ...]) -> CheckTask:
    if setup is None:
        # The prompt is the trusted start of the program: its helpers and imports may serve the tests
        # too (HumanEval/32 uses ``poly``). It is run in the judge only when the tests use a name it
        # defines, which saves compiling it a second time for almost every problem.
        usable = extract == "continue" and isinstance(prompt, str) and _is_code(prompt)
        needed = usable and bool((_defined_names(prompt) - {entry_point}) & _used_names(test))
        setup = prompt if needed else ""
    tests = [f"{test}\n\ncheck({entry_point})\n"]
    spec = check_spec(tests, setup=setup, bind=[entry_point])
    return CheckTask(prompt, extract, timeout, 1, BanPolicy.from_patterns(banned), encode_judge_part(spec))


@functools.lru_cache(maxsize=1024)
def _assert_task(prompt: Any, test_list: tuple[str, ...], setup: str, entry: str | None, extract: str,
                 timeout: float, banned: tuple[str, ...]) -> CheckTask:
    bind: list[str] = []
    bind_defined: list[str] = []
    if entry:
        bind = [entry]
    else:
        provided = set(dir(builtins)) | _defined_names(setup)
        called: list[str] = []
        for statement in test_list:
            for name in _called_names(statement):
                if name not in provided and name not in called:
                    called.append(name)
        bind_defined = called
    spec = check_spec(list(test_list), setup=setup, bind=bind, bind_defined=bind_defined)
    return CheckTask(prompt, extract, timeout, len(test_list), BanPolicy.from_patterns(banned), encode_judge_part(spec))


def _defined_names(code: str) -> set[str]:
    tree = parse_untrusted(code or "")
    if tree is None:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _used_names(code: str) -> set[str]:
    tree = parse_untrusted(code)
    if tree is None:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def _called_names(code: str) -> list[str]:
    tree = parse_untrusted(code)
    if tree is None:
        return []
    return [n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]


def build_check(task: CheckTask, completion: Any) -> Program | Outcome:
    code = extract_code(completion, task.extract)
    if not has_code(code):
        return Outcome("no_code", total=task.total, detail="failed: no code found in the completion")
    prompt = task.prompt if isinstance(task.prompt, str) else ""
    if task.extract == "continue":
        source, prefix_lines = prompt + code, prompt.count("\n")
    elif task.extract == "body":
        source, prefix_lines = assemble(prompt, code, "body")
    elif prompt and _is_code_prompt(prompt):
        # a code prompt (imports, helpers) stays in front of stand-alone code
        source, prefix_lines = prompt + "\n" + code + "\n", prompt.count("\n") + 1
    else:
        source, prefix_lines = code, 0
    early = ban_outcome(task.policy, source, prefix_lines, task.total)
    if early is not None:
        return early
    return build_program(source, task.judge_part, limit_s=task.timeout, policy=task.policy)


@functools.lru_cache(maxsize=1024)
def _is_code(text: str) -> bool:
    return parse_untrusted(text) is not None


_DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign,
                ast.AnnAssign)


@functools.lru_cache(maxsize=1024)
def _is_code_prompt(text: str) -> bool:
    """Whether a prompt is code to run ahead of a stand-alone completion: it parses, and it only
    defines and imports (docstrings aside). A one-word prompt ("fibonacci") or a question that
    happens to parse is prose: run ahead of a correct answer, it would be a NameError, an error
    the answer did not make."""
    tree = parse_untrusted(text)
    if tree is None or not tree.body:
        return False
    prose = [n for n in tree.body if isinstance(n, ast.Expr) and not isinstance(n.value, ast.Constant)]
    return not prose and all(isinstance(n, (*_DEFINITIONS, ast.Expr)) for n in tree.body) and any(
        isinstance(n, _DEFINITIONS) for n in tree.body)

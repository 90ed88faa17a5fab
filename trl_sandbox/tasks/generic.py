"""The generic task: any dataset with test columns is scored without a plugin.

A row without a ``sandbox_task`` column is scored here. Its columns say how, in one of three styles:

**Call style** (the original TRL + Daytona example's ``TASKS`` entries):
    ``func_name`` (str), ``tests`` (list of Python expressions, each producing the function's one
    argument; evaluated on the host with ``random`` seeded by ``seed``, default 0) and ``reference``
    (str: an expression naming a callable, e.g. ``"sorted"`` or ``"_kadane"`` (Kadane's algorithm),
    or ``"lambda xs: ..."``; or source code defining ``func_name``). Expected values are computed
    from the reference here, on the host; the sandbox returns the candidate's values as plain data
    and the host compares them. Optional: ``banned_patterns`` (list of str, see ``trl_sandbox.judge.bans``),
    ``raise_is_error`` (bool, default true: a candidate raising on a test input is an ``error``).

**Check style** (HumanEval-like): ``test`` (code defining ``check(candidate)``) and ``entry_point``
    (the function's name). Optional ``test_setup``: trusted code run before ``test`` in the judge
    (default: the prompt, when the completion continues it), for helpers the tests use.

**I/O style** (competitive programming): a whole program, in any of the judge's languages, reads
    each test's input on stdin and is judged on what it prints. Rows carry ``tests`` as
    ``{input, output}`` pairs or come in a published layout (APPS, CodeContests, LiveCodeBench,
    ``verification_info``, DeepCoder, open-r1's Codeforces): see ``trl_sandbox.tasks.io`` and
    ``trl_sandbox.tasks.io_layouts``.

**Assert style** (MBPP-like): ``test_list`` (list of ``assert`` statements). Optional
    ``test_setup_code`` and ``test_imports`` (list of import lines), run in the judge first, and
    ``entry_point``/``func_name`` to name the function under test (default: every function the
    asserts call that the setup and builtins do not provide).

Common optional columns: ``extract`` (``body``, ``continue``, ``fence``, ``answer``, ``raw``,
``auto``; see ``trl_sandbox.tasks.extract``; default ``auto``, or ``continue`` for check style with a
string prompt), ``timeout`` (seconds for loading the code and running every test; default 1.0 for
call style, 3.0 otherwise), ``task_id``.

``tasks_from_dict(TASKS)`` turns an original-style ``TASKS`` dict into such a dataset;
``DictTasks(TASKS)`` is the same as a task set a plugin can register under a name.
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from trl_sandbox.judge.verdict import (
    JUDGE_ARGV,
    call_outcome,
    check_outcome,
)
from trl_sandbox.sandbox import ConfigError, ExecResult, Outcome, Program
from trl_sandbox.tasks.call import (
    CALL_COLUMNS,
    DEFAULT_CALL_TIMEOUT,
    REFERENCE_HELPERS,
    CallTask,
    _check_mode,
    _hashable_prompt,
    build_call,
    call_task,
    compute_inputs,
    expected_values,
    resolve_reference,
)
from trl_sandbox.tasks.check import (
    ASSERT_COLUMNS,
    CHECK_COLUMNS,
    DEFAULT_CHECK_TIMEOUT,
    CheckTask,
    _assert_task,
    _check_task,
    _defined_names,
    _is_code,
    build_check,
)
from trl_sandbox.tasks.io import IOTask, build_io, score_io
from trl_sandbox.tasks.io_calls import FunctionTestsTask, build_function_tests, score_function_tests
from trl_sandbox.tasks.io_layouts import io_task_of, layout_of

# -- the generic task -----------------------------------------------------------------------------


def _style(row: Mapping[str, Any]) -> str:
    def present(column: str) -> bool:
        return row.get(column) not in (None, "")

    if all(present(c) for c in CALL_COLUMNS):
        return "call"
    if all(present(c) for c in CHECK_COLUMNS):
        return "check"
    if present("test_list"):
        return "assert"
    if layout_of(row) is not None:
        return "io"
    styles = {"call": CALL_COLUMNS, "check": CHECK_COLUMNS, "assert": ASSERT_COLUMNS}
    closest = max(styles, key=lambda s: (sum(present(c) for c in styles[s]), s == "call"))
    missing = [c for c in styles[closest] if not present(c)]
    if any(present(c) for c in styles[closest]):
        raise ConfigError(
            f"dataset row (task_id={row.get('task_id')!r}) has some of the generic task's {closest}-style columns "
            f"but lacks {', '.join(missing)}; see trl_sandbox.tasks.generic for the columns each style needs"
        )
    raise ConfigError(
        f"dataset row (task_id={row.get('task_id')!r}) has no 'sandbox_task' column and none of the generic "
        f"task's test columns: add {', '.join(CALL_COLUMNS)} (call style), {', '.join(CHECK_COLUMNS)} "
        f"(check style) or {', '.join(ASSERT_COLUMNS)} (assert style); missing: {', '.join(missing)}. "
        "Or set 'sandbox_task' to the name of a registered task set (`trl-sandbox tasks` lists them)."
    )


class GenericTask:
    """Scores rows that carry their own tests (see the module docstring for the columns)."""

    name = "generic"
    description = ("any dataset with test columns: call (func_name/tests/reference), check (test/entry_point), "
                   "assert (test_list) or io (whole programs on stdin/stdout, in the published layouts)")

    _instance: GenericTask | None = None

    @classmethod
    def check_row(cls, row: Mapping[str, Any]) -> GenericTask:
        """The generic task for ``row``; raises ``ConfigError`` naming the missing columns."""
        _style(row)
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def rows(self, **options: Any) -> list[dict[str, Any]]:
        return []

    def resolve(self, row: Mapping[str, Any]) -> CallTask | CheckTask | IOTask | FunctionTestsTask:
        style = _style(row)
        if style == "io":
            return io_task_of(row)
        if style == "call":
            return call_task(row, task_id=str(row.get("task_id") or ""), extract="auto")
        prompt = _hashable_prompt(row.get("prompt", ""))
        banned = tuple(str(p) for p in (row.get("banned_patterns") or ()))
        timeout = float(row.get("timeout") or DEFAULT_CHECK_TIMEOUT)
        if style == "check":
            extract = str(row.get("extract") or ("continue" if isinstance(row.get("prompt"), str) else "auto"))
            _check_mode(extract)
            setup = row.get("test_setup")
            return _check_task(prompt, str(row["test"]), str(row["entry_point"]),
                               None if setup is None else str(setup), extract, timeout, banned)
        extract = str(row.get("extract") or "auto")
        _check_mode(extract)
        imports = row.get("test_imports") or []
        setup = "\n".join([*(str(i) for i in imports), str(row.get("test_setup_code") or "")])
        entry = row.get("entry_point") or row.get("func_name")
        return _assert_task(prompt, tuple(str(t) for t in row["test_list"]), setup, str(entry) if entry else None,
                            extract, timeout, banned)

    def build(self, completion: str, row: Mapping[str, Any]) -> Program | Outcome:
        task = self.resolve(row)
        if isinstance(task, CallTask):
            return build_call(task, completion, row.get("prompt"))
        if isinstance(task, IOTask):
            return build_io(task, completion)
        if isinstance(task, FunctionTestsTask):
            return build_function_tests(task, completion)
        return build_check(task, completion)

    def score(self, result: ExecResult, row: Mapping[str, Any], *, nonce: bytes | None) -> Outcome:
        task = self.resolve(row)
        if isinstance(task, CallTask):
            return call_outcome(result, nonce, task.expected, raise_is_error=task.raise_is_error)
        if isinstance(task, IOTask):
            return score_io(task, result, nonce)
        if isinstance(task, FunctionTestsTask):
            return score_function_tests(task, result, nonce)
        return check_outcome(result, nonce, task.total)


# -- original-style TASKS dicts -------------------------------------------------------------------


class DictTasks:
    """A task set from an original-style ``TASKS`` dict: ``{task_id: {prompt, func_name,
    banned_patterns, tests, reference}}``. Register it from a plugin, or use ``tasks_from_dict``.

    An entry may also carry ``solution`` (a known-good completion, in the task's extraction mode),
    which ``validate`` runs through the sandbox; ``extract`` and ``timeout`` override the set's
    defaults (``body``: the model continues the function body, as in the original; 1 second).
    """

    def __init__(
        self,
        tasks: Mapping[str, Mapping[str, Any]],
        name: str = "tasks",
        *,
        extract: str = "body",
        timeout: float = DEFAULT_CALL_TIMEOUT,
        description: str = "",
        raise_is_error: bool = True,
    ) -> None:
        _check_mode(extract)
        self.tasks = {str(k): dict(v) for k, v in tasks.items()}
        self.name = name
        self.extract = extract
        self.timeout = timeout
        self.raise_is_error = raise_is_error
        self.description = description or f"{len(self.tasks)} call-style tasks ({', '.join(self.tasks)})"
        for task_id, entry in self.tasks.items():
            missing = [c for c in ("prompt", *CALL_COLUMNS) if entry.get(c) in (None, "")]
            if missing:
                raise ConfigError(f"task {task_id!r} of {name!r} lacks {', '.join(missing)}")

    def entry(self, task_id: str) -> dict[str, Any]:
        try:
            entry = self.tasks[task_id]
        except KeyError:
            raise ConfigError(f"task set {self.name!r} has no task {task_id!r}; it has {', '.join(self.tasks)}") from None
        return {"raise_is_error": self.raise_is_error, **entry}

    def spec(self, task_id: str, timeout: float | None = None, extract: str | None = None) -> CallTask:
        """The resolved task; ``timeout``/``extract`` override the entry's (a row may carry both:
        e.g. a multi-turn episode scores a whole solution file with ``extract="auto"``)."""
        entry = self.entry(task_id)
        if timeout:
            entry["timeout"] = float(timeout)
        if extract:
            entry["extract"] = str(extract)
        return call_task(entry, task_id=task_id, extract=self.extract, timeout=self.timeout)

    def _row_spec(self, row: Mapping[str, Any]) -> CallTask:
        return self.spec(str(row["task_id"]), row.get("timeout"), row.get("extract"))

    def rows(self, task_ids: Sequence[str] | None = None, repeat: int = 1, **options: Any) -> list[dict[str, Any]]:
        """One row per task (``prompt``, ``task_id``), ``repeat`` times over."""
        if options:
            raise ConfigError(f"task set {self.name!r} does not take options {sorted(options)}")
        ids = list(task_ids) if task_ids is not None else list(self.tasks)
        for task_id in ids:
            self.entry(task_id)
        return [{"prompt": self.tasks[t]["prompt"], "task_id": t} for _ in range(max(1, int(repeat))) for t in ids]

    def build(self, completion: str, row: Mapping[str, Any]) -> Program | Outcome:
        return build_call(self._row_spec(row), completion)

    def score(self, result: ExecResult, row: Mapping[str, Any], *, nonce: bytes | None) -> Outcome:
        task = self._row_spec(row)
        return call_outcome(result, nonce, task.expected, raise_is_error=task.raise_is_error)

    def validate(self, *, provider: str | None = "local", settings: Mapping[str, Any] | None = None) -> list[str]:
        """Problems with the tasks themselves (empty when all is well).

        On the host: the references load and run on every test input, the prompts parse, the
        function is defined. In a sandbox (``provider``; ``None`` skips this part): each ``solution``
        passes through the real judge, so a reference or a judge path that cannot pass is caught.
        """
        problems: list[str] = []
        cases = []
        for task_id in self.tasks:
            try:
                spec = self.spec(task_id)
            except ConfigError as exc:
                problems.append(f"{self.name}/{task_id}: {exc}")
                continue
            entry = self.tasks[task_id]
            prompt = entry["prompt"]
            if spec.extract == "body":
                if not _is_code(prompt + "    pass\n"):
                    problems.append(f"{self.name}/{task_id}: the prompt does not parse as the start of a function")
                elif spec.func_name not in _defined_names(prompt):
                    problems.append(f"{self.name}/{task_id}: the prompt does not define {spec.func_name!r}")
            if entry.get("solution"):
                cases.append((entry["solution"], {"prompt": prompt, "task_id": task_id, "sandbox_task": self.name}))
        if provider and cases:
            problems.extend(run_self_check(self, cases, provider=provider, settings=settings))
        return problems


def run_self_check(
    task: Any,
    cases: Sequence[tuple[Any, Mapping[str, Any]]],
    *,
    provider: str = "local",
    settings: Mapping[str, Any] | None = None,
    pool_size: int = 2,
) -> list[str]:
    """Run known-good completions through ``task`` in real sandboxes; every one must pass.

    Returns one line per problem (empty when every case passed).
    """
    from trl_sandbox.judge.verdict import score_cases
    from trl_sandbox.pool.sandbox_pool import SandboxPool

    name = getattr(task, "name", "?")
    try:
        with SandboxPool.open(provider, size=pool_size, settings=settings, made_by="self-check") as pool:
            outcomes = score_cases(pool, task, cases)
    except Exception as exc:
        return [f"{name}: could not run the self-check on provider {provider!r}: {exc}"]
    problems = []
    for (_, row), outcome in zip(cases, outcomes):
        if outcome.status != "passed":
            problems.append(
                f"{name}/{row.get('task_id')}: its own solution scored {outcome.status} "
                f"({outcome.passed}/{outcome.total}): {outcome.detail}"
            )
    return problems


def tasks_from_dict(
    tasks: Mapping[str, Mapping[str, Any]],
    *,
    repeat: int = 1,
    extract: str = "body",
    timeout: float = DEFAULT_CALL_TIMEOUT,
):
    """A ``datasets.Dataset`` for an original-style ``TASKS`` dict, scored by the generic task.

    Every row carries its own columns (``prompt, task_id, func_name, tests, reference,
    banned_patterns, extract, timeout``), so the dataset needs no registration. A callable
    ``reference`` is stored as its source code.
    """
    from datasets import Dataset

    rows = []
    for task_id, entry in tasks.items():
        missing = [c for c in ("prompt", *CALL_COLUMNS) if entry.get(c) in (None, "")]
        if missing:
            raise ConfigError(f"task {task_id!r} lacks {', '.join(missing)}")
        reference = entry["reference"]
        if callable(reference):
            try:
                reference = textwrap.dedent(inspect.getsource(reference))
            except (OSError, TypeError) as exc:
                raise ConfigError(
                    f"task {task_id!r}: cannot store the reference {reference!r} in a dataset; give its source "
                    "code or an expression as a string"
                ) from exc
        row = {
            "prompt": entry["prompt"],
            "task_id": str(task_id),
            "func_name": str(entry["func_name"]),
            "tests": [str(t) for t in entry["tests"]],
            "reference": str(reference),
            "banned_patterns": [str(p) for p in (entry.get("banned_patterns") or [])],
            "extract": str(entry.get("extract") or extract),
            "timeout": float(entry.get("timeout") or timeout),
        }
        call_task(row, task_id=str(task_id))  # fail now, not in the middle of training
        rows.append(row)
    return Dataset.from_list([dict(r) for _ in range(max(1, int(repeat))) for r in rows])


__all__ = [
    "CALL_COLUMNS",
    "CHECK_COLUMNS",
    "ASSERT_COLUMNS",
    "REFERENCE_HELPERS",
    "DictTasks",
    "GenericTask",
    "JUDGE_ARGV",
    "compute_inputs",
    "expected_values",
    "resolve_reference",
    "run_self_check",
    "tasks_from_dict",
]

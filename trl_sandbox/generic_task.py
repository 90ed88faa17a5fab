"""The generic task: any dataset with test columns is scored without a plugin.

A row without a ``sandbox_task`` column is scored here. Its columns say how, in one of three styles:

**Call style** (the original TRL + Daytona example's ``TASKS`` entries):
    ``func_name`` (str), ``tests`` (list of Python expressions, each producing the function's one
    argument; evaluated on the host with ``random`` seeded by ``seed``, default 0) and ``reference``
    (str: an expression naming a callable, e.g. ``"sorted"`` or ``"_kadane"`` (Kadane's algorithm),
    or ``"lambda xs: ..."``; or source code defining ``func_name``). Expected values are computed
    from the reference here, on the host; the sandbox returns the candidate's values as plain data
    and the host compares them. Optional: ``banned_patterns`` (list of str, see ``trl_sandbox.bans``),
    ``raise_is_error`` (bool, default true: a candidate raising on a test input is an ``error``).

**Check style** (HumanEval-like): ``test`` (code defining ``check(candidate)``) and ``entry_point``
    (the function's name). Optional ``test_setup``: trusted code run before ``test`` in the judge
    (default: the prompt, when the completion continues it), for helpers the tests use.

**Assert style** (MBPP-like): ``test_list`` (list of ``assert`` statements). Optional
    ``test_setup_code`` and ``test_imports`` (list of import lines), run in the judge first, and
    ``entry_point``/``func_name`` to name the function under test (default: every function the
    asserts call that the setup and builtins do not provide).

Common optional columns: ``extract`` (``body``, ``continue``, ``fence``, ``answer``, ``raw``,
``auto``; see ``trl_sandbox.extract``; default ``auto``, or ``continue`` for check style with a
string prompt), ``timeout`` (seconds for loading the code and running every test; default 1.0 for
call style, 3.0 otherwise), ``task_id``.

``tasks_from_dict(TASKS)`` turns an original-style ``TASKS`` dict into such a dataset;
``DictTasks(TASKS)`` is the same as a task set a plugin can register under a name.
"""

from __future__ import annotations

import ast
import builtins
import copy
import functools
import inspect
import math
import random
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .bans import BanPolicy
from .content_guard import parse_untrusted
from .extract import MODES, assemble, extract_code, has_code
from .judge import (
    JUDGE_ARGV,
    build_program,
    call_outcome,
    call_spec,
    check_outcome,
    check_spec,
    encode_judge_part,
)
from .sandbox import ConfigError, ExecResult
from .tasks import Outcome, Program

CALL_COLUMNS = ("func_name", "tests", "reference")
CHECK_COLUMNS = ("test", "entry_point")
ASSERT_COLUMNS = ("test_list",)
DEFAULT_CALL_TIMEOUT = 1.0
DEFAULT_CHECK_TIMEOUT = 3.0


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
    elif prompt and _is_code(prompt):
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
    styles = {"call": CALL_COLUMNS, "check": CHECK_COLUMNS, "assert": ASSERT_COLUMNS}
    closest = max(styles, key=lambda s: (sum(present(c) for c in styles[s]), s == "call"))
    missing = [c for c in styles[closest] if not present(c)]
    if any(present(c) for c in styles[closest]):
        raise ConfigError(
            f"dataset row (task_id={row.get('task_id')!r}) has some of the generic task's {closest}-style columns "
            f"but lacks {', '.join(missing)}; see trl_sandbox.generic_task for the columns each style needs"
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
    description = "any dataset with test columns: call (func_name/tests/reference), check (test/entry_point) or assert (test_list)"

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

    def resolve(self, row: Mapping[str, Any]) -> CallTask | CheckTask:
        style = _style(row)
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
        return build_check(task, completion)

    def score(self, result: ExecResult, row: Mapping[str, Any], *, nonce: bytes | None) -> Outcome:
        task = self.resolve(row)
        if isinstance(task, CallTask):
            return call_outcome(result, nonce, task.expected, raise_is_error=task.raise_is_error)
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
    from .judge import score_cases
    from .pool import SandboxPool

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

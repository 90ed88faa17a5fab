"""I/O-style tasks: a whole program reads each test's input on stdin and is judged on what it prints.

The generic task picks this style when a row carries tests as ``{input, output}`` pairs, in our own
columns or in one of the published layouts (``trl_sandbox.tasks.io_layouts``: APPS/TACO,
CodeContests, LiveCodeBench, ``verification_info``, DeepCoder, open-r1's Codeforces). Our own
columns:

``tests``
    A list of ``{"input": str, "output": str}`` (a JSON string of one works too). A test without an
    expected output is a broken task (``ConfigError``), never a pass.
``language``
    ``python`` (default), ``cpp``, ``c``, ``java``, ``rust``, ``go``, ``javascript`` or an alias
    (``c++``, ``py3``, ``js``...); a plugin adds more (``trl_sandbox.judge.languages``). Without the
    column, the completion's fence tag (```` ```cpp ````) chooses, else Python; the sandbox lacking
    the toolchain of a language the fence chose is then the program's error, not ``infra``.
``compare``
    ``tokens`` (default: whitespace-separated tokens, words case-insensitive, real numbers in the
    answer matched within 1e-5 absolute or relative, an integer in the answer only by its own
    text: ``trl_sandbox.judge.io_compare``), ``lines`` (each line stripped, as many lines),
    ``exact``, or ``float:TOL`` (tokens, real numbers within TOL).
``checker`` / ``checker_language`` / ``checker_contract``
    A program for problems with several right answers (Python by default), run under a contract:
    ``testlib`` (default: ``checker input output answer``; exit 0 accepts, 1 or 2 rejects) or
    ``open-r1`` (open-r1's Codeforces checkers: ``checker input correct_output solution_output``;
    ``1`` on stdout accepts, ``0`` rejects). Anything else is the checker's own failure: the
    output's ``WA`` where the checker accepts the expected answer, else ``infra``.
``time_limit`` (CPU seconds per test, default 2), ``memory_limit`` (MB per test, default 256),
``stop_at_first_failure`` (bool, default false: every test runs, for partial credit),
``total_time_limit`` (CPU seconds for all of a program's tests, default 60; after it, or after two
time limits, the remaining tests are time limits without running: a program slow on every test
must not hold its sandbox past the reward call's deadline, where its failure would score None),
``compile_time_limit`` (CPU seconds, default 10), ``extract``, ``task_id``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trl_sandbox.judge.io_compare import CHECKER_CONTRACTS
from trl_sandbox.judge.io_verdict import build_io_program, io_outcome
from trl_sandbox.judge.languages import Language, languages
from trl_sandbox.sandbox import ConfigError, ExecResult, Outcome, Program
from trl_sandbox.tasks.extract import MODES, completion_text

DEFAULT_TIME_LIMIT = 2.0
DEFAULT_MEMORY_MB = 256
DEFAULT_COMPILE_TIME = 10.0
COMPARE_MODES = ("tokens", "lines", "exact", "float:TOL")

_FENCE = re.compile(r"```[ \t]*(?P<lang>[A-Za-z0-9_+#.-]*)[^\n]*\n(?P<code>.*?)(?:```|\Z)", re.DOTALL)


@dataclass(frozen=True)
class IOTask:
    task_id: str
    tests: tuple[tuple[str, str], ...]
    language: Language | None  # None: the completion's fence tag chooses (else Python)
    compare: str = "tokens"
    time_limit: float = DEFAULT_TIME_LIMIT
    memory_mb: int = DEFAULT_MEMORY_MB
    compile_time: float = DEFAULT_COMPILE_TIME
    checker: tuple[Language, str] | None = None
    checker_contract: str = "testlib"
    stop_on_fail: bool = False
    extract: str = "auto"
    total_time_limit: float = 60.0

    @property
    def total(self) -> int:
        return len(self.tests)


def check_compare(mode: str) -> str:
    mode = (mode or "tokens").strip().lower()
    if mode in ("tokens", "lines", "exact"):
        return mode
    if mode.startswith("float:"):
        try:
            if float(mode[6:]) >= 0:
                return mode
        except ValueError:
            pass
    raise ConfigError(f"compare={mode!r}: use one of {', '.join(COMPARE_MODES)} (e.g. float:1e-6)")


def check_contract(value: Any, task_id: str) -> str:
    """A checker contract the judge knows (``io_compare.CHECKER_CONTRACTS``): a checker read under
    the wrong one can accept anything (open-r1's checkers exit 0 also when they print ``0``)."""
    contract = str(value or "testlib").strip().lower()
    if contract not in CHECKER_CONTRACTS:
        raise ConfigError(f"row {task_id!r}: checker_contract={value!r}: use one of {', '.join(CHECKER_CONTRACTS)}")
    return contract


def _number(row: Mapping[str, Any], column: str, default: float) -> float:
    value = row.get(column)
    if value in (None, ""):
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"row {row.get('task_id')!r}: {column}={value!r} is not a number") from None
    if not number > 0:
        raise ConfigError(f"row {row.get('task_id')!r}: {column}={value!r} must be positive")
    return number


def normalise_tests(tests: Any, task_id: Any) -> tuple[tuple[str, str], ...]:
    """``[{input, output}, ...]`` (or its JSON text) as pairs of strings; a missing output is an error."""
    if isinstance(tests, (str, bytes)):
        try:
            tests = json.loads(tests)
        except ValueError:
            raise ConfigError(f"row {task_id!r}: tests is a string that is not JSON") from None
    if not isinstance(tests, Sequence) or isinstance(tests, (str, bytes)) or not tests:
        raise ConfigError(f"row {task_id!r}: an I/O task needs a non-empty list of {{input, output}} tests")
    pairs = []
    for i, test in enumerate(tests):
        if not isinstance(test, Mapping) or "input" not in test:
            raise ConfigError(f"row {task_id!r}: test {i + 1} is not an {{input, output}} mapping")
        output = test.get("output")
        if output is None:
            raise ConfigError(f"row {task_id!r}: test {i + 1} has no expected output; a test without one is a "
                              "broken task, never a pass (remove the test or add its output)")
        pairs.append((_text(test["input"]), _text(output)))
    return tuple(pairs)


def _text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "\n".join(str(v) for v in value) + ("\n" if value else "")
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)


def io_task(row: Mapping[str, Any], tests: Sequence[tuple[str, str]] | None = None, **defaults: Any) -> IOTask:
    """The task a row describes (our own columns; ``tests`` and ``defaults`` come from a layout)."""
    task_id = str(row.get("task_id") or defaults.get("task_id") or "")
    table = languages()
    name = row.get("language") or defaults.get("language")
    language = table.get(str(name)) if name else None
    checker = None
    checker_source = row.get("checker") or defaults.get("checker")
    if checker_source:
        checker = (table.get(str(row.get("checker_language") or defaults.get("checker_language") or "python")),
                   str(checker_source))
    extract = str(row.get("extract") or "auto")
    if extract not in ("auto", "fence", "raw"):
        raise ConfigError(f"row {task_id!r}: extract={extract!r}: I/O tasks take auto, fence or raw (of {', '.join(MODES)})")
    memory = row.get("memory_limit") or defaults.get("memory_mb")
    return IOTask(
        task_id=task_id,
        tests=tuple(tests) if tests is not None else normalise_tests(row.get("tests"), task_id),
        language=language,
        compare=check_compare(str(row.get("compare") or defaults.get("compare") or "tokens")),
        time_limit=_number({**defaults, **row}, "time_limit", DEFAULT_TIME_LIMIT),
        memory_mb=int(_number({"memory_limit": memory}, "memory_limit", DEFAULT_MEMORY_MB)),
        compile_time=_number(row, "compile_time_limit", DEFAULT_COMPILE_TIME),
        checker=checker,
        checker_contract=check_contract(row.get("checker_contract") or (None if row.get("checker") else
                                                                         defaults.get("checker_contract")), task_id),
        stop_on_fail=bool(row.get("stop_at_first_failure") or False),
        extract=extract,
        total_time_limit=_number(row, "total_time_limit", 60.0),
    )


def program_code(task: IOTask, completion: Any) -> tuple[Language, str]:
    """The program in ``completion`` and its language: the last fenced block tagged with the row's
    language (or, without a ``language`` column, the last fenced block whose tag names a known
    language), else the whole completion."""
    text = completion_text(completion)
    table = languages()
    if task.extract != "raw":
        found = None
        for match in _FENCE.finditer(text):
            tag = match.group("lang").lower()
            if task.language is not None:
                if tag == "" or tag in table.fence_tags(task.language):
                    found = (task.language, match.group("code"))
            else:
                try:
                    found = (table.get(tag) if tag else table.get("python"), match.group("code"))
                except ConfigError:
                    continue
        if found is not None:
            return found
        if task.extract == "fence":
            return task.language or table.get("python"), ""
    return task.language or table.get("python"), text


def build_io(task: IOTask, completion: Any) -> Program | Outcome:
    language, code = program_code(task, completion)
    if not code.strip():
        return Outcome("no_code", total=task.total, detail="no code found in the completion", tests=(False,) * task.total)
    return build_io_program(
        language, code, [{"input": i, "output": o} for i, o in task.tests], compare=task.compare,
        time_limit=task.time_limit, memory_mb=task.memory_mb, compile_time=task.compile_time,
        checker=task.checker, checker_contract=task.checker_contract, stop_on_fail=task.stop_on_fail,
        total_time_limit=task.total_time_limit,
    )


def score_io(task: IOTask, result: ExecResult, nonce: bytes | None) -> Outcome:
    """The outcome of ``task``'s judged program. Without a ``language`` column the completion's
    fence chose the language, so a toolchain the sandbox lacks is the program's failure."""
    return io_outcome(result, nonce, task.total, fence_chosen=task.language is None)

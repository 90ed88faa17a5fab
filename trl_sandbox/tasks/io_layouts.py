"""The published layouts of stdin/stdout datasets, read as they are published (plus a ``task_id``).

Which layout a row has is told by its columns, as for the generic task's other styles:

=====================  ==========================================================================
layout                 columns
=====================  ==========================================================================
ours                   ``tests``: a list of ``{input, output}`` (``trl_sandbox.tasks.io``)
APPS, TACO             ``input_output``: JSON ``{"inputs": [...], "outputs": [...]}``
CodeContests           ``public_tests``, ``private_tests``, ``generated_tests`` (each ``{"input": [...],
                       "output": [...]}``), ``time_limit`` (``{"seconds", "nanos"}``), ``memory_limit_bytes``
LiveCodeBench          ``public_test_cases`` (JSON list of ``{input, output, testtype}``),
                       ``private_test_cases`` (the same, zlib-compressed, pickled and base64-encoded)
verification_info      ``verification_info``: ``{"language", "test_cases": [{input, output, type}]}``
                       (PrimeIntellect's verifiable-coding-problems and SYNTHETIC-1)
DeepCoder              ``tests``: a list of ``{input, output, testtype}``, or ``{"inputs", "outputs"}``
open-r1 Codeforces     ``official_tests`` (list of ``{input, output}``), ``time_limit`` (s),
                       ``memory_limit`` (MB), ``generated_checker`` (Python, run under open-r1's
                       contract), ``input_mode``
=====================  ==========================================================================

Rows whose tests call a function instead (APPS's and TACO's ``fn_name``, LiveCodeBench's and
DeepCoder's ``functional`` tests with ``metadata.func_name``) run through the function judge's call
mode (``trl_sandbox.tasks.io_calls``). LiveCodeBench's private tests are
decoded by an unpickler that admits nothing but strings: no dataset can run code on the host.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import pickle
import zlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from trl_sandbox.sandbox import ConfigError
from trl_sandbox.tasks.io import IOTask, io_task, normalise_tests

if TYPE_CHECKING:
    from trl_sandbox.tasks.io_calls import FunctionTestsTask

LAYOUT_COLUMNS: dict[str, tuple[str, ...]] = {
    "codeforces": ("official_tests",),
    "verification_info": ("verification_info",),
    "livecodebench": ("public_test_cases", "private_test_cases"),
    "code_contests": ("public_tests", "private_tests", "generated_tests"),
    "apps": ("input_output",),
}
_MAX_PICKLE_BYTES = 1 << 30


def _present(row: Mapping[str, Any], column: str) -> bool:
    return row.get(column) not in (None, "", [], {})


def _json(value: Any, what: str, task_id: Any) -> Any:
    if isinstance(value, (str, bytes)):
        try:
            return json.loads(value)
        except ValueError:
            raise ConfigError(f"row {task_id!r}: {what} is not valid JSON") from None
    return value


def layout_of(row: Mapping[str, Any]) -> str | None:
    """The layout of ``row`` (see the module docstring), or ``None`` when it is not an I/O row."""
    for layout, columns in LAYOUT_COLUMNS.items():
        if any(_present(row, c) for c in columns):
            return layout
    tests = row.get("tests")
    if isinstance(tests, (str, bytes)):
        text = tests.lstrip()[:1]
        if text not in ("[", "{"):
            return None
        try:
            tests = json.loads(tests)
        except ValueError:
            return None
    if isinstance(tests, Mapping) and "inputs" in tests:
        return "deepcoder"
    if isinstance(tests, Sequence) and not isinstance(tests, (str, bytes)) and tests \
            and all(isinstance(t, Mapping) and "input" in t for t in tests):
        return "deepcoder" if any("testtype" in t for t in tests) else "io"
    return None


class _StringsOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise ConfigError(f"LiveCodeBench private tests hold a pickled {module}.{name}; only strings are accepted")


def decode_livecodebench(blob: str) -> Any:
    """LiveCodeBench's ``private_test_cases``: base64, zlib, a pickled JSON string (or plain JSON)."""
    stripped = blob.lstrip()
    if stripped.startswith("["):
        return json.loads(stripped)
    raw = zlib.decompressobj().decompress(base64.b64decode(blob), _MAX_PICKLE_BYTES)
    text = _StringsOnly(io.BytesIO(raw)).load()
    if not isinstance(text, str):
        raise ConfigError("LiveCodeBench private tests did not decode to a JSON string")
    return json.loads(text)


def _refuse_functional(task_id: Any, what: str) -> None:
    raise ConfigError(f"row {task_id!r}: {what} call a function in a way trl-sandbox does not read; filter such "
                      "rows out, or give them in the call style (func_name, tests, reference)")


class Functional(Exception):
    """The row's tests call a function (``trl_sandbox.tasks.io_calls``), raised from the layout's reader."""

    def __init__(self, func_name: str, cases: list[tuple[Any, Any]], wrapped: bool) -> None:
        super().__init__(func_name)
        self.func_name, self.cases, self.wrapped = func_name, cases, wrapped


def _func_name(row: Mapping[str, Any], task_id: Any) -> str:
    metadata = _json(row.get("metadata") or {}, "metadata", task_id) or {}
    name = metadata.get("func_name") if isinstance(metadata, Mapping) else None
    if not name:
        _refuse_functional(task_id, "its functional tests (no metadata.func_name)")
    return str(name)


def _pairs(inputs: Sequence[Any], outputs: Sequence[Any], task_id: Any) -> list[dict[str, Any]]:
    if len(inputs) != len(outputs):
        raise ConfigError(f"row {task_id!r}: {len(inputs)} test inputs but {len(outputs)} outputs")
    return [{"input": i, "output": o} for i, o in zip(inputs, outputs)]


def _typed(tests: Sequence[Mapping[str, Any]], row: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    task_id = row.get("task_id")
    kinds = {str(test.get(key) or "stdin").lower() for test in tests}
    if kinds & {"functional", "function_call", "call"}:
        if key != "testtype" or len(kinds) > 1:
            _refuse_functional(task_id, f"its tests ({key}={sorted(kinds)!r})")
        from trl_sandbox.tasks.io_calls import json_lines_cases

        raise Functional(_func_name(row, task_id), json_lines_cases(tests, task_id), wrapped=False)
    return list(tests)


def tests_and_defaults(row: Mapping[str, Any]) -> tuple[list[Mapping[str, Any]], dict[str, Any]]:
    """The row's tests as ``{input, output}`` mappings, and the limits and language its layout gives."""
    task_id = row.get("task_id")
    layout = layout_of(row)
    defaults: dict[str, Any] = {}
    if layout == "io":
        return list(_json(row["tests"], "tests", task_id)), defaults
    if layout == "apps":
        spec = _json(row["input_output"], "input_output", task_id) or {}
        if spec.get("fn_name"):
            cases = _pairs(spec.get("inputs") or [], spec.get("outputs") or [], task_id)
            raise Functional(str(spec["fn_name"]), [(c["input"], c["output"]) for c in cases], wrapped=True)
        return _pairs(spec.get("inputs") or [], spec.get("outputs") or [], task_id), defaults
    if layout == "code_contests":
        tests: list[Mapping[str, Any]] = []
        for column in LAYOUT_COLUMNS["code_contests"]:
            part = _json(row.get(column) or {}, column, task_id) or {}
            tests += _pairs(part.get("input") or [], part.get("output") or [], task_id)
        limit = row.get("time_limit")
        if isinstance(limit, Mapping):
            seconds = float(limit.get("seconds") or 0) + float(limit.get("nanos") or 0) / 1e9
            defaults["time_limit"] = seconds or None
        if row.get("memory_limit_bytes"):
            defaults["memory_mb"] = max(1, int(row["memory_limit_bytes"]) >> 20)
        return tests, defaults
    if layout == "livecodebench":
        public = _json(row.get("public_test_cases") or "[]", "public_test_cases", task_id)
        private = row.get("private_test_cases") or []
        if private:
            try:
                private = decode_livecodebench(private) if isinstance(private, str) else private
            except (ValueError, zlib.error, pickle.UnpicklingError, EOFError) as exc:
                raise ConfigError(f"row {task_id!r}: private_test_cases cannot be decoded: {exc}") from None
        return _typed(list(public) + list(private), row, "testtype"), defaults
    if layout == "verification_info":
        info = _json(row["verification_info"], "verification_info", task_id) or {}
        if info.get("language"):
            defaults["language"] = info["language"]
        return _typed(info.get("test_cases") or [], row, "type"), defaults
    if layout == "deepcoder":
        tests_value = _json(row["tests"], "tests", task_id)
        if isinstance(tests_value, Mapping):
            cases = _pairs(tests_value.get("inputs") or [], tests_value.get("outputs") or [], task_id)
            if tests_value.get("fn_name"):  # TACO's layout inside DeepCoder
                raise Functional(str(tests_value["fn_name"]), [(c["input"], c["output"]) for c in cases], wrapped=True)
            return cases, defaults
        return _typed(tests_value, row, "testtype"), defaults
    if layout == "codeforces":
        if str(row.get("input_mode") or "stdio").lower() not in ("stdio", "stdin", ""):
            raise ConfigError(f"row {task_id!r}: input_mode={row.get('input_mode')!r}: only stdio problems are judged")
        if row.get("time_limit"):
            defaults["time_limit"] = float(row["time_limit"])
        if row.get("memory_limit"):
            defaults["memory_mb"] = int(float(row["memory_limit"]))
        if row.get("generated_checker"):
            # open-r1's checkers: ``checker.py input correct_output solution_output``, 1 or 0 on stdout.
            defaults["checker"] = str(row["generated_checker"])
            defaults["checker_contract"] = "open-r1"
        return list(_json(row["official_tests"], "official_tests", task_id)), defaults
    raise ConfigError(f"row {task_id!r} is not in an I/O layout ({', '.join(['ours', *LAYOUT_COLUMNS, 'deepcoder'])})")


_CACHE: OrderedDict[str, Any] = OrderedDict()
_CACHE_ENTRIES = 256


def _seconds(value: Any) -> float | None:
    try:
        return float(value) if value not in (None, "") and float(value) > 0 else None
    except (TypeError, ValueError):
        return None


def _fingerprint(value: Any, digest: Any) -> None:
    """Feed ``value`` to ``digest`` unambiguously (type, length, content), strings as their bytes:
    about ten times faster than hashing ``repr`` of a row that holds megabytes of tests."""
    if isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        digest.update(b"s%d:" % len(data))
        digest.update(data)
    elif isinstance(value, Mapping):
        digest.update(b"d%d:" % len(value))
        for key in sorted(value, key=str):
            _fingerprint(str(key), digest)
            _fingerprint(value[key], digest)
    elif isinstance(value, (list, tuple)):
        digest.update(b"l%d:" % len(value))
        for item in value:
            _fingerprint(item, digest)
    else:
        text = repr(value).encode("utf-8", "surrogatepass")
        digest.update(b"r%d:%s:" % (len(text), type(value).__name__.encode()))
        digest.update(text)


def io_task_of(row: Mapping[str, Any]) -> IOTask | FunctionTestsTask:
    """The I/O task of ``row``, in any layout; resolved once per distinct row (rows repeat once per
    completion of a group, and a large one holds megabytes of tests)."""
    digest = hashlib.blake2b(digest_size=20)
    _fingerprint({k: v for k, v in row.items() if k != "prompt"}, digest)
    key = digest.hexdigest()
    task = _CACHE.get(key)
    if task is not None:
        _CACHE.move_to_end(key)
        return task
    try:
        tests, defaults = tests_and_defaults(row)
    except Functional as calls:
        from trl_sandbox.tasks.io_calls import function_tests_task

        task = function_tests_task(str(row.get("task_id") or ""), calls.func_name, calls.cases, wrapped=calls.wrapped,
                                   timeout=_seconds(row.get("timeout")))
        _CACHE[key] = task
        return task
    if row.get("time_limit") is not None and not isinstance(row.get("time_limit"), (int, float, str)):
        row = {k: v for k, v in row.items() if k != "time_limit"}  # CodeContests' {"seconds", "nanos"}
    if layout_of(row) == "codeforces":
        row = {k: v for k, v in row.items() if k not in ("time_limit", "memory_limit")}
    task = io_task(row, normalise_tests(tests, row.get("task_id")), **defaults)
    _CACHE[key] = task
    while len(_CACHE) > _CACHE_ENTRIES:
        _CACHE.popitem(last=False)
    return task


def named_languages(dataset: Any, rows: int = 2000) -> set[str]:
    """The program languages a dataset's rows name (their ``language`` column or their layout's)."""
    names: set[str] = set()
    columns = getattr(dataset, "column_names", None) or []
    if "language" in columns and hasattr(dataset, "unique"):
        names.update(str(v) for v in dataset.unique("language") if v)
    if "verification_info" in columns:
        for value in dataset.select(range(min(rows, len(dataset))))["verification_info"]:
            info = _json(value, "verification_info", None) if value else None
            if isinstance(info, Mapping) and info.get("language"):
                names.add(str(info["language"]))
    return names


def check_io_toolchains(dataset: Any, path: str) -> None:
    """``ConfigError`` at construction when a language the dataset names has no toolchain on ``path``
    (the local sandbox sees the host's ``/usr``: what is missing here is missing there)."""
    import shutil

    from trl_sandbox.judge.languages import check_toolchain, languages

    if dataset is None:
        return
    parts = dataset.values() if isinstance(getattr(dataset, "column_names", None), dict) else [dataset]
    for part in parts:
        for name in sorted(named_languages(part)):
            check_toolchain(languages().get(name), which=lambda tool: shutil.which(tool, path=path))


# Address space (MiB) a runtime that bounds its heap by a flag needs beside a row's limit in every
# process of the sandbox (``sandbox_memory_mb``): a JVM reserves its heap, class space and code
# cache up front, V8 its heap's cage; below it a right program fails as if it were wrong.
RESERVED_MB = 1536


def io_memory_warning(dataset: Any, memory_mb: int) -> str | None:
    """What to set when a language the dataset names reserves more address space than the sandbox's
    per-process limit ``memory_mb`` leaves a 256 MB row; None when it is room enough."""
    from trl_sandbox.judge.languages import languages

    if dataset is None:
        return None
    parts = dataset.values() if isinstance(getattr(dataset, "column_names", None), dict) else [dataset]
    tight = sorted({lang.name for part in parts for lang in map(languages().get, named_languages(part))
                    if lang.memory == "flag" and lang.name != "go"})
    need = 256 + RESERVED_MB
    if not tight or memory_mb >= need:
        return None
    return (f"rows in {', '.join(tight)} need sandbox_memory_mb of their memory limit + {RESERVED_MB} "
            f"(at least {need} for 256 MB rows; now {memory_mb}): under it a JVM with a large heap cannot "
            "start and V8's heap stops growing early, so right programs fail (docs/io-programs.md, Languages)")

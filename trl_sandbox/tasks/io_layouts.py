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
                       ``memory_limit`` (MB), ``generated_checker`` (Python), ``input_mode``
=====================  ==========================================================================

Rows whose tests call a function instead (APPS's ``fn_name``, LiveCodeBench's and DeepCoder's
``functional`` tests) are refused with a ``ConfigError`` that says so: filter them out, or convert
them to the call style (``func_name``, ``tests``, ``reference``). LiveCodeBench's private tests are
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
from typing import Any

from trl_sandbox.sandbox import ConfigError
from trl_sandbox.tasks.io import IOTask, io_task, normalise_tests

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
    raise ConfigError(f"row {task_id!r}: {what} call a function instead of reading stdin; I/O tasks need stdin "
                      "tests. Filter such rows out, or give them in the call style (func_name, tests, reference)")


def _pairs(inputs: Sequence[Any], outputs: Sequence[Any], task_id: Any) -> list[dict[str, Any]]:
    if len(inputs) != len(outputs):
        raise ConfigError(f"row {task_id!r}: {len(inputs)} test inputs but {len(outputs)} outputs")
    return [{"input": i, "output": o} for i, o in zip(inputs, outputs)]


def _typed(tests: Sequence[Mapping[str, Any]], task_id: Any, key: str) -> list[Mapping[str, Any]]:
    for test in tests:
        kind = str(test.get(key) or "stdin").lower()
        if kind in ("functional", "function_call", "call"):
            _refuse_functional(task_id, f"its tests ({key}={kind!r})")
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
            _refuse_functional(task_id, f"its tests (fn_name={spec['fn_name']!r})")
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
        tests = _typed(_json(row.get("public_test_cases") or "[]", "public_test_cases", task_id), task_id, "testtype")
        private = row.get("private_test_cases")
        if private:
            try:
                tests += _typed(decode_livecodebench(private) if isinstance(private, str) else private, task_id, "testtype")
            except (ValueError, zlib.error, pickle.UnpicklingError, EOFError) as exc:
                raise ConfigError(f"row {task_id!r}: private_test_cases cannot be decoded: {exc}") from None
        return tests, defaults
    if layout == "verification_info":
        info = _json(row["verification_info"], "verification_info", task_id) or {}
        if info.get("language"):
            defaults["language"] = info["language"]
        return _typed(info.get("test_cases") or [], task_id, "type"), defaults
    if layout == "deepcoder":
        tests_value = _json(row["tests"], "tests", task_id)
        metadata = _json(row.get("metadata") or {}, "metadata", task_id) or {}
        if isinstance(metadata, Mapping) and metadata.get("func_name"):
            _refuse_functional(task_id, f"its tests (metadata.func_name={metadata['func_name']!r})")
        if isinstance(tests_value, Mapping):
            if tests_value.get("fn_name"):
                _refuse_functional(task_id, f"its tests (fn_name={tests_value['fn_name']!r})")
            return _pairs(tests_value.get("inputs") or [], tests_value.get("outputs") or [], task_id), defaults
        return _typed(tests_value, task_id, "testtype"), defaults
    if layout == "codeforces":
        if str(row.get("input_mode") or "stdio").lower() not in ("stdio", "stdin", ""):
            raise ConfigError(f"row {task_id!r}: input_mode={row.get('input_mode')!r}: only stdio problems are judged")
        if row.get("time_limit"):
            defaults["time_limit"] = float(row["time_limit"])
        if row.get("memory_limit"):
            defaults["memory_mb"] = int(float(row["memory_limit"]))
        if row.get("generated_checker"):
            defaults["checker"] = str(row["generated_checker"])
        return list(_json(row["official_tests"], "official_tests", task_id)), defaults
    raise ConfigError(f"row {task_id!r} is not in an I/O layout ({', '.join(['ours', *LAYOUT_COLUMNS, 'deepcoder'])})")


_CACHE: OrderedDict[str, IOTask] = OrderedDict()
_CACHE_ENTRIES = 256


def io_task_of(row: Mapping[str, Any]) -> IOTask:
    """The I/O task of ``row``, in any layout; resolved once per distinct row (rows repeat once per
    completion of a group, and a large one holds megabytes of tests)."""
    key = hashlib.sha256(repr(sorted((str(k), repr(v)) for k, v in row.items() if k != "prompt")).encode(
        "utf-8", "surrogatepass")).hexdigest()
    task = _CACHE.get(key)
    if task is not None:
        _CACHE.move_to_end(key)
        return task
    tests, defaults = tests_and_defaults(row)
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

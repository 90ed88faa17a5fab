"""The columns of an agent task's row, whatever layout it was loaded from.

=================  =====================================================================================
column             meaning
=================  =====================================================================================
``task_id``        the task's name: a Harbor or terminal-bench task directory's name, a SWE row's
                   ``instance_id``; unique in a set
``prompt``         what the agent is asked (``instruction.md``, ``task.yaml``'s ``instruction``, a SWE
                   row's ``problem_statement``)
``sandbox_task``   ``"agent"``: the task kind that grades these rows
``environment``    the prepared environment (``trl_sandbox.environments.spec``: ``files``, ``setup``,
                   ``base``, ``workdir``, ...), made from the task's Dockerfile (``agents.dockerfile``)
                   or its repository at a commit. Never holds a hidden test
``env``            ``{name: value}`` the Dockerfile's ``ENV`` set: already exported to its ``RUN``
                   steps; the agent's commands and the verifier should see them too
``tests``          the hidden tests, ``{path relative to tests_dir: text}``: carried by the row, handed
                   to the verifier only at grading time, never part of ``environment``
``tests_dir``      where the grader places ``tests``: ``/tests`` for Harbor and terminal-bench (their
                   convention), the working directory for SWE rows (the patched test files overwrite
                   the repository's own)
``verify``         the verifier's command, run by ``/bin/sh -c`` from the working directory:
                   ``bash /tests/test.sh`` (Harbor), ``bash /tests/run-tests.sh`` (terminal-bench),
                   ``python3 -m pytest -rA FILES`` (SWE rows, unless the row gives its own)
``verify_env``     ``{name: value}`` for the verifier only (Harbor's ``[verifier] env``;
                   terminal-bench's ``TEST_DIR=/tests``)
``parser``         where the verdict comes from: ``reward_file`` (Harbor: the verifier writes
                   ``/logs/verifier/reward.txt``, a number, or ``reward.json``), ``pytest`` (the
                   verifier's ``-rA`` report: every id of ``expected`` passed, or with no ``expected``
                   every reported test passed), ``exit_code`` (0 passes; the default for rows given
                   in these columns directly)
``protected``      paths relative to the working directory the agent must not change: restored from the
                   prepared environment (or from ``tests``) before grading. A SWE row's test-patch files
``expected``       test ids that must pass (SWE: ``FAIL_TO_PASS`` + ``PASS_TO_PASS``); may be empty
``agent_timeout``  seconds the agent's episode (or single-turn script) may take (default 600)
``verify_timeout`` seconds the verifier may take (default 600)
``solution``       the oracle: a bash script that solves the task when run from the working directory
                   (``solution/solve.sh``, ``solution.sh``), or ``None`` when the task ships none
``solution_files`` ``{path: text}`` other files of Harbor's ``solution/``, placed at ``/solution`` with
                   ``solve.sh`` (Harbor runs ``bash /solution/solve.sh``)
=================  =====================================================================================

``agent_rows`` gives these as Python values. In a ``datasets.Dataset`` (``load_agent_tasks``) the
map-valued columns (``MAP_COLUMNS``) are JSON text, since Arrow would otherwise merge every row's
keys into one struct; ``row_of`` reads either form back, checked.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from typing import Any

from trl_sandbox.environments.spec import parse
from trl_sandbox.sandbox import TASK_COLUMN, ConfigError

AGENT_TASK = "agent"
COLUMNS = ("task_id", "prompt", TASK_COLUMN, "environment", "env", "tests", "tests_dir", "verify", "verify_env",
           "parser", "protected", "expected", "agent_timeout", "verify_timeout", "solution", "solution_files")
MAP_COLUMNS = ("environment", "env", "tests", "verify_env", "solution_files")
PARSERS = ("reward_file", "pytest", "exit_code")
TESTS_DIR = "/tests"
REWARD_FILES = ("/logs/verifier/reward.txt", "/logs/verifier/reward.json")
LEAK_MIN_CHARS = 64  # a hidden test this long found verbatim in the environment is a leak, not a coincidence


def relative_path(path: Any, what: str) -> str:
    """``path`` normalised, or a ``ConfigError`` when it is absolute or leaves its directory."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise ConfigError(f"{what}: a path must be a non-empty string, not {path!r}")
    norm = posixpath.normpath(path)
    if norm.startswith("/") or norm in (".", "..") or norm.startswith("../"):
        raise ConfigError(f"{what}: {path!r} must be a relative path inside its directory (no leading '/', no '..')")
    return norm


def _map(value: Any, what: str, task: str) -> dict[str, str]:
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ConfigError(f"task {task}: {what} is not valid JSON ({exc}); give a dict or its JSON text") from exc
    if isinstance(value, (list, tuple)):
        value = dict(value)
    if not isinstance(value, Mapping):
        raise ConfigError(f"task {task}: {what} must be a dict, not {type(value).__name__}")
    out = {}
    for key, text in value.items():
        if text is None:
            continue  # Arrow's filler for a struct's missing keys
        if not isinstance(key, str) or not isinstance(text, str):
            raise ConfigError(f"task {task}: {what}[{key!r}] must map text to text, not {type(text).__name__}")
        out[key] = text
    return out


def _strings(value: Any, what: str, task: str) -> list[str]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)  # SWE-bench sets store FAIL_TO_PASS as JSON text
        except ValueError:
            raise ConfigError(f"task {task}: {what} must be a list of strings (or its JSON text), "
                              f"not {value[:80]!r}") from None
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"task {task}: {what} must be a list of non-empty strings")
    return list(value)


def _seconds(value: Any, what: str, task: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"task {task}: {what} must be a positive number of seconds, not {value!r}")
    return float(value)


def row_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """An agent row checked and in Python values (map columns as dicts), whatever form it came in;
    a ``ConfigError`` that names the task and the column for anything malformed."""
    task = row.get("task_id")
    if not isinstance(task, str) or not task:
        raise ConfigError(f"an agent task needs a task_id (a non-empty string), not {task!r}")
    missing = [c for c in ("prompt", "environment", "verify") if not row.get(c)]
    if missing:
        raise ConfigError(f"task {task}: missing column(s) {missing}; an agent task needs a prompt, an environment "
                          "and a verify command (see trl_sandbox.agents.columns)")
    if not isinstance(row["prompt"], (str, list)) or not isinstance(row["verify"], str):
        raise ConfigError(f"task {task}: prompt (text, or chat messages) and verify (text) are needed")
    environment = row["environment"]
    spec = parse(environment)
    if isinstance(environment, str):
        environment = json.loads(environment)
    tests = {relative_path(p, f"task {task}: tests"): t for p, t in _map(row.get("tests"), "tests", task).items()}
    tests_dir = row.get("tests_dir") or TESTS_DIR
    if not isinstance(tests_dir, str) or not tests_dir.startswith("/"):
        raise ConfigError(f"task {task}: tests_dir must be an absolute path, not {tests_dir!r}")
    parser = row.get("parser") or "exit_code"
    if parser not in PARSERS:
        raise ConfigError(f"task {task}: parser={parser!r}; use one of {', '.join(PARSERS)}")
    solution = row.get("solution") or None
    if solution is not None and not isinstance(solution, str):
        raise ConfigError(f"task {task}: solution must be the text of a bash script")
    checked = {
        "task_id": task,
        "prompt": row["prompt"],
        TASK_COLUMN: row.get(TASK_COLUMN) or AGENT_TASK,
        "environment": dict(environment),
        "env": _map(row.get("env"), "env", task),
        "tests": tests,
        "tests_dir": posixpath.normpath(tests_dir),
        "verify": row["verify"],
        "verify_env": _map(row.get("verify_env"), "verify_env", task),
        "parser": parser,
        "protected": [relative_path(p, f"task {task}: protected")
                      for p in _strings(row.get("protected"), "protected", task)],
        "expected": _strings(row.get("expected"), "expected", task),
        "agent_timeout": _seconds(row.get("agent_timeout", 600), "agent_timeout", task),
        "verify_timeout": _seconds(row.get("verify_timeout", 600), "verify_timeout", task),
        "solution": solution,
        "solution_files": _map(row.get("solution_files"), "solution_files", task),
    }
    _no_leak(task, dict(spec.files) if spec else {}, tests)
    return checked


def _no_leak(task: str, files: Mapping[str, str], tests: Mapping[str, str]) -> None:
    """A hidden test found verbatim among the environment's files would be in the agent's reach."""
    texts = {text: path for path, text in files.items() if len(text.strip()) >= LEAK_MIN_CHARS}
    for path, text in tests.items():
        if text in texts:
            raise ConfigError(f"task {task}: the hidden test {path} is also in the environment as {texts[text]}, "
                              "in the agent's reach; take it out of the environment (the Dockerfile's COPY)")


def for_dataset(row: Mapping[str, Any]) -> dict[str, Any]:
    """A checked row with its map columns as JSON text, ready for ``datasets.Dataset.from_list``."""
    out = {column: row[column] for column in COLUMNS}
    for column in MAP_COLUMNS:
        out[column] = json.dumps(row[column], sort_keys=True, ensure_ascii=False)
    return out

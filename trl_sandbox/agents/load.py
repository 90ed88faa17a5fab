"""Agent tasks from wherever they come, as checked rows or a ``datasets.Dataset`` for the trainer.

``load_agent_tasks(source, image_map=...)`` reads:

* ``"builtin"``: the built-in set (``agents.builtin_tasks``), its image mapped to ``host``;
* a Harbor task directory (``task.toml``) or a terminal-bench one (``task.yaml``), or a directory
  of such directories (other subdirectories are skipped, and logged);
* a ``.jsonl`` or ``.json`` file of rows, or a list of dicts: SWE-style rows (``repo`` and
  ``base_commit``: ``agents.swe``) or rows already in the agent columns (``agents.columns``).

Everything is read and checked at load time: a malformed task, a Dockerfile outside the supported
subset, an image the map does not resolve, or two tasks with one ``task_id`` is a ``ConfigError``
that names the task and says what to do. ``agent_rows`` gives the same rows as Python values.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from trl_sandbox.agents.builtin_tasks import BUILTIN_IMAGE_MAP, TASKS, write_builtin
from trl_sandbox.agents.columns import for_dataset, row_of
from trl_sandbox.agents.harbor import harbor_row, is_harbor_task
from trl_sandbox.agents.images import parse_image_map
from trl_sandbox.agents.swe import is_swe_row, swe_row
from trl_sandbox.agents.terminal_bench import is_terminal_bench_task, terminal_bench_row
from trl_sandbox.sandbox import ConfigError

log = logging.getLogger("trl_sandbox")
Source = str | Path | Iterable[Mapping[str, Any]]


def _task_dir(path: Path, image_map: dict[str, str], setup_network: bool) -> dict[str, Any]:
    if is_harbor_task(path):
        return harbor_row(path, image_map=image_map, setup_network=setup_network)
    return terminal_bench_row(path, image_map=image_map, setup_network=setup_network)


def _directory(path: Path, image_map: dict[str, str], setup_network: bool) -> list[dict[str, Any]]:
    if is_harbor_task(path) or is_terminal_bench_task(path):
        return [_task_dir(path, image_map, setup_network)]
    tasks, skipped = [], []
    for child in sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if is_harbor_task(child) or is_terminal_bench_task(child):
            tasks.append(_task_dir(child, image_map, setup_network))
        else:
            skipped.append(child.name)
    if not tasks:
        raise ConfigError(f"{path}: no task directories (a Harbor task has a task.toml, a terminal-bench task a "
                          "task.yaml)")
    if skipped:
        log.warning("%s: skipped %d directories that are not tasks: %s", path, len(skipped), ", ".join(skipped[:10]))
    return tasks


def _file(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".jsonl":
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        rows = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(rows, list):
        raise ConfigError(f"{path}: expected a JSON list of rows")
    return rows


def agent_rows(source: Source = "builtin", *, image_map: Mapping[str, str] | Iterable[str] | None = None,
               task_ids: Iterable[str] | None = None, setup_network: bool = False,
               binary_files: str = "error") -> list[dict[str, Any]]:
    """The rows of ``source`` (see the module's docstring), checked, in Python values.

    ``image_map``: what each task's image runs on (``agents.images``); ``task_ids``: keep only
    these (an unknown one is an error); ``setup_network``: give the environments' setup the
    network (locally; their ``RUN apt-get``/``pip install`` lines need it); ``binary_files``:
    what a SWE row does with a binary file of its repository (``error`` or ``skip``).
    """
    mapping = parse_image_map(image_map)
    if isinstance(source, str) and source == "builtin":
        with tempfile.TemporaryDirectory(prefix="trl-sandbox-builtin-") as scratch:
            write_builtin(scratch)
            rows = _directory(Path(scratch), {**BUILTIN_IMAGE_MAP, **mapping}, setup_network)
    elif isinstance(source, (str, Path)):
        path = Path(source)
        if path.is_dir():
            rows = _directory(path, mapping, setup_network)
        elif path.is_file() and path.suffix in (".jsonl", ".json"):
            rows = _file(path)
        else:
            raise ConfigError(f"{source}: not 'builtin', a task directory, a directory of them, or a .jsonl/.json "
                              f"file of rows (built-in tasks: {', '.join(TASKS)})")
    else:
        rows = list(source)
    rows = [swe_row(row, image_map=mapping, binary_files=binary_files, setup_network=setup_network)
            if is_swe_row(row) else row for row in rows]
    checked = [row_of(row) for row in rows]
    seen: set[str] = set()
    for row in checked:
        if row["task_id"] in seen:
            raise ConfigError(f"two tasks are named {row['task_id']!r}; task ids must be unique")
        seen.add(row["task_id"])
    if task_ids is not None:
        wanted = list(task_ids)
        unknown = sorted(set(wanted) - seen)
        if unknown:
            raise ConfigError(f"unknown task id(s) {unknown}; the source has {sorted(seen)[:20]}")
        checked = [row for row in checked if row["task_id"] in wanted]
    if not checked:
        raise ConfigError(f"{source!r}: no agent tasks")
    return checked


def load_agent_tasks(source: Source = "builtin", **options: Any):
    """A ``datasets.Dataset`` of agent tasks for ``SandboxGRPOTrainer`` (options: see ``agent_rows``).

    The map-valued columns (``environment``, ``env``, ``tests``, ``verify_env``,
    ``solution_files``) are JSON text in the dataset; ``columns.row_of`` reads a row back.
    """
    from datasets import Dataset

    return Dataset.from_list([for_dataset(row) for row in agent_rows(source, **options)])

"""Tasks: turn a completion into a ``Program`` and an execution into an ``Outcome``.

A task set (registered through ``trl_sandbox_register_tasks``) lists dataset rows and scores
completions for them. Rows carry ``prompt``, ``task_id`` and ``sandbox_task`` (the task set's name)
plus whatever columns the task needs; TRL hands every column to the reward function, which hands
the row back to the task. A dataset without ``sandbox_task`` is scored by the generic task
(``trl_sandbox.tasks.generic``), which reads the test columns documented there.

The verdict is computed outside the model's reach: the program only produces plain data (or a
verdict from a judge process the candidate cannot touch), and the task decides on the host.
"""

from __future__ import annotations

from typing import Any

from trl_sandbox.sandbox import TASK_COLUMN, ConfigError


def load_tasks(name: str = "builtin", validate: bool = False, **options: Any):
    """A ``datasets.Dataset`` of the task set ``name``, ready for ``SandboxGRPOTrainer``.

    ``options`` go to the task set's ``rows()`` (e.g. ``task_ids=[...]``, ``repeat=8``).
    ``validate=True`` first runs the task set's ``validate()`` self-check (its references or
    known-good solutions against its own tests, in the local sandbox) and raises ``ConfigError``
    listing the problems, so a broken task set is caught before training starts.
    """
    from datasets import Dataset

    from trl_sandbox.plugins import get_task_set

    task = get_task_set(name)
    if validate:
        check = getattr(task, "validate", None)
        problems = check() if check is not None else []
        if problems:
            listed = "\n  ".join(str(p) for p in problems[:20])
            raise ConfigError(f"task set {name!r} failed its self-check:\n  {listed}")
    rows = [dict(row, **{TASK_COLUMN: name}) for row in task.rows(**options)]
    if not rows:
        raise ConfigError(f"task set {name!r} produced no rows for options {options!r}")
    return Dataset.from_list(rows)

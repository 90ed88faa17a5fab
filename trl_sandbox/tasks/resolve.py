"""Which task scores a dataset row: the task set its ``sandbox_task`` column names, else the
generic task (the row carries its own tests).

It sits above ``tasks`` (the protocol and ``Outcome``), the plugins and ``generic_task`` so that
none of those has to import another one back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trl_sandbox.plugins import get_task_set
from trl_sandbox.sandbox import TASK_COLUMN, Task
from trl_sandbox.tasks.generic import GenericTask


def resolve_task(row: Mapping[str, Any]) -> Task:
    """The task set that scores ``row``: its ``sandbox_task`` column, else the generic task."""
    name = row.get(TASK_COLUMN)
    if name:
        return get_task_set(str(name))
    return GenericTask.check_row(row)

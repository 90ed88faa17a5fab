"""Tasks: turn a completion into a ``Program`` and an execution into an ``Outcome``.

A task set (registered through ``trl_sandbox_register_tasks``) lists dataset rows and scores
completions for them. Rows carry ``prompt``, ``task_id`` and ``sandbox_task`` (the task set's name)
plus whatever columns the task needs; TRL hands every column to the reward function, which hands
the row back to the task. A dataset without ``sandbox_task`` is scored by the generic task
(``trl_sandbox.generic_task``), which reads the test columns documented there.

The verdict is computed outside the model's reach: the program only produces plain data (or a
verdict from a judge process the candidate cannot touch), and the task decides on the host.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable

from .sandbox import ConfigError, ExecResult

Status = Literal["passed", "failed", "error", "timeout", "banned", "no_code", "infra"]
STATUSES: tuple[Status, ...] = ("passed", "failed", "error", "timeout", "banned", "no_code", "infra")

# The dataset column naming the task set that scores a row.
TASK_COLUMN = "sandbox_task"


@dataclass(frozen=True)
class Program:
    """What to run in a sandbox for one completion.

    ``nonce_on_stdin``: the runner prepends 16 fresh random bytes to ``stdin`` for every execution
    and hands the same bytes to ``Task.score``; a judge inside the sandbox signs its verdict with
    them so that the candidate's own output can never pass for a verdict. The nonce is not part of
    ``key()``, so identical programs are still deduplicated and cached.
    """

    argv: tuple[str, ...]
    stdin: bytes = b""
    files: tuple[tuple[str, bytes], ...] = ()
    timeout: float = 1.0
    nonce_on_stdin: bool = False

    def key(self, salt: str = "") -> str:
        """A hash of everything that determines the result (for dedup within a batch and caching)."""
        h = hashlib.sha256()
        for part in (salt, repr(self.timeout), repr(self.nonce_on_stdin)):
            h.update(part.encode("utf-8", "surrogatepass"))  # model text may hold lone surrogates
            h.update(b"\0")
        h.update(_argv_digest(tuple(self.argv)))
        h.update(self.stdin)
        for path, data in self.files:
            h.update(path.encode("utf-8", "surrogatepass") + b"\0")
            h.update(hashlib.sha256(data).digest())
        return h.hexdigest()


@functools.lru_cache(maxsize=64)
def _argv_digest(argv: tuple[str, ...]) -> bytes:
    """The argv's part of a program's key, kept for the argvs seen last: a judged program's argv
    is the judge's whole source, the same for every completion."""
    return hashlib.sha256(repr(argv).encode("utf-8", "surrogatepass")).digest()


@dataclass(frozen=True)
class Outcome:
    """The verdict on one completion. ``reward`` is filled in by the reward scheme."""

    status: Status
    passed: int = 0
    total: int = 0
    reward: float | None = None
    detail: str = ""
    tests: tuple[bool, ...] = field(default=(), repr=False)

    def with_reward(self, reward: float | None) -> Outcome:
        return replace(self, reward=reward)


@runtime_checkable
class Task(Protocol):
    """A task set. ``build``/``score`` receive one dataset row (a mapping of its columns).

    Optional: ``quick_score = True`` where ``score`` only reads a verdict (work linear in the
    result's size, no I/O, no decoding of the program's values, as ``judge.check_outcome``): the
    scorer then scores small results on the pool's loop instead of handing them to its thread.
    """

    name: str
    description: str

    def rows(self, **options: Any) -> list[dict[str, Any]]:
        """Dataset rows: at least ``prompt`` and ``task_id``; ``sandbox_task`` is added by ``load_tasks``."""
        ...

    def build(self, completion: str, row: Mapping[str, Any]) -> Program | Outcome:
        """A program to run, or a final ``Outcome`` (``no_code``/``banned``) without running anything."""
        ...

    def score(self, result: ExecResult, row: Mapping[str, Any], *, nonce: bytes | None) -> Outcome:
        """The outcome of ``result``; ``reward`` may be left ``None`` for the scheme to fill in."""
        ...


def load_tasks(name: str = "builtin", validate: bool = False, **options: Any):
    """A ``datasets.Dataset`` of the task set ``name``, ready for ``SandboxGRPOTrainer``.

    ``options`` go to the task set's ``rows()`` (e.g. ``task_ids=[...]``, ``repeat=8``).
    ``validate=True`` first runs the task set's ``validate()`` self-check (its references or
    known-good solutions against its own tests, in the local sandbox) and raises ``ConfigError``
    listing the problems, so a broken task set is caught before training starts.
    """
    from datasets import Dataset

    from .plugins import get_task_set

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

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


IO_INSTRUCTION = {
    "any": "in Python 3 (a ```python fenced block) or C++17 (a ```cpp fenced block)",
    "python": "in Python 3, in a ```python fenced block",
    "cpp": "in C++17, in a ```cpp fenced block",
}


def load_io_dataset(source: str, *, split: str = "train", prompt_column: str = "description",
                    language: str = "any") -> Any:
    """Competitive-programming problems as published, ready for ``SandboxGRPOTrainer``.

    ``source`` is a hub dataset id or a local ``.json``/``.jsonl``/``.parquet`` file in any layout
    the generic task reads (``trl_sandbox.tasks.io_layouts``: APPS/TACO, CodeContests,
    LiveCodeBench, ``verification_info``, DeepCoder, open-r1's Codeforces, or a ``tests`` column).
    Every row keeps its columns and gains a ``prompt`` (its ``prompt_column`` and an instruction to
    answer with a whole program in ``language``: ``any``, ``python`` or ``cpp``), a ``task_id``
    (its ``task_id``, ``name`` or ``problem_id``, else its index) and, unless ``language`` is
    ``any``, a ``language``. Rows that are not stdin/stdout problems (tests that call a function,
    none at all) are dropped, and their count logged: the prompt asks for a program.
    """
    import logging

    from datasets import load_dataset

    from trl_sandbox.tasks.io import IOTask
    from trl_sandbox.tasks.io_layouts import io_task_of

    if language not in IO_INSTRUCTION:
        raise ConfigError(f"language={language!r}: use one of {', '.join(IO_INSTRUCTION)}")
    if source.endswith((".json", ".jsonl", ".parquet")):
        rows = load_dataset("parquet" if source.endswith(".parquet") else "json", data_files=source, split="train")
    else:
        rows = load_dataset(source, split=split)
    if prompt_column not in rows.column_names:
        raise ConfigError(f"prompt_column={prompt_column!r} is not a column of {source} "
                          f"(columns: {', '.join(rows.column_names)})")
    instruction = ("\n\nWrite a complete program that reads the input from standard input and writes the answer "
                   f"to standard output, {IO_INSTRUCTION[language]}.\n")

    def prepare(row: dict, index: int) -> dict:
        extra = {"prompt": str(row[prompt_column]) + instruction,
                 "task_id": str(row.get("task_id") or row.get("name") or row.get("problem_id") or index)}
        if language != "any":
            extra["language"] = language
        return extra

    def judged_on_stdin(row: dict) -> bool:
        try:
            return isinstance(io_task_of(row), IOTask)
        except ConfigError:
            return False

    prepared = rows.map(prepare, with_indices=True)
    kept = prepared.filter(judged_on_stdin)
    if len(kept) < len(prepared):
        logging.getLogger("trl_sandbox").warning("%s: dropped %d of %d rows that are not stdin/stdout problems",
                                                 source, len(prepared) - len(kept), len(prepared))
    if not len(kept):
        raise ConfigError(f"{source}: no row has stdin/stdout tests in a layout trl-sandbox reads")
    return kept

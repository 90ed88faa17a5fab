"""Scorer: completions and dataset rows in, ``Outcome``s out.

It is the one path from a completion to a reward, shared by ``SandboxReward`` (training) and
``trl-sandbox evaluate``: resolve the row's task, build the program (or stop early on banned or
missing code), run each distinct program once (a GRPO group repeats itself a lot), score every
row on the host, apply the reward scheme. Infrastructure failures become ``status="infra"``,
``reward=None``: never a code failure.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
import pickle
import sys
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from trl_sandbox.environments.spec import row_environment
from trl_sandbox.judge.content_guard import build_guarded, score_guarded
from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.sandbox import ConfigError, ExecResult, Outcome, Program, Task
from trl_sandbox.scoring.clip import clip_text
from trl_sandbox.scoring.schemes import RewardScheme, get_scheme
from trl_sandbox.tasks.resolve import resolve_task

NONCE_BYTES = 16
AGENT_MARGIN_S = 60.0  # an agent sample's two leases and its changes, beyond its row's own time budgets


@dataclass
class ScoreStats:
    """What one ``ascore`` call did, for metrics."""

    outcomes: Counter = field(default_factory=Counter)
    programs: int = 0  # distinct programs needed
    executed: int = 0  # actually run (not deduplicated or cached)
    cache_hits: int = 0
    seconds: float = 0.0


# How much of the host's memory program output may hold beyond the one call that scores it.
#: Default byte budget of ``ResultCache`` (``SandboxGRPOConfig.sandbox_cache_bytes``).
CACHE_BYTES = 64 << 20
#: A result at most this large (stdout and stderr, as the host holds them) is cached whole and
#: scored again on a hit; a larger one is reduced to the outcomes it was scored as.
CACHE_RESULT_BYTES = 64 << 10
#: The most UTF-8 bytes of an ``Outcome.detail`` the scorer hands on (metrics, logs, results files,
#: episodes' observations); the rest is cut with a marker.
DETAIL_BYTES = 4 << 10
# What an entry costs besides its text: the entry, its key, the result or outcome objects.
_ENTRY_OVERHEAD = 512


def clip_detail(outcome: Outcome) -> Outcome:
    """``outcome`` with its detail clipped to ``DETAIL_BYTES`` (the outcome itself unchanged)."""
    detail = outcome.detail
    if len(detail) <= DETAIL_BYTES // 4:
        return outcome
    clipped = clip_text(str(detail), DETAIL_BYTES)
    return outcome if clipped is detail else replace(outcome, detail=clipped)


def result_bytes(result: ExecResult) -> int:
    """The host memory ``result``'s output holds (a str of non-ASCII text costs 2 or 4 bytes a character)."""
    return sys.getsizeof(result.stdout) + sys.getsizeof(result.stderr)


def row_fingerprint(row: Mapping[str, Any]) -> bytes | None:
    """What identifies a dataset row for the cache's outcomes: a digest of its pickle, or ``None``
    when it does not pickle (then nothing is cached for it). Two rows that pickle alike score alike."""
    try:
        return hashlib.sha256(pickle.dumps(dict(row), protocol=4)).digest()
    except Exception:
        return None


@dataclass
class CachedResult:
    """What the cache keeps of one program's run.

    ``result`` is the whole ``ExecResult`` where it is small (a hit scores it again, exactly as the
    first time); ``None`` where it was large: then ``outcomes`` holds, for each row it was scored
    for (by ``row_fingerprint``), the final outcome (reward applied, detail clipped), computed from
    the whole result before any of it was dropped. A hit for a row not among them is a miss.
    """

    result: ExecResult | None
    nonce: bytes | None
    outcomes: dict[bytes, Outcome] = field(default_factory=dict)
    size: int = 0


class ResultCache:
    """LRU of execution results keyed by ``Program.key`` (salted with the provider and limits),
    bounded in entries (``max_entries``) and in bytes (``max_bytes``).

    Only conclusive results are cached: infrastructure failures and timeouts (which a loaded
    machine can produce spuriously) are always run again. A result larger than ``max_result_bytes``
    is not kept: its outcomes are (see ``CachedResult``), so that a program that floods its output
    (a debug print in a loop, 16 MiB of undecodable bytes) costs the host a few hundred bytes per
    entry, not the 32 MiB its decoded streams took.
    """

    def __init__(self, max_entries: int = 4096, max_bytes: int = CACHE_BYTES,
                 max_result_bytes: int = CACHE_RESULT_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_result_bytes = max_result_bytes
        self.bytes = 0
        self._entries: OrderedDict[str, CachedResult] = OrderedDict()

    def get(self, key: str) -> CachedResult | None:
        hit = self._entries.get(key)
        if hit is not None:
            self._entries.move_to_end(key)
        return hit

    def keeps_whole(self, result: ExecResult) -> bool:
        """Whether ``result`` would be kept whole (else only the outcomes scored from it)."""
        return result_bytes(result) <= min(self.max_result_bytes, self.max_bytes)

    def put(self, key: str, result: ExecResult, nonce: bytes | None,
            outcomes: Mapping[bytes, Outcome] | None = None) -> None:
        """Keep ``result`` whole if it is small, else ``outcomes`` (row fingerprint -> final outcome)."""
        if self.max_entries <= 0 or self.max_bytes <= 0 or result.timed_out:
            return
        if self.keeps_whole(result):
            entry = CachedResult(result, nonce, size=_ENTRY_OVERHEAD + result_bytes(result))
        else:
            if not outcomes:
                return
            earlier = self._entries.get(key)
            kept = dict(earlier.outcomes) if earlier is not None and earlier.result is None else {}
            kept.update((fp, clip_detail(o)) for fp, o in outcomes.items())
            size = _ENTRY_OVERHEAD + sum(_ENTRY_OVERHEAD + sys.getsizeof(o.detail) + 8 * len(o.tests)
                                         for o in kept.values())
            entry = CachedResult(None, None, kept, size)
        if entry.size > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old.size
        self._entries[key] = entry
        self.bytes += entry.size
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            _, dropped = self._entries.popitem(last=False)
            self.bytes -= dropped.size

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
        cache_bytes: int = CACHE_BYTES,
    ) -> None:
        """``timeout`` (e.g. ``SandboxGRPOConfig.sandbox_timeout``) is handed to tasks as the row's ``timeout``
        column unless the row sets its own. ``cache_size`` and ``cache_bytes`` bound the result cache
        in entries and in bytes (``sandbox_cache_size``, ``sandbox_cache_bytes``)."""
        self.pool = pool
        self.scheme = get_scheme(scheme)
        self._use_task_scheme = scheme == "task"
        self.cache = ResultCache(cache_size, cache_bytes)
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
        agents: list[asyncio.Future] = []
        agent_rows: list[int] = []

        def final(i: int, outcome: Outcome) -> Outcome:
            # The reward comes from the whole outcome; only then is its detail clipped, so that
            # what the host keeps (metrics, logs, results files, the cache) is bounded.
            if outcome.reward is None and outcome.status != "infra":
                outcome = outcome.with_reward(self._reward(tasks[i], outcome))
            return clip_detail(outcome)

        def finish(i: int, outcome: Outcome) -> None:
            outcomes[i] = outcome = final(i, outcome)
            stats.outcomes[outcome.status] += 1
            if on_result is not None:
                on_result(i, outcome)

        for i, (completion, row) in enumerate(zip(completions, rows)):
            if self.timeout is not None and row.get("timeout") is None:
                # The row's ``timeout`` is how a task learns its time limit (the judge inside the
                # program enforces it per call; the sandbox adds a margin around the program).
                row = rows_for_score[i] = {**row, "timeout": self.timeout}
            task = tasks[i] = resolve_task(row)
            if callable(getattr(task, "arun", None)):  # an agent task: actions, then its own grading
                agent_rows.append(i)
                agents.append(asyncio.ensure_future(self._run_agent(task, i, completion_text(completion), row, finish)))
                continue
            built = build_guarded(task, completion_text(completion), row)
            if isinstance(built, Outcome):
                finish(i, built)
                continue
            try:  # the row's prepared environment: the program runs in its own copy of it
                environment = row_environment(row)
            except ConfigError as exc:
                finish(i, Outcome("infra", detail=f"the row's environment is malformed: {exc}"))
                continue
            if environment is not None:
                built = replace(built, environment=environment)
            key = built.key(self._salt)
            by_key.setdefault(key, (built, []))[1].append(i)

        stats.programs = len(by_key)

        async def run_one(key: str, program: Program, indices: list[int]) -> None:
            hit = self.cache.get(key)
            if hit is not None and hit.result is None:
                # A large result was reduced to its outcomes: a hit needs every row's.
                prints = [row_fingerprint(rows_for_score[i]) for i in indices]
                if all(p is not None and p in hit.outcomes for p in prints):
                    stats.cache_hits += 1
                    for i, p in zip(indices, prints):
                        finish(i, hit.outcomes[p])  # type: ignore[index]
                    return
                hit = None
            if hit is not None:
                stats.cache_hits += 1
                result, nonce = hit.result, hit.nonce
                assert result is not None
            else:
                nonce = os.urandom(NONCE_BYTES) if program.nonce_on_stdin else None
                stdin = program.stdin
                if nonce is not None:
                    stdin = nonce + stdin
                try:
                    result = await self.pool.aexec(
                        program.argv, stdin=stdin, timeout=program.timeout, files=program.files,
                        environment=program.environment,
                    )
                except Exception as exc:
                    for i in indices:
                        finish(i, Outcome("infra", detail=f"{type(exc).__name__}: {exc}"))
                    return
                stats.executed += 1
            # Decoding and comparing what a program returned is host work on model-controlled
            # data: it runs on a worker thread, so a crafted result cannot stall the pool's loop.
            group, group_rows = [tasks[i] for i in indices], [rows_for_score[i] for i in indices]
            if _quick(group, result):
                scored = _score_all(group, result, group_rows, nonce)
            else:
                loop = asyncio.get_running_loop()
                scored = await loop.run_in_executor(self._executor, _score_all, group, result, group_rows, nonce)
            scored = [final(i, outcome) for i, outcome in zip(indices, scored)]
            if hit is None:
                if self.cache.keeps_whole(result):
                    self.cache.put(key, result, nonce)
                elif all(o.status != "infra" for o in scored):
                    # Scored from the whole result above; only these outcomes are kept.
                    prints = [row_fingerprint(r) for r in group_rows]
                    if all(p is not None for p in prints):
                        self.cache.put(key, result, nonce, dict(zip(prints, scored)))  # type: ignore[arg-type]
            del result  # a flood's decoded output leaves the host with this call, not with the cache
            for i, outcome in zip(indices, scored):
                finish(i, outcome)

        jobs = [asyncio.ensure_future(run_one(k, p, idx)) for k, (p, idx) in by_key.items()] + agents
        if agents and deadline_s is not None:
            deadline_s = max(deadline_s, self._agent_deadline([rows_for_score[i] for i in agent_rows]))
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

    def _agent_deadline(self, rows: Sequence[Mapping[str, Any]]) -> float:
        """Time enough for every agent sample to get its own verdict, the pool running them one
        wave after another: otherwise an agent that only stalls until the call's deadline would
        score ``None`` (left out of the group) instead of its failure."""
        budget = max(float(row.get("agent_timeout") or 600) + float(row.get("verify_timeout") or 600) for row in rows)
        waves = math.ceil(len(rows) / max(1, int(getattr(self.pool, "size", 1) or 1)))
        return waves * (budget + AGENT_MARGIN_S)

    async def _run_agent(self, task: Any, i: int, completion: str, row: Mapping[str, Any],
                         finish: Callable[[int, Outcome], None]) -> None:
        """An agent task's sample (``agents.task.AgentTask.arun``): never raises."""
        try:
            outcome = await task.arun(self.pool, completion, row)
        except Exception as exc:  # a failed setup, a lost sandbox, a malformed row: never the model's
            outcome = Outcome("infra", detail=f"{type(exc).__name__}: {exc}")
        finish(i, outcome)

    def reward(self, task: Task | None, outcome: Outcome) -> float | None:
        """The reward scheme's value for ``outcome`` (``None`` for ``infra``)."""
        return None if outcome.status == "infra" else self._reward(task, outcome)

    def _reward(self, task: Task | None, outcome: Outcome) -> float | None:
        task_scheme = getattr(task, "reward_scheme", None) if self._use_task_scheme else None
        return (task_scheme or self.scheme)(outcome)

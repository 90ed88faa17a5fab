"""What a flooding program leaves in the host's memory: a bounded amount, whatever the count.

A completion may write 16 MiB of undecodable bytes to stderr (a debug print in a loop does it)
and still return the right answer. Decoded, that is 32 MiB of ``str`` on the host; a result cache
that kept it whole for each of its 4,096 entries would hold 130 GB. These tests run such
completions through the public ``Scorer`` on the real local sandbox and measure the host's Python
heap with ``tracemalloc`` after the outcomes are dropped; the control measures the same way with
a cache told to keep results whole, and sees the growth.
"""

from __future__ import annotations

import gc
import threading
import tracemalloc

import pytest

from trl_sandbox import load_tasks
from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.sandbox import ExecResult, Outcome
from trl_sandbox.scoring.clip import clip_text
from trl_sandbox.scoring.scorer import (
    CACHE_RESULT_BYTES,
    DETAIL_BYTES,
    ResultCache,
    Scorer,
)

MIB = 1 << 20

_SOLVE = (
    "    best = cur = xs[0]\n"
    "    for x in xs[1:]:\n"
    "        cur = max(x, cur + x)\n"
    "        best = max(best, cur)\n"
    "    return best\n"
)


def _flood(tag: int, mib: int = 16, answer: str = _SOLVE) -> str:
    """A right answer that first writes ``mib`` MiB of bytes that are not UTF-8 to stderr (once)."""
    return (
        "    import os\n"
        "    if not globals().get('_flooded'):\n"
        "        globals()['_flooded'] = True\n"
        f"        os.write(2, b'\\xff' * ({mib} << 20))  # program {tag}\n" + answer
    )


@pytest.fixture(scope="module")
def row():
    return dict(load_tasks("builtin", task_ids=["max_subarray"])[0])


def _growth(scorer: Scorer, row, tags: range) -> tuple[float, list[Outcome]]:
    """Heap bytes the host still holds after scoring ``tags``' floods (two at a time), outcomes dropped."""
    seen: list[Outcome] = []
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for k in range(tags.start, tags.stop, 2):
            batch = [_flood(t) for t in range(k, min(k + 2, tags.stop))]
            outcomes = scorer.score(batch, [row] * len(batch))
            seen.extend(Outcome(o.status, o.passed, o.total, o.reward, o.detail[:100]) for o in outcomes)
            del outcomes
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - base, seen
    finally:
        tracemalloc.stop()


def test_many_distinct_flooding_completions_leave_a_bounded_host_heap(row):
    """40 distinct passing programs, 16 MiB of stderr each: the cache keeps their outcomes, not their
    output. Control: the same measurement with a cache that keeps every result whole (the old
    ``ResultCache``) sees 32 MiB per program."""
    count, control_count = 40, 6
    with SandboxPool.open("local", size=2) as pool:
        scorer = Scorer(pool)
        scorer.score([_flood(-1)], [row])  # the pool's and the judge's one-time allocations
        growth, outcomes = _growth(scorer, row, range(count))
        assert len(scorer.cache) == count + 1 and scorer.cache.bytes < 1 * MIB

        old = Scorer(pool)
        old.cache = ResultCache(4096, max_bytes=1 << 60, max_result_bytes=1 << 60)  # whole results, as before
        old.score([_flood(-1)], [row])
        control, control_outcomes = _growth(old, row, range(1000, 1000 + control_count))
    assert [(o.status, o.reward) for o in outcomes + control_outcomes] == [("passed", 1.0)] * (count + control_count)
    assert growth < 4 * MIB, f"{growth / MIB:.1f} MiB kept after {count} floods"
    assert control > control_count * 30 * MIB, f"control: only {control / MIB:.1f} MiB kept"


def test_a_cache_hit_on_a_flood_gives_exactly_the_fresh_outcome_and_reward(row):
    """Outcomes are computed from the whole result before anything is dropped: a hit, a fresh run
    and an uncached scorer agree on status, tests, reward and detail, for a pass and for a failure
    whose exception message is 2 MiB long."""
    wrong = "    import os\n    os.write(2, b'\\xfe' * (16 << 20))\n    raise ValueError('x' * (2 << 20))\n"
    completions = [_flood(7), wrong]
    with SandboxPool.open("local", size=2) as pool:
        scorer = Scorer(pool)
        first, stats1 = pool.loop.run(scorer.ascore(completions, [row, row]))
        again, stats2 = pool.loop.run(scorer.ascore(completions, [row, row]))
        fresh = Scorer(pool, cache_size=0).score(completions, [row, row])
    assert stats1.executed == 2 and stats2.executed == 0 and stats2.cache_hits == 2
    assert first == again == fresh
    assert (first[0].status, first[0].reward, first[0].passed) == ("passed", 1.0, 7)
    assert first[1].status == "error" and first[1].reward == -1.0
    assert all(scorer.cache.get(k).result is None for k in list(scorer.cache._entries))  # outcomes only


def test_a_hit_for_another_row_runs_the_program_again(row, flaky_provider):
    """A large result's cached outcomes belong to the rows they were scored for: a row that scores
    the same program differently (the echo task's ``expected``) never gets another row's verdict."""
    big = f"'x' * {CACHE_RESULT_BYTES * 2}"

    def echo(expected):
        return [{"prompt": "p", "sandbox_task": "echo", "task_id": "big", "expected": expected}]

    with SandboxPool.open(flaky_provider(), size=1) as pool:
        scorer = Scorer(pool)
        (right,) = scorer.score([big], echo("x" * CACHE_RESULT_BYTES * 2))
        (wrong,), stats = pool.loop.run(scorer.ascore([big], echo("y")))
    assert right.status == "passed" and wrong.status == "failed"
    assert stats.executed == 1 and stats.cache_hits == 0


def test_the_cache_is_bounded_in_bytes_as_well_as_entries():
    """Small results are kept whole, evicted oldest first once their bytes pass ``max_bytes``."""
    cache = ResultCache(max_entries=1000, max_bytes=200_000, max_result_bytes=50_000)
    for i in range(100):
        cache.put(f"k{i}", ExecResult(0, stdout="a" * 40_000), None)
    assert cache.bytes <= 200_000 and 3 <= len(cache) <= 5
    assert cache.get("k99") is not None and cache.get("k0") is None
    unbounded_entries = ResultCache(max_entries=1000, max_bytes=1 << 60, max_result_bytes=1 << 60)  # control
    for i in range(100):
        unbounded_entries.put(f"k{i}", ExecResult(0, stdout="a" * 40_000), None)
    assert len(unbounded_entries) == 100 and unbounded_entries.bytes > 4_000_000


@pytest.mark.parametrize("text", [
    "a" * 100_000,
    "é" * 100_000,
    "\ufffd" * 50_000 + "😀" * 50_000,
    "x😀" * 40_000,
    "\udcff" * 60_000 + "b",  # lone surrogates, as a provider's surrogateescape decoding leaves them
])
def test_clip_text_keeps_head_and_tail_whole_characters_and_says_what_it_cut(text):
    limit = 4096
    clipped = clip_text(text, limit)
    data = clipped.encode("utf-8", "surrogatepass")
    assert len(data) <= limit
    total = len(text.encode("utf-8", "surrogatepass"))
    head, _, rest = clipped.partition("\n... [")
    cut, _, tail = rest.partition(" bytes cut] ...\n")
    assert text.startswith(head) and text.endswith(tail) and len(head) > 0 and len(tail) > 0
    kept = len(head.encode("utf-8", "surrogatepass")) + len(tail.encode("utf-8", "surrogatepass"))
    assert int(cut) == total - kept  # the marker counts exactly what is missing
    assert clip_text(clipped, limit) == clipped  # clipping twice changes nothing
    assert clip_text(text[:500], limit) == text[:500]  # what fits is left alone


def test_an_outcome_detail_is_clipped_after_the_reward_is_computed(flaky_provider, monkeypatch):
    """A task may put a whole stream into ``detail``: what the host keeps is clipped, but the
    reward scheme sees the whole outcome first."""
    from trl_sandbox.plugins import get_task_set

    task = get_task_set("echo")

    def score(self, result, row, *, nonce=None):
        return Outcome("failed", 0, 1, detail=result.stdout)

    monkeypatch.setattr(type(task), "score", score)
    seen = []
    lock = threading.Lock()

    def scheme(outcome):
        with lock:
            seen.append(len(outcome.detail))
        return 0.5

    rows = [{"prompt": "p", "sandbox_task": "echo", "task_id": "big", "expected": "?"}]
    with SandboxPool.open(flaky_provider(), size=1) as pool:
        (outcome,) = Scorer(pool, scheme=scheme, cache_size=0).score(["'é' * 1_000_000"], rows)
    assert seen and seen[0] >= 1_000_000  # the scheme read the whole detail
    assert outcome.reward == 0.5 and len(outcome.detail.encode()) <= DETAIL_BYTES
    assert "bytes cut] ..." in outcome.detail

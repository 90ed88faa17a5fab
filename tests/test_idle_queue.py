"""The pool's idle sandboxes: first come, first served; no sandbox lost to a cancelled or timed-out
job; a pool that can make no sandbox wakes every waiting job at once."""

from __future__ import annotations

import asyncio

import pytest

from trl_sandbox.pool.idle_queue import IdleQueue


def run(coro):
    return asyncio.run(coro)


def test_waiting_jobs_are_served_in_the_order_they_came():
    async def main():
        q: IdleQueue[str] = IdleQueue()
        got: list[tuple[int, str]] = []

        async def job(i):
            got.append((i, await q.get(5)))

        jobs = [asyncio.ensure_future(job(i)) for i in range(3)]
        await asyncio.sleep(0)
        for item in ("a", "b", "c"):
            q.put_nowait(item)
        await asyncio.gather(*jobs)
        return got, q.empty()

    got, empty = run(main())
    assert sorted(got) == [(0, "a"), (1, "b"), (2, "c")]
    assert empty  # each item went to a waiter, none was left idle


def test_an_idle_item_is_taken_without_waiting_and_kept_when_nobody_waits():
    async def main():
        q: IdleQueue[str] = IdleQueue()
        q.put_nowait("x")
        assert not q.empty()
        return await q.get(0.01), q.empty(), await q.get(0.01)

    assert run(main()) == ("x", True, None)  # the second get times out: None


def test_a_cancelled_job_does_not_lose_the_item_it_was_handed():
    async def main():
        q: IdleQueue[str] = IdleQueue()
        first = asyncio.ensure_future(q.get(5))
        second = asyncio.ensure_future(q.get(5))
        await asyncio.sleep(0)
        q.put_nowait("a")  # handed to the first waiter...
        first.cancel()  # ...which is cancelled before it runs again
        with pytest.raises(asyncio.CancelledError):
            await first
        return await second

    assert run(main()) == "a"


def test_a_cancelled_waiter_is_skipped():
    async def main():
        q: IdleQueue[str] = IdleQueue()
        first = asyncio.ensure_future(q.get(5))
        second = asyncio.ensure_future(q.get(5))
        await asyncio.sleep(0)
        first.cancel()
        await asyncio.sleep(0)
        q.put_nowait("a")
        return await second, first.cancelled()

    assert run(main()) == ("a", True)


def test_a_timed_out_waiter_gives_none_and_the_next_item_stays_idle():
    async def main():
        q: IdleQueue[str] = IdleQueue()
        assert await q.get(0.01) is None
        q.put_nowait("a")  # the timed-out waiter is gone: the item stays for the next job
        return q.empty(), await q.get(0.01)

    assert run(main()) == (False, "a")


def test_failure_wakes_every_waiting_job_and_later_ones_until_cleared():
    async def main():
        q: IdleQueue[str] = IdleQueue()
        jobs = [asyncio.ensure_future(q.get(30)) for _ in range(3)]
        await asyncio.sleep(0)
        q.fail()
        woken = await asyncio.wait_for(asyncio.gather(*jobs), 5)
        at_once = await asyncio.wait_for(q.get(30), 5)  # failed: no waiting at all
        q.clear_failed()
        q.put_nowait("b")
        return woken, at_once, await q.get(1)

    assert run(main()) == ([None, None, None], None, "b")

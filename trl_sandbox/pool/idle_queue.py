"""The pool's idle sandboxes, handed to waiting jobs in the order the jobs came.

``asyncio.Queue`` plus an event for "no sandbox is left" made every job that had to wait start two
tasks and an ``asyncio.wait``; a scorer queues a whole batch of programs behind a few sandboxes,
so nearly every job waits, and that bookkeeping was a sizeable part of the host's CPU per job. Here
a waiting job is one future: a sandbox that comes back is set on the first live one directly.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

from trl_sandbox.pool.loop import within

T = TypeVar("T")


class IdleQueue(Generic[T]):
    """Idle items (sandboxes), and the jobs waiting for one, both first in, first out.

    ``fail()`` marks that none is left and none can be made: every waiting job wakes (with
    ``None``) to see why, as does every job that starts waiting until ``clear_failed()``."""

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._waiters: deque[asyncio.Future[T | None]] = deque()
        self.failed = False

    def empty(self) -> bool:
        return not self._items

    def get_nowait(self) -> T:
        """The oldest idle item (``IndexError`` when there is none)."""
        return self._items.popleft()

    def put_nowait(self, item: T) -> None:
        """Hand ``item`` to the longest-waiting job, or keep it idle."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(item)
                return
        self._items.append(item)

    def fail(self) -> None:
        self.failed = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def clear_failed(self) -> None:
        self.failed = False

    async def get(self, timeout: float) -> T | None:
        """An idle item, waiting up to ``timeout`` seconds for one; ``None`` on failure or timeout."""
        if self._items:
            return self._items.popleft()
        if self.failed:
            return None
        waiter: asyncio.Future[T | None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await within(waiter, timeout)
        except asyncio.TimeoutError:
            if waiter.done() and not waiter.cancelled():  # handed one just as the time ran out
                return waiter.result()
            waiter.cancel()
            return None
        except BaseException:  # cancelled: an item already handed over goes back, not astray
            if waiter.done() and not waiter.cancelled() and waiter.result() is not None:
                self.put_nowait(waiter.result())  # type: ignore[arg-type]
            waiter.cancel()
            raise

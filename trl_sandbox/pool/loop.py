"""A private asyncio event loop on a daemon thread.

The trainer is synchronous and TRL runs async rewards on *its* loop, which exists only when some
reward is async at construction. The pool needs a loop whose life it controls (the CLI has no
trainer at all), so it owns one. Coroutines from any thread or loop are handed over with
``submit``/``run``/``wrap``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sys
import threading
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], seconds: float) -> T:
    """``await awaitable``, cancelled with ``asyncio.TimeoutError`` after ``seconds``.

    ``asyncio.wait_for`` runs its argument as a task of its own (before Python 3.12), a few
    scheduling rounds per call; the pool bounds every exec and every reset, and on a fast local
    sandbox that bookkeeping was a sizeable part of the host's CPU per job. ``asyncio.timeout``
    (3.11+) cancels the awaiting task itself, with no new task."""
    if sys.version_info < (3, 11):
        return await asyncio.wait_for(awaitable, seconds)
    async with asyncio.timeout(seconds):
        return await awaitable


class LoopThread:
    def __init__(self, name: str = "trl-sandbox-loop") -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._started = threading.Event()
        self._thread.start()
        self._started.wait()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._started.set)
        self.loop.run_forever()
        # Let cancelled tasks unwind before the loop is closed.
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self.loop.is_closed()

    def in_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if os.getpid() != self.pid:
            # A forked child has a copy of the loop but not its thread: the job would wait forever.
            coro.close()
            raise RuntimeError(
                f"this sandbox pool belongs to process {self.pid}; a forked child cannot use it (its event-loop "
                "thread does not survive the fork). Create the pool in the child, or start children with the "
                "'spawn' method (a pickled SandboxReward builds its own pool there)"
            )
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on this loop from a *different* thread and wait for its result."""
        if self.in_loop():
            coro.close()
            raise RuntimeError("LoopThread.run() called from its own loop; await the coroutine instead")
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except (concurrent.futures.TimeoutError, KeyboardInterrupt):
            future.cancel()
            raise

    async def wrap(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on this loop from any other running loop (or directly if already on it)."""
        if self.in_loop():
            return await coro
        return await asyncio.wrap_future(self.submit(coro))

    def stop(self, timeout: float = 10.0) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

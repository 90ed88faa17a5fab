"""A create limiter shared by every training process of one machine.

Sandbox services cap creates per second and creates in flight per account (Daytona, Modal: a
few tens per second). Each rank of an ``accelerate launch`` has its own pool, so 8 ranks x 16
sandboxes start 128 creates at the same instant and trip the vendor's rate limit, and the
resulting 429 storm delays everyone. A per-process semaphore cannot see the other ranks; this
limiter coordinates them through files under one directory, with ``flock``:

* **rate**: a file holds the time of the next free start slot; a create takes the slot under an
  exclusive lock and moves it on by ``1 / rate`` s, then waits for its slot (outside the lock).
* **concurrency**: ``concurrent`` slot files; a create holds an exclusive lock on one of them for
  as long as it runs. The kernel drops the lock when its holder exits, so a SIGKILLed rank never
  leaks a slot.

Blocking file calls run in worker threads, so the pool's event loop never blocks. The state is
keyed by name (the provider's), so different services do not throttle each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import AsyncIterator

from trl_sandbox.sandbox import ConfigError


def default_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"trl-sandbox-limits-{os.getuid()}")


class HostLimiter:
    """Host-wide limits on sandbox creates for one provider ``name``."""

    def __init__(self, name: str, rate_per_s: float | None = None, concurrent: int | None = None,
                 directory: str | None = None) -> None:
        if rate_per_s is not None and not rate_per_s > 0:
            raise ConfigError(f"host create rate must be a positive number per second, got {rate_per_s!r}")
        if concurrent is not None and (not isinstance(concurrent, int) or concurrent < 1):
            raise ConfigError(f"host create concurrency must be a whole number of at least 1, got {concurrent!r}")
        self.name = "".join(c if c.isalnum() or c in "-_." else "-" for c in name) or "provider"
        self.rate_per_s = rate_per_s
        self.concurrent = concurrent
        self.directory = directory or default_dir()
        os.makedirs(self.directory, mode=0o700, exist_ok=True)

    def _path(self, suffix: str) -> str:
        return os.path.join(self.directory, f"{self.name}.{suffix}")

    def _take_rate_slot(self) -> float:
        """Reserve the next start time (``time.time()`` scale) and return it."""
        assert self.rate_per_s is not None
        fd = os.open(self._path("rate"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.pread(fd, 64, 0).decode(errors="replace").strip()
            try:
                next_free = float(raw)
            except ValueError:
                next_free = 0.0
            now = time.time()
            slot = max(now, next_free)
            data = f"{slot + 1.0 / self.rate_per_s:.6f}".encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            return slot
        finally:
            os.close(fd)  # closing drops the lock

    def _try_concurrency_slot(self) -> int | None:
        assert self.concurrent is not None
        for i in range(self.concurrent):
            fd = os.open(self._path(f"slot{i}"), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                os.close(fd)
        return None

    @contextlib.asynccontextmanager
    async def create_slot(self) -> AsyncIterator[float | None]:
        """Hold one create's place: wait for a free concurrency slot and a rate slot.

        Yields the start time reserved by the rate limit (``time.time()`` scale), or None."""
        fd = None
        if self.concurrent is not None:
            wait = 0.005
            while (fd := await asyncio.to_thread(self._try_concurrency_slot)) is None:
                await asyncio.sleep(wait)
                wait = min(wait * 2, 0.1)
        try:
            slot = None
            if self.rate_per_s is not None:
                slot = await asyncio.to_thread(self._take_rate_slot)
                delay = slot - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            yield slot
        finally:
            if fd is not None:
                os.close(fd)

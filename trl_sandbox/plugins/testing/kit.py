"""What every conformance check shares: a fast pool's settings, byte-exact stdin, and small
async helpers."""


from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from trl_sandbox.pool.sandbox_pool import PoolSettings
from trl_sandbox.sandbox import ExecResult, Provider, SandboxSpec

T = TypeVar("T")
ProviderFactory = Callable[[], Provider]

# Short back-offs and deadlines for a pool against a local fake; no health checks during a test.
FAST = PoolSettings(backoff_initial_s=0.05, backoff_max_s=0.2, lease_timeout_s=20.0, create_timeout_s=20.0,
                    destroy_timeout_s=10.0, health_interval_s=3600.0)
# Every byte value, CR/LF, a NUL, shell syntax and quotes, invalid UTF-8: stdin must arrive byte-exact.
STDIN = bytes(range(256)) * 4 + b"\r\n\n$(touch /tmp/pwned)\x00EOF\n'\"`" + b"\xff" * 3
_BOTH = ("import sys\nfor i in range(3):\n    print(i, flush=True); print(f'e{i}', file=sys.stderr, flush=True)\n"
         "sys.stdout.write('tail é'); sys.stderr.write('bad3'); sys.exit(5)")
_DIGEST = ("import hashlib, sys; data = sys.stdin.buffer.read(); "
           "print(len(data), hashlib.sha256(data).hexdigest()); print('to stderr', file=sys.stderr); sys.exit(3)")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def closing(provider: Provider, coro: Awaitable[T]) -> T:
    """Await ``coro``, then close ``provider`` whatever happened."""
    try:
        return await coro
    finally:
        await provider.aclose()


def _digest_line(data: bytes) -> str:
    return f"{len(data)} {hashlib.sha256(data).hexdigest()}\n"


async def _raises(exc_type: type[BaseException], awaitable: Awaitable[Any]) -> BaseException:
    """The ``exc_type`` that ``awaitable`` raised; AssertionError if it returned (other errors propagate)."""
    try:
        await awaitable
    except exc_type as exc:
        return exc
    raise AssertionError(f"{exc_type.__name__} was not raised")


async def run_programs(make: ProviderFactory, *programs: list[str], spec: SandboxSpec | None = None,
                       timeout: float = 10, reset: bool = True) -> list[ExecResult]:
    """Each of ``programs`` in turn on one new sandbox (a reset after each when ``reset``); their
    results. The provider is closed after."""
    p = make()

    async def go() -> list[ExecResult]:
        sandbox = await p.create(spec or SandboxSpec())
        out = []
        for argv in programs:
            out.append(await sandbox.exec(argv, timeout=timeout))
            if reset:
                await sandbox.reset()
        return out

    return await closing(p, go())

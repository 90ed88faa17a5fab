"""SandboxPool: a warm pool of sandboxes with leases, retries, health checks and certain teardown.

The failure modes it exists for: a sandbox that dies or stops answering is replaced rather than
failing training; infrastructure errors are retried with backoff (honouring ``Retry-After``) and
reported as such, never as wrong code; every provider call has a deadline so a reward call cannot
hang; ``close()`` destroys everything the pool created, and a final sweep by run tags catches
sandboxes whose ``create`` timed out after the provider had already made them.

This module is the leasing half (who gets which sandbox, and what a job's failure means for the
sandbox it ran on); ``pool/heal.py`` the healing half (creating with backoff, the outage budget,
resets, replacements, the health loop); ``pool/close.py`` the teardown.

The pool runs on its own event loop thread (``loop.LoopThread``). ``run``/``close`` are
synchronous and thread-safe; ``aexec`` can be awaited from any loop.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from trl_sandbox.environments.builds import Prepared, SetupFailed
from trl_sandbox.environments.spec import EnvironmentSpec
from trl_sandbox.pool.close import PoolClosing
from trl_sandbox.pool.environment_pools import EnvironmentPools
from trl_sandbox.pool.heal import PoolHealing, _Broken, _Lost, _Transient
from trl_sandbox.pool.idle_queue import IdleQueue
from trl_sandbox.pool.loop import LoopThread
from trl_sandbox.pool.settings import PoolSettings, PoolStats, percentile
from trl_sandbox.pool.tags import RUN_TAG, process_tags
from trl_sandbox.sandbox import (
    ConfigError,
    ExecResult,
    InfraError,
    Provider,
    RateLimitError,
    Sandbox,
    SandboxOutageError,
    SandboxSpec,
)

log = logging.getLogger("trl_sandbox.pool.sandbox_pool")

__all__ = ["PoolSettings", "PoolStats", "SandboxPool", "percentile"]


class SandboxPool(PoolHealing, PoolClosing, EnvironmentPools):
    """A fixed-size pool of warm sandboxes of one provider.

    Create it cheaply (it builds nothing), ``start()`` it when work begins, ``close()`` it in a
    ``finally``. ``SandboxPool.open(...)`` does all three as a context manager.
    """

    def __init__(
        self,
        provider: Provider | str,
        spec: SandboxSpec | None = None,
        size: int = 4,
        settings: PoolSettings | None = None,
        *,
        made_by: str = "pool",
    ) -> None:
        if size < 1:
            raise ConfigError(f"sandbox pool size must be at least 1, got {size}")
        if isinstance(provider, str):  # a provider's name, as SandboxPool.open takes it
            from trl_sandbox.plugins import make_provider

            provider = make_provider(provider, {})
        if not callable(getattr(provider, "create", None)):
            raise ConfigError(
                f"SandboxPool needs a provider (an object with create/destroy/list, or a provider name "
                f"such as 'local'), not {type(provider).__name__}"
            )
        self.provider = provider
        self.spec = spec or SandboxSpec()
        self.made_by = made_by  # what created the pool, for its sandboxes' tags
        self.size = size
        self.settings = settings or PoolSettings()
        self.stats = PoolStats()
        self._stats_lock = threading.Lock()
        self._loop: LoopThread | None = None
        self._idle: IdleQueue[Sandbox] | None = None
        self._members: dict[str, Sandbox] = {}
        self._born: dict[str, float] = {}
        self._pending_creates = 0
        self._tasks: set[asyncio.Task] = set()
        self._ready: asyncio.Event | None = None
        self._last_create_error: BaseException | None = None
        self._fatal_error: BaseException | None = None
        self._failing_since: float | None = None  # first failed create since the last success
        self._dropping: dict[str, Sandbox] = {}  # removed from the pool, delete not yet confirmed
        self._deleting: set[asyncio.Task] = set()  # replacements whose delete is under way
        self._creating: set[asyncio.Task] = set()  # create slots inside provider.create
        self.leftovers: list[str] = []  # ids the closing sweep found and could not remove
        self._closed = False
        self._started = False
        self._state_lock = threading.Lock()
        self._by_image: OrderedDict[str, SandboxPool] = OrderedDict()  # environment_pools.py
        self._by_image_lock = threading.Lock()
        self.leased = 0  # sandboxes checked out now
        self.ever_up = False  # a sandbox was up since start(): later outages are transient, not setup errors

    # -- lifecycle (sync, any thread) ------------------------------------------------------------

    @classmethod
    @contextlib.contextmanager
    def open(
        cls,
        provider: str | Provider = "local",
        size: int = 4,
        settings: Mapping[str, Any] | None = None,
        spec: SandboxSpec | None = None,
        pool_settings: PoolSettings | None = None,
        made_by: str = "pool",
    ):
        """Build, start and always close a pool: ``with SandboxPool.open("local", size=4) as pool:``."""
        if isinstance(provider, str):
            from trl_sandbox.plugins import make_provider

            provider = make_provider(provider, dict(settings or {}))
        pool = cls(provider, spec=spec, size=size, settings=pool_settings, made_by=made_by)
        try:
            pool.start(wait=True)
            yield pool
        finally:
            pool.close()

    @property
    def started(self) -> bool:
        return self._started and not self._closed

    @property
    def loop(self) -> LoopThread:
        if self._loop is None:
            raise RuntimeError("the sandbox pool has not been started")
        return self._loop

    def start(self, wait: bool = False, tags: Mapping[str, str] | None = None) -> None:
        """Start the loop and begin warming ``size`` sandboxes.

        With ``wait=False`` warming overlaps whatever the caller does next (the first generation);
        jobs simply wait for the first sandbox. ``tags`` are added to the spec's tags; a pool whose
        tags carry no run id gets this process's (``tags.process_tags``), so that every sandbox can
        be traced to its owner and reaped when that owner dies.
        """
        with self._state_lock:
            if self._started and not self._closed:
                return
            # A closed pool starts afresh (e.g. ``trainer.evaluate()`` after ``train()`` closed it).
            self._closed = False
            self._members, self._born, self._tasks, self._dropping = {}, {}, set(), {}
            self._deleting, self._creating = set(), set()
            self._pending_creates = 0
            self._fatal_error = self._last_create_error = self._failing_since = None
            self.leftovers = []
            self.ever_up = False
            merged = {**self.spec.tags, **(tags or {})}
            if RUN_TAG not in merged:
                merged = process_tags(self.made_by, merged)
            self.spec = replace(self.spec, tags=merged)
            self._loop = LoopThread()
            self._loop.run(self._astart())
            self._started = True
            atexit.register(self.close)
        if wait:
            self.wait_ready()

    def grow(self, size: int) -> None:
        """Raise the pool's size to at least ``size`` (it never shrinks); the new sandboxes start warming now.

        Multi-turn episodes hold a sandbox each for their whole length, so the number needed is
        only known when episodes start; a fixed size would leave the last ones (and the judge)
        waiting for a sandbox that no one gives back.
        """
        with self._state_lock:
            if size <= self.size:
                return
            self.size = size
            running = self._started and not self._closed and self._loop is not None
        if running:
            if self._loop.in_loop():
                self._refill()
            else:
                self._loop.loop.call_soon_threadsafe(self._refill)

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until at least one sandbox is up; raise if none could be created."""
        self.loop.run(self.aready(), timeout=timeout)

    def close(self) -> None:
        """Destroy every sandbox this pool created and stop its loop. Idempotent, never raises."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            started = self._started
        self.close_image_pools()
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        if not started or self._loop is None:
            return
        try:
            if self._loop.alive:
                budget = self.settings.destroy_timeout_s * 2 + 5
                self._loop.run(self._aclose(), timeout=budget)
        except BaseException as exc:  # teardown must finish even on Ctrl-C or a stuck provider
            log.warning("sandbox pool teardown was interrupted: %r", exc)
        finally:
            self._loop.stop()

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | str | None = None,
        timeout: float,
        files: Sequence[tuple[str, bytes]] = (),
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        environment: EnvironmentSpec | None = None,
    ) -> ExecResult:
        """Synchronous ``aexec``. Raises ``InfraError`` when every attempt failed."""
        return self.loop.run(self._aexec(argv, stdin, timeout, files, cwd, env, environment))

    async def aexec(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | str | None = None,
        timeout: float,
        files: Sequence[tuple[str, bytes]] = (),
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        environment: EnvironmentSpec | None = None,
    ) -> ExecResult:
        """Run one job on a leased sandbox, retrying infrastructure failures on fresh sandboxes.
        With ``environment``, the job runs in its own copy of that prepared environment, built
        once (``SetupFailed``, an ``InfraError``, when its setup fails)."""
        return await self.loop.wrap(self._aexec(argv, stdin, timeout, files, cwd, env, environment))

    async def aready(self) -> None:
        if self._loop is not None and not self._loop.in_loop():
            return await self._loop.wrap(self.aready())
        assert self._ready is not None
        await self._ready.wait()
        if self._fatal_error is not None:
            raise self._fatal_error

    def drain_stats(self) -> PoolStats:
        with self._stats_lock:
            return self.stats.drain()

    def provider_usage(self) -> dict[str, float | str]:
        """What the provider reports about its use of the machine since the last call, if anything.

        A provider may offer ``usage() -> dict`` (the local one: ``sandbox/isolation_mode`` and
        ``sandbox/cpu_s``); remote providers need nothing. Read on the pool's loop, where the
        provider's state changes; a failure is logged and reads as no data, never an error.
        """
        usage = getattr(self.provider, "usage", None)
        if usage is None:
            return {}

        async def read() -> dict[str, float | str]:
            return dict(usage())

        try:
            if self._loop is not None and self._loop.alive and not self._loop.in_loop():
                return self._loop.run(read(), timeout=10)
            return dict(usage())
        except Exception as exc:  # metrics must never stop training
            log.warning("reading the provider's usage failed: %r", exc)
            return {}

    def _count(self, key: str, n: int = 1) -> None:
        with self._stats_lock:
            self.stats.counts[key] += n

    @property
    def members(self) -> int:
        return len(self._members)

    # -- leasing (pool loop) ---------------------------------------------------------------------

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[Sandbox]:
        """Exclusive use of one sandbox. Raise ``InfraError`` inside to have it replaced."""
        sandbox = await self.checkout()
        broken = False
        try:
            yield sandbox
        except (InfraError, _Broken, asyncio.CancelledError):
            broken = True
            raise
        finally:
            self.checkin(sandbox, broken=broken)

    async def checkout(self, prepared: Prepared | None = None) -> Sandbox:
        """Take a sandbox out of the pool until ``checkin`` (for episodes spanning many calls).
        With ``prepared`` whose sandboxes are made from an image, one of that image's pool.

        Must run on the pool's loop (``aexec`` and ``SandboxEnvironment`` take care of that).
        """
        child = self.image_pool(prepared)
        if child is not None:
            return await child.checkout()
        if self._loop is not None and not self._loop.in_loop():
            return await self._loop.wrap(self.checkout())
        if self._closed:
            raise InfraError("the sandbox pool is closed")
        assert self._idle is not None
        t0 = time.perf_counter()
        self._refill()  # first: a job is also what notices that a lost sandbox needs replacing
        self._raise_if_unavailable()
        sandbox = await self._next_idle()
        while self._expiring(sandbox):  # replaced before its lifetime ends under a job
            self._count("rotated")
            self._spawn(self._replace(sandbox))
            sandbox = await self._next_idle()
        # Warm: served by a sandbox that already existed when the lease began (possibly after
        # waiting for its reset); cold: the job had to wait for a sandbox to be created.
        warm = self._born.get(sandbox.id, 0.0) < t0
        with self._stats_lock:
            self.stats.lease_wait_s.append(time.perf_counter() - t0)
            self.stats.counts["leases_warm" if warm else "leases_cold"] += 1
            self.leased += 1
        return sandbox

    def _raise_if_unavailable(self) -> None:
        """Fail at once when every sandbox is lost and none can be created (an outage, a quota, a
        bad configuration); transient create failures only make jobs wait."""
        if self._fatal_error is not None and not self._members:
            if isinstance(self._fatal_error, SandboxOutageError):
                raise self._fatal_error
            raise InfraError(f"no sandbox is available: {self._fatal_error}")

    async def _next_idle(self) -> Sandbox:
        """The next idle sandbox; ``InfraError`` after the lease timeout, or at once when the pool
        has lost every sandbox and cannot create one (waiting longer would only delay the ``None``)."""
        sandbox = await self._idle.get(self.settings.lease_timeout_s)
        if sandbox is not None:
            return sandbox
        self._raise_if_unavailable()
        detail = f"; last create error: {self._last_create_error}" if self._last_create_error else ""
        raise InfraError(f"no sandbox became free within {self.settings.lease_timeout_s:.0f} s{detail}")

    def checkin(self, sandbox: Sandbox, broken: bool = False) -> None:
        """Give a sandbox back: it is reset and reused, or replaced when ``broken``. Thread-safe."""
        if self._loop is not None and not self._loop.in_loop():
            self._loop.loop.call_soon_threadsafe(self.checkin, sandbox, broken)
            return
        if sandbox.id not in self._members:
            owner = self.owner_of(sandbox.id)
            if owner is not None:  # leased from an image's pool (environment_pools.py)
                owner.checkin(sandbox, broken)
            return  # already replaced, or the pool was closed (and destroyed it) meanwhile
        with self._stats_lock:
            self.leased = max(0, self.leased - 1)
        if broken or self._closed:
            self._spawn(self._replace(sandbox))
        elif self._reset_at_once(sandbox):
            self._idle.put_nowait(sandbox)  # straight to the next job waiting, if one is
        else:
            self._spawn(self._recycle(sandbox))

    # -- running a job ---------------------------------------------------------------------------

    async def _aexec(self, argv, stdin, timeout, files, cwd, env, environment=None, prepared=None) -> ExecResult:
        """Up to ``max_attempts`` leases. A transient error (429, 503, transport) keeps the sandbox:
        it goes back through a reset, so the next attempt still starts clean. A sandbox that is
        gone, dead or past its deadline is replaced. A provider's unexpected exception fails the
        job at once (it would recur) and replaces the sandbox."""
        last: BaseException | None = None
        if environment is not None and prepared is None:
            prepared = await self.prepare_environment(environment)
        child = self.image_pool(prepared)
        if child is not None:  # the environment's sandboxes are made from its image
            return await child.loop.wrap(child._aexec(argv, stdin, timeout, files, cwd, env, prepared=prepared))
        attempts = max(1, self.settings.max_attempts)
        for attempt in range(1, attempts + 1):
            if attempt > 1:
                self._count("retries")
                await asyncio.sleep(self._backoff(attempt - 1, last))
            sandbox = await self.checkout()
            verdict = "broken"
            try:
                result = await self._run_on(sandbox, argv, stdin, timeout, files, cwd, env, prepared)
                verdict = "kept"
                return result
            except _Transient as exc:
                last = exc.__cause__
                verdict = "kept"
                self._count("kept")
                self._count("rate_limited" if isinstance(last, RateLimitError) else "infra_errors")
            except _Lost as exc:
                last = exc.__cause__ or exc
                self._count("infra_errors")
            except _Broken as exc:
                raise InfraError(str(exc)) from exc
            except SetupFailed:  # the row's environment cannot be built: the sandbox is fine
                verdict = "kept"
                raise
            finally:
                self.checkin(sandbox, broken=verdict == "broken")
            log.info("sandbox job attempt %d/%d failed: %r", attempt, attempts, last)
        raise InfraError(f"{attempts} attempt(s) failed; last error: {type(last).__name__}: {last}") from last

"""SandboxPool: a warm pool of sandboxes with leases, retries, health checks and certain teardown.

The failure modes it exists for: a sandbox that dies or stops answering is replaced rather than
failing training; infrastructure errors are retried with backoff (honouring ``Retry-After``) and
reported as such, never as wrong code; every provider call has a deadline so a reward call cannot
hang; ``close()`` destroys everything the pool created, and a final sweep by run tags catches
sandboxes whose ``create`` timed out after the provider had already made them.

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
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import tenacity

from .loop import LoopThread
from .sandbox import (
    ConfigError,
    ExecResult,
    InfraError,
    Provider,
    QuotaError,
    RateLimitError,
    Sandbox,
    SandboxError,
    SandboxSpec,
)

log = logging.getLogger("trl_sandbox.pool")


@dataclass(frozen=True)
class PoolSettings:
    """Timing and retry knobs. Defaults suit both the local provider and remote ones."""

    max_attempts: int = 3  # per job, across sandboxes
    exec_slack_s: float = 10.0  # exec deadline = timeout + slack; past it the sandbox is presumed dead
    create_timeout_s: float = 120.0
    destroy_timeout_s: float = 30.0
    reset_timeout_s: float = 30.0
    lease_timeout_s: float = 300.0  # how long a job waits for a free sandbox before it is an infra failure
    health_interval_s: float = 30.0
    create_concurrency: int = 16
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    max_retry_after_s: float = 120.0  # a server's Retry-After is honoured up to this


@dataclass
class PoolStats:
    """Counters and latency samples since the last ``drain``; mutated on the pool loop only."""

    exec_s: list[float] = field(default_factory=list)
    lease_wait_s: list[float] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)

    def drain(self) -> PoolStats:
        out = PoolStats(self.exec_s, self.lease_wait_s, self.counts)
        self.exec_s, self.lease_wait_s, self.counts = [], [], Counter()
        return out


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


class _Broken(Exception):
    """Internal: a leased sandbox must be replaced, not reset and reused."""


class SandboxPool:
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
    ) -> None:
        if size < 1:
            raise ConfigError(f"sandbox pool size must be at least 1, got {size}")
        if isinstance(provider, str):  # a provider's name, as SandboxPool.open takes it
            from .plugins import make_provider

            provider = make_provider(provider, {})
        if not callable(getattr(provider, "create", None)):
            raise ConfigError(
                f"SandboxPool needs a provider (an object with create/destroy/list, or a provider name "
                f"such as 'local'), not {type(provider).__name__}"
            )
        self.provider = provider
        self.spec = spec or SandboxSpec()
        self.size = size
        self.settings = settings or PoolSettings()
        self.stats = PoolStats()
        self._stats_lock = threading.Lock()
        self._loop: LoopThread | None = None
        self._idle: asyncio.Queue[Sandbox] | None = None
        self._members: dict[str, Sandbox] = {}
        self._born: dict[str, float] = {}
        self._pending_creates = 0
        self._tasks: set[asyncio.Task] = set()
        self._ready: asyncio.Event | None = None
        self._last_create_error: BaseException | None = None
        self._fatal_error: BaseException | None = None
        self._closed = False
        self._started = False
        self._state_lock = threading.Lock()
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
    ):
        """Build, start and always close a pool: ``with SandboxPool.open("local", size=4) as pool:``."""
        if isinstance(provider, str):
            from .plugins import make_provider

            provider = make_provider(provider, dict(settings or {}))
        pool = cls(provider, spec=spec, size=size, settings=pool_settings)
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
        jobs simply wait for the first sandbox. ``tags`` are added to the spec's tags.
        """
        with self._state_lock:
            if self._started and not self._closed:
                return
            # A closed pool starts afresh (e.g. ``trainer.evaluate()`` after ``train()`` closed it).
            self._closed = False
            self._members, self._born, self._tasks = {}, {}, set()
            self._pending_creates = 0
            self._fatal_error = self._last_create_error = None
            self.ever_up = False
            if tags:
                self.spec = replace(self.spec, tags={**self.spec.tags, **tags})
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
    ) -> ExecResult:
        """Synchronous ``aexec``. Raises ``InfraError`` when every attempt failed."""
        return self.loop.run(self._aexec(argv, stdin, timeout, files, cwd, env))

    async def aexec(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | str | None = None,
        timeout: float,
        files: Sequence[tuple[str, bytes]] = (),
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """Run one job on a leased sandbox, retrying infrastructure failures on fresh sandboxes."""
        return await self.loop.wrap(self._aexec(argv, stdin, timeout, files, cwd, env))

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

    # -- internals (pool loop) -------------------------------------------------------------------

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _astart(self) -> None:
        self._idle = asyncio.Queue()
        self._ready = asyncio.Event()
        self._failed = asyncio.Event()  # set while no sandbox exists and none can be created
        self._semaphore = asyncio.Semaphore(max(1, self.settings.create_concurrency))
        for _ in range(self.size):
            self._pending_creates += 1
            self._spawn(self._create_one())
        self._spawn(self._health_loop())
        self._spawn(self._reap_stale())

    async def _reap_stale(self) -> None:
        """Destroy sandboxes that a dead process on this host left behind (e.g. a SIGKILLed run)."""
        from .tags import HOST_TAG, MANAGED_TAG, owner_is_dead

        host = self.spec.tags.get(HOST_TAG)
        if not host:
            return
        try:
            found = await asyncio.wait_for(
                self.provider.list({MANAGED_TAG: "1", HOST_TAG: host}), self.settings.destroy_timeout_s
            )
            stale = [info for info in found if owner_is_dead(info.tags, host)]
            await asyncio.gather(
                *(asyncio.wait_for(self.provider.destroy(i.id), self.settings.destroy_timeout_s) for i in stale),
                return_exceptions=True,
            )
            self._count("reaped", len(stale))
            if stale:
                log.warning("removed %d sandbox(es) left by dead runs on this host", len(stale))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            log.info("could not look for stale sandboxes: %r", exc)

    async def _create_one(self) -> None:
        """Create one sandbox (with retries) and put it in the idle queue."""
        try:
            async with self._semaphore:
                sandbox = await self._retrying(self._create_attempt, what="create")
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._last_create_error = exc
            self._count("create_failures")
            log.warning("could not create a sandbox: %s", exc)
            if isinstance(exc, (ConfigError, QuotaError)) and not self._members:
                self._fatal_error = exc
            elif not self._members and self._pending_creates <= 1:
                self._fatal_error = InfraError(f"no sandbox could be created: {exc}")
            if self._fatal_error is not None:
                self._failed.set()  # wakes jobs waiting for a sandbox: none is coming
            return
        finally:
            self._pending_creates -= 1
            if self._fatal_error is not None or self._members:
                self._ready.set()
        if self._closed:
            await self._destroy(sandbox)
            return
        self._members[sandbox.id] = sandbox
        self._born[sandbox.id] = time.perf_counter()
        self._fatal_error = None
        self._failed.clear()
        self.ever_up = True
        self._count("created")
        self._ready.set()
        self._idle.put_nowait(sandbox)

    async def _create_attempt(self) -> Sandbox:
        try:
            return await asyncio.wait_for(self.provider.create(self.spec), self.settings.create_timeout_s)
        except asyncio.TimeoutError as exc:
            # The provider may have made it anyway; the final sweep by tags removes it.
            raise InfraError(f"creating a sandbox took longer than {self.settings.create_timeout_s:.0f} s") from exc

    async def _retrying(self, attempt, what: str):
        s = self.settings

        def wait(state: tenacity.RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            if isinstance(exc, RateLimitError) and exc.retry_after:
                return min(float(exc.retry_after), s.max_retry_after_s)
            return min(s.backoff_max_s, s.backoff_initial_s * 2 ** (state.attempt_number - 1))

        def before_sleep(state: tenacity.RetryCallState) -> None:
            self._count("retries")
            exc = state.outcome.exception() if state.outcome else None
            self._count("rate_limited" if isinstance(exc, RateLimitError) else "infra_errors")
            log.info("retrying sandbox %s after %r", what, exc)

        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(max(1, s.max_attempts)),
            wait=wait,
            retry=tenacity.retry_if_exception_type(InfraError),
            before_sleep=before_sleep,
            reraise=True,
        )
        return await retrying(attempt)

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

    async def checkout(self) -> Sandbox:
        """Take a sandbox out of the pool until ``checkin`` (for episodes spanning many calls).

        Must run on the pool's loop (``aexec`` and ``SandboxEnvironment`` take care of that).
        """
        if self._loop is not None and not self._loop.in_loop():
            return await self._loop.wrap(self.checkout())
        if self._closed:
            raise InfraError("the sandbox pool is closed")
        self._raise_if_unavailable()
        assert self._idle is not None
        t0 = time.perf_counter()
        self._refill()
        sandbox = await self._next_idle()
        # Warm: served by a sandbox that already existed when the lease began (possibly after
        # waiting for its reset); cold: the job had to wait for a sandbox to be created.
        warm = self._born.get(sandbox.id, 0.0) < t0
        with self._stats_lock:
            self.stats.lease_wait_s.append(time.perf_counter() - t0)
            self.stats.counts["leases_warm" if warm else "leases_cold"] += 1
        return sandbox

    def _raise_if_unavailable(self) -> None:
        """Fail at once when every sandbox is lost and none can be created."""
        if self._fatal_error is not None and not self._members:
            raise InfraError(f"no sandbox is available: {self._fatal_error}")

    async def _next_idle(self) -> Sandbox:
        """The next idle sandbox; ``InfraError`` after the lease timeout, or at once when the pool
        has lost every sandbox and cannot create one (waiting longer would only delay the ``None``)."""
        if not self._idle.empty():  # the warm path: no futures, no waiting
            return self._idle.get_nowait()
        getter = asyncio.ensure_future(self._idle.get())
        failed = asyncio.ensure_future(self._failed.wait())
        try:
            await asyncio.wait({getter, failed}, timeout=self.settings.lease_timeout_s,
                               return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled: a sandbox already taken goes back, not astray
            if getter.done() and not getter.cancelled():
                self._idle.put_nowait(getter.result())
            raise
        finally:
            failed.cancel()
            if not getter.done():
                getter.cancel()  # asyncio.Queue hands a pending item to the next getter
        if getter.done() and not getter.cancelled():
            return getter.result()
        self._raise_if_unavailable()
        detail = f"; last create error: {self._last_create_error}" if self._last_create_error else ""
        raise InfraError(f"no sandbox became free within {self.settings.lease_timeout_s:.0f} s{detail}")

    def checkin(self, sandbox: Sandbox, broken: bool = False) -> None:
        """Give a sandbox back: it is reset and reused, or replaced when ``broken``. Thread-safe."""
        if self._loop is not None and not self._loop.in_loop():
            self._loop.loop.call_soon_threadsafe(self.checkin, sandbox, broken)
            return
        if sandbox.id not in self._members:
            return  # already replaced, or the pool was closed (and destroyed it) meanwhile
        if broken or self._closed:
            self._spawn(self._replace(sandbox))
        else:
            self._spawn(self._recycle(sandbox))

    async def _recycle(self, sandbox: Sandbox) -> None:
        try:
            await asyncio.wait_for(sandbox.reset(), self.settings.reset_timeout_s)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            log.info("sandbox %s failed its reset (%r); replacing it", sandbox.id, exc)
            await self._replace(sandbox)
            return
        if self._closed:
            await self._destroy(sandbox)
        else:
            self._idle.put_nowait(sandbox)

    async def _replace(self, sandbox: Sandbox) -> None:
        self._members.pop(sandbox.id, None)
        self._born.pop(sandbox.id, None)
        self._count("replaced")
        await self._destroy(sandbox)
        self._refill()

    def _refill(self) -> None:
        if self._closed:
            return
        missing = self.size - len(self._members) - self._pending_creates
        for _ in range(max(0, missing)):
            self._pending_creates += 1
            self._spawn(self._create_one())

    async def _destroy(self, sandbox: Sandbox) -> None:
        try:
            await asyncio.wait_for(self.provider.destroy(sandbox.id), self.settings.destroy_timeout_s)
            self._count("destroyed")
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._count("destroy_failures")
            log.warning("could not destroy sandbox %s: %r", sandbox.id, exc)

    async def _aexec(self, argv, stdin, timeout, files, cwd, env) -> ExecResult:
        self._raise_if_unavailable()

        async def attempt() -> ExecResult:
            async with self.lease() as sandbox:
                # A provider whose timeout is CPU time (the local one) says how long an exec may
                # take on the wall clock; past that plus the slack the sandbox is presumed dead.
                bound = getattr(sandbox, "wall_bound", None)
                deadline = (bound(timeout) if callable(bound) else timeout) + self.settings.exec_slack_s
                try:
                    for path, data in files:
                        await asyncio.wait_for(sandbox.write_file(path, data), deadline)
                    t0 = time.perf_counter()
                    result = await asyncio.wait_for(
                        sandbox.exec(argv, stdin=stdin, timeout=timeout, cwd=cwd, env=env), deadline
                    )
                except asyncio.TimeoutError as exc:
                    raise InfraError(f"sandbox {sandbox.id} did not answer within {deadline:.1f} s") from exc
                except SandboxError as exc:
                    if isinstance(exc, InfraError):
                        raise
                    raise _Broken(str(exc)) from exc
                except Exception as exc:
                    # A provider bug (or input it chokes on) is an infrastructure failure: it must
                    # never crash training nor be scored as the model's fault.
                    raise _Broken(f"provider {self.provider.name!r} failed: {exc!r}") from exc
                with self._stats_lock:
                    self.stats.exec_s.append(time.perf_counter() - t0)
                    self.stats.counts["execs"] += 1
                return result

        try:
            return await self._retrying(attempt, what="exec")
        except _Broken as exc:
            raise InfraError(str(exc)) from exc

    async def _health_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.settings.health_interval_s)
            await self._check_idle()

    async def _check_idle(self) -> None:
        """Probe idle sandboxes; replace dead ones; top the pool back up."""
        assert self._idle is not None
        checked: list[Sandbox] = []
        while not self._idle.empty():
            checked.append(self._idle.get_nowait())
        for sandbox in checked:
            try:
                ok = await asyncio.wait_for(sandbox.alive(), self.settings.reset_timeout_s)
            except asyncio.CancelledError:
                raise
            except BaseException:
                ok = False
            if ok:
                self._idle.put_nowait(sandbox)
            else:
                self._count("health_replaced")
                self._spawn(self._replace(sandbox))
        self._refill()

    async def _aclose(self) -> None:
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        await asyncio.gather(*[t for t in self._tasks if t is not current], return_exceptions=True)
        members = list(self._members.values())
        self._members.clear()
        await asyncio.gather(*(self._destroy(s) for s in members), return_exceptions=True)
        # Sweep by tags: catches sandboxes whose create timed out after the provider made them.
        if self.spec.tags:
            try:
                leftovers = await asyncio.wait_for(self.provider.list(self.spec.tags), self.settings.destroy_timeout_s)
                await asyncio.gather(
                    *(asyncio.wait_for(self.provider.destroy(info.id), self.settings.destroy_timeout_s) for info in leftovers),
                    return_exceptions=True,
                )
            except BaseException as exc:
                log.warning("final sweep of sandboxes by tags failed: %r", exc)
        try:
            await asyncio.wait_for(self.provider.aclose(), self.settings.destroy_timeout_s)
        except BaseException as exc:
            log.warning("closing the sandbox provider failed: %r", exc)

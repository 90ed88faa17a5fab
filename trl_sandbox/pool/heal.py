"""The healing half of ``SandboxPool``: creating, keeping, replacing and finally removing sandboxes.

A remote service fails in small ways all the time (a 503, a dropped connection, a 429, a sandbox
reclaimed under us) and in large ways now and then (an outage). The rules here keep the first
kind invisible and turn the second into one clear error:

* A create slot never gives up on a transient error: it retries with capped, jittered backoff
  (honouring ``Retry-After``) until it succeeds. Only ``ConfigError``/``QuotaError`` end it at
  once, because retrying them cannot help. Jitter keeps the slots of many pools (and ranks) from
  hitting a recovering service in lockstep.
* An outage is a time budget (``PoolSettings.outage_s``) spent with creates failing and none
  succeeding. Past it the pool declares ``SandboxOutageError`` naming the provider and the last
  error, so that training stops instead of running on ``None`` rewards; the health loop keeps
  probing, and one successful create ends the outage.
* A sandbox is replaced only when it is gone (``SandboxGoneError``), fails ``alive()``, or missed a
  deadline. A failed reset is retried while the sandbox still answers.

Finding what dead runs left at start and removing everything at close is ``pool/close.py``. All of
this runs on the pool's loop thread; ``SandboxPool`` (``pool/sandbox_pool.py``) mixes it in.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any

from trl_sandbox.environments.builds import SetupFailed
from trl_sandbox.pool.idle_queue import IdleQueue
from trl_sandbox.pool.loop import within
from trl_sandbox.sandbox import (
    ConfigError,
    ExecResult,
    InfraError,
    QuotaError,
    RateLimitError,
    Sandbox,
    SandboxError,
    SandboxGoneError,
    SandboxOutageError,
)

log = logging.getLogger("trl_sandbox.pool.sandbox_pool")

_jitter = random.Random()


class _Broken(Exception):
    """Internal: the job failed for good and its sandbox is replaced (a provider bug, a bad request)."""


class _Lost(Exception):
    """Internal: the sandbox is gone, dead or past its deadline; replace it and retry the job."""


class _Transient(Exception):
    """Internal: a 429/503/transport error while the sandbox still answers; keep it and retry."""


class PoolHealing:
    """Mixin for ``SandboxPool``; it relies on the attributes ``SandboxPool.__init__`` sets."""

    settings: Any
    provider: Any
    spec: Any
    size: int

    # -- backoff and outage ----------------------------------------------------------------------

    def _backoff(self, failures: int, exc: BaseException | None) -> float:
        """Seconds to wait after the ``failures``-th failure in a row: a server's ``Retry-After``
        when it gave one (capped), else exponential from ``backoff_initial_s`` up to
        ``backoff_max_s``, drawn from its upper half so that waiters spread out."""
        s = self.settings
        if isinstance(exc, RateLimitError) and exc.retry_after:
            return min(float(exc.retry_after), s.max_retry_after_s)
        ceiling = min(s.backoff_max_s, s.backoff_initial_s * 2 ** max(0, failures - 1))
        return ceiling * _jitter.uniform(0.5, 1.0)

    def _note_create_failure(self, exc: BaseException) -> None:
        self._last_create_error = exc
        if self._failing_since is None:
            self._failing_since = time.monotonic()
        self._count("create_failures")
        self._count("rate_limited" if isinstance(exc, RateLimitError) else "infra_errors")

    def _outage_over_budget(self) -> bool:
        since = self._failing_since
        return since is not None and time.monotonic() - since >= self.settings.outage_s

    def _declare_outage(self, exc: BaseException) -> None:
        if isinstance(self._fatal_error, SandboxOutageError):
            return
        elapsed = time.monotonic() - (self._failing_since or time.monotonic())
        self._fatal_error = SandboxOutageError(
            f"the {self.provider.name!r} sandbox provider has not created a sandbox for {elapsed:.0f} s "
            f"(outage budget sandbox_outage_s={self.settings.outage_s:g}); last error: "
            f"{type(exc).__name__}: {exc}. Check the service's status, or raise sandbox_outage_s to wait longer."
        )
        self._count("outages")
        log.error("%s", self._fatal_error)
        self._idle.fail()  # wakes jobs waiting for a sandbox when none is left

    @property
    def outage(self) -> SandboxOutageError | None:
        """The outage that leaves this pool without any sandbox, or ``None`` while it can work."""
        if isinstance(self._fatal_error, SandboxOutageError) and not self._members:
            return self._fatal_error
        return None

    # -- creating --------------------------------------------------------------------------------

    async def _astart(self) -> None:
        self._idle = IdleQueue()  # failed while no sandbox exists and none can be created
        self._ready = asyncio.Event()
        self._semaphore = asyncio.Semaphore(max(1, self.settings.create_concurrency))
        s = self.settings
        self._host_limiter = None
        if s.host_create_rate is not None or s.host_create_concurrency is not None:
            from trl_sandbox.pool.host_limit import HostLimiter

            self._host_limiter = HostLimiter(self.provider.name, s.host_create_rate, s.host_create_concurrency)
        self._refill()
        self._spawn(self._health_loop())
        self._spawn(self._reap_stale())

    def _refill(self) -> None:
        if self._closed or self._idle is None:
            return
        missing = self.size - len(self._members) - self._pending_creates
        for _ in range(max(0, missing)):
            self._pending_creates += 1
            self._spawn(self._create_one())

    async def _create_one(self) -> None:
        """Fill one slot: create until it works, the outage budget is spent, or retrying is pointless."""
        failures = 0
        try:
            while not self._closed:
                try:
                    async with self._semaphore:
                        sandbox = await self._create_attempt()
                except asyncio.CancelledError:
                    raise
                except (ConfigError, QuotaError) as exc:
                    self._note_create_failure(exc)
                    log.warning("could not create a sandbox: %s", exc)
                    if not self._members:
                        self._fatal_error = exc
                        self._idle.fail()
                    return
                except BaseException as exc:  # transient, or a provider bug: both worth another try
                    self._note_create_failure(exc)
                    if self._closed:
                        return
                    if self._outage_over_budget():
                        self._declare_outage(exc)
                        return
                    failures += 1
                    delay = self._backoff(failures, exc)
                    log.info("creating a sandbox failed (%r); trying again in %.2f s", exc, delay)
                    await asyncio.sleep(delay)
                    continue
                await self._adopt(sandbox)
                return
        finally:
            self._pending_creates -= 1
            if self._fatal_error is not None or self._members:
                self._ready.set()

    async def _create_attempt(self) -> Sandbox:
        if self._host_limiter is not None:
            async with self._host_limiter.create_slot():
                return await self._create_call()
        return await self._create_call()

    async def _create_call(self) -> Sandbox:
        task = asyncio.current_task()
        self._creating.add(task)  # close() lets it finish: cancelled, the service may still make it
        try:
            return await asyncio.wait_for(self.provider.create(self.spec), self.settings.create_timeout_s)
        except asyncio.TimeoutError as exc:
            # The provider may have made it anyway; the final sweep by tags removes it.
            raise InfraError(f"creating a sandbox took longer than {self.settings.create_timeout_s:.0f} s") from exc
        finally:
            self._creating.discard(task)

    async def _adopt(self, sandbox: Sandbox) -> None:
        if self._closed:
            await self._destroy(sandbox)
            return
        self._members[sandbox.id] = sandbox
        self._born[sandbox.id] = time.perf_counter()
        self._failing_since = None
        self._fatal_error = None
        self._idle.clear_failed()
        self.ever_up = True
        self._count("created")
        self._ready.set()
        self._idle.put_nowait(sandbox)

    # -- keeping and replacing -------------------------------------------------------------------

    async def _run_on(self, sandbox: Sandbox, argv, stdin, timeout, files, cwd, env, prepared=None) -> ExecResult:
        """Run one job on a leased sandbox; a failure is classified by what it says about the
        sandbox: ``_Lost`` (replace it), ``_Transient`` (keep it), ``_Broken`` (give up the job)."""
        # A provider whose timeout is CPU time (the local one) says how long an exec may take on
        # the wall clock; past that plus the slack the sandbox is presumed dead.
        bound = getattr(sandbox, "wall_bound", None)
        deadline = (bound(timeout) if callable(bound) else timeout) + self.settings.exec_slack_s
        try:
            if prepared is not None:  # the lease's own copy of the row's prepared environment
                await within(sandbox.use_environment(prepared), deadline)
            for path, data in files:
                await within(sandbox.write_file(path, data), deadline)
            t0 = time.perf_counter()
            result = await within(sandbox.exec(argv, stdin=stdin, timeout=timeout, cwd=cwd, env=env), deadline)
        except asyncio.TimeoutError as exc:
            raise _Lost(f"sandbox {sandbox.id} did not answer within {deadline:.1f} s") from exc
        except SandboxGoneError as exc:
            raise _Lost(str(exc)) from exc
        except SetupFailed:  # the environment's setup, not the sandbox: no retry helps, none is made
            raise
        except RateLimitError as exc:
            raise _Transient(str(exc)) from exc
        except InfraError as exc:
            if await self._probe(sandbox) is False:
                raise _Lost(f"sandbox {sandbox.id} is no longer alive after: {exc}") from exc
            raise _Transient(str(exc)) from exc
        except SandboxError as exc:
            raise _Broken(str(exc)) from exc
        except Exception as exc:
            # A provider bug (or input it chokes on) is an infrastructure failure: it must
            # never crash training nor be scored as the model's fault.
            raise _Broken(f"provider {self.provider.name!r} failed: {exc!r}") from exc
        with self._stats_lock:
            self.stats.exec_s.append(time.perf_counter() - t0)
            self.stats.counts["execs"] += 1
        return result


    async def _probe(self, sandbox: Sandbox) -> bool | None:
        """``alive()`` within the reset deadline: True/False, or None when the probe itself hit a
        transient error (the sandbox may be fine; the service hiccuped)."""
        try:
            return bool(await asyncio.wait_for(sandbox.alive(), self.settings.reset_timeout_s))
        except asyncio.CancelledError:
            raise
        except (asyncio.TimeoutError, SandboxGoneError):
            return False
        except InfraError:
            return None
        except BaseException:
            return False

    @staticmethod
    def _reset_at_once(sandbox: Sandbox) -> bool:
        """A sandbox whose reset needs no round trip (the local one sends it with its next
        request, ``defer_reset``) is reset at check-in, without a task of its own: a few scheduling
        rounds of host CPU less per job, and the next job's request leaves sooner."""
        defer = getattr(sandbox, "defer_reset", None)
        try:
            return callable(defer) and defer() is True
        except Exception:
            return False

    async def _recycle(self, sandbox: Sandbox) -> None:
        """Reset a returned sandbox and put it back; retry a failed reset while the sandbox answers."""
        attempts = max(1, self.settings.reset_attempts)
        for attempt in range(1, attempts + 1):
            try:
                await within(sandbox.reset(), self.settings.reset_timeout_s)
                break
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                gone = isinstance(exc, (asyncio.TimeoutError, SandboxGoneError))
                if gone or attempt == attempts or await self._probe(sandbox) is False:
                    log.info("sandbox %s failed its reset (%r); replacing it", sandbox.id, exc)
                    await self._replace(sandbox)
                    return
                self._count("reset_retries")
                await asyncio.sleep(self._backoff(attempt, exc))
        if self._closed or sandbox.id not in self._members:
            await self._destroy(sandbox)
        else:
            self._idle.put_nowait(sandbox)

    async def _replace(self, sandbox: Sandbox) -> None:
        self._members.pop(sandbox.id, None)
        self._born.pop(sandbox.id, None)
        self._dropping[sandbox.id] = sandbox  # until its delete is confirmed: close() retries it
        self._count("replaced")
        self._refill()
        self._deleting.add(asyncio.current_task())
        try:
            if await self._destroy(sandbox):
                self._dropping.pop(sandbox.id, None)
        finally:
            self._deleting.discard(asyncio.current_task())

    async def _destroy(self, sandbox: Sandbox) -> bool:
        try:
            await asyncio.wait_for(self.provider.destroy(sandbox.id), self.settings.destroy_timeout_s)
            self._count("destroyed")
            return True
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._count("destroy_failures")
            log.warning("could not destroy sandbox %s: %r", sandbox.id, exc)
            return False

    async def _health_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.settings.health_interval_s)
            await self._check_idle()

    def _expiring(self, sandbox: Sandbox) -> bool:
        """True when ``sandbox`` is near the end of its server-side lifetime.

        Remote sandboxes get a short lifetime (a provider may cap ``spec.lifetime_s`` with its
        ``lifetime_cap_s``) so that a killed run's leftovers die within minutes; the pool hides
        that by replacing an idle member before its end (a quarter of the lifetime early, at most
        5 minutes), rather than letting a job find it gone."""
        cap = getattr(self.provider, "lifetime_cap_s", None) or float("inf")
        lifetime = min(float(self.spec.lifetime_s), float(cap))
        born = self._born.get(sandbox.id)
        return born is not None and time.perf_counter() - born >= lifetime - min(300.0, lifetime / 4)

    async def _check_idle(self) -> None:
        """Probe idle sandboxes; replace dead and expiring ones; top the pool back up (also after an outage)."""
        checked: list[Sandbox] = []
        while not self._idle.empty():
            checked.append(self._idle.get_nowait())
        for sandbox in checked:
            if self._expiring(sandbox):
                self._count("rotated")
                self._spawn(self._replace(sandbox))
            elif await self._probe(sandbox) is False:
                self._count("health_replaced")
                self._spawn(self._replace(sandbox))
            else:
                self._idle.put_nowait(sandbox)
        self._refill()

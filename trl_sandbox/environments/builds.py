"""Build each environment once: single-flight across threads and processes, a failure remembered.

``Builds.prepare(spec)`` returns a ``Prepared`` state, building it if no process of this machine
has: threads of this process wait on one future per key, processes on the key's file lock
(``EnvironmentCache.locked``), and whoever gets the lock second finds the tree ready. A setup
that fails (or times out) is tried once more; if it fails again, ``SetupFailed`` is raised for
every lease of the key in this process, its output logged once. ``SetupFailed`` is an
``InfraError``: the rows' programs and episodes score ``infra`` (reward ``None``), never a
verdict on the model's code.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trl_sandbox.environments.cache import EnvironmentCache, remove_tree
from trl_sandbox.environments.spec import EnvironmentSpec
from trl_sandbox.sandbox import ConfigError, InfraError

log = logging.getLogger("trl_sandbox.environments")

OUTPUT_KEPT = 4000
IDLE_S = 60.0  # a key no lease used for this long may be evicted (see Builds.release_idle)  # the tail of a failed setup's output kept for the log and the outcome's detail


class SetupFailed(InfraError):
    """An environment's setup failed or timed out (twice): its rows cannot be judged."""


@dataclass(frozen=True)
class Prepared:
    """A built environment: its key, the read-only tree, where leases see it, and the base."""

    key: str
    tree: Path
    workdir: str | None
    spec: EnvironmentSpec
    # What the lease's sandbox must be created from (a provider snapshot, a root filesystem), or
    # None: any of the provider's sandboxes can take a copy (pool/environment_pools.py).
    image: str | None = None


@dataclass
class BuildStats:
    """Per-step counters (``drain`` resets them)."""

    builds: int = 0
    build_s: float = 0.0
    hits: int = 0
    misses: int = 0
    failures: int = 0
    lease_ms: list[float] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        asked = self.hits + self.misses
        out = {"env/builds": float(self.builds), "env/build_s": self.build_s, "env/failures": float(self.failures)}
        if asked:
            out["env/hit_rate"] = self.hits / asked
        if self.lease_ms:
            ms = sorted(self.lease_ms)
            out["env/lease_ms_p50"] = ms[len(ms) // 2]
            out["env/lease_ms_max"] = ms[-1]
        return out


# build(spec, key, staging directory) -> metadata to keep; raises SetupFailed with the setup's output.
BuildFn = Callable[[EnvironmentSpec, str, Path], dict]


def _host_digest(base: str) -> str:
    """A base's digest where the provider knows only the host's system: its name."""
    return base


class Builds:
    """Single-flight builds of one provider kind into one cache (see the module docstring)."""

    def __init__(self, cache: EnvironmentCache, kind: str, build: BuildFn,
                 digest: Callable[[str], str] | None = None, attempts: int = 2,
                 active: Callable[[], set[str]] | None = None) -> None:
        self.cache = cache
        self.kind = kind
        self._build = build
        self._digest = digest or _host_digest
        self._attempts = attempts
        self._lock = threading.Lock()
        self._flights: dict[str, concurrent.futures.Future] = {}
        self._failed: dict[str, SetupFailed | ConfigError] = {}
        self._used: dict[str, float] = {}  # key -> when a lease of this process last prepared it
        self._active = active
        self.stats = BuildStats()

    def key(self, spec: EnvironmentSpec) -> str:
        return spec.key(self.kind, self._digest(spec.base))

    def drain(self) -> BuildStats:
        with self._lock:
            stats, self.stats = self.stats, BuildStats()
        return stats

    async def prepare(self, spec: EnvironmentSpec) -> Prepared:
        """The built state for ``spec`` (see the module docstring). Never blocks the event loop."""
        key = await asyncio.get_running_loop().run_in_executor(None, self.key, spec)
        if self._active is not None:
            self.release_idle(self._active() | {key})
        with self._lock:
            self._used[key] = time.monotonic()
            if key in self._failed:
                self.stats.misses += 1
                raise self._failed[key]
            flight = self._flights.get(key)
            owner = flight is None or (flight.done() and (flight.exception() is not None
                                                          or not flight.result().tree.is_dir()))
            if owner:  # the first lease of the key here, or its tree went (evicted by another process)
                flight = concurrent.futures.Future()
                self._flights[key] = flight
            else:  # served by a build that is done or under way
                self.stats.hits += 1
        assert flight is not None
        if owner:
            threading.Thread(target=self._run, args=(spec, key, flight), daemon=True,
                             name=f"trl-sandbox-env-{key[:8]}").start()
        return await asyncio.wrap_future(flight)

    def prepare_sync(self, spec: EnvironmentSpec) -> Prepared:
        """``prepare`` for threads without an event loop (prefetching, tests)."""
        return asyncio.run(self.prepare(spec))

    def _run(self, spec: EnvironmentSpec, key: str, flight: concurrent.futures.Future) -> None:
        try:
            flight.set_result(self._get(spec, key))
        except BaseException as exc:  # noqa: BLE001 - handed to every waiter
            if isinstance(exc, (SetupFailed, ConfigError)):  # a base that cannot run: the same next time
                with self._lock:
                    self._failed[key] = exc
            flight.set_exception(exc)

    def _prepared(self, spec: EnvironmentSpec, key: str, meta: dict) -> Prepared:
        return Prepared(key, self.cache.tree(key), spec.workdir, spec, meta.get("image"))

    def _get(self, spec: EnvironmentSpec, key: str) -> Prepared:
        built = False
        for _ in range(3):
            meta = self.cache.ready(key)
            if meta is not None and self.cache.hold(key):
                with self._lock:
                    self._used[key] = time.monotonic()
                    if not built:
                        self.stats.hits += 1
                return self._prepared(spec, key, meta)
            with self.cache.locked(key) as mine:
                if mine and self.cache.ready(key) is None:  # not built by another process meanwhile
                    with self._lock:
                        self.stats.misses += 1
                    self._build_locked(spec, key)
                    built = True
        raise InfraError(f"prepared environment {key[:12]} was evicted as soon as it was built, three times: "
                         "raise the cache's budget (environment_cache_mb)")

    def _build_locked(self, spec: EnvironmentSpec, key: str) -> None:
        """Build ``key`` (its lock held), trying twice; ``SetupFailed`` when both fail."""
        error: SetupFailed | None = None
        for attempt in range(1, self._attempts + 1):
            staging = self.cache.staging()
            t0 = time.perf_counter()
            try:
                meta = self._build(spec, key, staging)
                seconds = time.perf_counter() - t0
                self.cache.commit(staging, key, {**meta, "build_s": round(seconds, 3), "kind": self.kind})
            except ConfigError:  # a base that cannot run (an image without python3): no retry helps
                remove_tree(staging)
                raise
            except Exception as exc:  # a failed setup, or a tree the host cannot take in
                remove_tree(staging)
                if isinstance(exc, InfraError) and not isinstance(exc, SetupFailed):
                    raise  # the service failed a remote build (a create, a snapshot): not remembered
                error = exc if isinstance(exc, SetupFailed) else SetupFailed(
                    f"the build failed: {type(exc).__name__}: {exc}")
                log.warning("prepared environment %s (%s): setup failed (attempt %d of %d): %s",
                            key[:12], spec.describe(), attempt, self._attempts, error)
                continue
            except BaseException:
                remove_tree(staging)
                raise
            with self._lock:
                self.stats.builds += 1
                self.stats.build_s += seconds
            log.info("prepared environment %s built in %.1f s (%s)", key[:12], seconds, spec.describe())
            return
        with self._lock:
            self.stats.failures += 1
        assert error is not None
        raise error

    def release_idle(self, active: set[str], idle_s: float = IDLE_S) -> None:
        """Let the cache evict keys that no lease of this process uses (``active``: the keys of the
        leases running now) and that were not prepared for ``idle_s`` seconds."""
        now = time.monotonic()
        for key in self.cache.held - active:
            with self._lock:
                recent = now - self._used.get(key, 0.0) < idle_s
                if not recent:
                    self._used.pop(key, None)
                    self._flights.pop(key, None)  # the next lease holds it again (or rebuilds)
            if not recent:
                self.cache.release(key)

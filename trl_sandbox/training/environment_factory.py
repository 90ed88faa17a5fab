"""EnvironmentFactory: ``SandboxEnvironment`` episodes for trainers that do not hand them a pool.

``SandboxGRPOTrainer`` binds its own pool to ``SandboxEnvironment`` episodes. Other trainers do
not: a plain ``GRPOTrainer`` calls ``environment_factory()`` as is, and TRL's experimental
``AsyncGRPOTrainer`` pickles the factory into a spawned child process and calls it there. This
factory carries only settings (provider name and settings, pool size, scheme, limits), so it
pickles; the first call in a process builds that process's pool and scorer, every later call
there shares them, and the pool closes when the process exits (``SandboxPool.start`` registers
that). A pool never crosses a process boundary: its loop thread and sandboxes belong to the
process that started it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.sandbox import ConfigError, SandboxSpec
from trl_sandbox.scoring.scorer import Scorer


class EnvironmentFactory:
    """``factory()`` -> a ``SandboxEnvironment`` on this process's pool (built on the first call).

    Made through ``SandboxEnvironment.factory(**settings)``, which passes its class."""

    def __init__(
        self,
        *,
        environment_class: type,
        provider: str = "local",
        provider_settings: Mapping[str, Any] | None = None,
        pool_size: int = 4,
        spec: SandboxSpec | None = None,
        scheme: str | None = "original",
        timeout: float | None = None,
        tool_timeout: float = 10.0,
        max_output_chars: int = 4000,
        max_attempts: int | None = None,
    ) -> None:
        from trl_sandbox.plugins import make_provider

        # Made by ``SandboxEnvironment.factory`` (its ``cls``): this module never imports the class.
        self.environment_class = environment_class
        if not isinstance(provider, str):
            raise ConfigError("EnvironmentFactory takes a provider's name (e.g. 'local'), so that each process can build it")
        if pool_size < 1:
            raise ConfigError(f"pool_size must be at least 1, got {pool_size}")
        make_provider(provider, dict(provider_settings or {}))  # a bad name or a missing key fails here, not in a child
        self.provider = provider
        self.provider_settings = dict(provider_settings or {})
        self.pool_size = pool_size
        self.spec = spec
        self.scheme = scheme
        self.timeout = timeout
        self.environment_kwargs = {"tool_timeout": tool_timeout, "max_output_chars": max_output_chars,
                                   "max_attempts": max_attempts}
        self.environment_class(**self.environment_kwargs)  # a bad budget or limit fails here too
        self._local: tuple[int, SandboxPool, Scorer] | None = None
        self._lock = threading.Lock()

    def pool(self) -> SandboxPool:
        """This process's pool (built, not started, on first use; episodes start it)."""
        return self._pool_and_scorer()[0]

    def _pool_and_scorer(self) -> tuple[SandboxPool, Scorer]:
        with self._lock:
            # Keyed by pid: a fork inherits the parent's objects but not its loop thread.
            if self._local is None or self._local[0] != os.getpid():
                from trl_sandbox.plugins import make_provider

                pool = SandboxPool(make_provider(self.provider, dict(self.provider_settings)), spec=self.spec,
                                   size=self.pool_size, made_by="environment")
                scorer = Scorer(pool, scheme=self.scheme, cache_size=0, timeout=self.timeout)
                self._local = (os.getpid(), pool, scorer)
            return self._local[1], self._local[2]

    def __call__(self):
        pool, scorer = self._pool_and_scorer()
        environment = self.environment_class(pool=pool, scorer=scorer, **self.environment_kwargs)
        environment._factory = self
        return environment

    def close(self) -> None:
        """Close this process's pool now (it also closes at exit)."""
        with self._lock:
            local, self._local = self._local, None
        if local is not None and local[0] == os.getpid():
            local[1].close()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_local=None, _lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

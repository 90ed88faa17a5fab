"""Prepared environments on the ray provider: the local mechanism on each node.

Every node builds a key once, in its own cache (the local provider's ``environment_cache``, one
per machine), and every lease there gets its own overlay over that tree, exactly as a local
sandbox does (``trl_sandbox/local/environments.py``). The driver adds only the fan-out and the
memory of what happened:

- ``prepare(spec)`` (``RayProvider.prepare_environment``) builds the key on every node that holds
  a sandbox of this provider, through one actor per node (``SandboxActor.prepare_environment``,
  the node's ``LocalProvider.prepare_environment``): single-flight per key in each actor, and by
  the key's file lock across the actors of a node. Driver calls for the same key and node wait on
  one flight. A setup that fails there is ``SetupFailed`` (an ``InfraError``) raised to the pool's
  caller before any lease, and remembered: the key is never tried again by this driver.
- ``lease(sandbox, prepared)`` (``RaySandbox.use_environment``) asks the lease's actor to mount
  its copy; that actor builds the key first if its node had none yet (a node that joined later).
- The actors' build counters come back with every answer and are summed here: ``builds.drain()``
  gives the per-step ``BuildStats`` the pool and the trainer read, as for the local provider.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trl_sandbox.environments.builds import BuildStats, Prepared, SetupFailed
from trl_sandbox.environments.cache import default_root
from trl_sandbox.environments.spec import EnvironmentSpec
from trl_sandbox.sandbox import ConfigError, InfraError

if TYPE_CHECKING:
    from .provider import RayProvider, RaySandbox

log = logging.getLogger(__name__)


class NodeBuilds:
    """The nodes' build counters, summed on the driver (``drain`` as ``Builds.drain``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.stats = BuildStats()

    def add(self, counters: dict[str, Any]) -> None:
        with self._lock:
            s = self.stats
            s.builds += int(counters.get("builds", 0))
            s.build_s += float(counters.get("build_s", 0.0))
            s.hits += int(counters.get("hits", 0))
            s.misses += int(counters.get("misses", 0))
            s.failures += int(counters.get("failures", 0))
            s.lease_ms.extend(float(ms) for ms in counters.get("lease_ms", ()))

    def drain(self) -> BuildStats:
        with self._lock:
            stats, self.stats = self.stats, BuildStats()
        return stats


class RayEnvironments:
    """Prepared environments of one ``RayProvider`` (see the module docstring)."""

    def __init__(self, provider: RayProvider, local_settings: dict[str, Any]) -> None:
        self._provider = provider
        self._cache = local_settings.get("environment_cache")
        self.builds = NodeBuilds()
        self._flights: dict[tuple[EnvironmentSpec, str], asyncio.Future] = {}  # (spec, node id) -> its build
        self._failed: dict[EnvironmentSpec, SetupFailed] = {}

    def _failure(self, spec: EnvironmentSpec) -> SetupFailed | None:
        return self._failed.get(spec)

    def _remember(self, spec: EnvironmentSpec, exc: SetupFailed) -> None:
        if spec not in self._failed:
            log.warning("prepared environment (%s) failed on a node: its rows score infra: %s", spec.describe(), exc)
        self._failed[spec] = exc

    async def prepare(self, spec: EnvironmentSpec) -> Prepared:
        if spec.base != "host":
            raise ConfigError(f"environment.base={spec.base!r}: the ray provider prepares environments on the nodes' "
                              "own system only (base 'host'), as the local provider does")
        failed = self._failure(spec)
        if failed is not None:
            raise failed
        loop = asyncio.get_running_loop()
        flights = []
        for node, sandbox in self._one_per_node().items():
            flight = self._flights.get((spec, node))
            if flight is None or flight.get_loop() is not loop or (flight.done() and flight.exception() is not None):
                flight = self._flights[(spec, node)] = loop.create_task(self._build_on(sandbox, spec))
            flights.append(flight)
        answers = await asyncio.gather(*flights, return_exceptions=True)
        tree = None
        for answer in answers:
            if isinstance(answer, SetupFailed):
                self._remember(spec, answer)
                raise answer
            if isinstance(answer, ConfigError):
                raise answer
            if isinstance(answer, BaseException):
                # The actor or its node went (the pool replaces it): that node builds at its next lease.
                log.info("prepared environment (%s): a node's build did not answer: %r", spec.describe(), answer)
                continue
            key, tree = answer["key"], answer["tree"]
        if tree is None:  # no sandbox answered (none started yet): each lease's node builds it
            key = spec.key("local", spec.base)
            tree = str(Path(self._cache) if self._cache else default_root()) + f"/{key}/tree"
        return Prepared(key, Path(tree), spec.workdir, spec)

    def _one_per_node(self) -> dict[str, RaySandbox]:
        chosen: dict[str, RaySandbox] = {}
        for sandbox in list(self._provider._sandboxes.values()):
            chosen.setdefault(sandbox.node_id, sandbox)
        return chosen

    def _answer(self, answer: Any, sandbox: RaySandbox) -> dict[str, Any]:
        """An actor's answer about an environment: its counters added here; a failed setup raised."""
        if not isinstance(answer, dict) or "stats" not in answer:
            raise InfraError(f"sandbox {sandbox.id}: unexpected answer about a prepared environment: {answer!r}")
        self.builds.add(answer["stats"])
        if "failed" in answer:
            raise SetupFailed(answer["failed"])
        return answer

    async def _build_on(self, sandbox: RaySandbox, spec: EnvironmentSpec) -> dict[str, Any]:
        return self._answer(await sandbox._ask("prepare_environment", spec), sandbox)

    async def lease(self, sandbox: RaySandbox, prepared: Prepared) -> None:
        failed = self._failure(prepared.spec)
        if failed is not None:
            raise failed
        try:
            answer = self._answer(await sandbox._ask("use_environment", prepared.spec), sandbox)
        except SetupFailed as exc:  # this node built it at the lease, and its setup failed
            self._remember(prepared.spec, exc)
            raise
        sandbox.environment_mode = answer["mode"]

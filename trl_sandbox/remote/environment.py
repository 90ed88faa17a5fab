"""Prepared environments on remote providers: one snapshot per key, a private copy per lease.

A remote plugin gives ``RemoteEnvironments`` three calls of its service (``SnapshotHooks``): make
a snapshot of a sandbox, say whether one still exists, delete one. The rest is shared:

* **Build** (once per key and machine: ``environments.builds.Builds``, single-flight, a failed
  setup tried once more and then remembered as ``SetupFailed``): a sandbox from the spec's base
  (the provider's default, or the image or snapshot ``base`` names), with the network when
  ``setup_network`` is true; the files written into the working directory; each setup command
  run there through the lease launcher (``/bin/sh -c``, within ``setup_timeout`` in all); then the
  launcher's ``freeze`` copies the tree to the hidden ``ENV_ROOT/tree`` with the key beside it,
  and the service snapshots the sandbox under a fresh name.
* **Verify** before the key points at it: a sandbox booted from the snapshot must take a lease
  copy of the tree. A snapshot the SDK reported made but that does not exist, one that never
  becomes ready, one that 404s on boot: deleted (best effort) and built again, up to
  ``SNAPSHOT_ATTEMPTS`` times, then ``InfraError`` (never a verdict on the model's code).
* **Registry**: the on-disk cache keeps only metadata per key (the snapshot's reference), so
  the processes of one machine share it. A key found there is checked once per process; a
  snapshot that vanished since, or a create from it that fails as missing (``stale``), sends
  the key back to the cold path.
* **Lease** (``use``): the next exec's launcher gives the lease its copy at the working
  directory (``launcher_environment``: an overlay in ``ns`` mode, a copy elsewhere); the reset
  drops it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trl_sandbox.environments.builds import Builds, Prepared, SetupFailed
from trl_sandbox.environments.cache import EnvironmentCache
from trl_sandbox.environments.spec import EnvironmentSpec
from trl_sandbox.remote.launcher_environment import ENV_ROOT
from trl_sandbox.sandbox import ConfigError, InfraError, ResourceLimits, SandboxSpec

log = logging.getLogger("trl_sandbox.remote.environment")

SNAPSHOT_ATTEMPTS = 3
OUTPUT_KEPT = 4000
PREFIX = "trl-sandbox-env-"


class SnapshotLost(InfraError):
    """A snapshot failed, never became ready, or is not there: build the key again."""

    def __init__(self, message: str, ref: str | None = None) -> None:
        super().__init__(message)
        self.ref = ref  # what to delete, where the service gave it a reference


@dataclass
class SnapshotHooks:
    #: snapshot(sandbox, name) -> the reference a create takes; raises SnapshotLost
    snapshot: Callable[[Any, str], Awaitable[str]]
    #: exists(reference) -> whether the service still has it, ready
    exists: Callable[[str], Awaitable[bool]]
    #: delete(reference), best effort
    delete: Callable[[str], Awaitable[None]]


def use(sandbox: Any, prepared: Prepared, default_work: str, layer_mb: int) -> str:
    """Ask the sandbox's next exec for this lease's copy of ``prepared``; the new working dir."""
    lease = sandbox.lease
    if lease is None:
        raise InfraError(f"sandbox {sandbox.id}: prepared environments need the lease launcher (python3 in the image)")
    work = prepared.workdir or default_work
    lease.env = {"key": prepared.key, "work": work, "mb": int(layer_mb)}
    lease.env_root = ENV_ROOT
    if work not in lease.env_dirs:
        lease.env_dirs.append(work)
    return work


def _tail(text: str) -> str:
    return text[-OUTPUT_KEPT:]


class RemoteEnvironments:
    """The prepared environments of one remote provider (see the module docstring)."""

    def __init__(self, provider: Any, kind: str, hooks: SnapshotHooks, cache: str | None = None,
                 cache_mb: float = 20_000) -> None:
        self.provider = provider
        self.hooks = hooks
        self.builds = Builds(EnvironmentCache(cache, budget_mb=cache_mb), kind, self._build)
        self.images: dict[str, str] = {}  # snapshot reference -> key, for ``stale``
        self._checked: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- the pool's side ---------------------------------------------------------------------------

    async def prepare(self, spec: EnvironmentSpec) -> Prepared:
        self._loop = asyncio.get_running_loop()
        for _ in range(2):
            prepared = await self.builds.prepare(spec)
            assert prepared.image is not None
            self.images[prepared.image] = prepared.key
            if prepared.image in self._checked:
                return prepared
            if await self.hooks.exists(prepared.image):
                self._checked.add(prepared.image)
                return prepared
            log.warning("prepared environment %s: snapshot %s is gone; building it again", prepared.key[:12],
                        prepared.image)
            self.stale(prepared.image)
        raise InfraError(f"prepared environment {prepared.key[:12]}: its snapshot vanished twice")

    def stale(self, image: str) -> bool:
        """The snapshot ``image`` is missing: its key goes back to the cold path. True when it was one of ours."""
        key = self.images.pop(image, None)
        self._checked.discard(image)
        if key is None:
            return False
        release = getattr(self.builds.cache, "release", None)
        if release is not None:  # our own hold on the key would block its rebuild
            release(key)
        self.builds.cache.discard(key)
        return True

    def close(self) -> None:
        """The provider is closing: no lease of this process uses any key now."""
        for key in list(getattr(self.builds.cache, "held", ())):
            self.builds.cache.release(key)

    # -- building ----------------------------------------------------------------------------------

    def _build(self, spec: EnvironmentSpec, key: str, staging: Path) -> dict:
        """``Builds``' build function (a worker thread): the remote work runs on the provider's loop."""
        loop = self._loop
        assert loop is not None
        return asyncio.run_coroutine_threadsafe(self._abuild(spec, key), loop).result()

    def _sandbox_spec(self, spec: EnvironmentSpec, image: str | None = None) -> SandboxSpec:
        base = None if spec.base in ("", "host") else spec.base
        # The setup is the user's own (not the model's): the time limit is its bound.
        limits = ResourceLimits(cpu_seconds=spec.setup_timeout, memory_mb=8192, max_processes=1024,
                                file_size_mb=4096, open_files=4096)
        return SandboxSpec(image=image or base, network=spec.setup_network if image is None else False,
                           tags={"trl-sandbox-role": "environment-build"}, limits=limits,
                           lifetime_s=max(600.0, spec.setup_timeout + 600.0))

    async def _abuild(self, spec: EnvironmentSpec, key: str) -> dict:
        last: BaseException | None = None
        for attempt in range(1, SNAPSHOT_ATTEMPTS + 1):
            name = f"{PREFIX}{key[:16]}-{secrets.token_hex(4)}"
            sandbox = await self.provider.create(self._sandbox_spec(spec))
            try:
                output = await self._setup(sandbox, spec, key)
                ref = await self.hooks.snapshot(sandbox, name)
            except SnapshotLost as exc:  # never ready, or not there at all: delete what may exist
                last, ref = exc, None
                await self._delete(getattr(exc, "ref", None) or name)
            finally:
                await self._destroy(sandbox.id)
            if ref is not None:
                try:
                    await self._verify(spec, key, ref)
                    return {"image": ref, "name": name, "output": _tail(output)}
                except InfraError as exc:
                    last = exc
                    await self._delete(ref)
            log.warning("prepared environment %s: snapshot attempt %d of %d failed (%s); building again",
                        key[:12], attempt, SNAPSHOT_ATTEMPTS, last)
        raise InfraError(f"prepared environment {key[:12]}: no usable snapshot after {SNAPSHOT_ATTEMPTS} "
                         f"builds; last: {last}")

    async def _setup(self, sandbox: Any, spec: EnvironmentSpec, key: str) -> str:
        if getattr(sandbox, "lease", None) is None:
            raise ConfigError("prepared environments need python3 in the sandbox image (the lease launcher)")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + spec.setup_timeout
        work = spec.workdir or sandbox.work_dir
        sandbox.work_dir = work
        made = await sandbox.exec(["true"], timeout=30)  # the launcher makes the working directory
        if made.exit_code != 0:
            raise InfraError(f"environment build: could not make {work}: {made.stdout} {made.stderr}")
        for path, text in spec.files:
            await sandbox.write_file(path, text.encode("utf-8", "surrogateescape"))
        output = []
        for command in spec.setup:
            left = deadline - loop.time()
            if left <= 0:
                raise SetupFailed(f"environment setup ran past setup_timeout={spec.setup_timeout:g} s before "
                                  f"{command!r}\n{_tail(''.join(output))}")
            result = await sandbox.exec(["/bin/sh", "-c", command], timeout=left)
            output.append(f"$ {command}\n{result.stdout}{result.stderr}")
            if result.timed_out:
                raise SetupFailed(f"environment setup {command!r} ran past setup_timeout="
                                  f"{spec.setup_timeout:g} s\n{_tail(''.join(output))}")
            if result.exit_code != 0:
                raise SetupFailed(f"environment setup {command!r} exited {result.exit_code}\n"
                                  f"{_tail(''.join(output))}")
        sandbox.lease.freeze = {"from": work, "key": key}
        frozen = await sandbox.exec(["true"], timeout=max(60.0, deadline - loop.time()))
        if frozen.exit_code != 0:
            raise InfraError(f"environment build: freezing the tree failed: {frozen.stdout} {frozen.stderr}")
        return "".join(output)

    async def _verify(self, spec: EnvironmentSpec, key: str, ref: str) -> None:
        """Boot a sandbox from ``ref`` and take a lease copy of the tree in it."""
        try:
            sandbox = await self.provider.create(self._sandbox_spec(spec, image=ref))
        except InfraError as exc:
            raise SnapshotLost(f"booting snapshot {ref} failed: {exc}") from exc
        try:
            probe = Prepared(key, Path("/nonexistent"), spec.workdir, spec, ref)
            sandbox.work_dir = use(sandbox, probe, sandbox.work_dir, 64)
            result = await sandbox.exec(["/bin/sh", "-c", f"test -d {shlex.quote(sandbox.work_dir)}"], timeout=30)
            if result.exit_code != 0:
                raise SnapshotLost(f"snapshot {ref} booted without the tree: {result.stdout} {result.stderr}")
        except SnapshotLost:
            raise
        except InfraError as exc:
            raise SnapshotLost(f"snapshot {ref} booted without the tree of {key[:12]}: {exc}") from exc
        finally:
            await self._destroy(sandbox.id)

    async def _destroy(self, sandbox_id: str) -> None:
        try:
            await self.provider.destroy(sandbox_id)
        except Exception as exc:  # it ends with its lifetime
            log.warning("could not delete environment build sandbox %s: %r", sandbox_id, exc)

    async def _delete(self, ref: str) -> None:
        try:
            await self.hooks.delete(ref)
        except Exception as exc:
            log.warning("could not delete snapshot %s: %r", ref, exc)


class PreparesEnvironments:
    """Mixed into a remote provider: its ``RemoteEnvironments``, made on first use by the
    provider's ``_make_environments``, and the pool's two calls on them."""

    _environments: RemoteEnvironments | None = None

    def _make_environments(self) -> RemoteEnvironments:
        raise NotImplementedError

    @property
    def environments(self) -> RemoteEnvironments:
        if self._environments is None:
            self._environments = self._make_environments()
        return self._environments

    async def prepare_environment(self, spec: EnvironmentSpec) -> Prepared:
        """Build ``spec`` once into a snapshot (or find it built); leases are made from it."""
        return await self.environments.prepare(spec)

    def environment_metrics(self) -> dict[str, float]:
        return self._environments.builds.drain().metrics() if self._environments is not None else {}

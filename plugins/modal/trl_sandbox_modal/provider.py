"""Modal sandboxes through the official ``modal`` SDK (pinned: its protocol is private).

What a caller can rely on:

* ``create(spec)``: ``Sandbox.create("sleep", "infinity", app=..., image=..., tags=spec.tags,
  timeout=ceil(spec.lifetime_s), block_network=not spec.network, env=spec.env, cpu=(r, l),
  memory=(r, l))``: a finite server-side lifetime on every sandbox, the network off by default, the
  tags Modal's own (so ``list``/``reap`` find them from any process through ``Sandbox.list(app_id,
  tags)``). A ``sleep infinity`` entrypoint keeps the sandbox up between programs. The creation time
  travels as one more tag (``trl-sandbox-created``), since a listing gives none; ``list`` hides it.
* ``exec``, files, reset, alive: ``sandbox.py`` (every program through the lease launcher, whose
  wall clock is the per-exec timeout; Modal's exec timeout is the backstop).
* Errors: ``errors.py``. Throttling: Modal's client waits out a throttle (an ``RPCRetryPolicy``
  detail) without limit unless ``MODAL_MAX_THROTTLE_WAIT`` says otherwise, which would show up as
  latency inside the pool's time budget. The provider sets it (``max_throttle_wait``, default 0
  seconds, unless the variable is already set) so a throttle surfaces as ``RateLimitError`` with the
  server's wait, for the pool's limiter to honour.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import posixpath
import time
from collections.abc import Mapping
from typing import Any

from trl_sandbox import Capabilities, ConfigError, InfraError, SandboxInfo, SandboxSpec
from trl_sandbox.plugins.settings import flag, number
from trl_sandbox.remote.environment import PreparesEnvironments

from .errors import credentials, is_gone, translate
from .sandbox import ModalSandbox

log = logging.getLogger("trl_sandbox_modal")

CREATED_TAG = "trl-sandbox-created"  # epoch seconds at create: Modal's listing carries no time
MAX_LIFETIME_S = 24 * 3600  # Modal's longest sandbox timeout
SNAPSHOT = "modal-image:"  # ``SandboxSpec.image`` naming a Modal image id (a filesystem snapshot)


class ModalProvider(PreparesEnvironments):
    """Modal sandboxes.

    Settings (``sandbox_provider_settings``; numbers may be given as strings):

    * ``token_id``, ``token_secret``: else ``MODAL_TOKEN_ID``/``MODAL_TOKEN_SECRET`` or the active
      profile of ``~/.modal.toml``; the server is the SDK's (``MODAL_SERVER_URL``).
    * ``app_name`` (``trl-sandbox``: looked up, created if missing), ``environment_name`` (Modal's
      environment; the profile's by default).
    * ``image`` (``python:3.12-slim``, a registry tag; ``SandboxSpec.image`` wins): it needs
      ``python3`` for the lease launcher and the judge, and the toolchains of the languages you judge.
    * ``cpu``, ``memory``: physical cores and MiB requested (default: ``spec.cpus / 2`` cores, i.e.
      ``spec.cpus`` vCPUs, and ``spec.memory_mb``), each also the hard limit.
    * ``work_dir`` (``/tmp/trl-sandbox/work``; ``{id}`` becomes the sandbox id), ``rlimits``
      (apply ``SandboxSpec.limits`` in the launcher; true), ``clean_leases`` (true), ``isolation``
      (``auto``/``sweep``), ``resident_launcher`` (true): as for Daytona.
    * ``max_throttle_wait`` (0): seconds Modal's client may sleep on throttles before raising
      (``MODAL_MAX_THROTTLE_WAIT``; left alone when already set). ``create_timeout_s`` (120),
      ``max_concurrency``.
    * Prepared environments (``snapshots.py``): ``environment_cache``, ``environment_cache_mb``,
      ``environment_layer_mb``, ``snapshot_timeout_s`` (600), ``snapshot_ttl_s`` (a week: how long
      Modal keeps a snapshot image).
    """

    name = "modal"

    def __init__(
        self,
        token_id: str | None = None,
        token_secret: str | None = None,
        *,
        app_name: str = "trl-sandbox",
        environment_name: str | None = None,
        image: str | None = "python:3.12-slim",
        cpu: float | None = None,
        memory: int | None = None,
        work_dir: str = "/tmp/trl-sandbox/work",
        rlimits: bool = True,
        clean_leases: bool = True,
        isolation: str = "auto",
        resident_launcher: bool = True,
        max_throttle_wait: float = 0,
        create_timeout_s: float = 120.0,
        max_concurrency: int | None = None,
        environment_cache: str | None = None,
        environment_cache_mb: float = 20_000,
        environment_layer_mb: int = 1024,
        snapshot_timeout_s: float = 600.0,
        snapshot_ttl_s: int = 7 * 24 * 3600,
    ) -> None:
        self._token = credentials(token_id, token_secret)
        if not work_dir.startswith("/") or posixpath.normpath(work_dir) == "/":
            raise ConfigError(f"modal provider setting work_dir={work_dir!r} must be an absolute path below /")
        if isolation not in ("auto", "sweep"):
            raise ConfigError(f"modal provider setting isolation={isolation!r} must be auto or sweep")
        self.app_name = app_name
        self.environment_name = environment_name or None
        self.image = image or None
        self.cpu = number("modal", "cpu", cpu, float, 0.125)
        self.memory = number("modal", "memory", memory, int, 128)
        self.work_dir = posixpath.normpath(work_dir)
        self.rlimits = flag("modal", "rlimits", rlimits)
        self.clean_leases = flag("modal", "clean_leases", clean_leases)
        self.resident_launcher = flag("modal", "resident_launcher", resident_launcher)
        self.isolation = isolation
        throttle = number("modal", "max_throttle_wait", max_throttle_wait, float, 0)
        os.environ.setdefault("MODAL_MAX_THROTTLE_WAIT", str(int(throttle)))
        self.create_timeout_s = number("modal", "create_timeout_s", create_timeout_s, float, 1)
        self.capabilities = Capabilities(
            network_isolation=True, files=True, persistent_state=True, separate_stderr=True,
            max_concurrency=number("modal", "max_concurrency", max_concurrency, int, 1), fast_python=False)
        self.environment_cache = environment_cache or None
        self.environment_cache_mb = number("modal", "environment_cache_mb", environment_cache_mb, float, 1)
        self.environment_layer_mb = number("modal", "environment_layer_mb", environment_layer_mb, int, 1)
        self.snapshot_timeout_s = number("modal", "snapshot_timeout_s", snapshot_timeout_s, float, 0.1)
        self.snapshot_ttl_s = number("modal", "snapshot_ttl_s", snapshot_ttl_s, int, 60)
        self._client: Any = None
        self._app: Any = None
        self._images: dict[str, Any] = {}
        self._owned: dict[str, Any] = {}
        self._locks: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}
        self._cleanups: set[asyncio.Task] = set()

    def work_dir_for(self, sandbox_id: str) -> str:
        return self.work_dir.replace("{id}", sandbox_id)

    @staticmethod
    def is_snapshot(image: str | None) -> bool:
        return bool(image) and str(image).startswith(SNAPSHOT)

    def _make_environments(self) -> Any:
        from .snapshots import environments

        return environments(self, self.environment_cache, self.environment_cache_mb)

    # -- the SDK's objects -----------------------------------------------------------------------

    async def client(self) -> Any:
        """The Modal client and the app (looked up once; the SDK runs them on its own loop)."""
        if self._app is not None:
            return self._client
        import modal

        loop = asyncio.get_running_loop()
        lock = self._locks.setdefault(loop, asyncio.Lock())  # the pool's first creates arrive together
        async with lock:
            try:
                if self._client is None:
                    self._client = await modal.Client.from_credentials.aio(*self._token)
                if self._app is None:
                    self._app = await modal.App.lookup.aio(self.app_name, create_if_missing=True, client=self._client,
                                                           environment_name=self.environment_name)
            except Exception as exc:
                raise translate(exc, "connecting") from exc
        return self._client

    @property
    def app(self) -> Any:
        """The Modal app (after ``client()``)."""
        return self._app

    def forget_image(self, name: str) -> None:
        self._images.pop(name, None)

    def _image(self, name: str | None) -> Any:
        import modal

        name = name or self.image
        if name not in self._images:
            if self.is_snapshot(name):
                self._images[name] = modal.Image.from_id(name[len(SNAPSHOT):], client=self._client)
            elif name:
                self._images[name] = modal.Image.from_registry(name)
            else:
                self._images[name] = modal.Image.debian_slim()
        return self._images[name]

    def create_arguments(self, spec: SandboxSpec) -> dict[str, Any]:
        """``Sandbox.create``'s keyword arguments for ``spec`` (without app, image and client)."""
        cpu = self.cpu or max(0.125, spec.cpus / 2)
        memory = self.memory or int(spec.memory_mb)
        tags = {str(k): str(v) for k, v in spec.tags.items()}
        tags[CREATED_TAG] = f"{time.time():.3f}"
        return dict(tags=tags, timeout=max(1, min(MAX_LIFETIME_S, math.ceil(spec.lifetime_s))),
                    block_network=not spec.network, env={str(k): str(v) for k, v in spec.env.items()} or None,
                    cpu=(cpu, cpu), memory=(memory, memory))

    # -- the provider contract -------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> ModalSandbox:
        import modal

        client = await self.client()
        try:
            sdk_sandbox = await asyncio.wait_for(modal.Sandbox.create.aio(
                "sleep", "infinity", app=self._app, image=self._image(spec.image), client=client,
                **self.create_arguments(spec)), self.create_timeout_s)
        except asyncio.TimeoutError as exc:
            raise InfraError(f"Modal: creating a sandbox took more than {self.create_timeout_s:g} s; the "
                             "pool's final sweep by tags removes it if Modal made it") from exc
        except Exception as exc:
            if self.is_snapshot(spec.image) and is_gone(exc):  # one of our snapshot images: never a setting
                self.forget_image(spec.image)
                again = self._environments is not None and self._environments.stale(spec.image)
                raise InfraError(f"Modal: image {spec.image} is missing ({exc})"
                                 + ("; its environment is built again at its next use" if again else "")) from exc
            raise translate(exc, "create") from exc
        self._owned[sdk_sandbox.object_id] = (asyncio.get_running_loop(), sdk_sandbox)
        sandbox = ModalSandbox(self, sdk_sandbox, spec)
        try:
            await sandbox.prepare()
        except BaseException:
            self._owned.pop(sandbox.id, None)
            self._cleanup_later(sandbox.id)
            raise
        return sandbox

    def _cleanup_later(self, sandbox_id: str) -> None:
        """Terminate in the background (safe from a cancelled create); ``aclose`` waits for it."""
        task = asyncio.get_running_loop().create_task(self._destroy_quietly(sandbox_id))
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def _destroy_quietly(self, sandbox_id: str) -> None:
        try:
            await asyncio.wait_for(self.destroy(sandbox_id), 30)
        except Exception as exc:
            log.warning("could not terminate Modal sandbox %s (it ends with its timeout): %r", sandbox_id, exc)

    async def list(self, tags: Mapping[str, str]) -> list[SandboxInfo]:
        import modal

        client = await self.client()
        found = []
        try:
            async for sdk_sandbox in modal.Sandbox.list.aio(app_id=self._app.app_id, tags=dict(tags) or None,
                                                            client=client):
                try:
                    have = await sdk_sandbox.get_tags.aio()
                except Exception as exc:
                    if is_gone(exc):
                        continue  # ended between the listing and now
                    raise
                created = have.pop(CREATED_TAG, None)
                try:
                    created_at = float(created) if created else None
                except ValueError:
                    created_at = None
                found.append(SandboxInfo(sdk_sandbox.object_id, have, "running", created_at))
        except Exception as exc:
            raise translate(exc, "list") from exc
        return found

    async def destroy(self, sandbox_id: str) -> None:
        import modal

        client = await self.client()
        _, sdk_sandbox = self._owned.pop(sandbox_id, (None, None))
        try:
            if sdk_sandbox is None:
                sdk_sandbox = await modal.Sandbox.from_id.aio(sandbox_id, client=client)
            await sdk_sandbox.terminate.aio()
        except Exception as exc:
            if is_gone(exc):
                return  # already gone
            raise translate(exc, f"terminating sandbox {sandbox_id}") from exc

    async def aclose(self) -> None:
        if self._environments is not None:
            self._environments.close()
        loop = asyncio.get_running_loop()
        mine = [task for task in self._cleanups if task.get_loop() is loop]
        if mine:
            await asyncio.gather(*mine, return_exceptions=True)
        # This loop's sandboxes only: a prepared environment's pools share the provider on loops of their own.
        for sandbox_id, (owner, sdk_sandbox) in list(self._owned.items()):
            if owner is loop:
                del self._owned[sandbox_id]
                try:
                    await sdk_sandbox.detach.aio()
                except Exception:  # detaching only frees the client's connection to the router
                    pass
        self._locks.pop(loop, None)

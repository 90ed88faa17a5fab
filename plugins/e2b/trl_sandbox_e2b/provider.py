"""E2B sandboxes through the official ``e2b`` SDK (``AsyncSandbox``, bound by an ``E2B`` client).

What a caller can rely on:

* ``create(spec)``: ``spec.tags`` become E2B metadata (so ``list``/``reap`` find them from any
  process), ``spec.env`` the sandbox's env vars, ``allow_internet_access = spec.network`` (off by
  default), and the server-side lifetime is ``spec.lifetime_s`` capped by ``max_lifetime_s`` (E2B's
  ``timeout``; on its end the
  sandbox is killed: ``lifecycle={"on_timeout": "kill"}``). A create carries an idempotency key:
  one whose answer never came (``create_timeout_s``, or cancelled by the pool's deadline) is sent
  again in the background with the same key, and the sandbox E2B made for it is killed. CPU and memory belong to the template (E2B's create has no such
  fields): ``spec.cpus``/``memory_mb`` are not applied, the launcher's rlimits are.
* exec, files, reset and health: ``sandbox.py`` (every program through the lease launcher).
* Errors: ``errors.py``. The SDK's own control-plane retries (``retries``, default 0 here) would
  hide failures inside one attempt of the pool: the pool retries instead, within its budget and
  through the host-wide limiter (``sandbox_host_create_rate``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import posixpath
import uuid
from collections.abc import Mapping
from typing import Any

from trl_sandbox import Capabilities, ConfigError, InfraError, SandboxInfo, SandboxSpec
from trl_sandbox.plugins.settings import flag, number
from trl_sandbox.remote.environment import PreparesEnvironments

from . import errors
from .sandbox import E2BSandbox

log = logging.getLogger("trl_sandbox_e2b")


def _sdk() -> Any:
    try:
        import e2b
    except ImportError as exc:  # the distribution depends on it: a broken install
        raise ConfigError(f"the e2b sandbox provider needs the e2b SDK: pip install trl-sandbox-e2b ({exc})") from None
    return e2b


def _timed_out(exc: BaseException) -> bool:
    """A request that got no answer in time (the server may have acted on it)."""
    import httpx

    return isinstance(exc, (httpx.TimeoutException, TimeoutError))


class E2BProvider(PreparesEnvironments):
    """E2B sandboxes.

    Settings (``sandbox_provider_settings``; numbers may be given as strings):

    * ``api_key``, ``domain``, ``api_url``, ``sandbox_url``: the SDK's own configuration; unset values
      come from ``E2B_API_KEY``, ``E2B_DOMAIN``, ``E2B_API_URL``, ``E2B_SANDBOX_URL``.
    * ``template`` (E2B's ``base`` when unset; ``SandboxSpec.image`` takes precedence): a template
      whose image has ``python3`` (the lease launcher and the judge need it) and the toolchains the
      tasks use.
    * ``user`` (``root``): who runs commands and owns files (the launcher needs root to isolate).
    * ``work_dir`` (``/tmp/trl-sandbox/work``; ``{id}`` is replaced by the sandbox id), ``rlimits``
      (apply ``SandboxSpec.limits``; True), ``clean_leases`` (True), ``isolation`` (``auto`` or
      ``sweep``), ``resident_launcher`` (True).
    * Prepared environments (``snapshots.py``): ``environment_cache`` (the on-disk registry's
      directory), ``environment_cache_mb``, ``environment_layer_mb``, ``snapshot_timeout_s`` (600).
    * ``retries`` (the SDK's control-plane retries; 0), ``rate_limit_wait_s`` (the wait after a 429,
      which the SDK does not pass on; 1.0), ``request_timeout_s`` (30), ``create_timeout_s`` (60),
      ``max_lifetime_s`` (3600: a sandbox's lifetime is ``spec.lifetime_s`` capped by it; Hobby's
      limit is 1 h, Pro's 24 h),
      ``max_concurrency`` (None; E2B Hobby allows 20 running sandboxes, Pro 100).
    """

    name = "e2b"

    def __init__(
        self,
        api_key: str | None = None,
        domain: str | None = None,
        api_url: str | None = None,
        sandbox_url: str | None = None,
        *,
        template: str | None = None,
        user: str = "root",
        work_dir: str = "/tmp/trl-sandbox/work",
        rlimits: bool = True,
        clean_leases: bool = True,
        isolation: str = "auto",
        resident_launcher: bool = True,
        retries: int = 0,
        rate_limit_wait_s: float = 1.0,
        request_timeout_s: float = 30.0,
        create_timeout_s: float = 60.0,
        max_lifetime_s: float = 3600.0,
        max_concurrency: int | None = None,
        environment_cache: str | None = None,
        environment_cache_mb: float = 20_000,
        environment_layer_mb: int = 1024,
        snapshot_timeout_s: float = 600.0,
    ) -> None:
        _sdk()
        if not (api_key or os.environ.get("E2B_API_KEY")):
            raise ConfigError(f"the e2b sandbox provider needs an API key: {errors.KEY_HINT}")
        if not work_dir.startswith("/") or posixpath.normpath(work_dir) == "/":
            raise ConfigError(f"e2b provider setting work_dir={work_dir!r} must be an absolute path below /")
        if isolation not in ("auto", "sweep"):
            raise ConfigError(f"e2b provider setting isolation={isolation!r} must be auto or sweep")
        self._params = {k: v for k, v in dict(api_key=api_key, domain=domain, api_url=api_url,
                                               sandbox_url=sandbox_url).items() if v}
        self._params["retries"] = number("e2b", "retries", retries, int, 0)
        self.template = template or None
        self.user = user or "root"
        self.work_dir = posixpath.normpath(work_dir)
        self.rlimits = flag("e2b", "rlimits", rlimits)
        self.clean_leases = flag("e2b", "clean_leases", clean_leases)
        self.isolation = isolation
        self.resident_launcher = flag("e2b", "resident_launcher", resident_launcher)
        self.rate_limit_wait_s = number("e2b", "rate_limit_wait_s", rate_limit_wait_s, float, 0)
        self.request_timeout_s = number("e2b", "request_timeout_s", request_timeout_s, float, 0.1)
        self.create_timeout_s = number("e2b", "create_timeout_s", create_timeout_s, float, 1)
        # The pool rotates a member before this ends (``pool/heal.py``), so a killed run's
        # leftovers die within it; E2B's Hobby plan allows 1 h, Pro 24 h.
        self.lifetime_cap_s = number("e2b", "max_lifetime_s", max_lifetime_s, float, 60)
        self.environment_cache = environment_cache or None
        self.environment_cache_mb = number("e2b", "environment_cache_mb", environment_cache_mb, float, 1)
        self.environment_layer_mb = number("e2b", "environment_layer_mb", environment_layer_mb, int, 1)
        self.snapshot_timeout_s = number("e2b", "snapshot_timeout_s", snapshot_timeout_s, float, 0.1)
        self.capabilities = Capabilities(
            network_isolation=True, files=True, persistent_state=True, separate_stderr=True,
            max_concurrency=number("e2b", "max_concurrency", max_concurrency, int, 1), fast_python=False,
        )
        self._client: Any = None
        self._cleanups: set[asyncio.Task] = set()

    def work_dir_for(self, sandbox_id: str) -> str:
        return self.work_dir.replace("{id}", sandbox_id)

    def _make_environments(self) -> Any:
        from .snapshots import environments

        return environments(self, self.environment_cache, self.environment_cache_mb)

    @property
    def sdk(self) -> Any:
        """``AsyncSandbox`` bound to this provider's configuration (an ``e2b.E2B`` client)."""
        if self._client is None:
            self._client = _sdk().E2B(**self._params)
        return self._client.AsyncSandbox

    def _template(self, spec: SandboxSpec) -> str | None:
        return spec.image or self.template

    def from_environment(self, spec: SandboxSpec) -> bool:
        """Whether ``spec`` boots one of our environments' snapshots (its pristine tree is kept, hidden)."""
        from .snapshots import is_snapshot

        image = spec.image or ""
        return is_snapshot(image) or (self._environments is not None and image in self._environments.images)

    async def create(self, spec: SandboxSpec) -> E2BSandbox:
        template = self._template(spec)
        kwargs: dict[str, Any] = dict(
            timeout=max(1, math.ceil(min(spec.lifetime_s, self.lifetime_cap_s))),
            metadata={str(k): str(v) for k, v in spec.tags.items()},
            envs={str(k): str(v) for k, v in spec.env.items()} or None,
            allow_internet_access=bool(spec.network),
            lifecycle={"on_timeout": "kill"},
            idempotency_key=str(uuid.uuid4()),
            request_timeout=self.create_timeout_s,
        )
        if template:
            kwargs["template"] = template
        try:
            sdk_sandbox = await self.sdk.create(**kwargs)
        except asyncio.CancelledError:  # the pool gave up on it: E2B may have made it all the same
            self._cleanup_later(self._recover(kwargs))
            raise
        except Exception as exc:
            if _timed_out(exc):
                self._cleanup_later(self._recover(kwargs))
                raise InfraError(f"E2B: creating a sandbox timed out after {self.create_timeout_s:g} s "
                                 "(any sandbox it made is being killed)") from exc
            if errors.status_of(exc) == 404 and "template" in str(exc).lower():
                if self.from_environment(spec):  # one of our snapshots: its key goes back to the cold path
                    if self._environments is not None:
                        self._environments.stale(template or "")
                    raise InfraError(f"E2B: snapshot {template} is missing ({exc}); its environment is built "
                                     "again at its next use") from exc
                raise errors.unknown_template(template or "base", exc) from exc
            raise errors.translate(exc, "create", rate_limit_wait_s=self.rate_limit_wait_s) from exc
        sandbox = E2BSandbox(self, sdk_sandbox, spec)
        try:
            await sandbox._prepare()
        except BaseException:
            self._kill_later(sandbox.id)
            raise
        return sandbox

    def _kill_later(self, sandbox_id: str) -> None:
        """Kill in the background (safe from a cancelled create); the pool's sweep by tags also finds it."""
        self._cleanup_later(self._destroy_quietly(sandbox_id))

    def _cleanup_later(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def _recover(self, kwargs: dict[str, Any]) -> None:
        """A create whose answer never came: the same request again, with the same idempotency
        key, gives back the sandbox E2B made for it (or makes one), which is then killed."""
        try:
            sdk_sandbox = await self.sdk.create(**{**kwargs, "request_timeout": 30.0})
        except Exception as exc:
            log.warning("could not recover a timed-out E2B create (its sandbox, if any, ends with its lifetime "
                        "or the next sweep by tags): %r", exc)
            return
        await self._destroy_quietly(sdk_sandbox.sandbox_id)

    async def _destroy_quietly(self, sandbox_id: str) -> None:
        try:
            await asyncio.wait_for(self.destroy(sandbox_id), 30)
        except Exception as exc:
            log.warning("could not kill E2B sandbox %s (it ends with its lifetime): %r", sandbox_id, exc)

    async def list(self, tags: Mapping[str, str]) -> list[SandboxInfo]:
        from e2b import SandboxQuery, SandboxState

        query = SandboxQuery(metadata={str(k): str(v) for k, v in tags.items()} or None,
                             state=[SandboxState.RUNNING, SandboxState.PAUSED])
        found = []
        try:
            pager = self.sdk.list(query=query, limit=100, request_timeout=self.request_timeout_s)
            while pager.has_next:
                for info in await pager.next_items():
                    state = str(getattr(info.state, "value", info.state)).lower()
                    started = info.started_at.timestamp() if getattr(info, "started_at", None) else None
                    found.append(SandboxInfo(info.sandbox_id, dict(info.metadata or {}), state, started))
        except Exception as exc:
            raise errors.translate(exc, "list", rate_limit_wait_s=self.rate_limit_wait_s) from exc
        return found

    async def destroy(self, sandbox_id: str) -> None:
        """Kill a sandbox; one already gone is fine (``kill`` answers False for a 404)."""
        try:
            await self.sdk.kill(sandbox_id, request_timeout=self.request_timeout_s)
        except Exception as exc:
            if errors.is_gone(exc):
                return
            raise errors.translate(exc, f"killing sandbox {sandbox_id}",
                                   rate_limit_wait_s=self.rate_limit_wait_s) from exc

    async def aclose(self) -> None:
        if self._environments is not None:
            self._environments.close()
        loop = asyncio.get_running_loop()
        mine = [task for task in self._cleanups if task.get_loop() is loop]
        if mine:
            await asyncio.gather(*mine, return_exceptions=True)

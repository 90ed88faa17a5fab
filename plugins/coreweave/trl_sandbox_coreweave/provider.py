"""CoreWeave Sandbox (formerly Aviato) through the official ``cwsandbox`` SDK (gRPC).

The SDK runs every call on its own background event-loop thread and hands back futures
(``OperationRef``, ``Process``); this provider awaits them with ``asyncio.wrap_future`` semantics
(``await ref``), so the pool's loop never blocks. The one blocking call it uses,
``Sandbox.get_status()``, runs in a worker thread.

What a caller can rely on:

* ``create(spec)``: ``spec.tags`` become cwsandbox tags ``"key:value"`` (CoreWeave turns tags into
  Kubernetes labels), ``max_lifetime_seconds`` is ``spec.lifetime_s`` capped by the ``max_lifetime_s``
  setting (1800: a killed run's leftovers end within 30 minutes; the pool replaces members first), the
  image is ``spec.image`` or the ``image`` setting (``python:3.11``), ``resources`` are Guaranteed
  QoS from the ``cpu``/``memory`` settings or the spec, and with ``spec.network`` off all egress and
  ingress is denied. ``create`` waits until the sandbox runs; one that does not start in time (or
  fails) is deleted before ``InfraError`` is raised.
* ``exec``: argv runs without a shell; stdout and stderr are separate. stdin is streamed over the
  exec RPC, byte-exact, then closed. A timeout is the exec RPC's deadline: the SDK raises
  ``SandboxTimeoutError`` and the result is ``timed_out=True``. Inside the sandbox the command also
  runs under ``timeout -s KILL`` (one second past the deadline) so that nothing keeps running if
  the service does not stop a command whose RPC was cancelled, and under ``prlimit`` for
  ``SandboxSpec.limits`` (both only when the image has the tool; checked once per sandbox).
* Relative paths and the default cwd are the work directory (``work_dir``, default
  ``/tmp/trl-sandbox/work``). ``reset()`` sends nothing: the next exec carries it. Every program
  runs through the lease launcher (``trl_sandbox.remote.lease``): in a PID namespace of its own
  that ends with it (or, where the image refuses namespaces, between two sweeps that kill every
  process a program left), after the due reset has emptied ``/tmp``, ``/var/tmp``, ``/dev/shm``
  and the work directory; the launcher applies ``SandboxSpec.limits`` and the cwd.
* Errors: UNAVAILABLE/INTERNAL/transport -> ``InfraError``, RESOURCE_EXHAUSTED -> ``RateLimitError``
  (``retry_after`` from the server's RetryInfo) or ``QuotaError`` when it names a quota,
  UNAUTHENTICATED/PERMISSION_DENIED -> ``ConfigError``, NOT_FOUND on our sandbox -> ``InfraError``
  (it vanished).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import posixpath
import re
import shlex
import time
from collections.abc import Mapping, Sequence
from typing import Any

from trl_sandbox import (
    Capabilities,
    ConfigError,
    ExecResult,
    InfraError,
    QuotaError,
    RateLimitError,
    ResourceLimits,
    SandboxError,
    SandboxGoneError,
    SandboxInfo,
    SandboxSpec,
)
from trl_sandbox.plugins.settings import flag, number
from trl_sandbox.remote import environment, files
from trl_sandbox.remote.environment import PreparesEnvironments
from trl_sandbox.remote.lease import (
    CLEANING_MARGIN_S,
    FAILED_EXIT,
    LAUNCHER_SOURCE,
    Lease,
    failure,
    probe_argv,
    timed_out,
)
from trl_sandbox.sandbox import exec_arguments

from .snapshots import environments, is_snapshot, options, split

log = logging.getLogger("trl_sandbox_coreweave")

TAG_SEPARATOR = ":"
KEY_HINT = (
    "set CWSANDBOX_API_KEY (a CoreWeave Sandbox API key; the cwsandbox SDK reads only this variable, "
    "AVIATO_API_KEY from the Aviato days is not read) or pass the provider setting api_key=...; "
    "to authenticate with Weights & Biases instead, pass auth=wandb (needs `pip install 'trl-sandbox-coreweave[wandb]'` "
    "and WANDB_API_KEY or `wandb login`)"
)
_QUOTA = re.compile(r"(?<![a-z])quota", re.IGNORECASE)  # also matches reasons like CWSANDBOX_QUOTA_EXCEEDED
_GRACE_S = 1  # the in-sandbox kill comes this long after the exec deadline


def encode_tags(tags: Mapping[str, str]) -> list[str]:
    return [f"{k}{TAG_SEPARATOR}{v}" for k, v in tags.items()]


def decode_tags(tags: Sequence[str]) -> dict[str, str]:
    out = {}
    for tag in tags:
        key, _, value = str(tag).partition(TAG_SEPARATOR)
        out[key] = value
    return out


# -- errors -------------------------------------------------------------------------------------


def _grpc_code(exc: BaseException) -> Any:
    """The gRPC status code behind an SDK error (the SDK chains the ``grpc.RpcError`` as the cause)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        code = getattr(current, "code", None)
        if callable(code):
            try:
                return code()
            except Exception:
                pass
        current = current.__cause__ or current.__context__
    return None


def translate(exc: BaseException, what: str, sandbox_id: str | None = None) -> SandboxError:
    """Map a cwsandbox SDK (or gRPC) error to the trl-sandbox taxonomy."""
    if isinstance(exc, SandboxError):
        return exc
    import grpc
    from cwsandbox import (
        CWSandboxAuthenticationError,
        CWSandboxValidationError,
        SandboxNotFoundError,
        SandboxResourceExhaustedError,
    )

    code = _grpc_code(exc)
    message = f"CoreWeave Sandbox: {what} failed: {exc}"
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED or isinstance(exc, SandboxResourceExhaustedError):
        if _QUOTA.search(f"{exc} {getattr(exc, 'reason', '') or ''}"):
            return QuotaError(f"{message}. This is an account quota: use fewer or smaller sandboxes")
        delay = getattr(exc, "retry_delay", None)
        if hasattr(delay, "total_seconds"):
            delay = delay.total_seconds()
        return RateLimitError(message, retry_after=float(delay) if delay is not None else None)
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED) or isinstance(
        exc, CWSandboxAuthenticationError
    ):
        return ConfigError(f"{message}. The credentials were rejected: {KEY_HINT}")
    if code == grpc.StatusCode.INVALID_ARGUMENT or isinstance(exc, (CWSandboxValidationError, ValueError, TypeError)):
        return ConfigError(f"{message}. The request was rejected; check the provider settings")
    if sandbox_id is not None and (code == grpc.StatusCode.NOT_FOUND or isinstance(exc, SandboxNotFoundError)):
        return SandboxGoneError(f"CoreWeave Sandbox: sandbox {sandbox_id} vanished ({what}: {exc})")
    return InfraError(message)


def _is_exec_timeout(exc: BaseException) -> bool:
    """True when the command ran out of time: the exec RPC's deadline, or the service's command timeout.

    The SDK raises ``SandboxTimeoutError`` for other waits too (connecting, the sandbox becoming ready,
    the service never signalling that stdin may be sent): those are infrastructure failures.
    """
    from cwsandbox import SandboxCommandTimeoutError, SandboxRequestTimeoutError, SandboxTimeoutError

    if isinstance(exc, SandboxCommandTimeoutError):
        return True
    return (isinstance(exc, SandboxTimeoutError) and not isinstance(exc, SandboxRequestTimeoutError)
            and "timed out after" in str(exc))


# -- sandbox ------------------------------------------------------------------------------------


class CoreWeaveSandbox:
    """One CoreWeave sandbox. Use through ``CoreWeaveProvider.create``."""

    def __init__(self, provider: CoreWeaveProvider, sdk_sandbox: Any, spec: SandboxSpec) -> None:
        self.id: str = sdk_sandbox.sandbox_id
        self.tags = dict(spec.tags)
        self.work_dir = provider.work_dir_for(self.id)
        self.limits: ResourceLimits = spec.limits
        self.network = bool(spec.network)  # without it, each program gets a network namespace of its own
        self.tools: set[str] = set()
        self.from_environment = is_snapshot(spec.image)
        self.image_base = None if self.from_environment else spec.image  # what a snapshot of it restores on
        # The lease launcher (``trl_sandbox.remote.lease``): a clean lease and an isolated program
        # per exec. None when the image has no python3 (the old behaviour, with a warning).
        self.lease: Lease | None = None
        self._busy = 0
        self._provider = provider
        self._sb = sdk_sandbox

    def _path(self, path: str) -> str:
        if "\0" in path:
            raise ValueError(f"invalid path {path!r}")
        return posixpath.normpath(posixpath.join(self.work_dir, path))

    async def _prepare(self) -> None:
        """Create the work directory and find out which helper tools the image has."""
        work = shlex.quote(self.work_dir)
        script = (f"mkdir -p -- {work} && for tool in prlimit timeout env; do "
                  'if command -v "$tool" >/dev/null 2>&1; then echo "tool=$tool"; fi; done')
        clean = self._provider.clean_leases
        if clean:  # the launcher's probe rides in the same exec (its source and spec as $1 and $2)
            script += '; python3 -I -S -c "$1" "$2" </dev/null 2>/dev/null; true'
        try:
            result = await self._sb.exec(["/bin/sh", "-c", script, "sh", LAUNCHER_SOURCE,
                                          probe_argv(serve=self._provider.resident_launcher and self._provider.isolation != "sweep")[-1]] if clean
                                         else ["/bin/sh", "-c", script], timeout_seconds=60)
        except Exception as exc:
            raise translate(exc, "preparing the work directory", self.id) from exc
        if result.returncode != 0:
            raise InfraError(f"CoreWeave Sandbox: sandbox {self.id}: could not create {self.work_dir}: "
                             f"{result.stderr or result.stdout!r}")
        self.tools = {line[5:] for line in result.stdout.splitlines() if line.startswith("tool=")}
        if clean:
            self.lease = Lease.adopt(result.stdout, self.id, "coreweave", sweep=self._provider.isolation == "sweep",
                                     env_root=environment.ENV_ROOT if self.from_environment else None)

    def command(self, argv: list[str], timeout: float, env: Mapping[str, str] | None,
                cwd: str | None = None) -> tuple[list[str], str | None]:
        """argv wrapped with the environment, the in-sandbox kill and the resource limits (the
        launcher applies them and the cwd, and carries a due reset); and the launcher's tag."""
        prefix: list[str] = []
        if env:
            if "env" not in self.tools:
                raise InfraError(f"CoreWeave Sandbox: sandbox {self.id} has no `env` to pass exec variables")
            prefix += ["env", "--", *(f"{k}={v}" for k, v in env.items())]
        margin = CLEANING_MARGIN_S if self.lease is not None else 0  # the launcher's cleaning
        # Not in sweep mode: the program would see the wrapper's command line, the launcher's tag
        # in it (its own ``failed`` line forged). The launcher ends the program at its deadline and
        # the next sweep kills whatever outlived a launcher the SDK's timeout abandoned.
        sweep = self.lease is not None and self.lease.isolation == "sweep"
        if self._provider.kill_after_timeout and "timeout" in self.tools and not sweep:
            prefix += ["timeout", "-s", "KILL", str(math.ceil(timeout) + _GRACE_S + margin)]
        if self.lease is not None:
            launcher, tag = self.lease.argv(argv, work=self.work_dir, cwd=cwd, timeout=timeout,
                                            limits=self.limits if self._provider.rlimits else None,
                                            network=self.network, cap=self.limits.output_bytes)
            return [*prefix, *launcher], tag
        if self._provider.rlimits and "prlimit" in self.tools:
            limits = self.limits
            prefix += ["prlimit", f"--cpu={max(1, math.ceil(limits.cpu_seconds))}",
                       f"--as={int(limits.memory_mb) << 20}", f"--fsize={int(limits.file_size_mb) << 20}",
                       f"--nofile={int(limits.open_files)}", "--"]
        return [*prefix, *argv], None

    async def exec(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | str | None = None,
        timeout: float,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        argv, stdin = exec_arguments(argv, stdin, timeout)
        self._busy += 1
        try:
            return await self._exec(argv, stdin, timeout, cwd, env)
        finally:
            self._busy -= 1

    async def _exec(self, argv: list[str], stdin: bytes | None, timeout: float, cwd: str | None,
                    env: Mapping[str, str] | None) -> ExecResult:
        full_cwd = self._path(cwd) if cwd else self.work_dir
        command, tag = self.command(argv, timeout, {str(k): str(v) for k, v in (env or {}).items()}, full_cwd)
        reset = False
        if self.lease is not None:
            reset, self.lease.reset_due = self.lease.reset_due, False
        started = time.monotonic()
        try:
            # With the launcher, no cwd for the SDK (it would wrap the argv in one more shell).
            process = self._sb.exec(command, cwd=None if tag is not None else full_cwd,
                                    timeout_seconds=float(timeout) + (CLEANING_MARGIN_S if tag is not None else 0),
                                    stdin=bool(stdin))
            if stdin:
                try:
                    await process.stdin.write(bytes(stdin))
                    await process.stdin.close()
                except Exception as exc:  # the program exited without reading it all: its result says how
                    log.debug("stdin of an exec in sandbox %s was cut short: %r", self.id, exc)
            result = await process
        except Exception as exc:
            if _is_exec_timeout(exc) and tag is None:
                return ExecResult(exit_code=None, timed_out=True, duration_s=time.monotonic() - started)
            if _is_exec_timeout(exc):
                # The launcher ends a program at its own deadline and says so: the service's backstop,
                # 10 s later, means the launcher (or the resident) failed, never the program.
                raise SandboxGoneError(f"CoreWeave Sandbox: sandbox {self.id}: the lease launcher did not end "
                                       "the program by its deadline") from exc
            if reset:
                self.lease.reset_due = True  # it may not have reached the sandbox: carry it again
            raise translate(exc, "exec", self.id) from exc
        duration = time.monotonic() - started
        cap = self.limits.output_bytes
        out, err = result.stdout_bytes, result.stderr_bytes
        if tag is not None and result.returncode == FAILED_EXIT:
            why = failure(out.decode("utf-8", "replace"), tag)
            if why is not None:  # the sandbox cannot be made clean: another one runs the program
                raise SandboxGoneError(f"CoreWeave Sandbox: sandbox {self.id}: the lease launcher failed: {why}")
        if tag is not None and out.endswith(b"]\n") and timed_out(out[-64:].decode("ascii", "replace"), tag):
            return ExecResult(exit_code=None, timed_out=True, duration_s=duration)
        truncated = len(out) > cap or len(err) > cap
        return ExecResult(
            exit_code=result.returncode,
            stdout=out[:cap].decode("utf-8", "replace"),
            stderr=err[:cap].decode("utf-8", "replace"),
            truncated=truncated,
            duration_s=duration,
        )

    async def _flush_reset(self) -> None:
        """Carry a due reset now (one exec), before a file operation that must see its result."""
        if self.lease is not None and self.lease.reset_due:
            result = await self._exec(["true"], None, 30, None, None)
            if result.exit_code != 0:
                raise InfraError(f"CoreWeave Sandbox: sandbox {self.id}: reset failed: {result.stderr!r}")

    async def write_file(self, path: str, data: bytes) -> None:
        """Write a file; missing parent directories are created (when the service does not do it)."""
        from cwsandbox import SandboxFileError

        if isinstance(data, str):
            data = data.encode()
        full, relative = files.confine(self.work_dir, path)
        await self._flush_reset()
        if self.lease is not None:  # never through a link a program left (``trl_sandbox.remote.files``)
            staged = files.staging_path()
            try:
                await self._sb.write_file(staged, bytes(data))
                done = await self._sb.exec(files.argv("write", self.work_dir, relative, staged), timeout_seconds=60)
            except Exception as exc:
                raise translate(exc, f"writing {path}", self.id) from exc
            files.answer(done.stdout, path)
            return
        parent = posixpath.dirname(full)
        try:
            try:
                await self._sb.write_file(full, bytes(data))
            except SandboxFileError:
                if parent == self.work_dir:
                    raise
                made = await self._sb.exec(["mkdir", "-p", "--", parent], timeout_seconds=60)
                if made.returncode != 0:
                    raise OSError(made.returncode, f"cannot create {parent}: {made.stderr.strip()}", path) from None
                await self._sb.write_file(full, bytes(data))
        except OSError:
            raise
        except Exception as exc:
            raise translate(exc, f"writing {path}", self.id) from exc

    async def read_file(self, path: str) -> bytes:
        from cwsandbox import SandboxFileError

        full, relative = files.confine(self.work_dir, path)
        await self._flush_reset()
        if self.lease is not None:
            try:
                done = await self._sb.exec(files.argv("read", self.work_dir, relative), timeout_seconds=60)
            except Exception as exc:
                raise translate(exc, f"reading {path}", self.id) from exc
            return files.answer(done.stdout, path)
        try:
            return bytes(await self._sb.read_file(full))
        except SandboxFileError as exc:
            if "NOT_FOUND" in str(getattr(exc, "reason", "") or "") or "not found" in str(exc).lower():
                raise FileNotFoundError(2, f"no such file in sandbox {self.id}", path) from exc
            raise translate(exc, f"reading {path}", self.id) from exc
        except Exception as exc:
            raise translate(exc, f"reading {path}", self.id) from exc

    async def use_environment(self, prepared: Any) -> None:
        """This lease's private copy of a prepared environment, made by the next exec's launcher
        (``trl_sandbox.remote.environment``); the reset drops it."""
        self.work_dir = environment.use(self, prepared, self._provider.work_dir_for(self.id),
                                        self._provider.environment_layer_mb)

    async def reset(self) -> None:
        """With the lease launcher, the reset travels with the next exec (no request of its own):
        that exec first kills what earlier programs left (ns mode: nothing can be left) and empties
        /tmp, /var/tmp, /dev/shm and the work directory. Without it, one exec empties the work dir."""
        self.work_dir = self._provider.work_dir_for(self.id)
        if self.lease is not None:
            self.lease.reset_due = True
            return
        work = shlex.quote(self.work_dir)
        try:
            result = await self._sb.exec(["/bin/sh", "-c", f"rm -rf -- {work} && mkdir -p -- {work}"],
                                         timeout_seconds=30)
        except Exception as exc:
            raise translate(exc, "reset", self.id) from exc
        if result.returncode != 0:
            raise InfraError(f"CoreWeave Sandbox: sandbox {self.id}: reset failed: {result.stderr!r}")

    def defer_reset(self) -> bool:
        """``reset`` without awaiting, for a pool taking the sandbox back (True: due with the next exec)."""
        if self.lease is None or self._busy:
            return False
        self.work_dir = self._provider.work_dir_for(self.id)
        self.lease.reset_due = True
        return True

    async def alive(self) -> bool:
        from cwsandbox import SandboxError as SDKSandboxError
        from cwsandbox import SandboxStatus

        try:
            status = await asyncio.to_thread(self._sb.get_status)
        except SDKSandboxError as exc:
            log.info("sandbox %s is not alive: %r", self.id, exc)
            return False
        return status == SandboxStatus.RUNNING

    async def stop(self) -> None:
        try:
            await self._sb.stop(graceful_shutdown_seconds=self._provider.stop_grace_s, missing_ok=True)
        finally:
            await self.release()

    async def release(self) -> None:
        """Close this sandbox's gRPC channels now rather than whenever the SDK object is collected.

        The SDK closes them only when a sandbox is used as a context manager; its (private) cleanup
        coroutine runs on the SDK's own loop. Skipped quietly if a later SDK moved it.
        """
        cleanup = getattr(self._sb, "_cleanup_channels_async", None)
        manager = getattr(self._sb, "_loop_manager", None)
        if cleanup is None or manager is None:
            return
        try:
            await asyncio.wrap_future(manager.run_async(cleanup()))
        except Exception as exc:
            log.debug("could not close the channels of sandbox %s: %r", self.id, exc)


# -- provider -----------------------------------------------------------------------------------


class CoreWeaveProvider(PreparesEnvironments):
    """CoreWeave Sandbox (formerly Aviato).

    Settings (``sandbox_provider_settings``; numbers may be given as strings):

    * ``api_key`` (else ``CWSANDBOX_API_KEY``), ``auth`` (``api_key``, the default, or ``wandb``),
      ``base_url`` (else ``CWSANDBOX_BASE_URL``, else the SDK's ``https://api.cwsandbox.com``).
    * ``image`` (``python:3.11``; ``SandboxSpec.image`` takes precedence), ``cpu`` (e.g. ``"1"`` or
      ``"500m"``; default ``SandboxSpec.cpus``), ``memory`` (e.g. ``"2Gi"``; default
      ``SandboxSpec.memory_mb``), ``runtime_class`` (e.g. ``gvisor``), ``data_plane_mode``
      (``auto``/``gateway``/``direct``; the SDK's default when unset).
    * ``work_dir`` (``/tmp/trl-sandbox/work``; ``{id}`` is replaced by the sandbox id), ``rlimits``
      (apply ``SandboxSpec.limits`` with ``prlimit``; True), ``kill_after_timeout`` (True),
      ``start_timeout_s`` (90; keep it below the pool's create deadline), ``request_timeout_s`` (60),
      ``stop_grace_s`` (0), ``max_lifetime_s`` (1800, at least 60), ``max_concurrency``, ``sdk_signal_handlers`` (False: the trainer owns
      SIGINT/SIGTERM; the SDK's own handlers are turned off, process-wide).
    """

    name = "coreweave"

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        auth: str = "api_key",
        image: str = "python:3.11",
        cpu: str | float | None = None,
        memory: str | None = None,
        runtime_class: str | None = None,
        data_plane_mode: str | None = None,
        work_dir: str = "/tmp/trl-sandbox/work",
        rlimits: bool = True,
        kill_after_timeout: bool = True,
        start_timeout_s: float = 90.0,
        request_timeout_s: float = 60.0,
        stop_grace_s: float = 0.0,
        max_concurrency: int | None = None,
        sdk_signal_handlers: bool = False,
        max_lifetime_s: float = 1800.0,
        environment_cache: str | None = None,
        environment_cache_mb: float = 20_000,
        environment_layer_mb: int = 1024,
        snapshot_size: str = "10Gi",
        snapshot_timeout_s: float = 600.0,
        clean_leases: bool = True,
        isolation: str = "auto",
        resident_launcher: bool = True,
    ) -> None:
        import cwsandbox

        auth = str(auth or "api_key").lower()
        if auth in ("api_key", "apikey", "coreweave", "coreweave_api_key"):
            key = api_key or os.environ.get("CWSANDBOX_API_KEY")
            if not key:
                found = " (AVIATO_API_KEY is set, but it is no longer read: rename it)" if os.environ.get(
                    "AVIATO_API_KEY") else ""
                raise ConfigError(f"the {self.name} sandbox provider needs credentials{found}: {KEY_HINT}")
            self._auth: Any = cwsandbox.AuthHeaders(headers={"Authorization": f"Bearer {key}"}, strategy="api_key")
        elif auth == "wandb":
            try:
                import wandb  # noqa: F401
            except ImportError:
                raise ConfigError("coreweave provider setting auth=wandb needs `pip install 'trl-sandbox-coreweave[wandb]'`") from None
            self._auth = cwsandbox.AuthStrategy.WANDB
        else:
            raise ConfigError(f"coreweave provider setting auth={auth!r} must be api_key or wandb")
        if not work_dir.startswith("/") or posixpath.normpath(work_dir) == "/":
            raise ConfigError(f"coreweave provider setting work_dir={work_dir!r} must be an absolute path below /")
        if data_plane_mode:
            try:
                data_plane_mode = cwsandbox.DataPlaneMode(str(data_plane_mode).lower())
            except ValueError:
                raise ConfigError(f"coreweave provider setting data_plane_mode={data_plane_mode!r} "
                                  "must be auto, gateway or direct") from None
        self.base_url = base_url or None
        self.image = image
        self.cpu = str(cpu) if cpu not in (None, "") else None
        self.memory = str(memory) if memory not in (None, "") else None
        self.runtime_class = runtime_class or None
        self.data_plane_mode = data_plane_mode or None
        self.work_dir = posixpath.normpath(work_dir)
        self.rlimits = flag("coreweave", "rlimits", rlimits)
        self.kill_after_timeout = flag("coreweave", "kill_after_timeout", kill_after_timeout)
        self.start_timeout_s = number("coreweave", "start_timeout_s", start_timeout_s, float, 1)
        self.request_timeout_s = number("coreweave", "request_timeout_s", request_timeout_s, float, 1)
        self.stop_grace_s = number("coreweave", "stop_grace_s", stop_grace_s, float, 0)
        self.clean_leases = flag("coreweave", "clean_leases", clean_leases)
        self.resident_launcher = flag("coreweave", "resident_launcher", resident_launcher)
        if isolation not in ("auto", "sweep"):
            raise ConfigError(f"coreweave provider setting isolation={isolation!r} must be auto or sweep")
        self.isolation = isolation
        # The service has no idle stop and no way to extend a lifetime, so a short one is the only
        # bound on a killed run's leftovers; the pool replaces members before it ends.
        self.lifetime_cap_s = number("coreweave", "max_lifetime_s", max_lifetime_s, float, 60)
        self.capabilities = Capabilities(
            network_isolation=True,
            files=True,
            persistent_state=True,
            separate_stderr=True,
            max_concurrency=number("coreweave", "max_concurrency", max_concurrency, int, 1),
            fast_python=False,
        )
        if not flag("coreweave", "sdk_signal_handlers", sdk_signal_handlers):
            try:
                cwsandbox.disable_signal_handlers()
            except RuntimeError:  # another part of this process already let the SDK install them
                log.debug("cwsandbox signal handlers were already installed")
        self.environment_cache = environment_cache or None
        self.environment_cache_mb = number("coreweave", "environment_cache_mb", environment_cache_mb, float, 1)
        self.environment_layer_mb = number("coreweave", "environment_layer_mb", environment_layer_mb, int, 1)
        self.snapshot_size = str(snapshot_size)
        self.snapshot_timeout_s = number("coreweave", "snapshot_timeout_s", snapshot_timeout_s, float, 0.1)
        self._owned: dict[str, CoreWeaveSandbox] = {}
        self._cleanups: set[asyncio.Task] = set()

    def work_dir_for(self, sandbox_id: str) -> str:
        return self.work_dir.replace("{id}", sandbox_id)

    def _make_environments(self) -> Any:
        """Prepared environments (``snapshots.py``)."""
        return environments(self, self.environment_cache, self.environment_cache_mb)

    def _common(self) -> dict[str, Any]:
        common: dict[str, Any] = {"auth": self._auth, "base_url": self.base_url}
        return {k: v for k, v in common.items() if v is not None}

    def sdk_sandbox(self, spec: SandboxSpec) -> Any:
        """An unstarted SDK ``Sandbox`` for ``spec``."""
        from cwsandbox import NetworkOptions, Sandbox

        resources = {
            "cpu": self.cpu or f"{max(1, math.ceil(spec.cpus * 1000))}m",
            "memory": self.memory or f"{max(1, int(spec.memory_mb))}Mi",
        }
        image = spec.image
        extra: dict[str, Any] = {}
        fss = options(spec, self.snapshot_size)
        if fss is not None:
            extra["file_system_snapshot"] = fss
            if is_snapshot(image):
                image = split(image)[1]
        try:
            return Sandbox(
                container_image=image or self.image,
                tags=encode_tags(spec.tags),
                max_lifetime_seconds=max(1, math.ceil(min(spec.lifetime_s, self.lifetime_cap_s))),
                resources=resources,
                network=None if spec.network else NetworkOptions(deny_egress=True, deny_ingress=True),
                environment_variables={str(k): str(v) for k, v in spec.env.items()} or None,
                runtime_class=self.runtime_class,
                data_plane_mode=self.data_plane_mode,
                request_timeout_seconds=self.request_timeout_s,
                **extra,
                **self._common(),
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"CoreWeave Sandbox: invalid sandbox settings: {exc}") from exc

    async def create(self, spec: SandboxSpec) -> CoreWeaveSandbox:
        sdk_sandbox = self.sdk_sandbox(spec)
        try:
            await sdk_sandbox.start()
        except Exception as exc:
            if is_snapshot(spec.image) and "NOT_FOUND" in str(getattr(_grpc_code(exc), "name", "")) \
                    and self._environments is not None and self._environments.stale(spec.image):
                raise InfraError(f"CoreWeave Sandbox: snapshot {spec.image} is missing ({exc}); its "
                                 "environment is built again at its next use") from exc
            raise translate(exc, "create") from exc
        sandbox = CoreWeaveSandbox(self, sdk_sandbox, spec)
        try:
            try:
                await asyncio.wait_for(self._running(sdk_sandbox), self.start_timeout_s)
            except asyncio.TimeoutError as exc:
                raise InfraError(f"CoreWeave Sandbox: sandbox {sandbox.id} did not start within "
                                 f"{self.start_timeout_s:g} s") from exc
            except Exception as exc:
                raise translate(exc, f"starting sandbox {sandbox.id}") from exc
            await sandbox._prepare()
        except BaseException:
            # It exists server-side: delete it now rather than let it live out its lifetime.
            self._cleanup_later(sandbox)
            raise
        self._owned[sandbox.id] = sandbox
        return sandbox

    @staticmethod
    async def _running(sdk_sandbox: Any) -> None:
        await sdk_sandbox  # the SDK's await: until RUNNING

    def _cleanup_later(self, sandbox: CoreWeaveSandbox) -> None:
        """Stop in the background (safe from a cancelled create); ``aclose`` waits for it."""

        async def stop() -> None:
            try:
                await asyncio.wait_for(sandbox.stop(), 30)
            except Exception as exc:
                log.warning("could not delete CoreWeave sandbox %s (it ends with its lifetime): %r",
                            sandbox.id, exc)

        task = asyncio.get_running_loop().create_task(stop())
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def list(self, tags: Mapping[str, str]) -> list[SandboxInfo]:
        from cwsandbox import Sandbox

        try:
            found = await Sandbox.list(tags=encode_tags(tags) or None, timeout_seconds=self.request_timeout_s,
                                       **self._common())
        except Exception as exc:
            raise translate(exc, "list") from exc
        infos = []
        for sdk_sandbox in found:
            created = sdk_sandbox.created_at or sdk_sandbox.started_at
            status = sdk_sandbox.status
            infos.append(SandboxInfo(
                id=sdk_sandbox.sandbox_id,
                tags=decode_tags(sdk_sandbox.tags),
                state=str(getattr(status, "value", status) or "unknown"),
                created_at=created.timestamp() if created else None,
            ))
        return infos

    async def destroy(self, sandbox_id: str) -> None:
        from cwsandbox import Sandbox

        sandbox = self._owned.pop(sandbox_id, None)
        try:
            if sandbox is not None:
                await sandbox.stop()
            else:
                await Sandbox.delete(sandbox_id, missing_ok=True, timeout_seconds=self.request_timeout_s,
                                     **self._common())
        except Exception as exc:
            raise translate(exc, f"deleting sandbox {sandbox_id}") from exc

    async def aclose(self) -> None:
        """Wait for background deletions and close the channels of sandboxes still owned (they keep running)."""
        if self._environments is not None:
            self._environments.close()
        if self._cleanups:
            await asyncio.gather(*list(self._cleanups), return_exceptions=True)
        owned, self._owned = list(self._owned.values()), {}
        await asyncio.gather(*(sandbox.release() for sandbox in owned), return_exceptions=True)


class AviatoProvider(CoreWeaveProvider):
    """The same provider under CoreWeave Sandbox's former name."""

    name = "aviato"

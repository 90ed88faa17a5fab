"""Daytona sandboxes through the official SDK's ``AsyncDaytona`` client.

What a caller can rely on:

* ``create(spec)``: ``spec.tags`` become Daytona labels, ``spec.env`` the sandbox environment,
  ``network_block_all = not spec.network``. The server-side lifetime is finite: ``ttl_minutes``
  (a hard wall-clock limit since creation, rounded up to whole minutes) plus, by default, an
  ephemeral sandbox (deleted as soon as it stops) with Daytona's inactivity auto-stop. A create that
  times out after Daytona made the sandbox (``DaytonaTimeoutError.sandbox_id``) deletes it before
  raising ``InfraError``.
* ``exec(argv, stdin=...)``: Daytona runs a shell command string, so argv is quoted with
  ``shlex.join``. stdin is uploaded byte-exact as a file first and redirected (the file is unlinked
  before the program starts); without stdin the program reads ``/dev/null``. Daytona's daemon
  merges stderr into stdout, so the command sends the program's stderr to a file and appends it
  after nonce-marked separators (``streams.py``): ``stdout`` and ``stderr`` are the program's own,
  with no extra call per exec (``capabilities.separate_stderr`` is True). The time limit is enforced by Daytona's daemon in whole seconds (rounded up); it
  kills the command's process group and answers 408, which becomes ``timed_out=True``.
  ``SandboxSpec.limits`` (CPU seconds, address space, file size, open files) are applied with
  ``prlimit`` when the sandbox image has it (checked once per sandbox).
* Relative paths and the default cwd are the work directory (``work_dir``, default
  ``/tmp/trl-sandbox/work``). Files persist until ``reset()``, which sends nothing: the next exec
  carries it. Every program runs through the lease launcher (``trl_sandbox.remote.lease``): in a
  PID namespace of its own that ends with it (or, where the image refuses namespaces, between two
  sweeps that kill every process a program left), after the due reset has emptied ``/tmp``,
  ``/var/tmp``, ``/dev/shm`` and the work directory; stdin up to 4 MiB rides in the command.
* Errors: 429 -> ``RateLimitError`` (``retry_after`` from ``Retry-After-*``/``Retry-After``),
  5xx, transport errors and a sandbox that vanished (404) -> ``InfraError``, account limits
  (400/403/422 saying "limit"/"quota"/"exceeded") -> ``QuotaError``, 401 and other 400/403 ->
  ``ConfigError``.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import logging
import math
import os
import posixpath
import re
import secrets
import shlex
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
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
from trl_sandbox.remote.lease import CLEANING_MARGIN_S, FAILED_EXIT, Lease, failure, probe_argv, timed_out
from trl_sandbox.sandbox import exec_arguments

from .snapshots import environments, is_snapshot, snapshot_name
from .streams import split_streams, split_streams_script

log = logging.getLogger("trl_sandbox_daytona")

LANGUAGE_LABEL = "code-toolbox-language"  # the SDK adds it to every sandbox it creates
KEY_HINT = (
    "set DAYTONA_API_KEY (create a key in the Daytona dashboard: https://app.daytona.io/dashboard/keys), "
    "or pass the provider setting api_key=...; DAYTONA_JWT_TOKEN together with DAYTONA_ORGANIZATION_ID "
    "also works"
)
# "Sandbox resource limit reached (16)", "Total disk limit exceeded. Maximum allowed: 30GiB"
_QUOTA = re.compile(r"(?<![a-z0-9_])(quota|limits?|exceed(s|ed)?)(?![a-z0-9_])", re.IGNORECASE)
_GONE_STATES = {"destroyed", "destroying"}
#: Stdin up to this size travels inside the exec's command (base64 here-document); larger stdin is
#: uploaded first (one more request), as before the lease launcher. Small enough that the whole
#: command stays below Linux's 128 KiB limit for one argument, should a daemon pass it as `sh -c`.
STDIN_INLINE_BYTES = 64 << 10


def _env(name: str) -> str | None:
    """A ``DAYTONA_*`` variable the way the SDK reads it: process environment, then ``.env.local``/``.env``."""
    try:
        from daytona._utils.env import DaytonaEnvReader

        return DaytonaEnvReader().get(name)
    except Exception:  # the SDK moved its reader: the process environment is what matters most
        return os.environ.get(name)


# -- errors -------------------------------------------------------------------------------------


def _status(exc: BaseException) -> int | None:
    """The HTTP status behind a Daytona SDK error (also when it only survives on the cause chain)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for attr in ("status_code", "status"):
            value = getattr(current, attr, None)
            if isinstance(value, int) and 100 <= value < 600:
                return value
        current = current.__cause__ or current.__context__
    return None


def _headers(exc: BaseException) -> dict[str, str]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        headers = getattr(current, "headers", None)
        if headers:
            try:
                return {str(k).lower(): str(v) for k, v in dict(headers).items()}
            except Exception:
                pass
        current = current.__cause__ or current.__context__
    return {}


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from ``Retry-After`` or Daytona's per-throttler ``Retry-After-<name>`` headers.

    Values are seconds or an HTTP date; when several throttlers answer, the longest wait wins.
    """
    waits = []
    for key, value in headers.items():
        key = key.lower()
        if key != "retry-after" and not key.startswith("retry-after-"):
            continue
        try:
            waits.append(max(0.0, float(value)))
            continue
        except ValueError:
            pass
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            continue
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        waits.append(max(0.0, (when - datetime.now(timezone.utc)).total_seconds()))
    return max(waits) if waits else None


def translate(exc: BaseException, what: str, sandbox_id: str | None = None) -> SandboxError:
    """Map a Daytona SDK (or transport) error to the trl-sandbox taxonomy."""
    if isinstance(exc, SandboxError):
        return exc
    from daytona import DaytonaAuthenticationError, DaytonaBadRequestError, DaytonaRateLimitError

    status = _status(exc)
    message = f"Daytona: {what} failed: {exc}"
    if status == 429 or isinstance(exc, DaytonaRateLimitError):
        return RateLimitError(message, retry_after=retry_after(_headers(exc)))
    if status == 401 or isinstance(exc, DaytonaAuthenticationError):
        return ConfigError(f"{message}. The credentials were rejected: {KEY_HINT}")
    if status in (400, 403, 422) and _QUOTA.search(str(exc)):
        return QuotaError(f"{message}. This is an account limit: use fewer or smaller sandboxes "
                          "(sandbox_pool_size, cpu/memory/disk settings) or raise the limit with Daytona")
    if status == 403:
        return ConfigError(f"{message}. The API key lacks a permission this needs")
    if status in (400, 422) or (status is None and isinstance(exc, DaytonaBadRequestError)):
        return ConfigError(f"{message}. Daytona rejected the request; check the provider settings")
    if status == 404 and sandbox_id is not None:
        return SandboxGoneError(f"Daytona: sandbox {sandbox_id} vanished ({what}: {exc})")
    return InfraError(message)


def _is_exec_timeout(exc: BaseException) -> bool:
    """True for the daemon's answer that the command ran out of time (HTTP 408).

    Not for transport timeouts (``DaytonaConnectionTimeoutError``) nor a gateway's 504: those are
    infrastructure failures, never the program's.
    """
    from daytona import DaytonaConnectionError, DaytonaProcessExecutionTimeoutError

    if isinstance(exc, DaytonaConnectionError):
        return False
    return _status(exc) == 408 or isinstance(exc, DaytonaProcessExecutionTimeoutError)


def _state(sdk_sandbox: Any) -> str:
    state = getattr(sdk_sandbox, "state", None)
    return str(getattr(state, "value", state) or "unknown").lower()


def _timestamp(value: Any) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


# -- sandbox ------------------------------------------------------------------------------------


class DaytonaSandbox:
    """One Daytona sandbox. Use through ``DaytonaProvider.create``."""

    def __init__(self, provider: DaytonaProvider, sdk_sandbox: Any, spec: SandboxSpec) -> None:
        self.id: str = sdk_sandbox.id
        self.tags = dict(spec.tags)
        self.work_dir = provider.work_dir_for(self.id)
        self.limits: ResourceLimits = spec.limits
        self.network = bool(spec.network)  # without it, each program gets a network namespace of its own
        self.prlimit = False
        self.from_environment = is_snapshot(spec.image)
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

    def _wrap(self, argv: list[str]) -> str:
        if not (self.prlimit and self._provider.rlimits):
            return shlex.join(argv)
        limits = self.limits
        caps = [
            f"--cpu={max(1, math.ceil(limits.cpu_seconds))}",
            f"--as={int(limits.memory_mb) << 20}",
            f"--fsize={int(limits.file_size_mb) << 20}",
            f"--nofile={int(limits.open_files)}",
        ]
        return shlex.join(["prlimit", *caps, "--", *argv])

    async def _shell(self, command: str, timeout: int, what: str) -> Any:
        try:
            return await self._sb.process.exec(command, cwd="/", timeout=timeout)
        except Exception as exc:
            raise translate(exc, what, self.id) from exc

    async def _prepare(self) -> None:
        """Create the work directory, see whether ``prlimit`` is there to apply the limits, and
        probe what the lease launcher may do in this image (the same single request)."""
        work = shlex.quote(self.work_dir)
        probe = shlex.join(probe_argv(serve=self._provider.resident_launcher and self._provider.isolation != "sweep")) if self._provider.clean_leases else "true"
        response = await self._shell(
            f"mkdir -p -- {work} && if command -v prlimit >/dev/null 2>&1; then echo prlimit=yes; fi; "
            f"{probe} </dev/null 2>/dev/null; true",
            timeout=60, what="preparing the work directory",
        )
        if response.exit_code != 0:
            raise InfraError(f"Daytona: sandbox {self.id}: could not create {self.work_dir}: {response.result!r}")
        self.prlimit = "prlimit=yes" in (response.result or "")
        if self._provider.clean_leases:
            self.lease = Lease.adopt(response.result or "", self.id, "daytona", sweep=self._provider.isolation == "sweep",
                                     env_root=environment.ENV_ROOT if self.from_environment else None)

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
        nonce = secrets.token_hex(16)
        lease = self.lease
        stdin_path = heredoc = None
        if stdin and lease is not None and len(stdin) <= STDIN_INLINE_BYTES:
            heredoc = base64.encodebytes(bytes(stdin)).decode("ascii")  # no upload: it rides in the command
        elif stdin:
            if lease is not None and lease.reset_due:
                await self._flush_reset()  # the reset would empty the work dir after the upload
            # Byte-exact stdin: upload it; the script opens it as the program's stdin and unlinks it.
            # With the launcher in /tmp itself: no link a program left in the work dir's path is followed.
            stdin_path = posixpath.join("/tmp" if lease is not None else self.work_dir,
                                        f".trl-sandbox-stdin-{uuid.uuid4().hex}")
            await self._upload(bytes(stdin), stdin_path, "uploading stdin")
        # With the launcher, in /tmp itself (no lease can replace it: a mount point in a program's
        # namespace), made new and unlinked before the launcher starts (``split_streams_script``).
        err_path = posixpath.join("/tmp" if lease is not None else
                                  posixpath.dirname(self.work_dir.rstrip("/")) or "/tmp",
                                  f".trl-sandbox-stderr-{uuid.uuid4().hex}")
        tag = None
        reset = False
        if lease is not None:
            launcher, tag = lease.argv(argv, work=self.work_dir, cwd=self._path(cwd) if cwd else None,
                                       limits=self.limits if self._provider.rlimits else None, timeout=timeout,
                                       stdin_b64=heredoc is not None,
                                       network=self.network, cap=self.limits.output_bytes)
            program, daemon_cwd = shlex.join(launcher), "/"
            reset, lease.reset_due = lease.reset_due, False
        else:
            program, daemon_cwd = self._wrap(argv), self._path(cwd) if cwd else self.work_dir
        command = split_streams_script(program, nonce, err_path, stdin_path, heredoc, tag)
        started = time.monotonic()
        try:
            response = await self._sb.process.exec(
                command,
                cwd=daemon_cwd,
                env={str(k): str(v) for k, v in env.items()} if env else None,
                # With the launcher, it enforces the program's limit from the program's start; the
                # daemon's limit is only a backstop that leaves room for the cleaning before it.
                timeout=max(1, math.ceil(timeout)) + (CLEANING_MARGIN_S if tag is not None else 0),
            )
        except Exception as exc:
            if _is_exec_timeout(exc) and tag is None:
                return ExecResult(exit_code=None, timed_out=True, duration_s=time.monotonic() - started)
            if _is_exec_timeout(exc):
                # The launcher ends a program at its own deadline and says so: the daemon's backstop,
                # 10 s later, means the launcher (or the resident) failed, never the program.
                raise SandboxGoneError(f"Daytona: sandbox {self.id}: the lease launcher did not end the "
                                       "program by its deadline") from exc
            if reset:
                lease.reset_due = True  # it may not have reached the sandbox: carry it again
            raise translate(exc, "exec", self.id) from exc
        duration = time.monotonic() - started
        stdout, stderr, complete = split_streams(response.result or "", nonce)
        if tag is not None and response.exit_code == FAILED_EXIT:
            why = failure(stdout, tag)
            if why is not None:  # the sandbox cannot be made clean: another one runs the program
                raise SandboxGoneError(f"Daytona: sandbox {self.id}: the lease launcher failed: {why}")
        if tag is not None and timed_out(stdout, tag):
            return ExecResult(exit_code=None, timed_out=True, duration_s=duration)
        cap = self.limits.output_bytes
        truncated = not complete or len(stdout) > cap or len(stderr) > cap
        return ExecResult(exit_code=response.exit_code, stdout=stdout[:cap], stderr=stderr[:cap],
                          truncated=truncated, duration_s=duration)

    async def _upload(self, data: bytes, full: str, what: str) -> None:
        try:
            await self._sb.fs.upload_file(data, full)
        except Exception as exc:
            raise translate(exc, what, self.id) from exc

    async def _flush_reset(self) -> None:
        """Carry a due reset now (one exec), before a file operation that must see its result."""
        if self.lease is not None and self.lease.reset_due:
            result = await self._exec(["true"], None, 30, None, None)
            if result.exit_code != 0:
                raise InfraError(f"Daytona: sandbox {self.id}: reset failed: {result.stdout!r} {result.stderr!r}")

    async def write_file(self, path: str, data: bytes) -> None:
        """Write a file; missing parent directories are created (when the daemon does not do it)."""
        if isinstance(data, str):
            data = data.encode()
        full, relative = files.confine(self.work_dir, path)
        await self._flush_reset()
        if self.lease is not None:  # never through a link a program left (``trl_sandbox.remote.files``)
            staged = files.staging_path()
            await self._upload(bytes(data), staged, f"writing {path}")
            done = await self._shell(shlex.join(files.argv("write", self.work_dir, relative, staged)), timeout=60,
                                     what=f"writing {path}")
            files.answer(done.result or "", path)
            return
        parent = posixpath.dirname(full)
        try:
            await self._upload(bytes(data), full, f"writing {path}")
        except (RateLimitError, QuotaError):
            raise
        except SandboxError:  # the daemon may refuse a missing parent directory (400 or otherwise)
            if parent == self.work_dir:
                raise
            made = await self._shell(f"mkdir -p -- {shlex.quote(parent)}", timeout=30, what=f"creating {parent}")
            if made.exit_code != 0:
                raise OSError(made.exit_code, f"cannot create {parent}: {made.result.strip()}", path) from None
            await self._upload(bytes(data), full, f"writing {path}")

    async def read_file(self, path: str) -> bytes:
        from daytona import FileDownloadRequest

        full, relative = files.confine(self.work_dir, path)
        await self._flush_reset()
        if self.lease is not None:
            done = await self._shell(shlex.join(files.argv("read", self.work_dir, relative)), timeout=60,
                                     what=f"reading {path}")
            return files.answer(done.result or "", path)
        try:
            (response,) = await self._sb.fs.download_files([FileDownloadRequest(source=full)])
        except Exception as exc:
            raise translate(exc, f"reading {path}", self.id) from exc
        if response.error:
            details = response.error_details
            status = getattr(details, "status_code", None)
            if status == 404 or "not found" in response.error.lower() or "no such file" in response.error.lower():
                raise FileNotFoundError(2, f"no such file in sandbox {self.id}", path)
            raise InfraError(f"Daytona: sandbox {self.id}: reading {path} failed: {response.error}")
        data = response.result
        return data.encode() if isinstance(data, str) else bytes(data or b"")

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
        response = await self._shell(f"rm -rf -- {work} && mkdir -p -- {work}", timeout=30, what="reset")
        if response.exit_code != 0:
            raise InfraError(f"Daytona: sandbox {self.id}: reset failed: {response.result!r}")

    def defer_reset(self) -> bool:
        """``reset`` without awaiting, for a pool taking the sandbox back (True: due with the next exec)."""
        if self.lease is None or self._busy:
            return False
        self.work_dir = self._provider.work_dir_for(self.id)
        self.lease.reset_due = True
        return True

    async def alive(self) -> bool:
        from daytona import DaytonaNotFoundError

        try:
            await self._sb.refresh_data()
        except DaytonaNotFoundError:
            return False
        except Exception as exc:
            raise translate(exc, "refresh", self.id) from exc
        if _state(self._sb) != "started":
            return False
        if self._provider.keep_alive:
            # An idle pool member must not reach Daytona's inactivity auto-stop between steps.
            try:
                await self._sb.refresh_activity()
            except Exception as exc:
                log.debug("could not refresh the activity of sandbox %s: %r", self.id, exc)
        return True


# -- provider -----------------------------------------------------------------------------------


class DaytonaProvider(PreparesEnvironments):
    """Daytona sandboxes.

    Settings (``sandbox_provider_settings``; numbers may be given as strings):

    * ``api_key``, ``api_url``, ``target``, ``jwt_token``, ``organization_id``: the SDK's own
      configuration; unset values come from ``DAYTONA_API_KEY``, ``DAYTONA_API_URL``,
      ``DAYTONA_TARGET``, ``DAYTONA_JWT_TOKEN``, ``DAYTONA_ORGANIZATION_ID``.
    * ``snapshot``: the snapshot to start from (Daytona's default snapshot when unset); or
      ``image``: a container image (``SandboxSpec.image`` takes precedence), built by Daytona.
      ``cpu``, ``memory`` (GiB), ``disk`` (GiB) apply to images only (a snapshot fixes its resources);
      without them an image sandbox gets ``ceil(spec.cpus)`` CPUs and ``ceil(spec.memory_mb / 1024)`` GiB.
    * ``auto_stop_interval`` (minutes of inactivity before Daytona stops the sandbox; 15, 0 = never),
      ``ephemeral`` (delete as soon as it stops; True), ``keep_alive`` (health checks refresh the
      activity of idle sandboxes; True). ``ttl_minutes`` always comes from ``SandboxSpec.lifetime_s``.
    * ``work_dir`` (``/tmp/trl-sandbox/work``; ``{id}`` is replaced by the sandbox id),
      ``rlimits`` (apply ``SandboxSpec.limits`` with ``prlimit``; True), ``os_user``,
      ``language`` (the SDK's code-toolbox language label; ``python``), ``network_allow_list``
      (CIDRs reachable when ``SandboxSpec.network`` is on), ``create_timeout_s`` (90; keep it below
      the pool's create deadline so a late sandbox is deleted here), ``max_concurrency``,
      ``connection_pool_maxsize`` (250).
    """

    name = "daytona"

    def __init__(
        self,
        api_key: str | None = None,
        api_url: str | None = None,
        target: str | None = None,
        jwt_token: str | None = None,
        organization_id: str | None = None,
        *,
        snapshot: str | None = None,
        image: str | None = None,
        cpu: int | None = None,
        memory: int | None = None,
        disk: int | None = None,
        auto_stop_interval: int = 15,
        ephemeral: bool = True,
        keep_alive: bool = True,
        work_dir: str = "/tmp/trl-sandbox/work",
        rlimits: bool = True,
        os_user: str | None = None,
        language: str = "python",
        network_allow_list: str | None = None,
        create_timeout_s: float = 90.0,
        max_concurrency: int | None = None,
        connection_pool_maxsize: int | None = 250,
        environment_cache: str | None = None,
        environment_cache_mb: float = 20_000,
        environment_layer_mb: int = 1024,
        snapshot_timeout_s: float = 600.0,
        clean_leases: bool = True,
        isolation: str = "auto",
        resident_launcher: bool = True,
    ) -> None:
        if not (api_key or _env("DAYTONA_API_KEY")) and not (
            (jwt_token or _env("DAYTONA_JWT_TOKEN")) and (organization_id or _env("DAYTONA_ORGANIZATION_ID"))
        ):
            raise ConfigError(f"the daytona sandbox provider needs credentials: {KEY_HINT}")
        if snapshot and image:
            raise ConfigError("daytona provider settings snapshot and image exclude each other; set one")
        if not work_dir.startswith("/") or posixpath.normpath(work_dir) == "/":
            raise ConfigError(f"daytona provider setting work_dir={work_dir!r} must be an absolute path below /")
        self._config = dict(api_key=api_key or None, api_url=api_url or None, target=target or None,
                            jwt_token=jwt_token or None, organization_id=organization_id or None,
                            connection_pool_maxsize=number("daytona", "connection_pool_maxsize",
                                                           connection_pool_maxsize, int, 1))
        self.snapshot = snapshot or None
        self.image = image or None
        self.cpu = number("daytona", "cpu", cpu, int, 1)
        self.memory = number("daytona", "memory", memory, int, 1)
        self.disk = number("daytona", "disk", disk, int, 1)
        self.auto_stop_interval = number("daytona", "auto_stop_interval", auto_stop_interval, int, 0)
        self.ephemeral = flag("daytona", "ephemeral", ephemeral)
        self.keep_alive = flag("daytona", "keep_alive", keep_alive)
        self.work_dir = posixpath.normpath(work_dir)
        self.rlimits = flag("daytona", "rlimits", rlimits)
        self.os_user = os_user or None
        self.language = language
        self.network_allow_list = network_allow_list or None
        self.create_timeout_s = number("daytona", "create_timeout_s", create_timeout_s, float, 1)
        self.clean_leases = flag("daytona", "clean_leases", clean_leases)
        self.resident_launcher = flag("daytona", "resident_launcher", resident_launcher)
        if isolation not in ("auto", "sweep"):
            raise ConfigError(f"daytona provider setting isolation={isolation!r} must be auto or sweep")
        self.isolation = isolation
        self.capabilities = Capabilities(
            network_isolation=True,
            files=True,
            persistent_state=True,
            separate_stderr=True,  # split inside the command: see streams.py
            max_concurrency=number("daytona", "max_concurrency", max_concurrency, int, 1),
            fast_python=False,
        )
        self.environment_cache = environment_cache or None
        self.environment_cache_mb = number("daytona", "environment_cache_mb", environment_cache_mb, float, 1)
        self.environment_layer_mb = number("daytona", "environment_layer_mb", environment_layer_mb, int, 1)
        self.snapshot_timeout_s = number("daytona", "snapshot_timeout_s", snapshot_timeout_s, float, 0.1)
        # One client per event loop: the pools of a prepared environment's snapshot run on loops
        # of their own (pool/environment_pools.py), and an SDK client belongs to one loop.
        self._sdks: dict[asyncio.AbstractEventLoop, Any] = {}
        self._owned: dict[str, Any] = {}
        self._cleanups: set[asyncio.Task] = set()

    def work_dir_for(self, sandbox_id: str) -> str:
        return self.work_dir.replace("{id}", sandbox_id)

    def _make_environments(self) -> Any:
        """Prepared environments (``snapshots.py``)."""
        return environments(self, self.environment_cache, self.environment_cache_mb)

    async def client(self) -> Any:
        """The ``AsyncDaytona`` client, created on first use on the running (pool) loop."""
        loop = asyncio.get_running_loop()
        sdk = self._sdks.get(loop)
        if sdk is not None:
            return sdk
        from daytona import AsyncDaytona, DaytonaConfig, DaytonaError

        try:
            sdk = self._sdks[loop] = AsyncDaytona(DaytonaConfig(**self._config))
        except DaytonaError as exc:
            raise translate(exc, "connecting") from exc
        for stale in [other for other in self._sdks if other.is_closed()]:
            del self._sdks[stale]
        return sdk

    def params(self, spec: SandboxSpec) -> Any:
        """The SDK's create parameters for ``spec``."""
        from daytona import CreateSandboxFromImageParams, CreateSandboxFromSnapshotParams, Resources

        common: dict[str, Any] = dict(
            language=self.language,
            labels={str(k): str(v) for k, v in spec.tags.items()},
            env_vars={str(k): str(v) for k, v in spec.env.items()} or None,
            network_block_all=not spec.network,
            auto_stop_interval=self.auto_stop_interval,
            ttl_minutes=max(1, math.ceil(spec.lifetime_s / 60)),
            ephemeral=self.ephemeral or None,
            os_user=self.os_user,
        )
        if spec.network and self.network_allow_list:
            common["network_allow_list"] = self.network_allow_list
        image = spec.image or self.image
        if is_snapshot(image):  # a prepared environment's snapshot, or a base naming one
            return CreateSandboxFromSnapshotParams(snapshot=snapshot_name(image), **common)
        if image:
            resources = Resources(
                cpu=self.cpu or max(1, math.ceil(spec.cpus)),
                memory=self.memory or max(1, math.ceil(spec.memory_mb / 1024)),
                disk=self.disk,
            )
            return CreateSandboxFromImageParams(image=image, resources=resources, **common)
        return CreateSandboxFromSnapshotParams(snapshot=self.snapshot, **common)

    async def create(self, spec: SandboxSpec) -> DaytonaSandbox:
        from daytona import DaytonaTimeoutError

        client = await self.client()
        try:
            sdk_sandbox = await client.create(self.params(spec), timeout=self.create_timeout_s)
        except DaytonaTimeoutError as exc:
            late = getattr(exc, "sandbox_id", None)
            if late:
                # Daytona made it but it did not start in time: delete it, or it leaks until its TTL.
                await self._delete_quietly(late)
            raise InfraError(f"Daytona: creating a sandbox timed out: {exc}") from exc
        except Exception as exc:
            if is_snapshot(spec.image) and _status(exc) in (400, 404) and self._environments is not None \
                    and self._environments.stale(spec.image):
                raise InfraError(f"Daytona: snapshot {spec.image} is missing ({exc}); its environment is "
                                 "built again at its next use") from exc
            raise translate(exc, "create") from exc
        self._owned[sdk_sandbox.id] = (asyncio.get_running_loop(), sdk_sandbox)
        sandbox = DaytonaSandbox(self, sdk_sandbox, spec)
        try:
            await sandbox._prepare()
        except BaseException:
            self._owned.pop(sandbox.id, None)
            self._cleanup_later(sandbox.id)
            raise
        return sandbox

    def _cleanup_later(self, sandbox_id: str) -> None:
        """Delete in the background (safe to call from a cancelled create); ``aclose`` waits for it."""
        task = asyncio.get_running_loop().create_task(self._delete_quietly(sandbox_id))
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def _delete_quietly(self, sandbox_id: str) -> None:
        try:
            await asyncio.wait_for(self.destroy(sandbox_id), 30)
        except Exception as exc:
            log.warning("could not delete Daytona sandbox %s (it ends with its TTL): %r", sandbox_id, exc)

    async def list(self, tags: Mapping[str, str]) -> list[SandboxInfo]:
        from daytona import ListSandboxesQuery

        client = await self.client()
        found = []
        try:
            async for sdk_sandbox in client.list(ListSandboxesQuery(labels=dict(tags) or None)):
                state = _state(sdk_sandbox)
                if state in _GONE_STATES:
                    continue
                labels = {k: v for k, v in (sdk_sandbox.labels or {}).items() if k != LANGUAGE_LABEL}
                found.append(SandboxInfo(sdk_sandbox.id, labels, state, _timestamp(sdk_sandbox.created_at)))
        except Exception as exc:
            raise translate(exc, "list") from exc
        return found

    async def destroy(self, sandbox_id: str) -> None:
        from daytona import DaytonaNotFoundError

        client = await self.client()
        loop, sdk_sandbox = self._owned.pop(sandbox_id, (None, None))
        try:
            if sdk_sandbox is None or loop is not asyncio.get_running_loop():  # another loop's object
                sdk_sandbox = await client.get(sandbox_id)
            await sdk_sandbox.delete()
        except DaytonaNotFoundError:
            return  # already gone
        except Exception as exc:
            if _status(exc) == 404:
                return
            raise translate(exc, f"deleting sandbox {sandbox_id}") from exc

    async def aclose(self) -> None:
        if self._environments is not None:
            self._environments.close()
        loop = asyncio.get_running_loop()
        mine = [task for task in self._cleanups if task.get_loop() is loop]
        if mine:
            await asyncio.gather(*mine, return_exceptions=True)
        sdk = self._sdks.pop(loop, None)
        self._owned = {k: v for k, v in self._owned.items() if v[0] is not loop}
        if sdk is not None:
            await sdk.close()

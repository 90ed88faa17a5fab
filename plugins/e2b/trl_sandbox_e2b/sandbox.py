"""One E2B sandbox (``E2BSandbox``): exec, files, reset and health over the SDK's envd client.

Every program runs through trl-sandbox's lease launcher (``trl_sandbox.remote.lease``), one SDK
command per exec (``commands.run(background=True)`` then ``wait()``, as ``root``). envd runs a
command as ``/bin/bash -l -c CMD``; CMD ``exec``s the launcher, so no shell stays in between:

* stdin up to ``STDIN_INLINE_BYTES`` rides in CMD as a base64 here-document the launcher decodes;
  larger stdin is uploaded to a fresh name in ``/tmp`` first and unlinked before the launcher
  starts; without stdin the program reads ``/dev/null``;
* ``env`` is applied after the login shell read ``/etc/profile`` (which resets ``PATH``), with
  ``env --`` so any name works;
* stdout and stderr arrive apart (envd's own ``data`` events); the launcher caps each at
  ``limits.output_bytes`` inside the sandbox;
* the time limit is the launcher's: its own wall clock, from the program's start, kills the
  program's whole tree (a PID namespace of its own that ends with it, or a sweep) and says so. The
  SDK's command ``timeout`` is a backstop ``CLEANING_MARGIN_S`` later: if it fires, the launcher did
  not do its job, so the command is killed and the sandbox is the one that failed
  (``SandboxGoneError``), never the program (e2b-dev/E2B#1031: envd ending the command's main
  process on its deadline leaves what it started running).

Without the launcher (``clean_leases=False``, or an image without ``python3``) the SDK's timeout is
the limit, and on ``TimeoutException`` the command is killed through envd (its process group only).
"""

from __future__ import annotations

import base64
import logging
import math
import posixpath
import secrets
import shlex
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from trl_sandbox import ExecResult, InfraError, ResourceLimits, SandboxGoneError, SandboxSpec
from trl_sandbox.remote import environment, files
from trl_sandbox.remote.lease import FAILED_EXIT, Lease, failure, probe_argv, timed_out
from trl_sandbox.sandbox import exec_arguments

from . import errors

log = logging.getLogger("trl_sandbox_e2b")

#: Stdin up to this size travels inside the command (base64 here-document), with no upload.
STDIN_INLINE_BYTES = 64 << 10
#: Seconds the SDK's backstop waits past the launcher's own deadline (the launcher cleans the
#: sandbox before the program's clock starts). Read at each exec (tests shorten it).
CLEANING_MARGIN_S = 10


class BackstopFired(Exception):
    """The SDK's command timeout fired: the command was still running past its whole budget."""


class E2BSandbox:
    """One E2B sandbox. Use through ``E2BProvider.create``."""

    def __init__(self, provider: Any, sdk_sandbox: Any, spec: SandboxSpec) -> None:
        self.id: str = sdk_sandbox.sandbox_id
        self.tags = dict(spec.tags)
        self.work_dir = provider.work_dir_for(self.id)
        self.limits: ResourceLimits = spec.limits
        self.network = bool(spec.network)  # without it, each program gets a network namespace of its own
        self.from_environment = provider.from_environment(spec)
        self.lease: Lease | None = None
        self._busy = 0
        self._provider = provider
        self._sb = sdk_sandbox

    def _translate(self, exc: BaseException, what: str) -> Exception:
        return errors.translate(exc, what, self.id, rate_limit_wait_s=self._provider.rate_limit_wait_s)

    async def _run(self, command: str, timeout: float, what: str) -> tuple[int, str, str]:
        """One command through envd: ``(exit code, stdout, stderr)``; a non-zero exit is a result.
        ``BackstopFired`` when the SDK's timeout ended it (the command is killed first)."""
        from e2b import CommandExitException
        from e2b.exceptions import SandboxUnreachableException, TimeoutException

        handle = None
        started = time.monotonic()
        try:
            handle = await self._sb.commands.run(command, background=True, user=self._provider.user, cwd="/",
                                                 timeout=timeout, request_timeout=self._provider.request_timeout_s)
            result = await handle.wait()
            return result.exit_code, result.stdout or "", result.stderr or ""
        except CommandExitException as exc:
            return exc.exit_code, exc.stdout or "", exc.stderr or ""
        except SandboxUnreachableException as exc:  # not confirmed dead: ask the API
            raise await self._unreachable(exc, what) from exc
        except TimeoutException as exc:
            if errors.is_gone(exc):
                raise self._translate(exc, what) from exc
            if handle is None or time.monotonic() - started < timeout:
                # A gateway's 504 or a request timeout, before the command's own deadline.
                raise InfraError(f"E2B: {what} failed: {exc}") from exc
            await self._kill(handle)
            raise BackstopFired(str(exc)) from exc
        except Exception as exc:
            raise self._translate(exc, what) from exc

    async def _kill(self, handle: Any) -> None:
        try:
            await handle.kill()
        except Exception as exc:  # the sandbox is replaced anyway where this matters
            log.debug("could not kill command %s in sandbox %s: %r", handle.pid, self.id, exc)

    async def _unreachable(self, exc: BaseException, what: str) -> Exception:
        try:
            info = await self._sb.get_info()
        except Exception as probe:
            if errors.is_gone(probe):
                return SandboxGoneError(f"E2B: sandbox {self.id} is gone ({what}: {exc})")
            return InfraError(f"E2B: {what} failed: {exc}")
        if str(getattr(info.state, "value", info.state)).lower() != "running":
            return SandboxGoneError(f"E2B: sandbox {self.id} is {info.state} ({what}: {exc})")
        return InfraError(f"E2B: {what} failed: {exc}")

    async def _prepare(self) -> None:
        """Create the work directory and probe what the lease launcher may do (one command)."""
        work = shlex.quote(self.work_dir)
        clean = self._provider.clean_leases
        probe = shlex.join(probe_argv(serve=self._provider.resident_launcher and self._provider.isolation != "sweep")) \
            if clean else "true"
        try:
            code, out, err = await self._run(f"mkdir -p -- {work} && {{ {probe} </dev/null 2>/dev/null; true; }}",
                                             60, "preparing the work directory")
        except BackstopFired as exc:
            raise InfraError(f"E2B: sandbox {self.id}: preparing it took over 60 s") from exc
        if code != 0:
            raise InfraError(f"E2B: sandbox {self.id}: could not create {self.work_dir}: {out!r} {err!r}")
        if clean:
            self.lease = Lease.adopt(out, self.id, "e2b", sweep=self._provider.isolation == "sweep",
                                     env_root=environment.ENV_ROOT if self.from_environment else None)

    async def exec(self, argv: Sequence[str], *, stdin: bytes | str | None = None, timeout: float,
                   cwd: str | None = None, env: Mapping[str, str] | None = None) -> ExecResult:
        argv, stdin = exec_arguments(argv, stdin, timeout)
        self._busy += 1
        try:
            return await self._exec(argv, stdin, timeout, cwd, env)
        finally:
            self._busy -= 1

    async def _exec(self, argv: list[str], stdin: bytes | None, timeout: float, cwd: str | None,
                    env: Mapping[str, str] | None) -> ExecResult:
        lease = self.lease
        heredoc = stdin_path = None
        if stdin and lease is not None and len(stdin) <= STDIN_INLINE_BYTES:
            heredoc = base64.encodebytes(bytes(stdin)).decode("ascii")
        elif stdin:
            await self._flush_reset()  # a due reset empties /tmp: it must not take the upload with it
            stdin_path = f"/tmp/.trl-sandbox-stdin-{uuid.uuid4().hex}"
            await self._upload(bytes(stdin), stdin_path, "uploading stdin")
        tag = None
        reset = False
        if lease is not None:
            launcher, tag = lease.argv(argv, work=self.work_dir, cwd=self._path(cwd) if cwd else None,
                                       limits=self.limits if self._provider.rlimits else None, timeout=timeout,
                                       stdin_b64=heredoc is not None, network=self.network,
                                       cap=self.limits.output_bytes)
            reset, lease.reset_due = lease.reset_due, False
            command = command_text(shlex.join(launcher), env or {}, heredoc, stdin_path)
        else:
            command = command_text(shlex.join(argv), env or {}, heredoc, stdin_path,
                                   cwd=self._path(cwd) if cwd else self.work_dir)
        budget = max(1, math.ceil(timeout)) + (CLEANING_MARGIN_S if tag is not None else 0)
        started = time.monotonic()
        try:
            code, stdout, stderr = await self._run(command, budget, "exec")
        except BackstopFired as exc:
            if tag is None:
                return ExecResult(exit_code=None, timed_out=True, duration_s=time.monotonic() - started)
            raise SandboxGoneError(f"E2B: sandbox {self.id}: the lease launcher did not end the program by its "
                                   f"deadline ({exc})") from exc
        except BaseException:
            if reset:
                lease.reset_due = True  # it may not have reached the sandbox: carry it again
            raise
        duration = time.monotonic() - started
        if tag is not None and code == FAILED_EXIT:
            why = failure(stdout, tag)
            if why is not None:  # the sandbox cannot be made clean: another one runs the program
                raise SandboxGoneError(f"E2B: sandbox {self.id}: the lease launcher failed: {why}")
        if tag is not None and timed_out(stdout, tag):
            return ExecResult(exit_code=None, timed_out=True, duration_s=duration)
        cap = self.limits.output_bytes
        truncated = len(stdout) > cap or len(stderr) > cap
        return ExecResult(exit_code=code, stdout=stdout[:cap], stderr=stderr[:cap], truncated=truncated,
                          duration_s=duration)

    def _path(self, path: str) -> str:
        if "\0" in path:
            raise ValueError(f"invalid path {path!r}")
        return posixpath.normpath(posixpath.join(self.work_dir, path))

    async def _upload(self, data: bytes, path: str, what: str) -> None:
        try:
            await self._sb.files.write(path, data, user=self._provider.user,
                                       request_timeout=self._provider.request_timeout_s)
        except Exception as exc:
            raise self._translate(exc, what) from exc

    async def _shell(self, argv: list[str], what: str) -> str:
        try:
            code, out, err = await self._run(shlex.join(argv) + " </dev/null", 60, what)
        except BackstopFired as exc:
            raise InfraError(f"E2B: sandbox {self.id}: {what} took over 60 s") from exc
        return out + err

    async def _flush_reset(self) -> None:
        """Carry a due reset now (one exec), before a file operation that must see its result."""
        if self.lease is not None and self.lease.reset_due:
            result = await self._exec(["true"], None, 30, None, None)
            if result.exit_code != 0:
                raise InfraError(f"E2B: sandbox {self.id}: reset failed: {result.stdout!r} {result.stderr!r}")

    async def write_file(self, path: str, data: bytes) -> None:
        """Write a file below the work directory; missing parent directories are created."""
        if isinstance(data, str):
            data = data.encode()
        full, relative = files.confine(self.work_dir, path)
        await self._flush_reset()
        if self.lease is not None:  # never through a link a program left (``trl_sandbox.remote.files``)
            staged = files.staging_path()
            await self._upload(bytes(data), staged, f"writing {path}")
            files.answer(await self._shell(files.argv("write", self.work_dir, relative, staged), f"writing {path}"),
                         path)
            return
        await self._upload(bytes(data), full, f"writing {path}")

    async def read_file(self, path: str) -> bytes:
        full, relative = files.confine(self.work_dir, path)
        await self._flush_reset()
        if self.lease is not None:
            return files.answer(await self._shell(files.argv("read", self.work_dir, relative), f"reading {path}"),
                                path)
        from e2b.exceptions import NotFoundException

        try:
            return bytes(await self._sb.files.read(full, format="bytes", user=self._provider.user))
        except NotFoundException as exc:
            if errors.is_gone(exc):
                raise self._translate(exc, f"reading {path}") from exc
            raise FileNotFoundError(2, f"no such file in sandbox {self.id}", path) from exc
        except Exception as exc:
            raise self._translate(exc, f"reading {path}") from exc

    async def use_environment(self, prepared: Any) -> None:
        """This lease's private copy of a prepared environment, made by the next exec's launcher."""
        self.work_dir = environment.use(self, prepared, self._provider.work_dir_for(self.id),
                                        self._provider.environment_layer_mb)

    async def reset(self) -> None:
        """With the lease launcher the reset travels with the next exec (no request of its own);
        without it, one command empties the work directory."""
        self.work_dir = self._provider.work_dir_for(self.id)
        if self.lease is not None:
            self.lease.reset_due = True
            return
        work = shlex.quote(self.work_dir)
        code, out, err = await self._run(f"rm -rf -- {work} && mkdir -p -- {work}", 30, "reset")
        if code != 0:
            raise InfraError(f"E2B: sandbox {self.id}: reset failed: {out!r} {err!r}")

    def defer_reset(self) -> bool:
        """``reset`` without awaiting, for a pool taking the sandbox back (True: due with the next exec)."""
        if self.lease is None or self._busy:
            return False
        self.work_dir = self._provider.work_dir_for(self.id)
        self.lease.reset_due = True
        return True

    async def alive(self) -> bool:
        """envd's ``/health`` through the proxy: a killed or expired sandbox answers 502."""
        try:
            return bool(await self._sb.is_running(request_timeout=self._provider.request_timeout_s))
        except Exception as exc:
            if errors.is_gone(exc):
                return False
            raise self._translate(exc, "health check") from exc


def command_text(program: str, env: Mapping[str, str], heredoc: str | None, stdin_path: str | None,
                 cwd: str | None = None) -> str:
    """The text envd's login shell runs: ``env`` set after ``/etc/profile`` (with ``env --``, so
    any name works), stdin attached, and the program ``exec``ed: no shell stays between envd and
    the program. ``program`` is already shell-quoted; ``cwd`` only without the launcher (which
    enters the program's directory itself)."""
    pairs = []
    for key, value in env.items():
        if not key or "=" in key or "\0" in key or "\0" in str(value):
            raise ValueError(f"invalid environment variable {key!r}")
        pairs.append(f"{key}={value}")
    text = f"exec env -- {shlex.join(pairs)} {program}" if pairs else f"exec {program}"
    if cwd is not None:
        text = f"cd -- {shlex.quote(cwd)} && {text}"
    if heredoc is not None:
        delimiter = f"TRL_STDIN_{secrets.token_hex(8)}"  # never in base64 text (no underscore there)
        return f"{text} <<'{delimiter}'\n{heredoc.rstrip(chr(10))}\n{delimiter}\n"
    if stdin_path is not None:
        src = shlex.quote(stdin_path)
        return f"{{ rm -f -- {src}; {text}; }} <{src}"
    return f"{text} </dev/null"

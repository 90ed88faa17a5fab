"""One Modal sandbox (``ModalSandbox``): exec through the lease launcher, files, reset, alive.

Every program runs through the shared remote lease launcher (``trl_sandbox.remote.lease``), as on
Daytona and CoreWeave: one ``Sandbox.exec`` per program, its argv the launcher's (Modal execs an
argv, no shell), the due reset riding along. Why the launcher also owns the time limit: Modal's exec
``timeout`` makes ``wait()`` return -1 and has no kill for the client to send, and whatever the
worker does at that deadline, a program's detached children are not its business. So the launcher's
own wall clock ends the program and everything it started (its PID namespace dies with it) and says
so on a line with a tag fresh per exec; Modal's exec timeout is only a backstop, ``CLEANING_MARGIN_S``
later, and its firing (rc -1, or the output stream running past the deadline) means the launcher
failed: the sandbox's fault (``SandboxGoneError``: the pool runs the program elsewhere), never the
program's timeout.

stdin is streamed over the exec's own stdin and closed (the program reads EOF after it); stdout and
stderr are the exec's two streams, each capped by the launcher in the sandbox. Files move through
exec too (no ``sb.filesystem``): ``trl_sandbox.remote.files`` walks the work directory without
following links; a write's data arrives on the exec's stdin into a fresh name in ``/tmp`` first.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import posixpath
import shlex
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from trl_sandbox import ExecResult, InfraError, ResourceLimits, SandboxGoneError, SandboxSpec
from trl_sandbox.remote import environment, files
from trl_sandbox.remote.lease import CLEANING_MARGIN_S, FAILED_EXIT, Lease, failure, probe_argv, timed_out
from trl_sandbox.sandbox import exec_arguments

from .errors import is_gone, translate

if TYPE_CHECKING:
    from .provider import ModalProvider

log = logging.getLogger("trl_sandbox_modal")

#: Receives a write's data on stdin into a fresh file (noclobber, private), then runs the copy.
_STAGE = 'f=$1; shift; (set -C; umask 077; cat > "$f") || exit 1; exec "$@"'
#: Modal's client refuses an exec whose arguments total more than 65,536 characters (ARG_MAX);
#: a longer argv (the launcher sent with the exec, a large judge) travels on stdin instead.
ARGV_LIMIT = 60_000
#: Reads exactly its argv (JSON, ``argv[1]`` bytes) from stdin, unbuffered, and execs it: the rest
#: of stdin is left in the pipe for the program.
_BOOT = ("import json, os, sys\n"
         "n = int(sys.argv[1]); b = b''\n"
         "while len(b) < n:\n"
         "    c = os.read(0, n - len(b))\n"
         "    if not c: sys.exit(125)\n"
         "    b += c\n"
         "a = json.loads(b)\n"
         "os.execvp(a[0], a)\n")


def fit_argv(argv: Sequence[str], stdin: bytes | None) -> tuple[list[str], bytes | None]:
    """``(argv, stdin)`` within Modal's argument limit: a long argv moves to the front of stdin,
    read by a small bootstrap that then execs it (same exec, no extra request)."""
    if sum(len(a) for a in argv) <= ARGV_LIMIT:
        return list(argv), stdin
    header = json.dumps(list(argv)).encode()
    return ["python3", "-I", "-S", "-c", _BOOT, str(len(header))], header + (stdin or b"")


class ModalSandbox:
    """One Modal sandbox. Use through ``ModalProvider.create``."""

    def __init__(self, provider: ModalProvider, sdk_sandbox: Any, spec: SandboxSpec) -> None:
        self.id: str = sdk_sandbox.object_id
        self.tags = dict(spec.tags)
        self.work_dir = provider.work_dir_for(self.id)
        self.limits: ResourceLimits = spec.limits
        self.network = bool(spec.network)
        self.from_environment = provider.is_snapshot(spec.image)
        self.lease: Lease | None = None
        self._busy = 0
        self._provider = provider
        self._sb = sdk_sandbox

    def _path(self, path: str) -> str:
        if "\0" in path:
            raise ValueError(f"invalid path {path!r}")
        return posixpath.normpath(posixpath.join(self.work_dir, path))

    async def _run(self, argv: Sequence[str], stdin: bytes | None, timeout: int | None,
                   env: Mapping[str, str] | None = None, workdir: str | None = None) -> tuple[int, bytes, bytes]:
        """One ``Sandbox.exec``: its exit code (-1: Modal's deadline passed) and both streams.

        stdin is written and closed while both streams are read (no pipe deadlock)."""
        argv, stdin = fit_argv(argv, stdin)
        process = await self._sb.exec.aio(*argv, timeout=timeout, text=False, workdir=workdir,
                                          env=dict(env) if env else None)

        async def feed() -> None:
            if stdin:
                process.stdin.write(stdin)
            process.stdin.write_eof()
            await process.stdin.drain.aio()

        fed, out, err = await asyncio.gather(feed(), process.stdout.read.aio(), process.stderr.read.aio(),
                                             return_exceptions=True)
        for part in (out, err):
            if isinstance(part, BaseException):
                raise part
        if isinstance(fed, BaseException):  # the program exited without reading all of it: its result says how
            log.debug("stdin of an exec in sandbox %s was cut short: %r", self.id, fed)
        code = await process.wait.aio()
        return code, bytes(out), bytes(err)

    async def _shell(self, argv: Sequence[str], what: str, stdin: bytes | None = None,
                     timeout: int = 60) -> tuple[int, str, str]:
        """An exec outside every lease (preparing, file operations), errors translated."""
        try:
            code, out, err = await self._run(argv, stdin, timeout)
        except Exception as exc:
            raise translate(exc, what, self.id) from exc
        if code == -1:
            raise InfraError(f"Modal: sandbox {self.id}: {what} did not finish within {timeout} s")
        return code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

    async def prepare(self) -> None:
        """Create the work directory and probe what the lease launcher may do here (one exec);
        the probe leaves the resident launcher running where the image allows namespaces."""
        provider = self._provider
        work = shlex.quote(self.work_dir)
        probe = "true"
        if provider.clean_leases:
            probe = shlex.join(probe_argv(serve=provider.resident_launcher and provider.isolation != "sweep"))
        code, out, err = await self._shell(
            ["/bin/sh", "-c", f"mkdir -p -- {work} || exit 1; {probe} </dev/null 2>/dev/null; true"],
            "preparing the work directory")
        if code != 0:
            raise InfraError(f"Modal: sandbox {self.id}: could not create {self.work_dir}: {err.strip()!r}")
        if provider.clean_leases:
            self.lease = Lease.adopt(out, self.id, "modal", sweep=provider.isolation == "sweep",
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
        tag = None
        reset = False
        workdir = None
        if lease is not None:
            command, tag = lease.argv(argv, work=self.work_dir, cwd=self._path(cwd) if cwd else None,
                                      limits=self.limits if self._provider.rlimits else None, timeout=timeout,
                                      network=self.network, cap=self.limits.output_bytes)
            reset, lease.reset_due = lease.reset_due, False
        else:
            command, workdir = argv, self._path(cwd) if cwd else self.work_dir
        # With the launcher, Modal's exec deadline is a backstop past the launcher's own one.
        backstop = max(1, math.ceil(timeout)) + (CLEANING_MARGIN_S if tag is not None else 0)
        started = time.monotonic()
        try:
            code, out, err = await self._run(command, stdin, backstop, env, workdir)
        except Exception as exc:
            from modal.exception import ExecTimeoutError

            if isinstance(exc, ExecTimeoutError):
                code, out, err = -1, b"", b""
            else:
                if reset:
                    lease.reset_due = True  # it may not have reached the sandbox: carry it again
                raise translate(exc, "exec", self.id) from exc
        duration = time.monotonic() - started
        # Modal's deadline passed: wait() says -1, or the worker's kill at the deadline came first
        # (with the launcher nothing legitimate runs that long: it ends the program 10 s before).
        if code == -1 or (duration >= backstop and (tag is not None or code == 128 + 9)):
            if tag is None:  # no launcher: Modal's deadline is the program's timeout
                return ExecResult(exit_code=None, timed_out=True, duration_s=duration)
            raise SandboxGoneError(f"Modal: sandbox {self.id}: the lease launcher did not end the program by its "
                                   "deadline (Modal's exec timeout fired)")
        if tag is not None and code == FAILED_EXIT:
            why = failure(out.decode("utf-8", "replace"), tag)
            if why is not None:  # the sandbox cannot be made clean: another one runs the program
                raise SandboxGoneError(f"Modal: sandbox {self.id}: the lease launcher failed: {why}")
        if tag is not None and out.endswith(b"]\n") and timed_out(out[-64:].decode("ascii", "replace"), tag):
            return ExecResult(exit_code=None, timed_out=True, duration_s=duration)
        cap = self.limits.output_bytes
        return ExecResult(exit_code=code, stdout=out[:cap].decode("utf-8", "replace"),
                          stderr=err[:cap].decode("utf-8", "replace"),
                          truncated=len(out) > cap or len(err) > cap, duration_s=duration)

    async def _flush_reset(self) -> None:
        """Carry a due reset now (one exec), before a file operation that must see its result."""
        if self.lease is not None and self.lease.reset_due:
            result = await self._exec(["true"], None, 30, None, None)
            if result.exit_code != 0:
                raise InfraError(f"Modal: sandbox {self.id}: reset failed: {result.stderr!r}")

    async def write_file(self, path: str, data: bytes) -> None:
        """Write a file (parents made); never through a link a program left (``remote.files``)."""
        if isinstance(data, str):
            data = data.encode()
        full, relative = files.confine(self.work_dir, path)
        await self._flush_reset()
        staged = files.staging_path()
        code, out, err = await self._shell(["/bin/sh", "-c", _STAGE, "sh", staged,
                                            *files.argv("write", self.work_dir, relative, staged)],
                                           f"writing {path}", stdin=bytes(data))
        files.answer(out, path)

    async def read_file(self, path: str) -> bytes:
        full, relative = files.confine(self.work_dir, path)
        await self._flush_reset()
        code, out, err = await self._shell(files.argv("read", self.work_dir, relative), f"reading {path}")
        return files.answer(out, path)

    async def use_environment(self, prepared: Any) -> None:
        """This lease's private copy of a prepared environment, made by the next exec's launcher."""
        self.work_dir = environment.use(self, prepared, self._provider.work_dir_for(self.id),
                                        self._provider.environment_layer_mb)

    async def reset(self) -> None:
        """With the lease launcher, the reset travels with the next exec (no request of its own);
        without it, one exec empties the work directory."""
        self.work_dir = self._provider.work_dir_for(self.id)
        if self.lease is not None:
            self.lease.reset_due = True
            return
        work = shlex.quote(self.work_dir)
        code, _, err = await self._shell(["/bin/sh", "-c", f"rm -rf -- {work} && mkdir -p -- {work}"], "reset")
        if code != 0:
            raise InfraError(f"Modal: sandbox {self.id}: reset failed: {err!r}")

    def defer_reset(self) -> bool:
        """``reset`` without awaiting, for a pool taking the sandbox back (True: due with the next exec)."""
        if self.lease is None or self._busy:
            return False
        self.work_dir = self._provider.work_dir_for(self.id)
        self.lease.reset_due = True
        return True

    async def alive(self) -> bool:
        try:
            return await self._sb.poll.aio() is None
        except Exception as exc:
            if is_gone(exc):
                return False
            raise translate(exc, "poll", self.id) from exc

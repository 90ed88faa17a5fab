"""One local sandbox seen from the host: a ``bwrap`` process and the channel to its supervisor.

The supervisor answers over bwrap's stdout (``supervisor/protocol.py``). bwrap's stderr carries
only what bwrap or a dying interpreter says; it is drained all the time (keeping the last few KB,
for ``_death_reason``), so that nothing written there can ever block PID 1.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import marshal
import os
import signal
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from trl_sandbox.local.agent_ops import AgentGrading
from trl_sandbox.local.supervisor import protocol as _proto
from trl_sandbox.sandbox import ExecResult, InfraError, SandboxSpec, exec_arguments, sandbox_path

if TYPE_CHECKING:
    from trl_sandbox.environments.builds import Prepared
    from trl_sandbox.local.cgroups import SandboxGroup


class LocalProvider(Protocol):
    """What a sandbox reads of the ``trl_sandbox.local.provider.LocalProvider`` that made it."""

    _grace: float
    work_size_mb: int
    environments: Any  # local.environments.LocalEnvironments
    warm_tokens: dict[str, str]
    wall_timeouts: int
    work_dir: str

    def wall_bound(self, timeout: float) -> float: ...

log = logging.getLogger("trl_sandbox.local.provider")

HEADER = _proto.HEADER
LENGTH = _proto.LENGTH
MARSHAL_VERSION = 4  # readable by every Python the supervisor supports (3.8+)
_RESET = marshal.dumps((_proto.OP_RESET,), MARSHAL_VERSION)
RESET_FRAME = LENGTH.pack(len(_RESET)) + _RESET
# The requests a due reset goes ahead of: whatever runs a program or touches the scratch places.
RESET_FIRST = frozenset((_proto.OP_EXEC, _proto.OP_WRITE, _proto.OP_READ, _proto.OP_ENV))
STDERR_KEPT = 8192  # the tail of bwrap's stderr kept for _death_reason


class _Died(Exception):
    """Internal: the supervisor went away (or stopped answering) during a request."""

    def __init__(self, reason: str, *, by_host: bool = False, hung: bool = False):
        super().__init__(reason)
        self.by_host = by_host
        self.hung = hung


class LocalSandbox(AgentGrading):
    """One bubblewrap container with its supervisor. Use through ``LocalProvider.create``."""

    def __init__(self, provider: LocalProvider, sandbox_id: str, spec: SandboxSpec, proc) -> None:
        self.id = sandbox_id
        self.spec = spec
        self.tags = dict(spec.tags)
        self.created_at = time.time()
        self.python_version = ""
        self._provider = provider
        self._proc = proc
        self._reader: asyncio.StreamReader = proc.stdout
        self._writer: asyncio.StreamWriter = proc.stdin
        self._lock = asyncio.Lock()
        self._reset_due = False  # see reset()
        self._work = provider.work_dir  # where file operations land: a lease's environment may move it
        self.environment_mode = ""  # how the last prepared environment was given: overlay or copy
        self._dead: str | None = None
        self._dead_by_host = False
        self._hang = False
        self._grace = provider._grace
        self._max_output = spec.limits.output_bytes
        self._lifetime = asyncio.get_running_loop().call_later(spec.lifetime_s, self._expire)
        self._kill_sent = False
        # Signal bwrap through a pidfd: Popen.kill() first polls the child with waitpid, which can
        # reap it under asyncio's child watcher (a spurious "Unknown child process" warning),
        # and a bare pid could be reused once the process is reaped.
        try:
            self._pidfd: int | None = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            self._pidfd = None
        self._stderr_tail = bytearray()
        self.group: SandboxGroup | None = None  # its cgroup, set by the provider
        self._drain = asyncio.get_running_loop().create_task(self._drain_stderr())

    async def _drain_stderr(self) -> None:
        """Read bwrap's stderr until it closes, keeping only its last ``STDERR_KEPT`` bytes: a
        pipe nobody reads fills up, and then whoever writes to it (PID 1 itself) blocks."""
        stream = self._proc.stderr
        tail = self._stderr_tail
        try:
            while True:
                chunk = await stream.read(1 << 16)
                if not chunk:
                    return
                tail += chunk
                if len(tail) > STDERR_KEPT:
                    del tail[:-STDERR_KEPT]
        except (OSError, ValueError):
            return

    @property
    def pid(self) -> int:
        """The host pid of the outer bwrap process."""
        return self._proc.pid

    # -- state ---------------------------------------------------------------------------------

    def _usable(self) -> bool:
        return self._dead is None and self._proc.returncode is None

    def _mark_dead(self, reason: str, *, by_host: bool = False) -> None:
        if self._dead is None:
            self._dead = reason
            self._dead_by_host = by_host
            log.debug("sandbox %s is dead: %s", self.id, reason)
            self._provider.environments.active.pop(self.id, None)
        if self._proc.returncode is None and not self._kill_sent:
            self._kill_sent = True
            try:
                if self._pidfd is not None:
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
                else:
                    self._proc.kill()
            except ProcessLookupError:
                pass

    def _expire(self) -> None:
        self._mark_dead(f"its lifetime of {self.spec.lifetime_s:g} s expired", by_host=True)

    def _check(self) -> None:
        if self._dead is not None:
            raise InfraError(f"sandbox {self.id} is dead: {self._dead}")
        if self._proc.returncode is not None:
            self._mark_dead(f"bwrap exited with status {self._proc.returncode}")
            raise InfraError(f"sandbox {self.id} is dead: {self._dead}")

    async def _stop(self, reason: str) -> None:
        self._lifetime.cancel()
        self._mark_dead(reason, by_host=True)
        try:
            self._writer.close()
        except Exception:
            pass
        try:
            await asyncio.wait_for(self._proc.wait(), 10)
            # Let both pipes see end of file while the loop runs, so that no transport is left
            # to be closed by the garbage collector after the loop has stopped.
            await asyncio.wait_for(asyncio.gather(self._reader.read(), asyncio.shield(self._drain)), 5)
        except asyncio.TimeoutError:
            log.warning("sandbox %s (pid %s) did not exit after SIGKILL", self.id, self._proc.pid)
        except RuntimeError:
            pass  # an exec in flight is reading stdout; it sees the end of file itself
        if not self._drain.done():
            self._drain.cancel()
        transport = getattr(self._proc, "_transport", None)
        if transport is not None:
            transport.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    # -- transport -----------------------------------------------------------------------------

    async def _call(
        self, request: tuple, deadline: float | None, raw: bytes = b""
    ) -> tuple[int, int, int, float, bytes, bytes]:
        """Send one request (plus a raw frame, for an exec's stdin) and read its answer:
        (kind, flags, code, duration, part1, part2). A due reset goes first, in the same write."""
        payload = marshal.dumps(request, MARSHAL_VERSION)
        frames = LENGTH.pack(len(payload)) + payload + raw
        reset_first = self._reset_due and request[0] in RESET_FIRST
        if reset_first:
            frames = RESET_FRAME + frames
            self._reset_due = False
        watchdog = None
        try:
            self._writer.write(frames)
            if len(frames) > 1 << 16:
                await self._writer.drain()
            if deadline is not None:
                watchdog = asyncio.get_running_loop().call_later(deadline, self._hung, deadline)
            if reset_first:
                await self._reset_answer()
                reset_first = False
            head = await self._reader.readexactly(HEADER.size)
            kind, flags, code, duration, n1, n2 = HEADER.unpack(head)
            if kind == _proto.K_RESULT and (n1 > self._max_output or n2 > self._max_output):
                self._mark_dead("the supervisor sent more output than the cap")
                raise _Died(self._dead or "protocol error")
            body = await self._reader.readexactly(n1 + n2) if n1 + n2 else b""
        except asyncio.CancelledError:
            # The answer is still on its way: the channel cannot be reused.
            self._mark_dead("a request was cancelled before its answer arrived")
            raise
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            if reset_first and self._dead is None:  # gone before the reset's answer: no program ran
                self._mark_dead(f"it died during its reset: {await self._death_reason()}", by_host=True)
            if self._dead is None:
                self._mark_dead(await self._death_reason())
            raise _Died(self._dead or "the sandbox died", by_host=self._dead_by_host, hung=self._hang) from exc
        finally:
            if watchdog is not None:
                watchdog.cancel()
        if n2:
            return kind, flags, code, duration, body[:n1], body[n1:]
        return kind, flags, code, duration, body, b""

    async def _reset_answer(self) -> None:
        """Read the answer to a reset sent ahead of a request. A failed reset ends the supervisor
        before it reads the request (``supervisor.main.serve``), and a sandbox that dies during its
        reset is no program's doing: either way the request fails as the host's (``by_host``), so
        that an exec raises ``InfraError`` instead of returning a result that blames the program."""
        kind, _, _, _, n1, n2 = HEADER.unpack(await self._reader.readexactly(HEADER.size))
        body = await self._reader.readexactly(n1 + n2) if n1 + n2 else b""
        if kind != _proto.K_OK:
            self._mark_dead(f"its reset failed: {body.decode('utf-8', 'replace')[:500]}", by_host=True)
            raise _Died(self._dead or "its reset failed", by_host=True)

    def _hung(self, deadline: float) -> None:
        self._hang = True
        self._mark_dead(f"no answer from the supervisor within {deadline:.1f} s")

    async def _death_reason(self) -> str:
        """Why the channel closed: bwrap's exit status and whatever it (or Python) said on stderr."""
        try:
            await asyncio.wait_for(self._proc.wait(), 1.0)
            await asyncio.wait_for(asyncio.shield(self._drain), 1.0)
        except (asyncio.TimeoutError, OSError):
            pass
        detail = bytes(self._stderr_tail)
        rc = self._proc.returncode
        reason = "the supervisor exited" if rc is None else f"bwrap exited with status {rc}"
        text = detail.decode("utf-8", "replace").strip()[-500:]
        return f"{reason}: {text}" if text else reason

    async def _start(self, config: dict, timeout: float) -> None:
        try:
            kind, _, _, _, version, _ = await asyncio.wait_for(self._call((_proto.OP_CONFIG, config), None), timeout)
        except _Died as exc:
            raise InfraError(f"sandbox {self.id} failed to start: {exc}") from None
        except asyncio.TimeoutError as exc:
            raise InfraError(f"sandbox {self.id} did not start within {timeout:g} s") from exc
        if kind != _proto.K_OK:
            raise InfraError(f"sandbox {self.id} failed to start: unexpected answer {kind!r}")
        self.python_version = version.decode(errors="replace")

    async def _simple(self, request: tuple, timeout: float = 60.0, raw: bytes = b"") -> tuple[int, int, bytes]:
        async with self._lock:
            self._check()
            try:
                kind, _, code, _, part1, _ = await self._call(request, timeout, raw)
            except _Died as exc:
                raise InfraError(f"sandbox {self.id} died: {exc}") from None
        if kind == _proto.K_ERROR:
            # A living supervisor answered: the operation failed on its arguments or on what programs
            # left in the sandbox, never because the sandbox broke (that is a _Died above). It is
            # the caller's error to see; a reset that fails this way makes the pool replace the sandbox.
            raise OSError(code or errno.EINVAL, f"sandbox {self.id}: {part1.decode('utf-8', 'replace')}")
        return kind, code, part1

    # -- Sandbox API ---------------------------------------------------------------------------

    async def exec(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | str | None = None,
        timeout: float,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        orphans_die: bool = False,
    ) -> ExecResult:
        """``orphans_die``: every process the program orphans is killed within a millisecond
        (``run_verifier``); otherwise they live until the program ends."""
        argv, stdin = exec_arguments(argv, stdin, timeout, allow_empty=True)  # the supervisor answers 127
        # A warm program's source travels as its token. A caller's argument that starts with a NUL
        # (never a valid argument, and maybe a token) travels as a bare NUL: it cannot name one.
        tokens = self._provider.warm_tokens
        argv = [tokens.get(a) or ("\0" if a[:1] == "\0" else a) for a in argv]
        if env:
            env = {str(k): str(v) for k, v in env.items()}
        stdin = stdin or b""
        request = (_proto.OP_EXEC, argv, len(stdin), float(timeout), cwd, env or None)
        if orphans_die:
            request += (True,)
        async with self._lock:
            self._check()
            started = time.monotonic()
            try:
                kind, flags, code, duration, out, err = await self._call(
                    request, self._provider.wall_bound(timeout) + self._grace, stdin
                )
            except _Died as exc:
                if exc.by_host:
                    raise InfraError(f"sandbox {self.id} was stopped during an exec: {exc}") from None
                oom = self.group is not None and self.group.new_oom_kills()
                return ExecResult(
                    exit_code=None,
                    stderr=f"trl-sandbox: the sandbox died during this execution ({exc})"
                    + ("; its memory cgroup ran out of memory" if oom else "") + "\n",
                    timed_out=exc.hung,
                    oom_killed=oom,
                    duration_s=time.monotonic() - started,
                )
        if kind != _proto.K_RESULT:
            self._mark_dead(f"protocol error: answer {kind!r} to an exec")
            raise InfraError(f"sandbox {self.id}: {self._dead}")
        if flags & _proto.F_WALL:
            self._provider.wall_timeouts += 1
            log.info("sandbox %s: a program slept or blocked until the wall-clock backstop (%.1f s)",
                     self.id, self._provider.wall_bound(timeout))
        return ExecResult(
            exit_code=code,
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            timed_out=bool(flags & _proto.F_TIMED_OUT),
            # Killed by the kernel because the sandbox's memory cgroup was full: the same verdict
            # as a MemoryError. One small read per exec keeps the baseline current.
            oom_killed=bool(flags & _proto.F_OOM) or (self.group is not None and self.group.new_oom_kills()
                                                      and code == -signal.SIGKILL),
            truncated=bool(flags & _proto.F_TRUNCATED),
            duration_s=duration,
        )

    def wall_bound(self, timeout: float) -> float:
        """The wall-clock seconds an exec with ``timeout`` may take (the pool waits that long)."""
        return self._provider.wall_bound(timeout)

    def _path(self, path: str) -> str:
        return sandbox_path(self._work, path)

    async def use_environment(self, prepared: Prepared) -> None:
        """Give this lease its private copy of a prepared environment (``supervisor/layers.py``):
        an overlay over the read-only prepared tree at the environment's working directory, dropped
        by the next reset. A failure is the sandbox's (``InfraError``): the pool replaces it."""
        t0 = time.perf_counter()
        try:
            _, _, mode = await self._simple(
                (_proto.OP_ENV, prepared.key, prepared.workdir, self._provider.work_size_mb))
        except OSError as exc:
            raise InfraError(f"sandbox {self.id} could not mount prepared environment {prepared.key[:12]}: "
                             f"{exc}") from exc
        self._work = prepared.workdir or self._provider.work_dir
        self._provider.environments.active[self.id] = prepared.key  # not evicted while leased
        self.environment_mode = mode.decode()
        self._provider.environments.builds.stats.lease_ms.append((time.perf_counter() - t0) * 1000)

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        if isinstance(data, str):
            data = data.encode()
        data = bytes(data)  # the contents travel as a raw frame after the request
        await self._simple((_proto.OP_WRITE, self._path(path), len(data), int(mode)), raw=data)

    async def read_file(self, path: str) -> bytes:
        _, _, data = await self._simple((_proto.OP_READ, self._path(path)))
        return data

    async def reset(self) -> None:
        """Back to a clean state before anything runs again: the reset is sent ahead of the next
        exec or file operation, in the same write, and answered first. A pool resets after every
        lease, so this saves each job a round trip to the supervisor. A reset that fails there ends
        the sandbox: that request raises ``InfraError`` and a pool replaces the sandbox."""
        async with self._lock:
            self._check()
            self._reset_due = True
            self._end_environment()

    def _end_environment(self) -> None:
        self._work = self._provider.work_dir
        self._provider.environments.active.pop(self.id, None)

    def defer_reset(self) -> bool:
        """``reset`` without awaiting, for a pool taking the sandbox back: True when the reset is
        now due with the next request; False when the sandbox is busy or dead (the pool then
        resets it the usual way, and replaces it if that fails)."""
        if self._lock.locked() or not self._usable():
            return False
        self._reset_due = True
        self._end_environment()
        return True

    async def alive(self) -> bool:
        if not self._usable():
            return False
        if self._lock.locked():
            return True  # busy with an exec, which has its own watchdog
        try:
            await self._simple((_proto.OP_PING,), timeout=10.0)
        except (InfraError, OSError):
            return False
        return True

    def __repr__(self) -> str:
        state = "running" if self._usable() else f"dead ({self._dead})"
        return f"<LocalSandbox {self.id} pid={self._proc.pid} {state}>"


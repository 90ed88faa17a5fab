"""A third-party-style plugin for tests: provider ``flaky`` and task set ``echo``.

``flaky`` runs programs as plain host subprocesses (no isolation: tests only) and injects the
failures a remote provider shows: failed and slow creates, transport errors, 429s with
Retry-After, execs that hang, sandboxes that die. Its state is per provider instance.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import threading
import time
from dataclasses import dataclass, field

from trl_sandbox import (
    Capabilities,
    ExecResult,
    InfraError,
    Outcome,
    Program,
    QuotaError,
    RateLimitError,
    SandboxGoneError,
    SandboxInfo,
    hookimpl,
)

_ids = itertools.count(1)


@dataclass
class Faults:
    create_failures: int = 0  # the first N creates raise InfraError
    create_quota: bool = False  # every create raises QuotaError
    create_delay_s: float = 0.0
    create_lands_late_s: float = 0.0  # the service makes the sandbox this late, even if the caller gave up
    exec_infra_failures: int = 0  # the first N execs raise InfraError (the sandbox stays alive)
    exec_vanish: int = 0  # the first N execs find their sandbox gone (SandboxGoneError)
    exec_kills: int = 0  # the first N execs kill their sandbox and raise a plain InfraError
    reset_failures: int = 0  # the first N resets raise InfraError (the sandbox stays alive)
    exec_rate_limits: int = 0  # the first N execs raise RateLimitError(retry_after)
    retry_after_s: float = 0.2
    exec_hangs: int = 0  # the first N execs never answer
    dead_after_execs: int | None = None  # a sandbox reports dead after this many execs
    journal: str | None = None  # append "create ID" / "destroy ID" lines here (survives the process)
    shared: bool = False  # keep sandboxes in one process-wide "server" shared by all instances
    calls: list = field(default_factory=list)


class FlakySandbox:
    def __init__(self, provider: FlakyProvider, sandbox_id: str, tags: dict) -> None:
        self.provider = provider
        self.id = sandbox_id
        self.tags = tags
        self.execs = 0
        self.resets = 0
        self.files: dict[str, bytes] = {}

    async def exec(self, argv, *, stdin=None, timeout, cwd=None, env=None) -> ExecResult:
        f = self.provider.faults
        f.calls.append(("exec", self.id))
        self.execs += 1
        if f.exec_hangs > 0:
            f.exec_hangs -= 1
            await asyncio.sleep(3600)
        if f.exec_infra_failures > 0:
            f.exec_infra_failures -= 1
            raise InfraError("injected transport error")
        if f.exec_vanish > 0:
            f.exec_vanish -= 1
            self.provider.live.pop(self.id, None)
            raise SandboxGoneError(f"injected: sandbox {self.id} vanished")
        if f.exec_kills > 0:
            f.exec_kills -= 1
            self.provider.live.pop(self.id, None)
            raise InfraError("injected: connection reset (the sandbox died)")
        if f.exec_rate_limits > 0:
            f.exec_rate_limits -= 1
            f.calls.append(("rate_limited", time.monotonic()))
            raise RateLimitError("injected 429", retry_after=f.retry_after_s)
        if isinstance(stdin, str):
            stdin = stdin.encode()
        argv = [sys.executable if a in ("python", "python3") else a for a in argv]
        t0 = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin or b""), timeout)
            return ExecResult(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"),
                              duration_s=time.perf_counter() - t0)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            return ExecResult(None, timed_out=True, duration_s=time.perf_counter() - t0)

    async def write_file(self, path: str, data: bytes) -> None:
        self.files[path] = data

    async def read_file(self, path: str) -> bytes:
        return self.files[path]

    async def reset(self) -> None:
        self.resets += 1
        self.files.clear()
        if self.provider.faults.reset_failures > 0:
            self.provider.faults.reset_failures -= 1
            raise InfraError("injected: reset failed")
        if not await self.alive():
            raise InfraError("sandbox died")

    async def alive(self) -> bool:
        limit = self.provider.faults.dead_after_execs
        return self.id in self.provider.live and (limit is None or self.execs < limit)


def _coerce(key: str, value):
    """Settings arrive as strings from the command line; give them the field's type."""
    default = Faults.__dataclass_fields__[key].default
    if isinstance(value, str) and isinstance(default, bool):
        return value.lower() in ("1", "true", "yes")
    if isinstance(value, str) and isinstance(default, (int, float)):
        return type(default)(value)
    return value


class FlakyProvider:
    name = "flaky"
    capabilities = Capabilities(network_isolation=False, fast_python=False)
    instances: list[FlakyProvider] = []
    server: dict[str, FlakySandbox] = {}

    def __init__(self, **faults) -> None:
        self.faults = Faults(**{k: _coerce(k, v) for k, v in faults.items()})
        self.live: dict[str, FlakySandbox] = FlakyProvider.server if self.faults.shared else {}
        self.created = 0
        self.closed = False
        FlakyProvider.instances.append(self)

    async def create(self, spec) -> FlakySandbox:
        f = self.faults
        if f.create_quota:
            raise QuotaError("injected: sandbox limit reached")
        sandbox = FlakySandbox(self, f"flaky-{os.getpid()}-{next(_ids)}", dict(spec.tags))
        if f.create_lands_late_s:
            # The "service" (a timer thread) makes the sandbox later, whatever the caller does.
            landed = asyncio.Event()
            loop = asyncio.get_running_loop()

            def land() -> None:
                self.live[sandbox.id] = sandbox
                try:
                    loop.call_soon_threadsafe(landed.set)
                except RuntimeError:  # the caller's loop is gone
                    pass

            threading.Timer(f.create_lands_late_s, land).start()
            f.calls.append(("create", sandbox.id))
            await landed.wait()
        if f.create_delay_s:
            # The sandbox exists server-side before the create call returns (like a slow remote create).
            self.live[sandbox.id] = sandbox
            await asyncio.sleep(f.create_delay_s)
        if f.create_failures > 0:
            f.create_failures -= 1
            self.live.pop(sandbox.id, None)
            raise InfraError("injected: create failed")
        self.live[sandbox.id] = sandbox
        self.created += 1
        self._journal("create", sandbox.id)
        return sandbox

    def _journal(self, event: str, sandbox_id: str) -> None:
        if self.faults.journal:
            with open(self.faults.journal, "a") as fh:
                fh.write(f"{event} {sandbox_id}\n")

    async def list(self, tags):
        return [SandboxInfo(s.id, s.tags, "running") for s in self.live.values()
                if all(s.tags.get(k) == v for k, v in tags.items())]

    async def destroy(self, sandbox_id: str) -> None:
        if self.live.pop(sandbox_id, None) is not None:
            self._journal("destroy", sandbox_id)

    async def aclose(self) -> None:
        self.closed = True


class EchoTasks:
    """Task set ``echo``: the completion is a Python expression; passed when it prints the row's ``expected``."""

    name = "echo"
    description = "print an expression and compare with the expected text (tests only)"
    required_columns = ("expected",)

    def rows(self, **options):
        return [{"prompt": "print 2+2", "task_id": "four", "expected": "4"},
                {"prompt": "print hello", "task_id": "hello", "expected": "hello"}]

    def build(self, completion: str, row) -> Program | Outcome:
        if not completion.strip():
            return Outcome("no_code", total=1, detail="empty completion")
        return Program(argv=("python3", "-c", f"print({completion})"), timeout=5.0)

    def score(self, result, row, *, nonce=None) -> Outcome:
        if result.timed_out:
            return Outcome("timeout", total=1)
        if result.exit_code != 0:
            return Outcome("error", total=1, detail=result.stderr[-200:])
        ok = result.stdout.strip() == str(row["expected"])
        return Outcome("passed" if ok else "failed", passed=int(ok), total=1, tests=(ok,))


@hookimpl
def trl_sandbox_register_providers(register):
    register("flaky", FlakyProvider)


@hookimpl
def trl_sandbox_register_tasks(register):
    register("echo", EchoTasks())


@hookimpl
def trl_sandbox_run_tags(run):
    return {"team": "tests"}

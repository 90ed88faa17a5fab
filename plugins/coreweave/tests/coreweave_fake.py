"""A fake CoreWeave Sandbox service on 127.0.0.1, for tests that drive the real ``cwsandbox`` SDK.

A ``grpc.aio`` server (on its own event-loop thread) built from the servicer class shipped in the
``cwsandbox`` wheel. It implements CreateSandbox, GetSandbox, ListSandboxes (tags, paging),
DeleteSandbox, StreamExec (ready/output/exit frames, stdin frames, separate stdout and stderr),
WriteFile and ReadFile; everything else answers UNIMPLEMENTED, which makes the SDK fall back from
the direct data plane to the gateway, as it would against a service without one. A command whose
RPC ends early (deadline, cancellation) has its process group killed.

Each fake sandbox is a container of its own on this host (``trl_sandbox.remote.fake_container``: a
bubblewrap with its own PID namespace, ``/tmp``, ``/var/tmp`` and ``/dev/shm``), as CoreWeave gives
each sandbox a pod: commands and file transfers happen inside it, a process a command leaves running
lives on there for the next command (until the sandbox is deleted), and a command sees only its own
sandbox's processes. ``exec_commands`` records the argv of every exec, per sandbox. It stands in for
the vendor's cloud: only test programs may be sent to it.

Faults are injected per RPC (``create``, ``get``, ``list``, ``delete``, ``exec``, ``write``,
``read``): ``fail(rpc, code, times, message, retry_delay, reason, match)`` aborts the next calls
(whose request contains ``match``, if given) with that status, carrying AIP-193 ``RetryInfo`` /
``ErrorInfo`` details as the real service does; ``stick_next_creates(n)`` leaves new sandboxes in
CREATING; ``vanish(id)`` removes a sandbox (NOT_FOUND from then on). File-system snapshots:
``coreweave_fake_snapshots`` (``snapshot_store``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field

import grpc
from coreweave_fake_snapshots import SnapshotRpcs, Snapshots, restore
from cwsandbox._proto import sandbox_pb2, sandbox_pb2_grpc
from google.protobuf import any_pb2, duration_pb2, timestamp_pb2
from google.rpc import error_details_pb2, status_pb2

from trl_sandbox.remote.fake_container import FakeContainer, FileError

API_KEY = "test-key"
DOMAIN = "cwsandbox.com"
S = sandbox_pb2


@dataclass
class FakeSandbox:
    id: str
    spec: sandbox_pb2.SandboxSpec
    state: int = S.STATE_RUNNING
    created: float = field(default_factory=time.time)
    procs: set = field(default_factory=set)
    box: FakeContainer | None = None  # the sandbox's container on this host

    @property
    def tags(self) -> list[str]:
        return list(self.spec.tags)

    @property
    def container(self) -> sandbox_pb2.Container:
        return self.spec.containers[0]


@dataclass
class Fault:
    code: grpc.StatusCode
    times: int
    message: str
    retry_delay: float | None = None
    reason: str | None = None
    match: bytes | None = None


def _timestamp(seconds: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def _details(code: grpc.StatusCode, message: str, retry_delay: float | None, reason: str | None) -> tuple:
    """``grpc-status-details-bin`` trailing metadata: a google.rpc.Status with RetryInfo/ErrorInfo."""
    if retry_delay is None and reason is None:
        return ()
    status = status_pb2.Status(code=code.value[0], message=message)
    if reason is not None:
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN))
        status.details.append(detail)
    if retry_delay is not None:
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(int(retry_delay * 1e9))
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        status.details.append(detail)
    return (("grpc-status-details-bin", status.SerializeToString()),)


def _killpg(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class FakeCoreWeave:
    def __init__(self, page_size: int = 2) -> None:
        self.page_size = page_size
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.deleted: list[str] = []
        self.calls: list[tuple[str, str | None]] = []
        self.exec_commands: dict[str, list[list[str]]] = {}
        self.faults: dict[str, list[Fault]] = {}
        self.stuck_creates = 0
        self.snapshot_store = Snapshots()
        self.created_tags: list[list[str]] = []
        self._chaos: tuple[random.Random, float, float] | None = None
        self.kill_on_cancel = True  # False: a command outlives its cancelled RPC (tests the in-sandbox kill)
        self.spawned: list = []  # every process started, killed at stop()
        self.lock = threading.Lock()
        self._ids = itertools.count(1)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-coreweave", daemon=True)
        self._server: grpc.aio.Server | None = None
        self.port = 0

    # -- control ---------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeCoreWeave:
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(10)
        return self

    async def _serve(self) -> int:
        self._server = grpc.aio.server()
        sandbox_pb2_grpc.add_SandboxServiceServicer_to_server(_Servicer(self), self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        return port

    def stop(self) -> None:
        if not self._loop.is_running():
            return
        with self.lock:
            for proc in self.spawned:
                if proc.returncode is None:
                    _killpg(proc)
            for sandbox in self.sandboxes.values():
                if sandbox.box is not None:
                    sandbox.box.kill()
        if self._server is not None:
            asyncio.run_coroutine_threadsafe(self._server.stop(None), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def fail(self, rpc: str, code: grpc.StatusCode, times: int = 1, message: str = "", *,
             retry_delay: float | None = None, reason: str | None = None, match: str | None = None) -> None:
        with self.lock:
            self.faults.setdefault(rpc, []).append(
                Fault(code, times, message or f"injected {code.name}", retry_delay, reason,
                      match.encode() if match else None)
            )

    def chaos(self, seed: int | None, transient: float = 0.2, vanish: float = 0.05) -> None:
        """Seeded random faults like a busy real service's: each create and exec fails with
        probability ``transient`` (UNAVAILABLE, INTERNAL, RESOURCE_EXHAUSTED) and each exec finds
        its sandbox reclaimed with probability ``vanish``. ``chaos(None)`` turns them off."""
        with self.lock:
            self._chaos = None if seed is None else (random.Random(seed), transient, vanish)

    def roll(self, rpc: str) -> str | None:
        with self.lock:
            if self._chaos is None or rpc not in ("create", "exec"):
                return None
            rng, transient, vanish = self._chaos
            draw = rng.random()
            if draw < transient:
                return rng.choice(["UNAVAILABLE", "INTERNAL", "RESOURCE_EXHAUSTED"])
            if rpc == "exec" and draw < transient + vanish:
                return "vanish"
            return None

    def stick_next_creates(self, n: int = 1) -> None:
        with self.lock:
            self.stuck_creates += n

    def vanish(self, sandbox_id: str) -> None:
        with self.lock:
            sandbox = self.sandboxes.pop(sandbox_id)
            for proc in list(sandbox.procs):
                _killpg(proc)
            sandbox.box.kill()

    def live(self) -> list[str]:
        with self.lock:
            return [s.id for s in self.sandboxes.values() if s.state in (S.STATE_RUNNING, S.STATE_CREATING)]

    def count(self, rpc: str) -> int:
        with self.lock:
            return sum(1 for r, _ in self.calls if r == rpc)

    # -- helpers for the servicer ----------------------------------------------------------------

    def message(self, sandbox: FakeSandbox) -> sandbox_pb2.Sandbox:
        status = sandbox_pb2.SandboxStatus(state=sandbox.state, create_time=_timestamp(sandbox.created))
        if sandbox.state != S.STATE_CREATING:
            status.start_time.CopyFrom(_timestamp(sandbox.created))
        return sandbox_pb2.Sandbox(sandbox_id=sandbox.id, spec=sandbox.spec, status=status)


class _Servicer(SnapshotRpcs, sandbox_pb2_grpc.SandboxServiceServicer):
    def __init__(self, fake: FakeCoreWeave) -> None:
        self.fake = fake

    async def _enter(self, rpc: str, context, request=None, sandbox_id: str | None = None) -> None:
        """Record the call, check the credentials, inject faults."""
        fake = self.fake
        with fake.lock:
            fake.calls.append((rpc, sandbox_id))
        metadata = dict(context.invocation_metadata() or ())
        if metadata.get("authorization") != f"Bearer {API_KEY}":
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "invalid API key")
        body = request.SerializeToString() if request is not None else b""
        with fake.lock:
            fault = next((f for f in fake.faults.get(rpc, []) if f.match is None or f.match in body), None)
            if fault is not None:
                fault.times -= 1
                if fault.times <= 0:
                    fake.faults[rpc].remove(fault)
        if fault is not None:
            await context.abort(fault.code, fault.message,
                                _details(fault.code, fault.message, fault.retry_delay, fault.reason))
        chaos = fake.roll(rpc)
        if chaos == "vanish":
            with contextlib.suppress(KeyError):
                fake.vanish(sandbox_id or "")
        elif chaos is not None:
            code = getattr(grpc.StatusCode, chaos)
            await context.abort(code, f"chaos: injected {chaos}", _details(code, "chaos", None, None))

    async def _sandbox(self, context, sandbox_id: str, *, running: bool = False) -> FakeSandbox:
        with self.fake.lock:
            sandbox = self.fake.sandboxes.get(sandbox_id)
        if sandbox is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"sandbox {sandbox_id} not found",
                                _details(grpc.StatusCode.NOT_FOUND, "not found", None, "CWSANDBOX_SANDBOX_NOT_FOUND"))
        if running and sandbox.state != S.STATE_RUNNING:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"sandbox {sandbox_id} is not running")
        return sandbox

    # -- control plane ---------------------------------------------------------------------------

    async def CreateSandbox(self, request, context):
        await self._enter("create", context, request)
        fake = self.fake
        container = await asyncio.get_running_loop().run_in_executor(None, FakeContainer)
        await restore(fake.snapshot_store, request.sandbox.spec, container, context)
        with fake.lock:
            sandbox = FakeSandbox(f"cw-{next(fake._ids)}-{uuid.uuid4().hex[:6]}", request.sandbox.spec,
                                  box=container)
            if fake.stuck_creates > 0:
                fake.stuck_creates -= 1
                sandbox.state = S.STATE_CREATING
            fake.sandboxes[sandbox.id] = sandbox
            fake.created_tags.append(list(request.sandbox.spec.tags))
        return fake.message(sandbox)

    async def GetSandbox(self, request, context):
        await self._enter("get", context, request, request.sandbox_id)
        return self.fake.message(await self._sandbox(context, request.sandbox_id))

    async def ListSandboxes(self, request, context):
        await self._enter("list", context, request)
        fake = self.fake
        wanted = set(request.tags)
        with fake.lock:
            matching = [s for s in fake.sandboxes.values()
                        if wanted <= set(s.tags) and (request.show_terminated or s.state in (S.STATE_RUNNING, S.STATE_CREATING))]
        start = int(request.page_token or 0)
        size = request.page_size or fake.page_size
        page = matching[start:start + size]
        following = str(start + size) if start + size < len(matching) else ""
        return sandbox_pb2.ListSandboxesResponse(sandboxes=[fake.message(s) for s in page], next_page_token=following)

    async def DeleteSandbox(self, request, context):
        await self._enter("delete", context, request, request.sandbox_id)
        fake = self.fake
        with fake.lock:
            sandbox = fake.sandboxes.get(request.sandbox_id)
        if sandbox is None and request.allow_missing:
            return sandbox_pb2.DeleteSandboxResponse()
        sandbox = await self._sandbox(context, request.sandbox_id)
        with fake.lock:
            if sandbox.state != S.STATE_COMPLETED:
                sandbox.state = S.STATE_COMPLETED
                fake.deleted.append(sandbox.id)
            for proc in list(sandbox.procs):
                _killpg(proc)
            sandbox.box.kill()
        return sandbox_pb2.DeleteSandboxResponse(sandbox=fake.message(sandbox))

    # -- data plane ------------------------------------------------------------------------------

    async def StreamExec(self, request_iterator, context):
        first = await request_iterator.__anext__()
        init = first.init
        await self._enter("exec", context, first, init.sandbox_id)
        sandbox = await self._sandbox(context, init.sandbox_id, running=True)
        # ``python3`` is this interpreter, as if it were the image's.
        env = {**sandbox.box.env, **dict(sandbox.container.environment_variables)}
        with self.fake.lock:
            self.fake.exec_commands.setdefault(sandbox.id, []).append(list(init.command))
        try:
            proc = await asyncio.create_subprocess_exec(
                *sandbox.box.argv(list(init.command)), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True)
        except OSError as exc:
            yield sandbox_pb2.ExecStreamResponse(error=sandbox_pb2.ExecStreamError(message=str(exc), code="EXEC_FAILED"))
            return
        with self.fake.lock:
            sandbox.procs.add(proc)
            self.fake.spawned.append(proc)
        queue: asyncio.Queue = asyncio.Queue()

        async def pump_stdin() -> None:
            try:
                async for request in request_iterator:
                    if request.HasField("close"):
                        break
                    if request.stdin:
                        proc.stdin.write(request.stdin)
                        await proc.stdin.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                try:
                    proc.stdin.close()
                except Exception:
                    pass

        async def pump(stream, which) -> None:
            while chunk := await stream.read(65536):
                await queue.put(sandbox_pb2.ExecStreamResponse(
                    output=sandbox_pb2.ExecStreamOutput(stream=which, data=chunk)))

        feeder = asyncio.ensure_future(pump_stdin())
        readers = asyncio.ensure_future(asyncio.gather(
            pump(proc.stdout, sandbox_pb2.ExecStreamOutput.STREAM_STDOUT),
            pump(proc.stderr, sandbox_pb2.ExecStreamOutput.STREAM_STDERR)))

        def finished(future: asyncio.Future) -> None:
            if not future.cancelled():
                future.exception()  # retrieved: a cancelled reader is not an error
            queue.put_nowait(None)

        readers.add_done_callback(finished)
        try:
            yield sandbox_pb2.ExecStreamResponse(ready=sandbox_pb2.ExecStreamReady(ready_time=_timestamp(time.time())))
            while (item := await queue.get()) is not None:
                yield item
            code = await proc.wait()
            if self.fake.sandboxes.get(sandbox.id) is not sandbox or sandbox.state != S.STATE_RUNNING:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"sandbox {sandbox.id} went away")
            yield sandbox_pb2.ExecStreamResponse(exit=sandbox_pb2.ExecStreamExit(exit_code=code))
        finally:
            if proc.returncode is None and self.fake.kill_on_cancel:
                _killpg(proc)  # the RPC ended first (deadline, cancellation): the command goes too
            feeder.cancel()
            readers.cancel()
            with self.fake.lock:
                sandbox.procs.discard(proc)

    async def WriteFile(self, request, context):
        await self._enter("write", context, request, request.sandbox_id)
        sandbox = await self._sandbox(context, request.sandbox_id, running=True)
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, sandbox.box.write, request.path, bytes(request.content))
        except FileError as exc:
            reason = "CWSANDBOX_FILE_NOT_FOUND" if exc.errno == 2 else "CWSANDBOX_FILE_IO_FAILED"
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc),
                                _details(grpc.StatusCode.FAILED_PRECONDITION, str(exc), None, reason))
        return sandbox_pb2.WriteFileResponse()

    async def ReadFile(self, request, context):
        await self._enter("read", context, request, request.sandbox_id)
        sandbox = await self._sandbox(context, request.sandbox_id, running=True)
        try:
            content = await asyncio.get_running_loop().run_in_executor(None, sandbox.box.read, request.path)
            return sandbox_pb2.ReadFileResponse(content=content)
        except FileError as exc:
            reason = "CWSANDBOX_FILE_NOT_FOUND" if exc.errno == 2 else "CWSANDBOX_FILE_IO_FAILED"
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc),
                                _details(grpc.StatusCode.NOT_FOUND, str(exc), None, reason))

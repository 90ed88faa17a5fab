"""The fake's exec data plane: ``/modal.task_command_router.TaskCommandRouter/*`` on the servicer
base the wheel ships, served by the same grpclib server as the control plane (the router URL the
fake hands out is its own).

``TaskExecStart`` starts the argv inside the sandbox's container (``nsenter``, as a worker's
runtime enters the task), with the sandbox's and the exec's environment and ``workdir``; its
``timeout_secs`` kills the command's process group then, as Modal's worker does (what the command
detached lives on in the sandbox, as it would there). Output is kept whole and served from any byte
offset (``TaskExecStdioRead`` streams until the pipe's end), stdin is written at its offset
(duplicates from a retried write are dropped), ``TaskExecWait``/``TaskExecPoll`` give the exit code
or the signal. A task whose sandbox is gone answers NOT_FOUND, as Modal's router does.
``TaskSnapshotFilesystem`` records the container's ``/var/tmp`` as a new image (a test may spoil
the next one: ``ghost`` is reported made but never there, ``pending`` never returns, ``boot404``
exists but a create from it answers NOT_FOUND).
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from typing import Any

from grpclib import GRPCError, Status
from modal_proto import task_command_router_pb2 as sr
from modal_proto.task_command_router_grpc import TaskCommandRouterBase

from .state import Dropped, Exec, Sandbox, State, grpc_error, kill_group
from .stubs import complete

CHUNK = 1 << 20


class _Router(TaskCommandRouterBase):
    def __init__(self, state: State) -> None:
        self.state = state

    async def _request(self, stream: Any, rpc: str) -> Any:
        request = await stream.recv_message()
        if not (stream.metadata or {}).get("authorization", "").startswith("Bearer "):
            raise GRPCError(Status.UNAUTHENTICATED, "missing router token")
        fault = self.state.take_fault(rpc, request)
        if fault is not None:
            raise grpc_error(fault.status, fault.message, fault.retry_after)
        await self.state.delay(rpc)
        chaos = self.state.roll(rpc)
        if chaos == "drop":
            await stream.cancel()
            raise Dropped
        if chaos == "vanish":
            with self.state.lock:
                sandbox = self.state.by_task.get(request.task_id)
            if sandbox is not None:
                await asyncio.get_running_loop().run_in_executor(None, self.state.end, sandbox, 3, True)
        elif chaos == "RESOURCE_EXHAUSTED":
            raise grpc_error(Status.RESOURCE_EXHAUSTED, "too many concurrent execs", 0.2)
        elif chaos is not None:
            raise GRPCError(Status[chaos], f"chaos: injected {chaos}")
        return request

    def _exec(self, request: Any) -> tuple[Sandbox, Exec]:
        sandbox = self.state.task(request.task_id)
        run = sandbox.execs.get(request.exec_id)
        if run is None:
            raise GRPCError(Status.NOT_FOUND, f"Exec {request.exec_id} not found")
        return sandbox, run

    async def TaskExecStart(self, stream: Any) -> None:
        request = await self._request(stream, "TaskExecStart")
        sandbox = self.state.task(request.task_id)
        if request.exec_id in sandbox.execs:  # a retried start (idempotent by exec id)
            await stream.send_message(sr.TaskExecStartResponse())
            return
        env = dict(sandbox.container.env)
        env.update(sandbox.env)
        for source in request.secret_sources:
            env.update(dict(source.env.contents))
        env.update(dict(request.env))
        argv = list(request.command_args)
        with self.state.lock:
            self.state.exec_argv.append(argv)
        argv = [sandbox.container.python if a == "python3" and i == 0 else a for i, a in enumerate(argv)]
        cwd = request.workdir or sandbox.definition.workdir or "/"
        proc = await asyncio.create_subprocess_exec(
            *sandbox.container.argv(argv, cwd), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=env, start_new_session=True)
        run = Exec(proc)
        self.state.procs.append(proc)
        sandbox.execs[request.exec_id] = run
        if request.timeout_secs:
            run.timer = asyncio.get_running_loop().call_later(request.timeout_secs, kill_group, proc)
        for fd, pipe in ((1, proc.stdout), (2, proc.stderr)):
            asyncio.ensure_future(self._pump(run, fd, pipe))
        await stream.send_message(sr.TaskExecStartResponse())

    async def _pump(self, run: Exec, fd: int, pipe: asyncio.StreamReader) -> None:
        buffer = run.out if fd == 1 else run.err
        while True:
            data = await pipe.read(CHUNK)
            if not data:
                break
            buffer += data
            run.notify()
        run.closed[fd] = True
        run.notify()

    async def TaskExecStdioRead(self, stream: Any) -> None:
        request = await self._request(stream, "TaskExecStdioRead")
        _, run = self._exec(request)
        fd = 1 if request.file_descriptor == sr.TASK_EXEC_STDIO_FILE_DESCRIPTOR_STDOUT else 2
        buffer = run.out if fd == 1 else run.err
        offset = request.offset
        while True:
            changed = run.changed
            if offset < len(buffer):
                data = bytes(buffer[offset:offset + CHUNK])
                offset += len(data)
                await stream.send_message(sr.TaskExecStdioReadResponse(data=data))
                continue
            if run.closed[fd]:
                return
            await changed.wait()

    async def TaskExecStdinWrite(self, stream: Any) -> None:
        request = await self._request(stream, "TaskExecStdinWrite")
        _, run = self._exec(request)
        data = request.data[max(0, run.stdin_written - request.offset):] if request.offset <= run.stdin_written else b""
        pipe = run.proc.stdin
        try:
            if data and not run.stdin_closed:
                pipe.write(data)
                run.stdin_written += len(data)
                await pipe.drain()
            if request.eof and not run.stdin_closed:
                run.stdin_closed = True
                pipe.close()
        except (BrokenPipeError, ConnectionResetError):  # the command exited without reading it all
            run.stdin_closed = True
        await stream.send_message(sr.TaskExecStdinWriteResponse())

    async def TaskExecStdinStatus(self, stream: Any) -> None:
        request = await self._request(stream, "TaskExecStdinStatus")
        _, run = self._exec(request)
        await stream.send_message(sr.TaskExecStdinStatusResponse(num_bytes_written=run.stdin_written,
                                                                 closed=run.stdin_closed))

    def _status(self, run: Exec) -> dict[str, int]:
        code = run.proc.returncode
        if code is None:
            return {}
        return {"signal": -code} if code < 0 else {"code": code}

    async def TaskExecWait(self, stream: Any) -> None:
        request = await self._request(stream, "TaskExecWait")
        sandbox, run = self._exec(request)
        waiter = asyncio.ensure_future(run.proc.wait())
        ended = asyncio.ensure_future(sandbox.ended.wait())
        try:
            await asyncio.wait({waiter, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
        if not sandbox.running:
            waiter.cancel()
            raise GRPCError(Status.NOT_FOUND, f"Task {request.task_id} not found")
        if run.timer is not None:
            run.timer.cancel()
        await stream.send_message(sr.TaskExecWaitResponse(**self._status(run)))

    async def TaskExecPoll(self, stream: Any) -> None:
        request = await self._request(stream, "TaskExecPoll")
        _, run = self._exec(request)
        await stream.send_message(sr.TaskExecPollResponse(**self._status(run)))

    async def TaskSnapshotFilesystem(self, stream: Any) -> None:
        request = await self._request(stream, "TaskSnapshotFilesystem")
        sandbox = self.state.task(request.task_id)
        container = sandbox.container

        def tar() -> bytes:
            return subprocess.run(container.argv(["tar", "-C", "/var/tmp", "-cf", "-", "."]), env=container.env,
                                  capture_output=True, check=True, timeout=120).stdout

        with self.state.lock:
            fault = self.state.snapshot_faults.pop(0) if self.state.snapshot_faults else None
        if fault == "pending":  # accepted, then never returns: the client's deadline ends the call
            with self.state.lock:
                self.state.snapshots_made += 1
            await asyncio.sleep(3600)
        data = await asyncio.get_running_loop().run_in_executor(None, tar)
        image_id = f"im-snap{uuid.uuid4().hex[:12]}"
        with self.state.lock:
            self.state.snapshots_made += 1
            if fault != "ghost":  # a ghost: reported made, never there
                self.state.snapshots[image_id] = data
            if fault == "boot404":
                self.state.boot404.add(image_id)
        await stream.send_message(sr.TaskSnapshotFilesystemResponse(image_id=image_id))


Router = complete(_Router)

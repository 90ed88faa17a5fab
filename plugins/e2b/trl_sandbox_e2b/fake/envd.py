"""The fake sandbox's envd: the ``process.Process`` Connect service, ``/files`` and ``/health``.

The protocol is not ours: ``ProcessWSGIApplication`` (generated, shipped inside the ``e2b`` wheel)
and ``connectrpc``'s server runtime parse requests and frame the JSON stream, with the SDK's own
JSON codec. This module only implements the service, the way envd behaves:

* ``Start`` runs ``cmd args`` (the SDK sends ``/bin/bash -l -c CMD``) inside the sandbox's
  container (``trl_sandbox.remote.fake_container``) with the sandbox's and the request's env and
  ``cwd``; events in order: ``start{pid}``, ``data{stdout|stderr}`` as output arrives, ``end``.
* At the request's deadline (``Connect-Timeout-Ms``) envd ends the command's main process (its
  process group) and the stream; what the command started in a session of its own keeps running,
  as on the real service (e2b-dev/E2B#1031): ending a program's whole tree is the client's job.
* ``SendInput``/``CloseStdin``/``SendSignal``/``List`` act on a process by pid.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.process import process_pb
from protobuf import Oneof

ProcessEvent = process_pb.ProcessEvent


@dataclass
class FakeProcess:
    """One command envd started."""

    pid: int
    popen: subprocess.Popen
    config: Any
    tag: str | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        """The command's main process and whatever stayed in its process group."""
        try:
            os.killpg(self.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _event(**kind: Any) -> process_pb.StartResponse:
    (name, value), = kind.items()
    return process_pb.StartResponse(event=ProcessEvent(event=Oneof(name, value)))


def _pump(stream: Any, name: str, out: queue.Queue) -> None:
    try:
        while True:
            chunk = os.read(stream.fileno(), 65536)
            if not chunk:
                break
            out.put((name, chunk))
    except OSError:
        pass
    finally:
        out.put((name, None))


class ProcessService:
    """``process.Process`` (sync flavour) for one fake E2B service; sandboxes come from ``fake``."""

    def __init__(self, fake: Any) -> None:
        self.fake = fake

    def _sandbox(self, ctx: Any) -> Any:
        sandbox_id = ctx.request_headers.get("e2b-sandbox-id") or ""
        sandbox = self.fake.running(sandbox_id)
        if sandbox is None:  # the proxy answers this before envd is reached; kept as a backstop
            raise ConnectError(Code.UNAVAILABLE, f"sandbox {sandbox_id} was not found")
        return sandbox

    def _process(self, ctx: Any, selector: Any) -> FakeProcess:
        sandbox = self._sandbox(ctx)
        chosen = getattr(selector, "selector", None)
        with self.fake.lock:
            for proc in sandbox.procs.values():
                if chosen is not None and ((chosen.field == "pid" and proc.pid == chosen.value)
                                           or (chosen.field == "tag" and proc.tag == chosen.value)):
                    return proc
        raise ConnectError(Code.NOT_FOUND, f"process with {getattr(chosen, 'field', '?')} "
                                           f"{getattr(chosen, 'value', '?')} not found")

    def start(self, request: Any, ctx: Any) -> Iterator[process_pb.StartResponse]:
        sandbox = self._sandbox(ctx)
        config = request.process
        container = sandbox.container
        env = {**container.env, **sandbox.envs, **dict(config.envs or {})}
        cwd = config.cwd or "/"
        if not container.isdir(cwd):
            raise ConnectError(Code.INVALID_ARGUMENT, f"cwd '{cwd}' does not exist")
        popen = subprocess.Popen(container.argv([config.cmd, *config.args], cwd), env=env,
                                 stdin=subprocess.PIPE if request.stdin else subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        with self.fake.lock:
            pid = sandbox.next_pid = sandbox.next_pid + 1
            proc = FakeProcess(pid, popen, config, request.tag or None)
            sandbox.procs[pid] = proc
            self.fake.spawned.append(popen)
        timeout_ms = ctx.timeout_ms
        deadline = None if not timeout_ms else time.monotonic() + timeout_ms / 1000
        return self._events(sandbox, proc, deadline)

    def _events(self, sandbox: Any, proc: FakeProcess, deadline: float | None) -> Iterator[process_pb.StartResponse]:
        out: queue.Queue = queue.Queue()
        for name, stream in (("stdout", proc.popen.stdout), ("stderr", proc.popen.stderr)):
            threading.Thread(target=_pump, args=(stream, name, out), daemon=True).start()
        try:
            yield _event(start=ProcessEvent.StartEvent(pid=proc.pid))
            open_streams = 2
            while open_streams:
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    proc.kill_group()  # envd ends the command's main process; setsid'd children live on
                    raise ConnectError(Code.DEADLINE_EXCEEDED, "command deadline exceeded")
                try:
                    name, chunk = out.get(timeout=min(wait, 0.5) if wait is not None else 0.5)
                except queue.Empty:
                    if sandbox.gone:
                        raise ConnectError(Code.UNAVAILABLE, f"the connection to sandbox {sandbox.id} ended "
                                           "before the stream completed") from None
                    continue
                if chunk is None:
                    open_streams -= 1
                    continue
                yield _event(data=ProcessEvent.DataEvent(output=Oneof(name, chunk)))
            while True:  # both streams closed: the main process is ending (or closed them early)
                try:
                    code = proc.popen.wait(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    if deadline is not None and time.monotonic() >= deadline:
                        proc.kill_group()
                        raise ConnectError(Code.DEADLINE_EXCEEDED, "command deadline exceeded") from None
            if sandbox.gone:
                raise ConnectError(Code.UNAVAILABLE, f"the connection to sandbox {sandbox.id} ended before "
                                   "the stream completed")
            status = f"exit status {code}" if code >= 0 else f"signal: {signal.Signals(-code).name.lower()}"
            yield _event(end=ProcessEvent.EndEvent(exit_code=code if code >= 0 else -1, exited=code >= 0,
                                                   status=status))
        finally:
            proc.done.set()
            with self.fake.lock:
                sandbox.procs.pop(proc.pid, None)
            for stream in (proc.popen.stdin, proc.popen.stdout, proc.popen.stderr):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:
                        pass

    def send_input(self, request: Any, ctx: Any) -> process_pb.SendInputResponse:
        proc = self._process(ctx, request.process)
        data = request.input.input.value if request.input and request.input.input else b""
        try:
            proc.popen.stdin.write(data)
            proc.popen.stdin.flush()
        except (AttributeError, OSError, ValueError) as exc:
            raise ConnectError(Code.FAILED_PRECONDITION, f"cannot write to the process's stdin: {exc}") from exc
        return process_pb.SendInputResponse()

    def close_stdin(self, request: Any, ctx: Any) -> process_pb.CloseStdinResponse:
        proc = self._process(ctx, request.process)
        try:
            proc.popen.stdin.close()
        except (AttributeError, OSError):
            pass
        return process_pb.CloseStdinResponse()

    def send_signal(self, request: Any, ctx: Any) -> process_pb.SendSignalResponse:
        proc = self._process(ctx, request.process)
        sig = signal.SIGKILL if request.signal == process_pb.Signal.SIGKILL else signal.SIGTERM
        proc.kill_group(sig)
        return process_pb.SendSignalResponse()

    def list(self, request: Any, ctx: Any) -> process_pb.ListResponse:
        sandbox = self._sandbox(ctx)
        with self.fake.lock:
            procs = [process_pb.ProcessInfo(config=p.config, pid=p.pid, tag=p.tag) for p in sandbox.procs.values()]
        return process_pb.ListResponse(processes=procs)

    def connect(self, request: Any, ctx: Any) -> Iterator[Any]:
        raise ConnectError(Code.UNIMPLEMENTED, "the fake does not reattach to a process")

    def update(self, request: Any, ctx: Any) -> Any:
        raise ConnectError(Code.UNIMPLEMENTED, "the fake has no PTY")

    def stream_input(self, request: Any, ctx: Any) -> Any:
        raise ConnectError(Code.UNIMPLEMENTED, "use SendInput")


def make_app(fake: Any) -> Any:
    """The generated WSGI application serving ``ProcessService`` with the SDK's JSON codec."""
    from e2b.envd.client_shared import ENVD_JSON_CODEC
    from e2b.envd.process.process_connect import ProcessWSGIApplication

    return ProcessWSGIApplication(ProcessService(fake), codecs=[ENVD_JSON_CODEC])

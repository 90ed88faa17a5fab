"""The fake's control plane: ``/modal.client.ModalClient/*`` on the servicer base the wheel ships.

Only the RPCs a sandbox's life needs are real: hello and auth token, app and environment lookup,
image get-or-create (a recorded Dockerfile; every sandbox runs this host's Python in a container of
its own whatever the image says), the V2 sandbox calls (create, wait, terminate, list by app and
tags, tags, task id, command router access). Each checks the client's credentials and first takes
an injected fault or the chaos's draw, as a busy service would answer.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from typing import Any

from google.protobuf import empty_pb2
from grpclib import GRPCError, Status
from modal_proto import api_pb2
from modal_proto.api_grpc import ModalClientBase

from trl_sandbox.remote.fake_container import FakeContainer

from .state import IMAGE_BUILDER_VERSION, Dropped, Sandbox, State, grpc_error
from .stubs import complete

TOKEN_ID = "ak-fake"
TOKEN_SECRET = "as-fake"
LIST_PAGE = 2  # small, so that a listing of a few sandboxes takes several pages
_RESULT = api_pb2.GenericResult


def jwt(seconds: float = 3600) -> str:
    """A JWT-shaped token whose ``exp`` the SDK decodes (it never verifies the signature)."""
    def part(obj: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")
    return f"{part({'alg': 'none'})}.{part({'exp': int(time.time() + seconds), 'sub': 'fake'})}.c2ln"


class _Api(ModalClientBase):
    def __init__(self, state: State) -> None:
        self.state = state

    async def _request(self, stream: Any, rpc: str) -> Any:
        """The request, after the credentials check and any fault injected for ``rpc``."""
        request = await stream.recv_message()
        metadata = stream.metadata or {}
        if metadata.get("x-modal-token-id") != TOKEN_ID or metadata.get("x-modal-token-secret") != TOKEN_SECRET:
            raise GRPCError(Status.UNAUTHENTICATED, "Token ID or secret is invalid")
        fault = self.state.take_fault(rpc, request)
        if fault is not None:
            raise grpc_error(fault.status, fault.message, fault.retry_after)
        if rpc != "SandboxCreateV2":  # a create's latency is its making: see there
            await self.state.delay(rpc)
        chaos = self.state.roll(rpc)
        if chaos == "drop":
            await stream.cancel()
            raise Dropped
        if chaos == "RESOURCE_EXHAUSTED":
            raise grpc_error(Status.RESOURCE_EXHAUSTED, "Sandbox creation rate limit (5/s) exceeded", 0.2)
        if chaos is not None:
            raise GRPCError(Status[chaos], f"chaos: injected {chaos}")
        return request

    def _sandbox(self, sandbox_id: str) -> Sandbox:
        with self.state.lock:
            sandbox = self.state.sandboxes.get(sandbox_id)
        if sandbox is None:
            raise GRPCError(Status.NOT_FOUND, f"Sandbox {sandbox_id} not found")
        return sandbox

    # -- session ---------------------------------------------------------------------------------

    async def ClientHello(self, stream: Any) -> None:
        await self._request(stream, "ClientHello")
        await stream.send_message(api_pb2.ClientHelloResponse())

    async def AuthTokenGet(self, stream: Any) -> None:
        await self._request(stream, "AuthTokenGet")
        await stream.send_message(api_pb2.AuthTokenGetResponse(token=jwt()))

    async def AppGetOrCreate(self, stream: Any) -> None:
        request = await self._request(stream, "AppGetOrCreate")
        with self.state.lock:
            app_id = self.state.apps.setdefault(request.app_name, f"ap-fake{uuid.uuid4().hex[:12]}")
        await stream.send_message(api_pb2.AppGetOrCreateResponse(app_id=app_id))

    async def EnvironmentGetOrCreate(self, stream: Any) -> None:
        await self._request(stream, "EnvironmentGetOrCreate")
        settings = api_pb2.EnvironmentSettings(image_builder_version=IMAGE_BUILDER_VERSION)
        await stream.send_message(api_pb2.EnvironmentGetOrCreateResponse(
            environment_id="en-fake", metadata=api_pb2.EnvironmentMetadata(name="main", settings=settings)))

    async def ImageGetOrCreate(self, stream: Any) -> None:
        request = await self._request(stream, "ImageGetOrCreate")
        commands = list(request.image.dockerfile_commands)
        image_id = f"im-fake{uuid.uuid4().hex[:12]}"
        with self.state.lock:
            self.state.images[image_id] = commands
        missing = [c for c in commands if c.startswith("FROM") and any(m in c for m in self.state.missing_images)]
        if missing:
            result = _RESULT(status=_RESULT.GENERIC_STATUS_FAILURE,
                             exception=f"{missing[0].split()[-1]}: manifest unknown (no such image in the registry)")
        else:
            result = _RESULT(status=_RESULT.GENERIC_STATUS_SUCCESS)
        await stream.send_message(api_pb2.ImageGetOrCreateResponse(
            image_id=image_id, result=result,
            metadata=api_pb2.ImageMetadata(image_builder_version=IMAGE_BUILDER_VERSION)))

    async def ImageFromId(self, stream: Any) -> None:
        request = await self._request(stream, "ImageFromId")
        with self.state.lock:
            known = request.image_id in self.state.images or request.image_id in self.state.snapshots
        if not known:
            raise GRPCError(Status.NOT_FOUND, f"Image {request.image_id} not found")
        await stream.send_message(api_pb2.ImageFromIdResponse(
            image_id=request.image_id, metadata=api_pb2.ImageMetadata(image_builder_version=IMAGE_BUILDER_VERSION)))

    # -- sandboxes -------------------------------------------------------------------------------

    async def SandboxCreateV2(self, stream: Any) -> None:
        request = await self._request(stream, "SandboxCreateV2")
        # Shielded: a client that gives up (its deadline cancels the call) does not stop the service
        # from making the sandbox, as on a real service; the sweep by tags must find it.
        sandbox = await asyncio.shield(self._make(request))
        access = api_pb2.CommandRouterAccess(url=self.state.router_url, jwt=jwt())
        await stream.send_message(api_pb2.SandboxCreateV2Response(
            sandbox_id=sandbox.id, task_id=sandbox.task_id, command_router_access=access,
            metadata=api_pb2.SandboxHandleMetadata(app_id=request.app_id)))

    async def _make(self, request: Any) -> Sandbox:
        definition = request.definition
        image_id = definition.image_id
        with self.state.lock:
            snapshot = self.state.snapshots.get(image_id)
            known = image_id in self.state.images or snapshot is not None
            known = known and image_id not in self.state.boot404
        if not known:
            raise GRPCError(Status.NOT_FOUND, f"Image {image_id} not found")
        loop = asyncio.get_running_loop()
        container = await loop.run_in_executor(None, FakeContainer)
        if snapshot:
            await loop.run_in_executor(None, _unpack, container, snapshot)
        sandbox_id, task_id = self.state.new_ids()
        tags = {t.tag_name: t.tag_value for t in request.tags}
        env: dict[str, str] = {}
        for source in request.secret_sources:
            env.update(dict(source.env.contents))
        sandbox = Sandbox(sandbox_id, task_id, request.app_id, tags, definition, container, env)
        self.state.add(sandbox)
        if self.state.stopped:
            self.state.end(sandbox, _RESULT.GENERIC_STATUS_TERMINATED)
        if definition.timeout_secs:  # the server-side lifetime: the sandbox ends then, whatever runs
            sandbox.timer = loop.call_later(definition.timeout_secs, self.state.end, sandbox,
                                            _RESULT.GENERIC_STATUS_TIMEOUT)
        # Listed (by its tags) from now on; the answer comes after the boot, however long the client waits.
        await self.state.delay("SandboxCreateV2")
        return sandbox

    def _result(self, sandbox: Sandbox) -> Any:
        return _RESULT(status=sandbox.result) if sandbox.result else _RESULT()

    async def SandboxWaitV2(self, stream: Any) -> None:
        request = await self._request(stream, "SandboxWaitV2")
        sandbox = self._sandbox(request.sandbox_id)
        if sandbox.running and request.timeout > 0:
            try:
                await asyncio.wait_for(sandbox.ended.wait(), min(request.timeout, 50))
            except asyncio.TimeoutError:
                pass
        await stream.send_message(api_pb2.SandboxWaitResponse(
            result=self._result(sandbox), metadata=api_pb2.SandboxHandleMetadata(app_id=sandbox.app_id)))

    async def SandboxTerminateV2(self, stream: Any) -> None:
        request = await self._request(stream, "SandboxTerminateV2")
        sandbox = self._sandbox(request.sandbox_id)
        await asyncio.get_running_loop().run_in_executor(None, self.state.end, sandbox,
                                                         _RESULT.GENERIC_STATUS_TERMINATED)
        await stream.send_message(api_pb2.SandboxTerminateResponse(existing_result=self._result(sandbox)))

    async def SandboxListV2(self, stream: Any) -> None:
        request = await self._request(stream, "SandboxListV2")
        wanted = {t.tag_name: t.tag_value for t in request.tags}
        before = request.before_timestamp or float("inf")
        with self.state.lock:
            matching = sorted((s for s in self.state.sandboxes.values()
                               if (request.include_finished or s.running) and s.created_at < before
                               and (not request.app_id or s.app_id == request.app_id)
                               and all(s.tags.get(k) == v for k, v in wanted.items())),
                              key=lambda s: -s.created_at)[:LIST_PAGE]
        infos = [api_pb2.SandboxInfo(
            id=s.id, created_at=s.created_at, app_id=s.app_id,
            tags=[api_pb2.SandboxTag(tag_name=k, tag_value=v) for k, v in s.tags.items()],
            task_info=api_pb2.TaskInfo(id=s.task_id, started_at=s.created_at, result=self._result(s)),
            metadata=api_pb2.SandboxHandleMetadata(app_id=s.app_id)) for s in matching]
        await stream.send_message(api_pb2.SandboxListResponse(sandboxes=infos))

    async def SandboxTagsGetV2(self, stream: Any) -> None:
        request = await self._request(stream, "SandboxTagsGetV2")
        sandbox = self._sandbox(request.sandbox_id)
        await stream.send_message(api_pb2.SandboxTagsGetResponse(
            tags=[api_pb2.SandboxTag(tag_name=k, tag_value=v) for k, v in sandbox.tags.items()]))

    async def SandboxTagsSetV2(self, stream: Any) -> None:
        request = await self._request(stream, "SandboxTagsSetV2")
        sandbox = self._sandbox(request.sandbox_id)
        with self.state.lock:
            sandbox.tags = {t.tag_name: t.tag_value for t in request.tags}
        await stream.send_message(empty_pb2.Empty())

    async def SandboxGetTaskIdV2(self, stream: Any) -> None:
        request = await self._request(stream, "SandboxGetTaskIdV2")
        sandbox = self._sandbox(request.sandbox_id)
        if not sandbox.running:
            await stream.send_message(api_pb2.SandboxGetTaskIdResponse(task_result=self._result(sandbox)))
            return
        await stream.send_message(api_pb2.SandboxGetTaskIdResponse(task_id=sandbox.task_id))

    async def SandboxGetCommandRouterAccess(self, stream: Any) -> None:
        request = await self._request(stream, "SandboxGetCommandRouterAccess")
        if request.sandbox_id:
            sandbox = self._sandbox(request.sandbox_id)
        else:
            sandbox = self.state.task(request.task_id)
        if not sandbox.running:
            raise GRPCError(Status.FAILED_PRECONDITION, "Sandbox already finished")
        await stream.send_message(api_pb2.SandboxGetCommandRouterAccessResponse(
            url=self.state.router_url, jwt=jwt()))


def _unpack(container: FakeContainer, data: bytes) -> None:
    import subprocess

    subprocess.run(container.argv(["tar", "-C", "/var/tmp", "-xf", "-"]), input=data, check=True,
                   env=container.env, capture_output=True, timeout=60)


Api = complete(_Api)

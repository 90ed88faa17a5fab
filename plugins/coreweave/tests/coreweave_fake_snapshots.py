"""The fake CoreWeave service's file-system snapshots (``CreateFileSystemSnapshot``,
``GetFileSystemSnapshot``, ``DeleteFileSystemSnapshot``, and a create that restores one).

A snapshot of a fake sandbox is a tarball of the directory its scratch volume is mounted at (the
container's own ``/var/tmp`` is a tmpfs: the "volume" is that directory), unpacked at the same
path in each sandbox created with ``restore_from_snapshot_id``. ``fault(kind)`` spoils the next
snapshot: ``"ghost"`` (an id comes back, but no snapshot exists), ``"pending"`` (it stays
``CREATING`` forever), ``"boot404"`` (it is ``READY`` but a create restoring it answers NOT_FOUND).
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import uuid
from dataclasses import dataclass

import grpc
from cwsandbox._proto import sandbox_pb2

S = sandbox_pb2


@dataclass
class FakeSnapshot:
    id: str
    source: str
    data: bytes
    state: int = S.SNAPSHOT_STATE_READY
    boot404: bool = False


class Snapshots:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.live: dict[str, FakeSnapshot] = {}
        self.faults: list[str] = []
        self.made = 0  # every snapshot call that answered with an id, ghosts included

    def fault(self, kind: str, times: int = 1) -> None:
        assert kind in ("ghost", "pending", "boot404")
        with self.lock:
            self.faults.extend([kind] * times)

    def drop_all(self) -> None:
        with self.lock:
            self.live.clear()

    def message(self, snap: FakeSnapshot) -> sandbox_pb2.FileSystemSnapshot:
        return S.FileSystemSnapshot(file_system_snapshot_id=snap.id, state=snap.state, size_bytes=len(snap.data),
                                    source_sandbox_id=snap.source)


def mount_path(spec: sandbox_pb2.SandboxSpec) -> tuple[str | None, str | None]:
    """(the scratch volume's mount path, the snapshot it restores) of a create request's spec."""
    restore = {v.name: v.scratch.restore_from_snapshot_id for v in spec.volumes if v.HasField("scratch")}
    for mount in spec.containers[0].volume_mounts if spec.containers else ():
        if mount.volume in restore:
            return mount.mount_path, restore[mount.volume] or None
    return None, None


async def restore(store: Snapshots, spec, box, context) -> None:
    """Before a create: NOT_FOUND for a snapshot that is missing or spoiled; else unpack it."""
    path, ident = mount_path(spec)
    if path is None:
        return
    await asyncio.get_running_loop().run_in_executor(None, lambda: subprocess.run(
        box.argv(["mkdir", "-p", path]), env=box.env, check=True, capture_output=True, timeout=30))
    if ident is None:
        return
    with store.lock:
        snap = store.live.get(ident)
    if snap is None or snap.boot404 or snap.state != S.SNAPSHOT_STATE_READY:
        box.kill()
        await context.abort(grpc.StatusCode.NOT_FOUND, f"file system snapshot {ident} not found")
    await asyncio.get_running_loop().run_in_executor(None, lambda: subprocess.run(
        box.argv(["tar", "-C", path, "-xf", "-"]), input=snap.data, env=box.env, check=True,
        capture_output=True, timeout=60))


class SnapshotRpcs:
    """Mixed into the fake's servicer (which has ``fake``, ``_enter`` and ``_sandbox``)."""

    async def CreateFileSystemSnapshot(self, request, context):
        await self._enter("snapshot_create", context, request, request.sandbox_id)
        sandbox = await self._sandbox(context, request.sandbox_id, running=True)
        store = self.fake.snapshot_store
        path, _ = mount_path(sandbox.spec)
        if path is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the sandbox has no file system snapshot mount")
        box = sandbox.box
        data = (await asyncio.get_running_loop().run_in_executor(None, lambda: subprocess.run(
            box.argv(["tar", "-C", path, "-cf", "-", "."]), env=box.env, capture_output=True, check=True,
            timeout=60))).stdout
        with store.lock:
            fault = store.faults.pop(0) if store.faults else None
            store.made += 1
            snap = FakeSnapshot(f"fss-{uuid.uuid4().hex[:10]}", sandbox.id, data)
            snap.state = S.SNAPSHOT_STATE_CREATING if fault == "pending" else S.SNAPSHOT_STATE_READY
            snap.boot404 = fault == "boot404"
            if fault != "ghost":
                store.live[snap.id] = snap
        return store.message(snap)

    async def GetFileSystemSnapshot(self, request, context):
        await self._enter("snapshot_get", context, request)
        store = self.fake.snapshot_store
        with store.lock:
            snap = store.live.get(request.file_system_snapshot_id)
        if snap is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"file system snapshot {request.file_system_snapshot_id} "
                                "not found")
        return store.message(snap)

    async def DeleteFileSystemSnapshot(self, request, context):
        await self._enter("snapshot_delete", context, request)
        store = self.fake.snapshot_store
        with store.lock:
            snap = store.live.pop(request.file_system_snapshot_id, None)
        if snap is None:
            if request.allow_missing:
                return S.FileSystemSnapshot(file_system_snapshot_id=request.file_system_snapshot_id)
            await context.abort(grpc.StatusCode.NOT_FOUND, "not found")
        snap.state = S.SNAPSHOT_STATE_DELETING
        return store.message(snap)

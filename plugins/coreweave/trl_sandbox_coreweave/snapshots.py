"""Prepared environments on CoreWeave: one file-system snapshot per key
(``trl_sandbox.remote.environment``).

The build sandbox is created with a scratch volume at the pristine tree's directory
(``FileSystemSnapshotOptions(mount_path=ENV_ROOT, size=...)``); ``sb.snapshot()``
(``CreateFileSystemSnapshot``) captures that directory and gives its id, ready when
``Sandbox.get_snapshot(id)`` says ``READY``. An id the service does not know (the call reported
success), one still ``CREATING`` after ``snapshot_timeout_s``, or one ``FAILED`` is
``SnapshotLost``: deleted and built again. A lease's sandbox is created from the provider's image
(or the image ``base`` names) with the snapshot restored at the same path
(``file_system_snapshot_id``); a create that answers that the snapshot is missing sends its key
back to the cold path (``RemoteEnvironments.stale``).

``Prepared.image`` is ``fss:<id>`` or ``fss:<id>|<image>``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from trl_sandbox.remote.environment import RemoteEnvironments, SnapshotHooks, SnapshotLost
from trl_sandbox.remote.launcher_environment import ENV_ROOT

FSS = "fss:"
BUILD_ROLE = ("trl-sandbox-role", "environment-build")


def is_snapshot(image: str | None) -> bool:
    return bool(image) and image.startswith(FSS)


def split(image: str) -> tuple[str, str | None]:
    """(snapshot id, container image or None) of ``fss:<id>[|<image>]``."""
    ident, _, base = image[len(FSS):].partition("|")
    return ident, base or None


def options(spec: Any, size: str) -> Any:
    """The ``FileSystemSnapshotOptions`` a sandbox of ``spec`` needs, if any."""
    from cwsandbox import FileSystemSnapshotOptions

    if is_snapshot(spec.image):
        return FileSystemSnapshotOptions(mount_path=ENV_ROOT, size=size, file_system_snapshot_id=split(spec.image)[0])
    if spec.tags.get(BUILD_ROLE[0]) == BUILD_ROLE[1]:
        return FileSystemSnapshotOptions(mount_path=ENV_ROOT, size=size)
    return None


def environments(provider: Any, cache: str | None, cache_mb: float) -> RemoteEnvironments:
    from cwsandbox import FileSystemSnapshotStatus, Sandbox

    from .provider import _grpc_code, translate

    def missing(exc: BaseException) -> bool:
        return str(getattr(_grpc_code(exc), "name", "")) == "NOT_FOUND" or "not found" in str(exc).lower()

    async def get(ident: str) -> Any:
        return await Sandbox.get_snapshot(ident, **provider._common())

    async def snapshot(sandbox: Any, name: str) -> str:
        try:
            ident = await sandbox._sb.snapshot(wait_for_ready=False)
        except Exception as exc:
            raise SnapshotLost(f"CoreWeave: snapshot of sandbox {sandbox.id} failed: {exc}") from exc
        loop = asyncio.get_running_loop()
        deadline = loop.time() + provider.snapshot_timeout_s
        while True:
            try:
                found = await get(ident)
            except Exception as exc:
                if missing(exc):
                    raise SnapshotLost(f"CoreWeave: snapshot {ident} was reported made but does not exist",
                                       ref=ident) from exc
                raise translate(exc, f"reading snapshot {ident}") from exc
            if found.status == FileSystemSnapshotStatus.READY:
                base = sandbox.image_base
                return f"{FSS}{ident}" + (f"|{base}" if base else "")
            if found.status == FileSystemSnapshotStatus.FAILED:
                raise SnapshotLost(f"CoreWeave: snapshot {ident} failed", ref=ident)
            if loop.time() > deadline:
                raise SnapshotLost(f"CoreWeave: snapshot {ident} still {found.status} after "
                                   f"{provider.snapshot_timeout_s:g} s", ref=ident)
            await asyncio.sleep(min(1.0, provider.snapshot_timeout_s / 10))

    async def exists(ref: str) -> bool:
        try:
            return (await get(split(ref)[0] if is_snapshot(ref) else ref)).status == FileSystemSnapshotStatus.READY
        except Exception as exc:
            if missing(exc):
                return False
            raise translate(exc, f"reading snapshot {ref}") from exc

    async def delete(ref: str) -> None:
        ident = split(ref)[0] if is_snapshot(ref) else ref
        await Sandbox.delete_snapshot(ident, missing_ok=True, **provider._common())

    return RemoteEnvironments(provider, "coreweave", SnapshotHooks(snapshot, exists, delete), cache, cache_mb)

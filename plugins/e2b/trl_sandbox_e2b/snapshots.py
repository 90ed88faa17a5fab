"""Prepared environments on E2B: one snapshot per key (``trl_sandbox.remote.environment``).

The build sandbox becomes a snapshot with ``AsyncSandbox.create_snapshot(name)`` (``POST
/sandboxes/{id}/snapshots``), which answers once it is made; the reference leases use is its name
(a snapshot is a template: ``AsyncSandbox.create(template=name)``). A call that fails or does not
answer within ``snapshot_timeout_s`` (E2B pauses the sandbox while it snapshots) is
``SnapshotLost``: whatever was made is deleted and the key built again; so is a snapshot the call
reported but that ``list_snapshots(name=...)`` does not show within that time. A create that answers 404 for a
snapshot of ours sends its key back to the cold path (``RemoteEnvironments.stale``). Snapshots are
deleted with ``delete_snapshot`` (``DELETE /templates/{id}``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from trl_sandbox.remote.environment import PREFIX, RemoteEnvironments, SnapshotHooks, SnapshotLost

from . import errors


def is_snapshot(image: str | None) -> bool:
    """An image that names one of our environments' snapshots (their names start with ``PREFIX``)."""
    return bool(image) and image.startswith(PREFIX)


def environments(provider: Any, cache: str | None, cache_mb: float) -> RemoteEnvironments:
    """The provider's prepared environments, with E2B's snapshot calls."""

    async def snapshot(sandbox: Any, name: str) -> str:
        try:
            info = await asyncio.wait_for(
                sandbox._sb.create_snapshot(name, request_timeout=provider.snapshot_timeout_s),
                provider.snapshot_timeout_s)
        except Exception as exc:
            raise SnapshotLost(f"E2B: snapshot {name} of sandbox {sandbox.id} failed: {exc!r}") from exc
        ref = (info.names or [name])[0] if getattr(info, "names", None) else name
        loop = asyncio.get_running_loop()
        deadline = loop.time() + provider.snapshot_timeout_s
        while not await exists(ref):  # listed once it is ready to boot
            if loop.time() > deadline:
                raise SnapshotLost(f"E2B: snapshot {ref} was reported made but is not listed after "
                                   f"{provider.snapshot_timeout_s:g} s", ref=ref)
            await asyncio.sleep(min(1.0, provider.snapshot_timeout_s / 10))
        return ref

    async def exists(ref: str) -> bool:
        try:
            pager = provider.sdk.list_snapshots(name=ref, request_timeout=provider.request_timeout_s)
            while pager.has_next:
                for info in await pager.next_items():
                    if ref == info.snapshot_id or ref in (info.names or []):
                        return True
            return False
        except Exception as exc:
            raise errors.translate(exc, f"reading snapshot {ref}") from exc

    async def delete(ref: str) -> None:
        await provider.sdk.delete_snapshot(ref, request_timeout=provider.request_timeout_s)

    return RemoteEnvironments(provider, "e2b", SnapshotHooks(snapshot, exists, delete), cache, cache_mb)

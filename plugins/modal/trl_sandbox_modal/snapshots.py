"""Prepared environments on Modal: one file-system snapshot image per key
(``trl_sandbox.remote.environment``).

The build sandbox's file system becomes a Modal image with ``Sandbox.snapshot_filesystem()``
(the command router's ``TaskSnapshotFilesystem``), kept by Modal for ``snapshot_ttl_s``; the image
is checked with ``Image.from_id(...).build()`` (``ImageFromId``: an image already made is not built again). A snapshot call that fails or
outlasts ``snapshot_timeout_s``, or an image the service does not know right after it, is
``SnapshotLost``: built again. Leases are created from ``modal-image:<id>`` (``Image.from_id``); a
create that answers that the image is missing sends its key back to the cold path
(``RemoteEnvironments.stale``). Modal's SDK has no call to delete an image: a dropped snapshot is
only forgotten here and expires with its TTL.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from trl_sandbox.remote.environment import RemoteEnvironments, SnapshotHooks, SnapshotLost

from .errors import is_gone, translate


def environments(provider: Any, cache: str | None, cache_mb: float) -> RemoteEnvironments:
    """The provider's prepared environments, with Modal's snapshot calls."""
    from .provider import SNAPSHOT

    async def snapshot(sandbox: Any, name: str) -> str:
        timeout = provider.snapshot_timeout_s
        try:
            image = await asyncio.wait_for(sandbox._sb.snapshot_filesystem.aio(
                timeout=max(1, math.ceil(timeout)), ttl=provider.snapshot_ttl_s), timeout)
        except Exception as exc:  # a timeout included: the snapshot never came
            raise SnapshotLost(f"Modal: snapshot {name} of sandbox {sandbox.id} failed: {exc!r}") from exc
        ref = f"{SNAPSHOT}{image.object_id}"
        if not await exists(ref):
            raise SnapshotLost(f"Modal: image {image.object_id} was reported made but does not exist")
        return ref

    async def exists(ref: str) -> bool:
        import modal

        client = await provider.client()
        try:
            # ``ImageFromId`` through the resolver (an image cannot be hydrated on demand)
            await modal.Image.from_id(ref[len(SNAPSHOT):], client=client).build.aio(provider.app)
        except Exception as exc:
            if is_gone(exc):
                return False
            raise translate(exc, f"reading image {ref}") from exc
        return True

    async def delete(ref: str) -> None:
        provider.forget_image(ref)  # no delete in Modal's SDK: it expires with its TTL

    return RemoteEnvironments(provider, "modal", SnapshotHooks(snapshot, exists, delete), cache, cache_mb)

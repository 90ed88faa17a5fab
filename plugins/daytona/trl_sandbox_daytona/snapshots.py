"""Prepared environments on Daytona: one snapshot per key (``trl_sandbox.remote.environment``).

The build sandbox's file system becomes a snapshot with ``AsyncSandbox.create_snapshot(name)``
(``POST /sandbox/{id}/snapshot``); it is ready when ``daytona.snapshot.get(name)`` says
``active``. A name the service does not know after the call (the SDK reported success), a
snapshot still ``pending`` (or ``building``, ...) after ``snapshot_timeout_s``, or one in
``error``/``build_failed`` is ``SnapshotLost``: deleted and built again. Leases are created with
``CreateSandboxFromSnapshotParams(snapshot=name)``; a create that answers that the snapshot is
missing sends its key back to the cold path (``RemoteEnvironments.stale``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from trl_sandbox.remote.environment import PREFIX, RemoteEnvironments, SnapshotHooks, SnapshotLost

SNAPSHOT_BASE = "snapshot:"  # an environment's ``base`` that names a Daytona snapshot
_BROKEN = {"error", "build_failed", "removing", "inactive"}


def _state(snapshot: Any) -> str:
    state = getattr(snapshot, "state", None)
    return str(getattr(state, "value", state) or "unknown").lower()


def is_snapshot(image: str | None) -> bool:
    return bool(image) and (image.startswith(PREFIX) or image.startswith(SNAPSHOT_BASE))


def snapshot_name(image: str) -> str:
    return image[len(SNAPSHOT_BASE):] if image.startswith(SNAPSHOT_BASE) else image


def environments(provider: Any, cache: str | None, cache_mb: float) -> RemoteEnvironments:
    """The provider's prepared environments, with Daytona's snapshot calls."""
    from daytona import DaytonaNotFoundError

    from .provider import translate

    async def snapshot(sandbox: Any, name: str) -> str:
        client = await provider.client()
        try:
            await sandbox._sb.create_snapshot(name, timeout=provider.snapshot_timeout_s)
        except Exception as exc:
            raise SnapshotLost(f"Daytona: snapshot {name} of sandbox {sandbox.id} failed: {exc}") from exc
        loop = asyncio.get_running_loop()
        deadline = loop.time() + provider.snapshot_timeout_s
        while True:
            try:
                found = await client.snapshot.get(name)
            except DaytonaNotFoundError as exc:
                raise SnapshotLost(f"Daytona: snapshot {name} was reported made but does not exist") from exc
            except Exception as exc:
                raise translate(exc, f"reading snapshot {name}") from exc
            state = _state(found)
            if state == "active":
                return name
            if state in _BROKEN:
                raise SnapshotLost(f"Daytona: snapshot {name} is {state}: {getattr(found, 'error_reason', '')}")
            if loop.time() > deadline:
                raise SnapshotLost(f"Daytona: snapshot {name} still {state} after {provider.snapshot_timeout_s:g} s")
            await asyncio.sleep(min(1.0, provider.snapshot_timeout_s / 10))

    async def exists(ref: str) -> bool:
        client = await provider.client()
        try:
            return _state(await client.snapshot.get(snapshot_name(ref))) == "active"
        except DaytonaNotFoundError:
            return False
        except Exception as exc:
            raise translate(exc, f"reading snapshot {ref}") from exc

    async def delete(ref: str) -> None:
        client = await provider.client()
        try:
            await client.snapshot.delete(snapshot_name(ref))
        except DaytonaNotFoundError:
            pass

    return RemoteEnvironments(provider, "daytona", SnapshotHooks(snapshot, exists, delete), cache, cache_mb)

"""The fake E2B's snapshots: ``POST /sandboxes/{id}/snapshots`` (201 ``{snapshotID, names}``),
``GET /snapshots`` (filtered by ``name`` or ``sandboxID``, paged by ``x-next-token``) and
``DELETE /templates/{id or name}`` (a snapshot is a template; 204, or 404). A snapshot of a fake
sandbox is a tarball of its ``/var/tmp`` (the container's lasting writable place besides
``/tmp``), unpacked into each sandbox created from it (``template`` = its id or name).

``fault(kind)`` spoils the next snapshot: ``"ghost"`` (the call answers but nothing is kept),
``"pending"`` (the call answers but the snapshot is never listed nor bootable: still uploading,
forever), ``"boot404"`` (it is listed, but a create from it answers 404).
"""

from __future__ import annotations

import subprocess
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class FakeSnapshot:
    id: str
    name: str
    source: str
    data: bytes
    boot404: bool = False
    pending: bool = False


@dataclass
class SnapshotStore:
    live: dict[str, FakeSnapshot] = field(default_factory=dict)  # by id
    faults: list[str] = field(default_factory=list)
    made: int = 0  # every snapshot call that answered success, ghosts included
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fault(self, kind: str, times: int = 1) -> None:
        assert kind in ("ghost", "pending", "boot404")
        with self.lock:
            self.faults.extend([kind] * times)

    def find(self, ref: str) -> FakeSnapshot | None:
        with self.lock:
            return self.live.get(ref) or next((s for s in self.live.values() if s.name == ref), None)

    def drop(self, ref: str) -> bool:
        with self.lock:
            snap = self.live.get(ref) or next((s for s in self.live.values() if s.name == ref), None)
            if snap is not None:
                del self.live[snap.id]
            return snap is not None

    def drop_all(self) -> None:
        with self.lock:
            self.live.clear()


def dto(snap: FakeSnapshot) -> dict:
    return {"snapshotID": snap.id, "names": [snap.name]}


def take(handler: Any, sandbox: Any, request: dict) -> None:
    """``POST /sandboxes/{id}/snapshots``."""
    store: SnapshotStore = handler.fake.snapshot_store
    container = sandbox.container
    data = subprocess.run(container.argv(["tar", "-C", "/var/tmp", "-cf", "-", "."]), env=container.env,
                          capture_output=True, check=True, timeout=120).stdout
    with store.lock:
        fault = store.faults.pop(0) if store.faults else None
    name = request.get("name") or f"snapshot-{uuid.uuid4().hex[:8]}"
    snap = FakeSnapshot(f"snap{uuid.uuid4().hex[:12]}", name, sandbox.id, data, boot404=fault == "boot404",
                        pending=fault == "pending")
    with store.lock:
        store.made += 1
        if fault != "ghost":
            store.live[snap.id] = snap
    handler.send(201, dto(snap))


def listing(handler: Any) -> None:
    """``GET /snapshots``."""
    store: SnapshotStore = handler.fake.snapshot_store
    query = {k: v[0] for k, v in parse_qs(urlsplit(handler.path).query).items()}
    with store.lock:
        found = [s for s in store.live.values() if not s.pending and (not query.get("name") or query["name"] in (s.name, s.id))
                 and (not query.get("sandboxID") or s.source == query["sandboxID"])]
    start = int(query.get("nextToken") or 0)
    limit = int(query.get("limit") or 100)
    headers = {"x-next-token": str(start + limit)} if start + limit < len(found) else {}
    handler.send(200, [dto(s) for s in found[start:start + limit]], headers)


def delete(handler: Any, ref: str) -> None:
    """``DELETE /templates/{id or name}``."""
    if handler.fake.snapshot_store.drop(ref) or ref in handler.fake.templates - {"base"}:
        return handler.send(204)
    handler.error(404, f"template '{ref}' not found")

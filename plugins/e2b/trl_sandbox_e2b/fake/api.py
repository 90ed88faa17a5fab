"""The fake E2B's control plane: the REST routes of ``api.e2b.app`` that the SDK calls.

``POST /v2/sandboxes`` (honouring ``Idempotency-Key``; 404 for a template it does not have; 429
past ``max_sandboxes`` running), ``GET /v2/sandboxes`` (``metadata`` filter, ``state``, paged by
``x-next-token``), ``GET``/``DELETE /sandboxes/{id}``, ``POST /sandboxes/{id}/timeout`` (a new end
of life counted from now), ``POST /v2/sandboxes/{id}/connect``, and the snapshot routes
(``snapshots.py``), whose snapshot is a template a later create may name. Errors are E2B's JSON ``{code, message}``.
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timezone
from typing import Any
from urllib.parse import parse_qs, urlsplit

from . import snapshots

_ID = re.compile(r"^/(?:v2/)?(?:sandboxes|templates)/([^/]+)")


def path_id(path: str) -> str | None:
    match = _ID.match(path)
    return match.group(1) if match else None


def route(method: str, path: str) -> str:
    parts = [p for p in path.split("/") if p]
    if parts and parts[0] == "v2":
        parts = parts[1:]
    if parts[:1] == ["sandboxes"]:
        if len(parts) == 1:
            return {"POST": "create", "GET": "list"}.get(method, "unknown")
        if len(parts) == 2:
            return {"GET": "get", "DELETE": "kill"}.get(method, "unknown")
        if len(parts) == 3 and method == "POST":
            return {"timeout": "set_timeout", "connect": "connect", "snapshots": "snapshot"}.get(parts[2], "unknown")
    if parts == ["snapshots"] and method == "GET":
        return "snapshot_list"
    if parts[:1] == ["templates"] and len(parts) == 2 and method == "DELETE":
        return "snapshot_delete"
    return "unknown"


def _iso(when: float) -> str:
    return datetime.fromtimestamp(when, timezone.utc).isoformat().replace("+00:00", "Z")


def dto(sandbox: Any, detail: bool = False) -> dict:
    """``Sandbox`` (create, connect), ``ListedSandbox`` or ``SandboxDetail``."""
    out = {"sandboxID": sandbox.id, "templateID": sandbox.template, "clientID": "fake-client",
           "envdVersion": sandbox.fake.envd_version}
    if detail:
        out.update(startedAt=_iso(sandbox.started_at), endAt=_iso(sandbox.end_at), cpuCount=2, memoryMB=512,
                   diskSizeMB=1024, state="running", metadata=dict(sandbox.metadata),
                   allowInternetAccess=sandbox.internet)
    return out


def handle(handler: Any, name: str, path: str, body: bytes) -> None:
    fake = handler.fake
    request = json.loads(body or b"{}") if body else {}
    fake.expire()
    if name == "create":
        return _create(handler, request)
    if name == "list":
        return _list(handler)
    if name == "snapshot_list":
        return snapshots.listing(handler)
    if name == "snapshot_delete":
        return snapshots.delete(handler, path_id(path) or "")
    sandbox_id = path_id(path) or ""
    sandbox = fake.running(sandbox_id)
    if sandbox is None:
        return handler.error(404, f"sandbox \"{sandbox_id}\" doesn't exist or you don't have access to it")
    if name == "get":
        return handler.send(200, dto(sandbox, detail=True))
    if name == "kill":
        fake.kill(sandbox_id)
        return handler.send(204)
    if name in ("set_timeout", "connect"):
        if "timeout" in request:
            sandbox.end_at = time.time() + float(request["timeout"])
        return handler.send(204) if name == "set_timeout" else handler.send(200, dto(sandbox))
    if name == "snapshot":
        return snapshots.take(handler, sandbox, request)
    return handler.error(404, f"no route for {path}")


def _create(handler: Any, request: dict) -> None:
    fake = handler.fake
    key = handler.headers.get("Idempotency-Key")
    with fake.lock:
        known = fake.idempotent.get(key) if key else None
    if known is not None and fake.running(known) is not None:
        return handler.send(201, dto(fake.running(known)))
    template = request.get("templateID") or "base"
    snap = fake.snapshot_store.find(template)
    if template not in fake.templates and (snap is None or snap.boot404 or snap.pending):
        return handler.error(404, f"template '{template}' not found")
    if fake.max_sandboxes is not None and len(fake.live()) >= fake.max_sandboxes:
        return handler.error(429, f"You have reached the maximum number of concurrent E2B sandboxes "
                                  f"({fake.max_sandboxes})")
    sandbox = fake.make_sandbox(template, request, snap.data if snap is not None else None)
    with fake.lock:
        if key:
            fake.idempotent[key] = sandbox.id
        stall, fake.stalls = (fake.stalls[0], fake.stalls[1:]) if fake.stalls else (0.0, fake.stalls)
    if stall:  # made, but the answer comes late (a slow placement, a proxy that holds it)
        time.sleep(stall)
    handler.send(201, dto(sandbox))


def _list(handler: Any) -> None:
    fake = handler.fake
    query = parse_qs(urlsplit(handler.path).query)
    wanted = {k: v[0] for k, v in parse_qs(query["metadata"][0]).items()} if "metadata" in query else {}
    states = set(query["state"][0].split(",")) if "state" in query else {"running", "paused"}
    start = int(query["nextToken"][0]) if query.get("nextToken") else 0
    limit = int(query["limit"][0]) if query.get("limit") else fake.page_size
    limit = min(limit, fake.page_size)
    with fake.lock:
        matching = [s for s in fake.sandboxes.values() if not s.gone and "running" in states
                    and all(s.metadata.get(k) == v for k, v in wanted.items())]
    page = [dto(s, detail=True) for s in matching[start:start + limit]]
    headers = {"x-next-token": str(start + limit)} if start + limit < len(matching) else {}
    handler.send(200, page, headers)

"""Servicer bases from the installed ``modal`` wheel, completed with UNIMPLEMENTED stubs.

The fake subclasses ``modal_proto.api_grpc.ModalClientBase`` and
``modal_proto.task_command_router_grpc.TaskCommandRouterBase`` as shipped in the pinned wheel, so
the request and response messages always match the SDK that talks to it. Both bases declare every
RPC abstract (hundreds); the fake implements only what the provider and its tests use, and every
other RPC answers ``UNIMPLEMENTED``, which the SDK turns into an error a test sees at once, never a
hang. ``complete(cls)`` adds those answers programmatically, so a new RPC in a new wheel needs no edit.
"""

from __future__ import annotations

from typing import Any

from grpclib import GRPCError, Status


def _unimplemented(name: str) -> Any:
    async def handler(self: Any, stream: Any) -> None:
        raise GRPCError(Status.UNIMPLEMENTED, f"the trl-sandbox Modal fake does not implement {name}")

    handler.__name__ = name
    return handler


def complete(cls: type) -> type:
    """``cls`` with an UNIMPLEMENTED handler for each abstract RPC it does not define."""
    missing = {name: _unimplemented(name) for name in getattr(cls, "__abstractmethods__", ())}
    if not missing:
        return cls
    return type(cls.__name__, (cls,), {**missing, "__doc__": cls.__doc__, "__module__": cls.__module__})

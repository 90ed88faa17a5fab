"""trl-sandbox provider ``e2b``: E2B cloud sandboxes through the official ``e2b`` SDK.

``pip install trl-sandbox-e2b``, set ``E2B_API_KEY``, then ``sandbox_provider="e2b"``. Settings and
behaviour are documented on :class:`E2BProvider` and in the README; ``python -m trl_sandbox_e2b.fake``
serves a fake E2B on loopback to try it offline.
"""

from __future__ import annotations

from trl_sandbox import hookimpl

from .provider import E2BProvider
from .sandbox import E2BSandbox

__all__ = ["E2BProvider", "E2BSandbox"]


@hookimpl
def trl_sandbox_register_providers(register):
    register("e2b", E2BProvider)

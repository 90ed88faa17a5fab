"""trl-sandbox provider ``ray``: the local bubblewrap sandbox on the nodes of a Ray cluster.

``pip install trl-sandbox-ray``, join the machines into a Ray cluster (``ray start``), then
``sandbox_provider="ray"``. Settings and behaviour are documented on :class:`RayProvider` and in
the README.
"""

from __future__ import annotations

from trl_sandbox import hookimpl

from .provider import RayProvider, RaySandbox

__all__ = ["RayProvider", "RaySandbox"]


@hookimpl
def trl_sandbox_register_providers(register):
    register("ray", RayProvider)

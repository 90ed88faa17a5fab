"""trl-sandbox provider ``daytona``: Daytona cloud sandboxes through the official ``daytona`` SDK.

``pip install trl-sandbox-daytona``, set ``DAYTONA_API_KEY``, then ``sandbox_provider="daytona"``.
Settings and behaviour are documented on :class:`DaytonaProvider` and in the README.
"""

from __future__ import annotations

from trl_sandbox import hookimpl

from .provider import DaytonaProvider, DaytonaSandbox

__all__ = ["DaytonaProvider", "DaytonaSandbox"]


@hookimpl
def trl_sandbox_register_providers(register):
    register("daytona", DaytonaProvider)

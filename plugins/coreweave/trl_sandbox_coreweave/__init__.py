"""trl-sandbox providers ``coreweave`` and ``aviato``: CoreWeave Sandbox through the ``cwsandbox`` SDK.

CoreWeave Sandbox was called Aviato before; both names give the same provider.
``pip install trl-sandbox-coreweave``, set ``CWSANDBOX_API_KEY``, then ``sandbox_provider="coreweave"``.
Settings and behaviour are documented on :class:`CoreWeaveProvider` and in the README.
"""

from __future__ import annotations

from trl_sandbox import hookimpl

from .provider import AviatoProvider, CoreWeaveProvider, CoreWeaveSandbox

__all__ = ["AviatoProvider", "CoreWeaveProvider", "CoreWeaveSandbox"]


@hookimpl
def trl_sandbox_register_providers(register):
    register("coreweave", CoreWeaveProvider)
    register("aviato", AviatoProvider)

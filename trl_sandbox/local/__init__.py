"""The built-in local provider: bubblewrap sandboxes with a warm Python fork server."""

from trl_sandbox.local.provider import LocalProvider, LocalSandbox

__all__ = ["LocalProvider", "LocalSandbox"]

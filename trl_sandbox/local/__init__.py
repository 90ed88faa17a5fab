"""The built-in local provider: bubblewrap sandboxes with a warm Python fork server."""

from .provider import LocalProvider, LocalSandbox

__all__ = ["LocalProvider", "LocalSandbox"]

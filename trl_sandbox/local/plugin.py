"""Registers the built-in ``local`` provider through the same hook as third-party providers."""

from __future__ import annotations

from trl_sandbox.plugins.hookspecs import hookimpl


@hookimpl
def trl_sandbox_register_providers(register):
    from trl_sandbox.local.provider import LocalProvider

    register("local", LocalProvider)

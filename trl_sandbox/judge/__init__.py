"""What decides a verdict where the model cannot reach it.

The judge program that runs in the sandbox beside the candidate (``candidate``, ``resident``,
``clock``, ``conn``, ``program``: standard library only, sent as source), the host's side of it
(``verdict``: building judged programs and checking the verdict they sign; ``prefetch``,
``values``), and the checks on model text before anything runs (``bans``, ``content_guard``).

Imports: the standard library and ``trl_sandbox.sandbox`` only. Everything else may import the
judge; the judge imports nothing above it, so what runs in the sandbox never depends on the host.
"""

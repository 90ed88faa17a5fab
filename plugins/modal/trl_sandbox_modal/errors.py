"""Modal SDK errors mapped onto trl-sandbox's taxonomy, and the credentials check.

Modal's client turns each gRPC status into one exception class (``modal/_grpc_client.py``) after
its own retries (three tries on UNAVAILABLE, INTERNAL and the like; ten on the command router), so
what reaches us has already been retried by the SDK; the pool's budget counts from there. What
decides the mapping:

* NOT_FOUND about one of our sandboxes, "already finished" (FAILED_PRECONDITION), a sandbox that
  terminated or timed out: the sandbox is gone (``SandboxGoneError``: the pool replaces it);
* RESOURCE_EXHAUSTED with Modal's retry policy, or saying "rate": a throttle (``RateLimitError``,
  with the server's ``retry_after_secs``); other RESOURCE_EXHAUSTED: an account limit (``QuotaError``);
* UNAUTHENTICATED, a missing token, an image that cannot be built, an invalid request: the
  configuration (``ConfigError``, one line saying what to fix);
* everything else (UNAVAILABLE, INTERNAL, transport errors, timeouts): ``InfraError``, retried.
"""

from __future__ import annotations

import asyncio
import os
import re
from typing import Any

from trl_sandbox import ConfigError, InfraError, QuotaError, RateLimitError, SandboxError, SandboxGoneError

TOKEN_HINT = ("set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET (create a token with `modal token new`, or at "
              "https://modal.com/settings/tokens), or pass the provider settings token_id and token_secret")
_RATE = re.compile(r"rate|throttl|too many requests", re.IGNORECASE)


def credentials(token_id: str | None, token_secret: str | None) -> tuple[str, str]:
    """The token to use: the settings, else what the SDK itself would read (``MODAL_TOKEN_*``, then
    the active profile of ``~/.modal.toml``). ``ConfigError`` naming the variables when there is none."""
    try:
        from modal.config import config
    except ImportError as exc:
        raise ConfigError("the modal sandbox provider needs the modal SDK: pip install trl-sandbox-modal "
                          f"(it pins modal==1.6.4): {exc}") from None
    token_id = token_id or os.environ.get("MODAL_TOKEN_ID") or config.get("token_id")
    token_secret = token_secret or os.environ.get("MODAL_TOKEN_SECRET") or config.get("token_secret")
    if not token_id or not token_secret:
        raise ConfigError(f"the modal sandbox provider needs a Modal token: {TOKEN_HINT}")
    return str(token_id), str(token_secret)


def retry_after(exc: BaseException) -> float | None:
    """The server's ``RPCRetryPolicy.retry_after_secs`` on a Modal error or its cause, if any."""
    from grpclib import GRPCError
    from modal_proto import api_pb2

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        # Modal's wrapper keeps the status details privately (its public ``details`` warns)
        if "_grpc_details" in vars(current):
            details = vars(current)["_grpc_details"]
        else:
            details = current.details if isinstance(current, GRPCError) else None
        for detail in details or []:
            if isinstance(detail, api_pb2.RPCRetryPolicy):  # a float32 on the wire: 0.4 arrives as 0.40000000596
                return max(0.1, round(float(detail.retry_after_secs), 3))
        current = current.__cause__ or current.__context__
    return None


def translate(exc: BaseException, what: str, sandbox_id: str | None = None) -> SandboxError:
    """The trl-sandbox error for a Modal SDK (or transport) error raised while doing ``what``."""
    if isinstance(exc, SandboxError):
        return exc
    from modal import exception as me

    message = f"Modal: {what} failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    if isinstance(exc, me.AuthError):
        return ConfigError(f"{message}. The token was rejected: {TOKEN_HINT}")
    if isinstance(exc, me.ImageBuildError):
        return ConfigError(f"Modal: the sandbox image could not be built ({_one_line(exc)}); check the provider "
                           "setting image (a registry tag such as python:3.12-slim)")
    if isinstance(exc, me.ResourceExhaustedError):
        wait = retry_after(exc)
        if wait is not None or _RATE.search(str(exc)):
            return RateLimitError(message, retry_after=wait)
        return QuotaError(f"{message}. This is an account limit: use fewer or smaller sandboxes "
                          "(sandbox_pool_size, cpu/memory) or raise the limit with Modal")
    if sandbox_id is not None and isinstance(exc, (me.NotFoundError, me.ConflictError, me.SandboxTerminatedError,
                                                   me.SandboxTimeoutError)):
        return SandboxGoneError(f"Modal: sandbox {sandbox_id} is gone ({what}: {_one_line(exc)})")
    if isinstance(exc, (me.ConflictError,)):
        return InfraError(message)
    if isinstance(exc, (me.InvalidError, me.NotFoundError)):
        return ConfigError(f"{message}. Modal rejected the request; check the provider settings")
    if isinstance(exc, (asyncio.TimeoutError, OSError, me.Error)):
        return InfraError(message)
    return InfraError(message)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300]


def is_gone(exc: Any) -> bool:
    """Whether ``exc`` says the sandbox no longer exists (for ``alive`` and ``destroy``)."""
    from modal import exception as me

    return isinstance(exc, (me.NotFoundError, me.SandboxTerminatedError, me.SandboxTimeoutError))

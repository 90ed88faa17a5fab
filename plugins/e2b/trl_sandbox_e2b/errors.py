"""The ``e2b`` SDK's errors in trl-sandbox's taxonomy.

Who caused a failure decides its class. A sandbox that was killed or reached its end of life
(``SandboxNotRunningException``: envd's proxy answered 502 "... was not found", also through the
SDK's own ``/health`` probe; ``SandboxNotFoundException``: the API's 404) is ``SandboxGoneError``:
the pool replaces it and runs the program elsewhere. A rate limit (429, Connect
RESOURCE_EXHAUSTED) is ``RateLimitError``; the SDK keeps no ``Retry-After`` for it, so the wait
is the provider's ``rate_limit_wait_s``. No capacity (503 ``ServiceBusyException``), other 5xx,
timeouts of a request and transport failures are ``InfraError`` (retried within the pool's
budget). Rejected credentials (401) and a template E2B does not have are ``ConfigError``: no retry
fixes them.
"""

from __future__ import annotations

import re

from trl_sandbox import ConfigError, InfraError, QuotaError, RateLimitError, SandboxError, SandboxGoneError

KEY_HINT = ("set E2B_API_KEY (create a key at https://e2b.dev/dashboard?tab=keys), or pass the provider "
            "setting api_key=...")
_QUOTA = re.compile(r"(?<![a-z0-9_])(quota|limit reached|exceed(s|ed)?)(?![a-z0-9_])", re.IGNORECASE)


def status_of(exc: BaseException) -> int | None:
    """The HTTP status an SDK error carries (``SandboxException.status_code``), if any."""
    value = getattr(exc, "status_code", None)
    return value if isinstance(value, int) and 100 <= value < 600 else None


def is_gone(exc: BaseException) -> bool:
    """The sandbox is dead for sure: killed, expired, or unknown to the API."""
    from e2b.exceptions import SandboxNotFoundException, SandboxNotRunningException

    return isinstance(exc, (SandboxNotRunningException, SandboxNotFoundException))


def translate(exc: BaseException, what: str, sandbox_id: str | None = None, *,
              rate_limit_wait_s: float = 1.0) -> SandboxError:
    """Map an E2B SDK (or transport) error to the trl-sandbox taxonomy."""
    if isinstance(exc, SandboxError):
        return exc
    from e2b.exceptions import (
        AuthenticationException,
        RateLimitException,
        SandboxException,
        ServiceBusyException,
    )

    message = f"E2B: {what} failed: {exc}"
    if isinstance(exc, AuthenticationException):
        return ConfigError(f"{message}. The credentials were rejected: {KEY_HINT}")
    if isinstance(exc, RateLimitException):
        return RateLimitError(message, retry_after=rate_limit_wait_s)
    if isinstance(exc, ServiceBusyException):
        return InfraError(message)
    if sandbox_id is not None and is_gone(exc):
        return SandboxGoneError(f"E2B: sandbox {sandbox_id} is gone ({what}: {exc})")
    status = status_of(exc)
    if isinstance(exc, SandboxException) and status in (400, 403, 422) and _QUOTA.search(str(exc)):
        return QuotaError(f"{message}. This is an account limit: use fewer sandboxes (sandbox_pool_size) "
                          "or raise the limit with E2B")
    if status == 403:
        return ConfigError(f"{message}. The API key lacks a permission this needs")
    if status in (400, 422):
        return ConfigError(f"{message}. E2B rejected the request; check the provider settings")
    return InfraError(message)


def unknown_template(template: str, exc: BaseException) -> ConfigError:
    return ConfigError(f"E2B: template {template!r} does not exist for this API key ({exc}); set the provider "
                       "setting template= to one of your templates (`e2b template list`), or leave it unset for "
                       "E2B's 'base'")

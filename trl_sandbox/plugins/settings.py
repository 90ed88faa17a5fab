"""Typed provider settings from what the user wrote.

Provider settings (``sandbox_provider_settings``, ``--setting KEY=VALUE``) reach a provider's
constructor as whatever the caller had: Python values from code or a config file, but plain
strings from the command line (``--setting max_concurrency=8`` passes ``"8"``). A provider must
turn them into numbers and booleans before use, and a value it cannot use must fail while the
provider is built, as a ``ConfigError`` that says which provider and which setting is wrong, not
later as a ``TypeError`` deep inside a request. These helpers do that one job, so that every
provider accepts the same spellings and reports a bad value in the same words.
"""

from __future__ import annotations

from typing import Any

from trl_sandbox.sandbox import ConfigError

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off", "")


def number(provider: str, name: str, value: Any, kind: type = float, minimum: float | None = None,
           *, required: bool = False, positive: bool = False) -> Any:
    """``value`` as a ``kind`` (``int`` or ``float``), at least ``minimum`` when given.

    ``None`` and ``""`` (an empty ``--setting name=``) mean "not set" and give ``None``, unless
    ``required``: then they are an error like any other non-number. For ``int``, the value goes
    through ``float`` first so that ``"2.0"`` and ``2.0`` are accepted (and truncated). ``positive``:
    the value must be above zero (sizes, timeouts, budgets: zero would disable or break them).
    Raises ``ConfigError`` naming ``provider`` and the setting ``name``.
    """
    if (value is None or value == "") and not required:
        return None
    try:
        result = kind(float(value)) if kind is int else kind(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{provider} provider setting {name}={value!r} must be a number") from None
    if positive and not result > 0:
        raise ConfigError(f"{provider} provider setting {name}={value!r} must be a positive number")
    if minimum is not None and result < minimum:
        raise ConfigError(f"{provider} provider setting {name}={value!r} must be at least {minimum}")
    return result


def flag(provider: str, name: str, value: Any) -> bool:
    """``value`` as a boolean.

    A string must be one of ``1/true/yes/on`` or ``0/false/no/off`` (any case; ``""`` is false):
    ``bool("false")`` would be True, so strings are never passed to ``bool``. Other values use
    their truth value. Raises ``ConfigError`` naming ``provider`` and the setting ``name``.
    """
    if isinstance(value, str):
        if value.lower() in TRUE:
            return True
        if value.lower() in FALSE:
            return False
        raise ConfigError(f"{provider} provider setting {name}={value!r} must be true or false")
    return bool(value)

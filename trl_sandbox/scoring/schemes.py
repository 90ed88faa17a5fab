"""Reward schemes: an ``Outcome`` in, a reward out. ``infra`` is always ``None``.

``None`` tells TRL to leave the completion out of its group's baseline: an infrastructure failure
must never be scored as wrong code, or the advantage of every other completion in the group is
poisoned.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence

from trl_sandbox.sandbox import ConfigError, Outcome

RewardScheme = Callable[[Outcome], "float | None"]

_FAILING = ("banned", "no_code", "error", "timeout")


def original(outcome: Outcome) -> float | None:
    """The TRL + Daytona example: -1 for banned, no code, errors and timeouts; else the pass fraction."""
    if outcome.status == "infra":
        return None
    if outcome.status in _FAILING or outcome.total <= 0:
        return -1.0
    return outcome.passed / outcome.total


def binary(outcome: Outcome) -> float | None:
    """1 when every test passed, else 0."""
    if outcome.status == "infra":
        return None
    return 1.0 if outcome.status == "passed" and outcome.total > 0 and outcome.passed == outcome.total else 0.0


def partial(outcome: Outcome) -> float | None:
    """The pass fraction, with no penalty below 0: a program that errors on one test keeps the others.

    Banned code and missing code still score 0, never a fraction.
    """
    if outcome.status == "infra":
        return None
    if outcome.status in ("banned", "no_code") or outcome.total <= 0:
        return 0.0
    return outcome.passed / outcome.total


def weighted(weights: Sequence[float]) -> RewardScheme:
    """Pass fraction with per-test weights (``outcome.tests`` must align with ``weights``)."""
    total_weight = float(sum(weights))

    def scheme(outcome: Outcome) -> float | None:
        if outcome.status == "infra":
            return None
        if outcome.status in ("banned", "no_code") or not outcome.tests or total_weight <= 0:
            return 0.0
        return sum(w for w, ok in zip(weights, outcome.tests) if ok) / total_weight

    return scheme


# "task": the task's own ``reward_scheme`` attribute when it has one, else ``original``.
SCHEMES: dict[str, RewardScheme] = {
    "original": original,
    "default": original,
    "task": original,
    "binary": binary,
    "partial": partial,
}


def get_scheme(spec: str | RewardScheme | None) -> RewardScheme:
    """A scheme by name (``original``, ``binary``, ``partial``, ``weighted:1,1,2``), ``module:function``, or callable."""
    if spec is None:
        return original
    if callable(spec):
        return spec
    if spec in SCHEMES:
        return SCHEMES[spec]
    if spec.startswith("weighted:"):
        try:
            return weighted([float(w) for w in spec.split(":", 1)[1].split(",")])
        except ValueError as exc:
            raise ConfigError(f"bad weighted reward scheme {spec!r}: use weighted:W1,W2,...") from exc
    if ":" in spec:
        module_name, _, attr = spec.partition(":")
        try:
            return getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"cannot load reward scheme {spec!r}: {exc}") from exc
    raise ConfigError(
        f"unknown reward scheme {spec!r}; use one of {sorted(SCHEMES)}, 'weighted:W1,W2,...' or 'module:function'"
    )

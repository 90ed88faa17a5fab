"""The pool's knobs (``PoolSettings``) and what it counts (``PoolStats``).

Kept apart from the pool so that configuration code (the trainer's config, the CLI) can build and
validate settings without the pool's machinery, and so that a bad value fails as a ``ConfigError``
when it is written down rather than as a strange wait deep inside a run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from trl_sandbox.sandbox import ConfigError


@dataclass(frozen=True)
class PoolSettings:
    """Timing and retry knobs. Defaults suit both the local provider and remote ones."""

    max_attempts: int = 3  # per job; a transient error keeps the sandbox, a lost one is replaced
    exec_slack_s: float = 10.0  # exec deadline = timeout + slack; past it the sandbox is presumed dead
    create_timeout_s: float = 120.0
    destroy_timeout_s: float = 30.0
    reset_timeout_s: float = 30.0
    lease_timeout_s: float = 300.0  # how long a job waits for a free sandbox before it is an infra failure
    health_interval_s: float = 30.0
    create_concurrency: int = 16
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    max_retry_after_s: float = 120.0  # a server's Retry-After is honoured up to this
    outage_s: float = 300.0  # creates failing this long with none succeeding: an outage (SandboxOutageError)
    reset_attempts: int = 3  # a failed reset is retried while the sandbox answers alive()
    # Host-wide create limits, shared by every process of this machine using the same provider
    # (the ranks of one launch): creates started per second, and creates in flight. None: off.
    host_create_rate: float | None = None
    host_create_concurrency: int | None = None

    def __post_init__(self) -> None:
        for name in ("exec_slack_s", "create_timeout_s", "destroy_timeout_s", "reset_timeout_s",
                     "lease_timeout_s", "health_interval_s", "backoff_max_s", "outage_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"PoolSettings.{name} must be a positive number of seconds, got {value!r}")
        rate = self.host_create_rate
        if rate is not None and (not isinstance(rate, (int, float)) or not rate > 0):
            raise ConfigError(f"PoolSettings.host_create_rate must be a positive number per second or None, got {rate!r}")
        concurrency = self.host_create_concurrency
        if concurrency is not None and (not isinstance(concurrency, int) or concurrency < 1):
            raise ConfigError("PoolSettings.host_create_concurrency must be a whole number of at least 1 or None, "
                              f"got {concurrency!r}")
        for name in ("max_attempts", "reset_attempts", "create_concurrency"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"PoolSettings.{name} must be a whole number of at least 1, got {value!r}")


@dataclass
class PoolStats:
    """Counters and latency samples since the last ``drain``; mutated on the pool loop only."""

    exec_s: list[float] = field(default_factory=list)
    lease_wait_s: list[float] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)

    def drain(self) -> PoolStats:
        out = PoolStats(self.exec_s, self.lease_wait_s, self.counts)
        self.exec_s, self.lease_wait_s, self.counts = [], [], Counter()
        return out


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]

"""Sandbox metrics of every rank, merged into whole-run values before TRL logs them.

Under ``accelerate launch`` each process (rank) scores its own slice of a batch with its own
pool. TRL averages everything handed to ``log_metric`` over processes (a gathered sum divided by
the number of values), so a count logged per rank comes out as the per-rank *mean*: with two
ranks of 2 completions each, ``sandbox/passed + failed + ... == 2`` for a step that scored 4.

So the trainer does not hand these values to ``log_metric``. Its reward and callback record them
here (``RankMetrics``), each with the rule that merges it; at every ``log()`` (which runs on all
ranks at the same step, on the main thread) the trainer gathers one snapshot per rank with a
single ``gather_object`` and appends the merged values to TRL's ``_metrics`` on every rank. The
values are identical everywhere, so TRL's own averaging leaves them unchanged. With one process
nothing is gathered and every value is what TRL's window mean gave before: a count logged once
per reward call comes out as its mean per call over the logging window.

The rules, per key:

- ``count``: summed over ranks (a per-rank total over the window divided by the number of
  events in it, so that ``logging_steps > 1`` still reads "per step", as it did before).
- ``rate``: numerator and denominator summed over ranks and window, then divided: the pass rate
  of the whole run's completions, not a mean of per-rank rates.
- ``slowest``: each rank's window mean, then the largest over ranks. For a phase that every
  rank waits on at TRL's reward gather (``reward_call_s``), the step takes the slowest rank's time.
- ``weakest``: each rank's window mean, then the smallest (``sandbox/cgroups`` is 1 only when every
  rank's sandboxes were in cgroups).
- ``samples``: the raw latency samples of every rank are gathered and the percentiles computed on
  the merged list. A p95 of p95s (or their max) is not the p95 of the run: with one slow rank the
  max overstates it and the mean hides it. The samples are a few floats per program; a window
  holds at most ``MAX_SAMPLES`` per rank (an even thinning beyond that).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from trl_sandbox.pool.settings import percentile

#: Latency samples kept per key, rank and logging window (evenly thinned beyond this).
MAX_SAMPLES = 20_000

Gather = Callable[[Any], list[Any]]


class _Window:
    """One rank's values for one mode (train or eval) since the last log."""

    def __init__(self) -> None:
        self.sums: dict[str, list[float]] = {}  # key -> [total, events]
        self.slowest: dict[str, list[float]] = {}
        self.weakest: dict[str, list[float]] = {}
        self.rates: dict[str, list[float]] = {}  # key -> [numerator, denominator, value when empty]
        self.samples: dict[str, tuple[list[float], dict[str, float]]] = {}

    def snapshot(self) -> dict[str, Any]:
        return {"sums": self.sums, "slowest": self.slowest, "weakest": self.weakest, "rates": self.rates,
                "samples": self.samples}


class RankMetrics:
    """This rank's sandbox metrics since the last log; ``merge`` turns all ranks' into one set.

    ``mode`` says whether values recorded now belong to training or evaluation (the trainer passes
    ``model.training``), so that an evaluation between two logs does not mix into training's.
    Recording is thread-safe: the reward runs on TRL's event-loop thread, the callback on the main one.
    """

    def __init__(self, mode: Callable[[], str] = lambda: "train") -> None:
        self._mode = mode
        self._lock = threading.Lock()
        self._windows: dict[str, _Window] = {}

    def _window(self) -> _Window:
        return self._windows.setdefault(self._mode(), _Window())

    @staticmethod
    def _add(table: dict[str, list[float]], key: str, value: float) -> None:
        entry = table.setdefault(key, [0.0, 0.0])
        entry[0] += float(value)
        entry[1] += 1.0

    def count(self, key: str, value: float) -> None:
        """A count (or amount, like CPU seconds) of one event; summed over ranks."""
        with self._lock:
            self._add(self._window().sums, key, value)

    def slowest(self, key: str, value: float) -> None:
        """A time every rank waits for; the largest rank mean is logged."""
        with self._lock:
            self._add(self._window().slowest, key, value)

    def weakest(self, key: str, value: float) -> None:
        """A 0/1 property that holds for the run only if it holds on every rank; the smallest is logged."""
        with self._lock:
            self._add(self._window().weakest, key, value)

    def rate(self, key: str, numerator: float, denominator: float, empty: float = 0.0) -> None:
        """A ratio of counts, recomputed from the summed counts; ``empty`` when nothing was counted."""
        with self._lock:
            entry = self._window().rates.setdefault(key, [0.0, 0.0, float(empty)])
            entry[0] += float(numerator)
            entry[1] += float(denominator)

    def samples(self, name: str, values: Iterable[float], percentiles: Mapping[str, float]) -> None:
        """Latency samples; ``percentiles`` maps each logged key to its percentile (``{"x_p95_s": 95}``),
        computed on every rank's samples together (0.0 when there are none)."""
        with self._lock:
            kept, wanted = self._window().samples.setdefault(name, ([], {}))
            kept.extend(float(v) for v in values)
            if len(kept) > MAX_SAMPLES:
                kept[:] = kept[:: -(-len(kept) // MAX_SAMPLES)]
            wanted.update(percentiles)

    def take(self, mode: str) -> dict[str, Any]:
        """This rank's snapshot for ``mode``, emptied for the next window."""
        with self._lock:
            window = self._windows.pop(mode, None)
        return (window or _Window()).snapshot()

    def merge(self, mode: str, gather: Gather | None = None) -> dict[str, float]:
        """The whole run's values for ``mode`` since the last log.

        ``gather(obj) -> [obj of rank 0, obj of rank 1, ...]`` is a collective: every rank must call
        ``merge`` at the same point (the trainer does so in ``log()``), even with nothing recorded.
        Without it (one process) only this rank's values are merged.
        """
        mine = self.take(mode)
        return merge_snapshots(gather(mine) if gather is not None else [mine])


def merge_snapshots(snapshots: list[dict[str, Any]]) -> dict[str, float]:
    """Apply each key's rule over the ranks' snapshots (see the module docstring)."""
    out: dict[str, float] = {}
    for key in sorted({k for s in snapshots for k in s["sums"]}):
        entries = [s["sums"][key] for s in snapshots if key in s["sums"]]
        events = max(e[1] for e in entries)
        out[key] = sum(e[0] for e in entries) / events
    for table, pick in (("slowest", max), ("weakest", min)):
        for key in sorted({k for s in snapshots for k in s[table]}):
            out[key] = pick(s[table][key][0] / s[table][key][1] for s in snapshots if key in s[table])
    for key in sorted({k for s in snapshots for k in s["rates"]}):
        entries = [s["rates"][key] for s in snapshots if key in s["rates"]]
        numerator, denominator = sum(e[0] for e in entries), sum(e[1] for e in entries)
        out[key] = numerator / denominator if denominator else entries[0][2]
    for name in sorted({k for s in snapshots for k in s["samples"]}):
        values: list[float] = []
        wanted: dict[str, float] = {}
        for s in snapshots:
            if name in s["samples"]:
                values.extend(s["samples"][name][0])
                wanted.update(s["samples"][name][1])
        for key, q in wanted.items():
            out[key] = percentile(values, q) if values else 0.0
    return dict(sorted(out.items()))

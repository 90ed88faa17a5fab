"""Reward curves: read a run's ``metrics.jsonl``, plot reward and pass rate per step, measure the gain.

``metrics.jsonl`` holds one JSON object per logged step (written by ``SandboxGRPOTrainer``): TRL's
``reward`` (mean reward of the step's completions) and the trainer's ``sandbox/pass_rate`` (share
of completions that passed every test), among others. Older or foreign files may only carry
``rewards/<name>/mean`` or ``pass_rate``; those are read too.

Only matplotlib is needed (Agg backend, no display), so plots can be drawn on a headless box after
the run, e.g. ``python -m trl_sandbox.commands.plotting out/metrics.jsonl out/rewards.png``.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

REWARD_KEYS = ("reward",)
PASS_RATE_KEYS = ("sandbox/pass_rate", "pass_rate")


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The JSON records of a ``metrics.jsonl`` file, in order (blank and truncated lines skipped)."""
    records = []
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a run killed mid-write leaves a partial last line
            if isinstance(record, dict):
                records.append(record)
    return records


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def reward_of(record: Mapping[str, Any]) -> float | None:
    """The step's mean reward: ``reward``, else the first ``rewards/<name>/mean``; None if absent."""
    for key in REWARD_KEYS:
        if key in record:
            return _number(record[key])
    for key, value in record.items():
        if key.startswith("rewards/") and key.endswith("/mean"):
            return _number(value)
    return None


def pass_rate_of(record: Mapping[str, Any]) -> float | None:
    """The step's pass rate (``sandbox/pass_rate`` or ``pass_rate``); None if absent."""
    for key in PASS_RATE_KEYS:
        if key in record:
            return _number(record[key])
    return None


def _series(records: Iterable[Mapping[str, Any]], getter) -> tuple[list[float], list[float]]:
    steps, values = [], []
    for i, record in enumerate(records):
        value = getter(record)
        if value is None:
            continue
        step = _number(record.get("step"))
        steps.append(step if step is not None else float(i + 1))
        values.append(value)
    return steps, values


def reward_gain(records: Sequence[Mapping[str, Any]] | Sequence[float], window: int = 10) -> dict[str, Any]:
    """Mean reward of the last ``window`` logged steps minus that of the first ``window``.

    ``records`` are metrics records (dicts, as in ``metrics.jsonl``) or plain per-step rewards.
    Steps without a reward are ignored. With fewer than ``2 * window`` rewarded steps the window
    shrinks to half of them, so the two windows never overlap. Returns ``first``, ``last``,
    ``gain``, ``window`` and ``steps`` (the number of rewarded steps); raises ``ValueError`` when
    fewer than two steps carry a reward.
    """
    if window < 1:
        raise ValueError("window must be at least 1")
    rewards: list[float] = []
    for item in records:
        value = reward_of(item) if isinstance(item, Mapping) else _number(item)
        if value is not None:
            rewards.append(value)
    if len(rewards) < 2:
        raise ValueError(f"need at least two steps with a reward to measure a gain, got {len(rewards)}")
    w = min(window, len(rewards) // 2)
    first = sum(rewards[:w]) / w
    last = sum(rewards[-w:]) / w
    return {"first": first, "last": last, "gain": last - first, "window": w, "steps": len(rewards)}


def _moving_average(values: Sequence[float], width: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= width:
            total -= values[i - width]
        out.append(total / min(i + 1, width))
    return out


def plot_rewards(
    metrics_jsonl_path: str | Path,
    png_path: str | Path,
    *,
    title: str | None = None,
    window: int = 10,
) -> Path:
    """Draw mean reward and pass rate per step from ``metrics_jsonl_path`` into ``png_path``.

    Each series is drawn per step (thin) and as a moving average over ``window`` steps (thick).
    The title states the reward gain (first ``window`` steps vs last ``window``) when there are
    enough steps. Raises ``ValueError`` when no record carries a reward or a pass rate.
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_jsonl_path)
    reward_steps, rewards = _series(records, reward_of)
    pass_steps, pass_rates = _series(records, pass_rate_of)
    if not rewards and not pass_rates:
        raise ValueError(f"{metrics_jsonl_path}: no record has a reward or a pass rate")

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    width = max(1, min(window, max(len(rewards), len(pass_rates)) // 4 or 1))
    if rewards:
        ax.plot(reward_steps, rewards, color="tab:blue", alpha=0.3, linewidth=1)
        ax.plot(reward_steps, _moving_average(rewards, width), color="tab:blue", linewidth=2,
                label=f"mean reward ({width}-step average)")
    if pass_rates:
        ax.plot(pass_steps, pass_rates, color="tab:green", alpha=0.3, linewidth=1)
        ax.plot(pass_steps, _moving_average(pass_rates, width), color="tab:green", linewidth=2,
                label=f"pass rate ({width}-step average)")
    ax.axhline(0.0, color="grey", linewidth=0.5)
    ax.set_xlabel("training step")
    ax.set_ylabel("mean reward / pass rate")
    lows = [v for v in (*rewards, *pass_rates)]
    ax.set_ylim(min(-1.05, min(lows) - 0.05), max(1.05, max(lows) + 0.05))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    if title is None:
        title = "GRPO with sandbox rewards"
        if len(rewards) >= 2:
            g = reward_gain(rewards, window=window)
            title += (f": mean reward {g['first']:+.2f} (first {g['window']} steps) -> "
                      f"{g['last']:+.2f} (last {g['window']}), gain {g['gain']:+.2f}")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path)
    plt.close(fig)
    return png_path


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) not in (1, 2):
        print("usage: python -m trl_sandbox.commands.plotting METRICS.jsonl [OUT.png]", file=sys.stderr)
        return 2
    src = Path(argv[0])
    dst = Path(argv[1]) if len(argv) == 2 else src.with_name("rewards.png")
    plot_rewards(src, dst)
    records = read_metrics(src)
    try:
        g = reward_gain(records)
        print(f"mean reward: first {g['window']} steps {g['first']:+.3f} -> last {g['window']} "
              f"{g['last']:+.3f} (gain {g['gain']:+.3f}, {g['steps']} steps)")
    except ValueError as exc:
        print(str(exc))
    print(f"plot: {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

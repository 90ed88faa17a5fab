"""What a person watching a training run sees: a progress bar with reward and pass rate, and a summary."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback


class RewardProgressCallback(TrainerCallback):
    """Replaces transformers' progress bar (which prints raw log dicts) with reward and pass rate."""

    def __init__(self) -> None:
        self.bar = None
        self.last: dict[str, float] = {}

    def install(self, trainer) -> None:
        trainer.remove_callback(ProgressCallback)
        trainer.remove_callback(PrinterCallback)

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero and not args.disable_tqdm:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=state.max_steps, desc="GRPO", unit="step", dynamic_ncols=True)

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return
        for key, short in (("reward", "reward"), ("sandbox/pass_rate", "pass"), ("sandbox/reward_call_s", "reward_s")):
            if isinstance(logs.get(key), (int, float)):
                self.last[short] = float(logs[key])
        if self.bar is not None and self.last:
            self.bar.set_postfix({k: f"{v:.3f}" for k, v in self.last.items()}, refresh=False)

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


@dataclass
class Summary:
    text: str
    data: dict[str, Any]


def summarize(trainer, elapsed_s: float, metrics_path: Path | None, plot_path: Path | None) -> Summary:
    from trl_sandbox.commands.plotting import read_metrics, reward_gain

    records = read_metrics(metrics_path) if metrics_path else []
    step_records = [r for r in records if "reward" in r]
    gain = reward_gain(step_records) if len(step_records) >= 2 else None
    totals: dict[str, float] = {}
    for record in step_records:
        for key, value in record.items():
            if key.startswith("sandbox/") and isinstance(value, (int, float)):
                totals[key] = totals.get(key, 0.0) + float(value)
    n = max(1, len(step_records))
    data = {
        "steps": trainer.state.global_step,
        "train_seconds": round(elapsed_s, 1),
        "reward_first": gain["first"] if gain else None,
        "reward_last": gain["last"] if gain else None,
        "reward_gain": gain["gain"] if gain else None,
        "window": gain["window"] if gain else None,
        "outcomes": {
            k.split("/", 1)[1]: round(totals.get(k, 0.0), 2)
            for k in ("sandbox/passed", "sandbox/failed", "sandbox/error", "sandbox/timeout",
                      "sandbox/banned", "sandbox/no_code", "sandbox/infra")
        },
        "mean_pass_rate": round(totals.get("sandbox/pass_rate", 0.0) / n, 4),
        "mean_reward_call_s": round(totals.get("sandbox/reward_call_s", 0.0) / n, 4),
        "mean_reward_time_share": round(totals.get("sandbox/reward_time_share", 0.0) / n, 4),
        "metrics": str(metrics_path) if metrics_path else None,
        "plot": str(plot_path) if plot_path else None,
    }
    lines = [
        "",
        f"Training finished: {data['steps']} steps in {data['train_seconds']:.0f} s",
    ]
    if gain:
        lines.append(
            f"  mean reward: first {gain['window']} steps {gain['first']:+.3f} -> last {gain['window']} steps "
            f"{gain['last']:+.3f} (gain {gain['gain']:+.3f})"
        )
    lines.append(
        "  outcomes (summed over logged steps): "
        + ", ".join(f"{k} {v:g}" for k, v in data["outcomes"].items())
    )
    lines.append(
        f"  pass rate {data['mean_pass_rate']:.3f}; reward call {data['mean_reward_call_s'] * 1000:.0f} ms mean; "
        f"rewards took {data['mean_reward_time_share'] * 100:.0f}% of step time"
    )
    if metrics_path:
        lines.append(f"  metrics: {metrics_path}")
    if plot_path:
        lines.append(f"  plot:    {plot_path}")
    return Summary("\n".join(lines), data)

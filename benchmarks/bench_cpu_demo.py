"""The CPU demo end to end: ``trl-sandbox train --preset cpu-demo``, timed, on one or more seeds.

    .venv/bin/python benchmarks/bench_cpu_demo.py [--seeds 0,1,2] [--max-steps N] [--window 10]

Each seed is a separate ``trl-sandbox train`` process (as a user runs it on a fresh machine: the
in-process model and tokenizer, the warm start, GRPO with local-sandbox rewards), with
``--seed_preset S --seed S``. Per seed it records the wall time of the whole command, the warm
start and GRPO times, the mean reward and pass rate of the first and last ``window`` steps and the
gain, read back from the run's ``metrics.jsonl``. The goal (the README's main command): a gain of
at least 0.3 within 10 minutes on 2 cores. Prints a table and writes
``benchmarks/results/cpu_demo.json`` with the machine it ran on (the load average is part of it:
on a shared machine other people's work slows the run down).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import machine

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trl_sandbox.commands.plotting import pass_rate_of, read_metrics, reward_gain, reward_of  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "cpu_demo.json"
GOAL_GAIN = 0.3
GOAL_SECONDS = 600.0


def window_mean(values: list[float], window: int, last: bool) -> float | None:
    if not values:
        return None
    w = min(window, max(1, len(values) // 2))
    chunk = values[-w:] if last else values[:w]
    return sum(chunk) / len(chunk)


def run_seed(seed: int, out_dir: Path, max_steps: int | None, window: int) -> dict:
    cmd = [sys.executable, "-m", "trl_sandbox.commands.cli", "train", "--preset", "cpu-demo",
           "--output_dir", str(out_dir), "--seed_preset", str(seed), "--seed", str(seed)]
    if max_steps is not None:
        cmd += ["--max_steps", str(max_steps)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false"}
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    result: dict = {"seed": seed, "exit_code": proc.returncode, "wall_s": round(wall, 1),
                    "loadavg_1min": [round(load0, 2), round(os.getloadavg()[0], 2)]}
    if proc.returncode != 0:
        result["error"] = proc.stderr[-2000:]
        return result
    records = read_metrics(out_dir / "metrics.jsonl")
    rewards = [r for r in (reward_of(x) for x in records) if r is not None]
    passes = [p for p in (pass_rate_of(x) for x in records) if p is not None]
    gain = reward_gain(records, window=window)
    summary = json.loads((out_dir / "summary.json").read_text()) if (out_dir / "summary.json").exists() else {}
    warm = json.loads((out_dir / "warm_start.json").read_text()) if (out_dir / "warm_start.json").exists() else {}
    result.update(
        steps=len(rewards),
        warm_start_s=warm.get("seconds"),
        warm_start_loss=round(warm["final_loss"], 4) if warm.get("final_loss") is not None else None,
        grpo_s=summary.get("train_seconds"),
        window=gain["window"],
        reward_first=round(gain["first"], 4),
        reward_last=round(gain["last"], 4),
        reward_gain=round(gain["gain"], 4),
        pass_first=round(window_mean(passes, window, last=False), 4) if passes else None,
        pass_last=round(window_mean(passes, window, last=True), 4) if passes else None,
        mean_reward_call_s=summary.get("mean_reward_call_s"),
        reward_time_share=summary.get("mean_reward_time_share"),
        plot_written=(out_dir / "rewards.png").exists(),
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (model init, warm start, sampling)")
    parser.add_argument("--max-steps", type=int, default=None, help="GRPO steps (default: the preset's)")
    parser.add_argument("--window", type=int, default=10, help="steps averaged at each end for the gain")
    parser.add_argument("--keep", type=Path, default=None, help="keep each run's output under this directory")
    parser.add_argument("--output", type=Path, default=RESULTS, help="where to write the JSON results")
    args = parser.parse_args()

    from trl_sandbox.training.presets.cpu_demo import CONFIG_OVERRIDES, MODEL_CONFIG, WARM_START

    info = machine(("torch", "transformers", "trl"))
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-cpu-demo-") as tmp:
        base = args.keep or Path(tmp)
        for seed in seeds:
            out_dir = base / f"seed{seed}"
            print(f"seed {seed}: trl-sandbox train --preset cpu-demo ...", flush=True)
            runs.append(run_seed(seed, out_dir, args.max_steps, args.window))
            r = runs[-1]
            if r["exit_code"] != 0:
                print(f"  failed (exit {r['exit_code']}):\n{r.get('error', '')}", flush=True)
            else:
                print(f"  {r['wall_s']:.0f} s, reward {r['reward_first']:+.3f} -> {r['reward_last']:+.3f} "
                      f"(gain {r['reward_gain']:+.3f})", flush=True)
    info["loadavg_at_end"] = os.getloadavg()

    header = (f"{'seed':>4} {'steps':>5} {'wall s':>7} {'warm s':>7} {'grpo s':>7} {'reward first':>12} "
              f"{'reward last':>11} {'gain':>7} {'pass first':>10} {'pass last':>9}")
    print()
    print(header)
    print("-" * len(header))
    ok = [r for r in runs if r["exit_code"] == 0]
    for r in runs:
        if r["exit_code"] != 0:
            print(f"{r['seed']:>4} failed (exit {r['exit_code']})")
            continue
        print(f"{r['seed']:>4} {r['steps']:>5} {r['wall_s']:>7.0f} {r['warm_start_s'] or 0:>7.0f} "
              f"{r['grpo_s'] or 0:>7.0f} {r['reward_first']:>+12.3f} {r['reward_last']:>+11.3f} "
              f"{r['reward_gain']:>+7.3f} {r['pass_first'] or 0:>10.2f} {r['pass_last'] or 0:>9.2f}")
    met = [r for r in ok if r["reward_gain"] >= GOAL_GAIN and r["wall_s"] <= GOAL_SECONDS]
    print(f"\ngoal (gain >= {GOAL_GAIN} within {GOAL_SECONDS / 60:.0f} min): met on {len(met)}/{len(runs)} seeds; "
          f"{info['cores']} cores, {info['cpu_model']}, load average "
          f"{info['loadavg_at_start'][0]:.2f} -> {info['loadavg_at_end'][0]:.2f}")

    report = {
        "benchmark": "cpu_demo",
        "command": "trl-sandbox train --preset cpu-demo --seed_preset S --seed S",
        "goal": {"min_gain": GOAL_GAIN, "max_seconds": GOAL_SECONDS, "window": args.window},
        "recipe": {"config_overrides": CONFIG_OVERRIDES, "model": MODEL_CONFIG, "warm_start": WARM_START.__dict__},
        "max_steps_override": args.max_steps,
        "machine": info,
        "runs": runs,
        "goal_met": len(met),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"results: {args.output}")
    return 0 if ok and len(ok) == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())

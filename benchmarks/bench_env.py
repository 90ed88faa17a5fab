"""Prepared environments on the local sandbox: one build and a copy-on-write copy per lease, next to
the two obvious ways, side by side in one run.

    .venv/bin/python benchmarks/bench_env.py [--rows 4] [--programs 8] [--pool 4] [--mb 70]

Each of ``rows`` rows has its own environment of about ``mb`` MB in about 4,900 files (a
generated tree of the size and file count of a small repository with its virtual environment:
``python3 -m venv`` plus generated modules and data), whose setup takes several seconds. Every row
runs ``programs`` programs (a GRPO group) that read a file of the tree and count its entries.
The ways:

* ``trl-sandbox``: the row's ``environment`` column; built once per row, every program in its own
  overlay (``SandboxPool.aexec(environment=...)``).
* ``setup in every lease``: each program runs the setup itself in its empty working directory first.
* ``cp -a per lease``: the prepared tree (built once, bound read-only into the sandboxes) copied into
  each program's working directory first.

Reported: wall seconds for all rows (builds included for trl-sandbox), seconds per group after the
build, builds made, and the per-lease overhead (trl-sandbox: mounting the copy, from the pool's
``env/lease_ms``; cp -a: the copy's own time inside the program). Writes
``benchmarks/results/env.json`` with the machine and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from machine import machine

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trl_sandbox.environments.cache import remove_tree  # noqa: E402
from trl_sandbox.environments.spec import parse  # noqa: E402
from trl_sandbox.plugins import make_provider  # noqa: E402
from trl_sandbox.pool.sandbox_pool import SandboxPool  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "env.json"

GENERATE = """import os, random, sys
random.seed(int(sys.argv[1]))
total, target, i = 0, int(sys.argv[2]) << 20, 0
while total < target:
    d = "src/pkg%d/sub%d" % (i % 40, i % 7)
    os.makedirs(d, exist_ok=True)
    size = random.choice((800, 2000, 6000, 50000))
    with open("%s/m%d.py" % (d, i), "w") as f:
        f.write("# %d\\n" % i + "x = 1\\n" * (size // 6))
    total += size
    i += 1
"""
PROGRAM = "cat src/pkg0/sub0/m0.py > /dev/null && find . -type f | wc -l"


def environment(row: int, mb: int) -> dict:
    return {"files": {"README.md": f"row {row}\n", "generate.py": GENERATE},
            "setup": ["python3 -m venv --without-pip venv", f"python3 generate.py {row} {mb}", "sleep 2"]}


async def run_way(pool: SandboxPool, way: str, rows: int, programs: int, mb: int, trees: list[str]) -> dict:
    groups, copy_ms = [], []
    t_all = time.perf_counter()
    for row in range(rows):
        spec = parse(environment(row, mb))
        if way == "trl-sandbox":
            await pool.prepare_environment(spec)  # the build, outside the group's time (once per key)
        t0 = time.perf_counter()
        if way == "trl-sandbox":
            jobs = [pool.aexec(["/bin/sh", "-c", PROGRAM], timeout=60, environment=spec) for _ in range(programs)]
        elif way == "setup in every lease":
            script = " && ".join(f"( {cmd} )" for cmd in spec.setup) + " && " + PROGRAM
            files = [(p, t.encode()) for p, t in spec.files]
            jobs = [pool.aexec(["/bin/sh", "-c", script], timeout=300, files=files) for _ in range(programs)]
        else:
            script = ("s=$(date +%s%N); cp -a /prepared/. . ; e=$(date +%s%N); echo copy_ns=$((e - s)) >&2; "
                      + PROGRAM)
            jobs = [pool.aexec(["/bin/sh", "-c", script.replace("/prepared", f"/prepared{row}")], timeout=120)
                    for _ in range(programs)]
        results = await asyncio.gather(*jobs)
        groups.append(time.perf_counter() - t0)
        counts = {r.stdout.strip() for r in results}
        bad = [r for r in results if r.exit_code != 0]
        if bad:
            raise RuntimeError(f"{way}: a program failed: {bad[0].stderr[-500:]}")
        if len(counts) != 1:
            raise RuntimeError(f"{way}: programs of one row saw different trees: {counts}")
        for r in results:
            for line in r.stderr.splitlines():
                if line.startswith("copy_ns="):
                    copy_ms.append(int(line.split("=")[1]) / 1e6)
    out = {"way": way, "total_s": time.perf_counter() - t_all, "group_s": statistics.median(groups)}
    if way == "trl-sandbox":
        metrics = pool.environment_metrics()
        out.update(builds=int(metrics.get("env/builds", 0)), build_s=metrics.get("env/build_s", 0.0),
                   lease_ms=metrics.get("env/lease_ms_p50"))
    elif copy_ms:
        out["lease_ms"] = statistics.median(copy_ms)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--programs", type=int, default=8)
    parser.add_argument("--pool", type=int, default=4)
    parser.add_argument("--mb", type=int, default=70)
    args = parser.parse_args()
    cache = Path(tempfile.mkdtemp(prefix="trl-sandbox-bench-env-", dir="/var/tmp"))
    os.chmod(cache, 0o755)
    settings = {"environment_cache": str(cache), "work_size_mb": max(256, 3 * args.mb)}
    rows = []
    try:
        provider = make_provider("local", settings)
        with SandboxPool.open(provider, size=args.pool) as pool:
            rows.append(pool.loop.run(run_way(pool, "trl-sandbox", args.rows, args.programs, args.mb, [])))
            rows.append(pool.loop.run(run_way(pool, "setup in every lease", args.rows, args.programs, args.mb, [])))
        trees = sorted(str(p) for p in cache.glob("*/tree"))
        binds = [[tree, f"/prepared{i}"] for i, tree in enumerate(trees)]
        provider = make_provider("local", {**settings, "extra_ro_binds": binds})
        with SandboxPool.open(provider, size=args.pool) as pool:
            rows.append(pool.loop.run(run_way(pool, "cp -a per lease", args.rows, args.programs, args.mb, trees)))
    finally:
        remove_tree(cache)
    base = {r["way"]: r for r in rows}
    ours = base["trl-sandbox"]["group_s"]
    print(f"\n{args.rows} rows x {args.programs} programs, an environment of about {args.mb} MB per row, "
          f"pool of {args.pool}\n")
    print("| way | all rows (s) | one group (s) | group vs trl-sandbox | builds | per-lease overhead (ms) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        lease = f"{r['lease_ms']:.1f}" if r.get("lease_ms") is not None else "-"
        print(f"| {r['way']} | {r['total_s']:.1f} | {r['group_s']:.2f} | {r['group_s'] / ours:.1f}x | "
              f"{r.get('builds', '-')} | {lease} |")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"machine": machine(), "args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

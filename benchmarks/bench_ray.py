"""The judged path through the ``ray`` provider next to ``local`` at the same number of sandboxes, in
one run: programs/s, the latency each exec gains by going through Ray, and the pool's start time.

    .venv/bin/python benchmarks/bench_ray.py [--repeat N] [--sandboxes K] [--rounds R] [--nodes 1,2,4]
                                             [--round-trips N] [--cpus-per-sandbox C]

A Ray cluster runs on this machine, on loopback, as the plugin's tests start it
(``ray.cluster_utils.Cluster``): a head without CPUs and ``--nodes`` worker nodes, each offering
``os.cpu_count()`` CPUs and K units of the custom resource ``sandbox``; every node's raylet, the GCS,
the dashboard and the agents share this machine's cores with the sandboxes, as they would on a
one-machine deployment. For every node count in ``--nodes`` the cluster is resized to it and the ray
side runs; the local side runs once per round; the sides alternate over R rounds (the order flips
every round) so that the load of a shared machine falls on both alike.

Measured:

* the judged path, each side: HumanEval's canonical solutions (164 x ``--repeat``, each repeat a
  concurrent ``ascore`` call, as ``bench_local.py`` runs it) scored by ``Scorer(pool, cache_size=0)``
  on a ``SandboxPool`` of K sandboxes; every outcome must be "passed". With it, the CPU each kind of
  process spent per program (the sandboxes, the sandbox actors' Ray workers, Ray's own processes,
  this driver) and the whole machine's;
* the pool's start, each side: building the provider plus ``pool.start(wait=True)`` (the first
  sandbox up) and until all K are up;
* exec round trips, after each ray side: ``--round-trips`` sequential ``["true"]`` and
  ``["python3", "-c", "pass"]`` on one warm local sandbox and one warm ray sandbox (made with
  ``provider.create``), interleaved call by call with a bare Ray actor call (an async actor's
  ``ping`` on a worker node, awaited as the provider awaits its calls, and with ``ray.get``) so that
  the machine's drift falls on all alike; the added latency is ray's p50 (p95) minus local's;
* ``true`` timed inside a Ray worker on a node (a local sandbox made there, no Ray call on the
  path), at the niceness Ray gives its workers and reniced to 0: what of the added latency is the
  sandbox's own exec on the node and what is the call through Ray;
* memory while the pool is up: RSS and PSS of this process's descendants by kind, and per sandbox
  (bwrap + supervisor; through ray also the actor's worker).

Goals (the issue): added latency per exec at most 2 ms at p50, and the judged path's programs/s
through ray at least 0.7x local's at equal sandboxes. Prints a table and PASS/FAIL per goal, checks
that no bwrap and no Ray process of this run outlives it, and writes ``benchmarks/results/ray.json``
with the machine it ran on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from machine import machine

# Ray would advertise the machine's outward address (found by routing toward 8.8.8.8); only
# loopback is reachable here, and this keeps a one-machine cluster on it. Before Ray is imported.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trl_sandbox.local import LocalProvider  # noqa: E402
from trl_sandbox.pool.sandbox_pool import SandboxPool, percentile  # noqa: E402
from trl_sandbox.sandbox import SandboxSpec  # noqa: E402
from trl_sandbox.scoring.scorer import Scorer  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "ray.json"
TIMEOUT = 3.0  # seconds per program, as bench_local.py
NAMESPACE = "trl-sandbox"
GOAL_ADDED_P50_MS = 2.0
GOAL_RATIO = 0.7
COMMANDS = {"true": ["true"], "python3 -c pass": ["python3", "-c", "pass"]}


# -- the cluster --------------------------------------------------------------------------------


class LoopbackCluster:
    """A head without CPUs and worker nodes resized on demand, all on 127.0.0.1."""

    def __init__(self, sandboxes: int) -> None:
        import ray
        from ray.cluster_utils import Cluster

        # ``Cluster`` writes its address to /tmp/ray/ray_current_cluster (what ``address="auto"``
        # finds) and deletes the file at shutdown: another cluster's address there is put back.
        self._address_file = Path(ray._common.utils.get_ray_address_file(None))
        self._previous = self._address_file.read_text() if self._address_file.exists() else None
        t0 = time.perf_counter()
        self.cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "node_ip_address": "127.0.0.1"})
        self._restore_address()
        self.sandboxes = sandboxes
        self.workers: list[Any] = []
        self.head_s = time.perf_counter() - t0
        ray.init(address=self.cluster.address, namespace=NAMESPACE, log_to_driver=False, logging_level="WARNING")
        self.session = self.cluster.head_node.session_name

    def _restore_address(self) -> None:
        if self._previous is not None:
            self._address_file.write_text(self._previous)

    @property
    def address(self) -> str:
        return self.cluster.address

    def resize(self, nodes: int) -> float:
        """Exactly ``nodes`` worker nodes; the seconds it took."""
        t0 = time.perf_counter()
        changed = False
        while len(self.workers) < nodes:
            self.workers.append(self.cluster.add_node(num_cpus=os.cpu_count(), resources={"sandbox": self.sandboxes},
                                                      node_ip_address="127.0.0.1"))
            changed = True
        while len(self.workers) > nodes:
            self.cluster.remove_node(self.workers.pop())
            changed = True
        if changed:
            self.cluster.wait_for_nodes()
            self._wait_alive(nodes)
        return time.perf_counter() - t0

    def _wait_alive(self, nodes: int) -> None:
        """Until the GCS itself lists ``nodes`` live worker nodes (the provider's capacity reads it)."""
        import ray

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            alive = [n for n in ray.nodes() if n.get("Alive") and (n.get("Resources") or {}).get("sandbox")]
            if len(alive) == nodes:
                return
            time.sleep(0.1)
        raise RuntimeError(f"the cluster did not reach {nodes} live worker nodes")

    def shutdown(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        self.cluster.shutdown()
        self._restore_address()


# -- processes and memory -----------------------------------------------------------------------


def descendants() -> list[Any]:
    import psutil

    return psutil.Process().children(recursive=True)


def kinds() -> dict[Any, str]:
    """This process's descendants, each with its kind.

    ``sandboxes``: every bwrap and what runs in it (the supervisor, the resident judge, programs);
    ``sandbox actor workers``: the Ray workers holding a sandbox (``ray::SandboxActor``);
    ``ray idle workers``: Ray workers holding nothing (``ray::IDLE``, prestarted or left);
    ``ray processes``: the GCS, raylets, dashboard, agents, monitors, other Ray workers;
    ``other``: anything else. Only descendants count: another Ray cluster on the machine does not.
    """
    import psutil

    procs = descendants()
    in_sandbox: set[int] = set()
    for p in procs:
        try:
            if p.name() == "bwrap":
                in_sandbox.add(p.pid)
                in_sandbox.update(c.pid for c in p.children(recursive=True))
        except psutil.Error:
            pass
    out = {}
    for p in procs:
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if p.pid in in_sandbox:
            out[p] = "sandboxes"
        elif cmd.startswith("ray::SandboxActor"):
            out[p] = "sandbox actor workers"
        elif cmd.startswith("ray::IDLE"):
            out[p] = "ray idle workers"
        elif "ray" in cmd:
            out[p] = "ray processes"
        else:
            out[p] = "other"
    return out


def cpu_of_kinds() -> dict[int, tuple[str, float]]:
    """CPU seconds so far of each descendant (with the children it reaped: a sandbox's programs)."""
    import psutil

    out = {}
    for p, kind in kinds().items():
        try:
            t = p.cpu_times()
            out[p.pid] = (kind, t.user + t.system + t.children_user + t.children_system)
        except psutil.Error:
            pass
    return out


def cpu_delta(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds spent between two ``cpu_of_kinds`` by kind (processes that ended in between lost)."""
    out: dict[str, float] = {}
    for pid, (kind, cpu) in after.items():
        out[kind] = out.get(kind, 0.0) + cpu - before.get(pid, (kind, 0.0))[1]
    return out


def memory_by_kind() -> dict[str, dict[str, float]]:
    """RSS and PSS (MB) of this process's descendants, by kind (``kinds``), while the pool is up; and
    per sandbox (the outermost bwrap and its tree; through ray, the actor's worker above it too) with
    the sandbox's niceness, which it inherits from whatever started it."""
    import psutil

    found = kinds()
    out: dict[str, Any] = {}
    per_sandbox: list[dict[str, float]] = []
    for p, kind in found.items():
        try:
            mem = p.memory_full_info()
        except psutil.Error:
            continue
        row = out.setdefault(kind, {"count": 0, "rss_mb": 0.0, "pss_mb": 0.0})
        row["count"] += 1
        row["rss_mb"] += mem.rss / 2**20
        row["pss_mb"] += getattr(mem, "pss", 0) / 2**20
    for p in found:
        try:
            parent = p.parent()
            if p.name() != "bwrap" or (parent is not None and parent.name() == "bwrap"):
                continue
            tree = [p, *p.children(recursive=True)]
            rss = sum(q.memory_info().rss for q in tree) / 2**20
            actor = parent.memory_info().rss / 2**20 if parent and found.get(parent) == "sandbox actor workers" else 0.0
            per_sandbox.append({"sandbox_rss_mb": rss, "actor_worker_rss_mb": actor, "nice": p.nice()})
        except psutil.Error:
            pass
    out["_per_sandbox"] = {
        "sandbox_rss_mb": statistics.mean(s["sandbox_rss_mb"] for s in per_sandbox) if per_sandbox else 0.0,
        "actor_worker_rss_mb": statistics.mean(s["actor_worker_rss_mb"] for s in per_sandbox) if per_sandbox else 0.0,
        "nice": sorted({s["nice"] for s in per_sandbox}),
        "count": len(per_sandbox),
    }
    return out


def machine_busy_s() -> float:
    """Seconds of CPU the whole machine has spent busy (all processes, /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


# -- the measured paths -------------------------------------------------------------------------


def humaneval_work() -> tuple[list[str], list[dict]]:
    from trl_sandbox_humaneval import HumanEvalTasks, problems

    by_id = problems()
    rows = [dict(r, sandbox_task="humaneval") for r in HumanEvalTasks().rows()]
    return [by_id[r["task_id"]]["canonical_solution"] for r in rows], rows


async def all_repeats(scorer: Scorer, completions: list[str], rows: list[dict], repeat: int) -> list:
    """``repeat`` concurrent ``ascore`` calls over the same completions: their outcomes, flat."""
    scored = await asyncio.gather(*(scorer.ascore(completions, rows) for _ in range(repeat)))
    return [o for outcomes, _ in scored for o in outcomes]


def run_judged(make: Callable[[], Any], completions: list[str], rows: list[dict], repeat: int,
               sandboxes: int) -> dict:
    """Pool start, then the judged path (pool + scorer + the judge program), then the pool's close."""
    t0 = time.perf_counter()
    provider = make()
    built = time.perf_counter() - t0
    pool = SandboxPool(provider, size=sandboxes, made_by="benchmark")
    try:
        pool.start(wait=True)
        first = time.perf_counter() - t0
        deadline = time.monotonic() + 120
        while pool.members < sandboxes and time.monotonic() < deadline:
            time.sleep(0.002)
        full = time.perf_counter() - t0
        scorer = Scorer(pool, cache_size=0)
        scorer.score(completions[:sandboxes], rows[:sandboxes])  # warm-up: each sandbox's judge starts
        pool.drain_stats()
        kinds0, busy0, host0 = cpu_of_kinds(), machine_busy_s(), time.process_time()
        start = time.perf_counter()
        outcomes = pool.loop.run(all_repeats(scorer, completions, rows, repeat))
        elapsed = time.perf_counter() - start
        busy, host = machine_busy_s() - busy0, time.process_time() - host0
        by_kind = cpu_delta(kinds0, cpu_of_kinds())
        counts = dict(pool.drain_stats().counts)
        memory = memory_by_kind()
    finally:
        t1 = time.perf_counter()
        pool.close()
        closed = time.perf_counter() - t1
    bad = [f"{r['task_id']}: {o.status} {str(o.detail)[:120]}" for o, r in zip(outcomes, rows * repeat)
           if o.status != "passed"]
    return {
        "elapsed": elapsed, "count": len(outcomes), "passed": len(outcomes) - len(bad), "failures": bad[:5],
        "programs_per_s": len(outcomes) / elapsed,
        "pool_start_s": {"provider": built, "first_ready": first, "all_ready": full, "close": closed},
        "machine_cpu_ms_per_program": 1000 * busy / len(outcomes),
        "driver_cpu_ms_per_program": 1000 * host / len(outcomes),
        "cpu_ms_per_program_by_kind": {k: 1000 * v / len(outcomes) for k, v in sorted(by_kind.items())},
        "pool_counts": {k: v for k, v in counts.items() if v},
        "memory": memory,
    }


def summary(times: list[float]) -> dict:
    return {"p50_ms": 1000 * percentile(times, 50), "p95_ms": 1000 * percentile(times, 95),
            "mean_ms": 1000 * statistics.mean(times), "n": len(times)}


def latency(make_ray: Callable[[], Any], n: int) -> dict:
    """Sequential round trips, interleaved so that the machine's drift falls on all alike: each of
    ``n`` turns runs, in an order that rotates every turn, every command of ``COMMANDS`` once on a
    warm local sandbox and once on a warm ray sandbox, and one bare Ray actor call (a trivial async
    actor's ``ping`` on a worker node, awaited as the provider awaits its calls) and one ``ray.get``
    of it. Added latency: ray's p50 (p95) minus local's, from this same interleaved run."""
    import ray

    @ray.remote(num_cpus=0, resources={"sandbox": 0.01})
    class Ping:
        async def ping(self) -> None:
            return None

    async def go() -> dict:
        local_provider, ray_provider = LocalProvider(), make_ray()
        handle = Ping.remote()
        boxes: dict[str, Any] = {}
        try:
            boxes["local"] = await local_provider.create(SandboxSpec(tags={"bench": "round-trips"}))
            boxes["ray"] = await ray_provider.create(SandboxSpec(tags={"bench": "round-trips"}))

            async def exec_on(which: str, argv: list[str]) -> None:
                result = await boxes[which].exec(argv, timeout=TIMEOUT)
                if result.exit_code != 0:
                    raise RuntimeError(f"{argv} on {which}: exit {result.exit_code}: {result.stderr[-200:]}")

            async def ping_get() -> None:
                ray.get(handle.ping.remote())

            steps: list[tuple[str, Callable[[], Any]]] = [("bare actor call, await", lambda: handle.ping.remote()),
                                                          ("bare actor call, ray.get", ping_get)]
            for label, argv in COMMANDS.items():
                for which in ("local", "ray"):
                    steps.append((f"{which}: {label}", lambda w=which, a=argv: exec_on(w, a)))
            times: dict[str, list[float]] = {label: [] for label, _ in steps}
            for turn in range(n + 10):  # the first 10 turns warm everything up and are not kept
                k = turn % len(steps)
                for label, step in steps[k:] + steps[:k]:
                    t = time.perf_counter()
                    await step()
                    if turn >= 10:
                        times[label].append(time.perf_counter() - t)
            out: dict[str, Any] = {label: summary(ts) for label, ts in times.items()}
            out["isolation_mode"] = {"local": local_provider.isolation_mode,
                                     "ray": boxes["ray"]._info["isolation_mode"]}
            return out
        finally:
            for which, provider in (("local", local_provider), ("ray", ray_provider)):
                if which in boxes:
                    await provider.destroy(boxes[which].id)
                await provider.aclose()
            ray.kill(handle, no_restart=True)

    return asyncio.run(go())


def exec_inside_an_actor(n: int) -> dict:
    """The local sandbox's ``true`` round trip timed inside a Ray worker on a worker node, with no Ray
    call on the path: once at the niceness Ray gives its workers (which the sandbox inherits), once
    with the worker's threads reniced to 0 before the sandbox starts. Splits the added latency into
    Ray's call and the sandbox's own exec on the node."""
    import ray

    @ray.remote(num_cpus=0, resources={"sandbox": 0.01})
    class Timer:
        async def trips(self, n: int, renice: bool) -> dict:
            from trl_sandbox_ray.actor import _lower_oom_score

            from trl_sandbox.local import LocalProvider
            from trl_sandbox.sandbox import SandboxSpec

            _lower_oom_score()  # as the sandbox actor does: Ray starts workers at oom_score_adj 1000
            before = os.getpriority(os.PRIO_PROCESS, 0)
            if renice:
                try:
                    for tid in os.listdir("/proc/self/task"):
                        os.setpriority(os.PRIO_PROCESS, int(tid), 0)
                except OSError as exc:
                    return {"error": f"renice: {exc}", "worker_nice": before}
            provider = LocalProvider()
            box = await provider.create(SandboxSpec())
            try:
                for _ in range(10):
                    await box.exec(["true"], timeout=TIMEOUT)
                times = []
                for _ in range(n):
                    t = time.perf_counter()
                    await box.exec(["true"], timeout=TIMEOUT)
                    times.append(time.perf_counter() - t)
            finally:
                await provider.destroy(box.id)
                await provider.aclose()
            return {**summary(times), "worker_nice": before, "sandbox_nice": os.getpriority(os.PRIO_PROCESS, 0)}

    handle = Timer.remote()
    try:
        return {"as_started": ray.get(handle.trips.remote(n, False), timeout=300),
                "reniced_to_0": ray.get(handle.trips.remote(n, True), timeout=300)}
    finally:
        ray.kill(handle, no_restart=True)


# -- main ---------------------------------------------------------------------------------------


def pooled_rate(runs: list[dict]) -> float:
    return sum(r["count"] for r in runs) / sum(r["elapsed"] for r in runs)


def paired_ratios(ray_runs: list[dict], local_runs: list[dict]) -> list[float]:
    """Ray's programs/s over the same round's local programs/s."""
    return [r["programs_per_s"] / loc["programs_per_s"] for r, loc in zip(ray_runs, local_runs)]


def added(phases: list[dict], command: str, q: str) -> list[float]:
    """Ray's round trip minus local's (ms) in each interleaved latency run, at percentile ``q``."""
    return [x[f"ray: {command}"][q] - x[f"local: {command}"][q] for x in phases]


def median_of(phases: list[dict], label: str) -> dict[str, float]:
    return {q: statistics.median(x[label][q] for x in phases) for q in ("p50_ms", "p95_ms")}


def leftovers(session: str, seen: dict[int, float], bwrap_before: set[int]) -> dict:
    """What outlives the run: processes of this run (seen as descendants, same pid and start time)
    still alive, processes naming this run's Ray session, and bwraps that were not there before."""
    import psutil

    alive = []
    for pid, created in seen.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == created:
                alive.append(f"{pid} {' '.join(p.cmdline())[:100]}")
        except psutil.Error:
            pass
    session_procs = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if session in cmd and p.pid != os.getpid():
            session_procs.append(f"{p.pid} {cmd[:100]}")
    bwrap = {int(x) for x in subprocess.run(["pgrep", "-x", "bwrap"], capture_output=True, text=True).stdout.split()}
    raylets = subprocess.run(["pgrep", "-f", "raylet"], capture_output=True, text=True).stdout.split()
    return {"ours_alive": alive, "with_our_session": session_procs, "new_bwrap": sorted(bwrap - bwrap_before),
            "raylets_on_machine": len(raylets)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5,
                    help="HumanEval's 164 canonical solutions x this many per side and round (concurrent ascore calls)")
    ap.add_argument("--sandboxes", type=int, default=2, help="sandboxes in the pool, the same for local and ray")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds of local and ray (the order flips each round)")
    ap.add_argument("--nodes", default="2",
                    help="comma list of worker-node counts of the loopback Ray cluster; the ray side runs at each")
    ap.add_argument("--round-trips", type=int, default=300,
                    help="turns of the interleaved latency run after each ray side: each times every trivial "
                    "command once on a local and once on a ray sandbox, and one bare Ray actor call")
    ap.add_argument("--cpus-per-sandbox", type=float, default=1.0,
                    help="Ray CPUs each sandbox actor reserves (each node offers os.cpu_count())")
    ap.add_argument("--output", type=Path, default=RESULTS)
    args = ap.parse_args()
    node_counts = [int(n) for n in args.nodes.split(",") if n.strip()]
    if not node_counts or min(node_counts) < 1:
        raise SystemExit("--nodes needs one or more positive counts")
    if args.cpus_per_sandbox > os.cpu_count():
        raise SystemExit("--cpus-per-sandbox cannot exceed a node's CPUs (os.cpu_count())")

    from trl_sandbox_ray import RayProvider

    info = machine(["ray"])
    wall0 = time.perf_counter()
    completions, rows = humaneval_work()
    bwrap_before = {int(x) for x in subprocess.run(["pgrep", "-x", "bwrap"], capture_output=True, text=True).stdout.split()}
    raylets_before = len(subprocess.run(["pgrep", "-f", "raylet"], capture_output=True, text=True).stdout.split())

    print(f"starting a loopback Ray cluster (head without CPUs, worker nodes of {os.cpu_count()} CPUs and "
          f"sandbox={args.sandboxes}) ...", flush=True)
    cluster = LoopbackCluster(args.sandboxes)
    seen: dict[int, float] = {}
    resize_s: list[dict] = []
    sides: dict[str, dict[str, list]] = {"local": {"judged": []}}
    for n in node_counts:
        sides[f"ray-{n}"] = {"judged": [], "latency": [], "inside": []}

    def remember() -> None:
        for p in descendants():
            try:
                seen[p.pid] = p.create_time()
            except Exception:
                pass

    def local() -> LocalProvider:
        return LocalProvider()

    try:
        # The cluster is up at its first size for every side, local included: what it costs idle
        # falls on both sides alike.
        resize_s.append({"round": 0, "nodes": node_counts[0], "seconds": cluster.resize(node_counts[0])})
        for i in range(args.rounds):
            order = ["local", *(f"ray-{n}" for n in node_counts)]
            for side in order if i % 2 == 0 else order[::-1]:
                if side == "local":
                    make: Callable[[], Any] = local
                    label = "local"
                else:
                    n = int(side.split("-")[1])
                    s = cluster.resize(n)
                    if s > 0.01:
                        resize_s.append({"round": i, "nodes": n, "seconds": s})

                    def make() -> RayProvider:
                        return RayProvider(address=cluster.address, cpus_per_sandbox=args.cpus_per_sandbox,
                                           resources={"sandbox": 1}, probe=False)

                    label = f"ray, {n} node{'s' if n > 1 else ''}"
                print(f"round {i + 1}/{args.rounds}: {label}: judged path ({len(rows) * args.repeat} completions, "
                      f"{args.sandboxes} sandboxes) ...", flush=True)
                judged = run_judged(make, completions, rows, args.repeat, args.sandboxes)
                judged["round"] = i
                sides[side]["judged"].append(judged)
                print(f"    {judged['programs_per_s']:.1f} programs/s, {judged['passed']}/{judged['count']} passed, "
                      f"pool up in {judged['pool_start_s']['all_ready']:.2f} s", flush=True)
                if judged["failures"]:
                    print("    not passed: " + "; ".join(judged["failures"]), flush=True)
                if side != "local":
                    lat = latency(make, args.round_trips)
                    lat["round"] = i
                    sides[side]["latency"].append(lat)
                    print("    round trips (interleaved): " + ", ".join(
                        f"{c} p50 {lat[c]['p50_ms']:.2f} ms" for c in lat if c not in ("round", "isolation_mode")),
                        flush=True)
                    inside = exec_inside_an_actor(args.round_trips)
                    inside["round"] = i
                    sides[side]["inside"].append(inside)
                    print("    true timed inside an actor: " + ", ".join(
                        f"{k} p50 {v['p50_ms']:.2f} ms p95 {v['p95_ms']:.2f} ms" if "p50_ms" in v else f"{k}: {v}"
                        for k, v in inside.items() if k != "round"), flush=True)
                remember()
    finally:
        remember()
        cluster.shutdown()
        time.sleep(1.0)
        deadline = time.monotonic() + 20
        while True:
            left = leftovers(cluster.session, seen, bwrap_before)
            if not (left["ours_alive"] or left["with_our_session"] or left["new_bwrap"]) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    total_s = time.perf_counter() - wall0

    # -- report ----------------------------------------------------------------------------------
    base = sides["local"]
    local_rate = pooled_rate(base["judged"])
    results: dict[str, dict] = {}
    every_latency = [x for side, data in sides.items() if side != "local" for x in data["latency"]]
    for side, data in sides.items():
        judged = data["judged"]
        row: dict[str, Any] = {
            "programs_per_s": pooled_rate(judged),
            "passed": sum(r["passed"] for r in judged), "count": sum(r["count"] for r in judged),
            "pool_start_s": statistics.median(r["pool_start_s"]["all_ready"] for r in judged),
            "pool_first_ready_s": statistics.median(r["pool_start_s"]["first_ready"] for r in judged),
            "pool_close_s": statistics.median(r["pool_start_s"]["close"] for r in judged),
            "machine_cpu_ms_per_program": statistics.mean(r["machine_cpu_ms_per_program"] for r in judged),
            "driver_cpu_ms_per_program": statistics.mean(r["driver_cpu_ms_per_program"] for r in judged),
            "cpu_ms_per_program_by_kind": {
                k: statistics.mean(r["cpu_ms_per_program_by_kind"].get(k, 0.0) for r in judged)
                for k in sorted({k for r in judged for k in r["cpu_ms_per_program_by_kind"]})},
            "sandbox_nice": judged[-1]["memory"]["_per_sandbox"]["nice"],
            "rounds": {"judged": judged},
        }
        if side == "local":
            # Local's round trips were timed interleaved with every ray side's: the median over all.
            row["exec_ms"] = {c: median_of(every_latency, f"local: {c}") for c in COMMANDS}
            row["isolation_mode"] = every_latency[-1]["isolation_mode"]["local"]
        else:
            phases = data["latency"]
            row["isolation_mode"] = phases[-1]["isolation_mode"]["ray"]
            row["exec_ms"] = {c: median_of(phases, f"ray: {c}") for c in COMMANDS}
            row["local_exec_ms_same_runs"] = {c: median_of(phases, f"local: {c}") for c in COMMANDS}
            row["ratio_vs_local"] = row["programs_per_s"] / local_rate
            row["ratio_vs_local_per_round"] = paired_ratios(judged, base["judged"])
            row["added_ms"] = {c: {q: statistics.median(added(phases, c, q)) for q in ("p50_ms", "p95_ms")}
                               for c in COMMANDS}
            row["added_ms_per_round"] = {c: {q: added(phases, c, q) for q in ("p50_ms", "p95_ms")} for c in COMMANDS}
            # What each judged program costs more through Ray, implied by the rates (K sandboxes busy).
            row["implied_added_ms_per_judged_program"] = 1000 * args.sandboxes * (
                1 / row["programs_per_s"] - 1 / local_rate)
            row["bare_actor_call_ms"] = {way: median_of(phases, f"bare actor call, {way}") for way in ("await", "ray.get")}
            row["rounds"]["latency"] = phases
            row["exec_inside_actor_ms"] = {
                way: median_of(data["inside"], way)
                for way in ("as_started", "reniced_to_0") if all("p50_ms" in x[way] for x in data["inside"])}
            row["exec_inside_actor_nice"] = {way: data["inside"][-1][way].get("sandbox_nice")
                                             for way in ("as_started", "reniced_to_0")}
            row["rounds"]["exec_inside_actor"] = data["inside"]
        results[side] = row

    def name(side: str) -> str:
        if side == "local":
            return f"local ({args.sandboxes} sandboxes)"
        n = int(side.split("-")[1])
        return f"ray, {n} node{'s' if n > 1 else ''} ({args.sandboxes} sandboxes)"

    print()
    print(f"{'provider':<28} {'programs/s':>10} {'vs local':>9} {'true p50/p95 ms':>16} {'added p50/p95':>14} "
          f"{'py p50/p95 ms':>14} {'added p50/p95':>14} {'pool start s':>12} {'correct':>11}")
    for side, r in results.items():
        e = r["exec_ms"]
        cells = {}
        for c in COMMANDS:
            cells[c] = f"{e[c]['p50_ms']:.2f}/{e[c]['p95_ms']:.2f}"
            a = r.get("added_ms", {}).get(c)
            cells[c + "+"] = f"{a['p50_ms']:+.2f}/{a['p95_ms']:+.2f}" if a else "-"
        ratio = f"{r['ratio_vs_local']:.2f}x" if "ratio_vs_local" in r else "1.00x"
        print(f"{name(side):<28} {r['programs_per_s']:>10.1f} {ratio:>9} {cells['true']:>16} {cells['true+']:>14} "
              f"{cells['python3 -c pass']:>14} {cells['python3 -c pass+']:>14} {r['pool_start_s']:>12.2f} "
              f"{r['passed']:>5}/{r['count']:<5}")
    print("(exec: sequential round trips on one warm sandbox each, local and ray interleaved call by call, median over "
          "rounds of each run's p50/p95; added: ray minus local in the same run; pool start: provider + pool until "
          "all sandboxes are up, median over rounds)")
    print()
    for side, r in results.items():
        rounds = r["rounds"]["judged"]
        print(f"{name(side)}: programs/s per round " + ", ".join(f"{j['programs_per_s']:.1f}" for j in rounds)
              + ("; vs local per round " + ", ".join(f"{x:.2f}x" for x in r["ratio_vs_local_per_round"])
                 if side != "local" else "")
              + f"; pool first sandbox {r['pool_first_ready_s']:.2f} s, all {r['pool_start_s']:.2f} s, close "
              f"{r['pool_close_s']:.2f} s; machine CPU {r['machine_cpu_ms_per_program']:.2f} ms/program "
              f"(driver {r['driver_cpu_ms_per_program']:.2f}); sandbox isolation {r['isolation_mode']}")
        if side != "local":
            b = r["bare_actor_call_ms"]
            print(f"    bare Ray actor call: await p50 {b['await']['p50_ms']:.2f} ms p95 {b['await']['p95_ms']:.2f} ms; "
                  f"ray.get p50 {b['ray.get']['p50_ms']:.2f} ms p95 {b['ray.get']['p95_ms']:.2f} ms; implied added "
                  f"time per judged program {r['implied_added_ms_per_judged_program']:.2f} ms")
            inside, nice = r["exec_inside_actor_ms"], r["exec_inside_actor_nice"]
            print("    true timed inside a Ray worker on a node (no Ray call on the path): " + "; ".join(
                f"sandbox at nice {nice[w]}: p50 {v['p50_ms']:.2f} ms p95 {v['p95_ms']:.2f} ms" for w, v in inside.items()))
        rest = (r["machine_cpu_ms_per_program"] - r["driver_cpu_ms_per_program"]
                - sum(r["cpu_ms_per_program_by_kind"].values()))
        print(f"    CPU per judged program (ms): whole machine {r['machine_cpu_ms_per_program']:.2f} = "
              + ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_ms_per_program_by_kind"].items())
              + f", this driver {r['driver_cpu_ms_per_program']:.2f}, the rest {rest:.2f} (kernel threads, other "
              f"processes); sandboxes at nice " + ",".join(str(x) for x in r["sandbox_nice"]))
    print()
    for side, r in results.items():
        mem = r["rounds"]["judged"][-1]["memory"]
        names = [k for k in mem if not k.startswith("_")]
        per = mem["_per_sandbox"]
        print(f"memory, {name(side)} (last round, pool up): " + "; ".join(
            f"{k} x{mem[k]['count']} RSS {mem[k]['rss_mb']:.0f} MB PSS {mem[k]['pss_mb']:.0f} MB" for k in names))
        print(f"    per sandbox: bwrap + supervisor RSS {per['sandbox_rss_mb']:.1f} MB"
              + (f", its actor's worker RSS {per['actor_worker_rss_mb']:.1f} MB" if side != "local" else ""))
    ray_own = {side: sum(v["rss_mb"] for k, v in r["rounds"]["judged"][-1]["memory"].items()
                         if k in ("ray processes", "ray idle workers", "sandbox actor workers"))
               for side, r in results.items() if side != "local"}
    for side, mb in ray_own.items():
        print(f"Ray's own processes (GCS, raylets, dashboard, agents, workers incl. the sandbox actors'), "
              f"{name(side)}: RSS {mb:.0f} MB")

    print()
    goals: dict[str, dict] = {}
    for side, r in results.items():
        if side == "local":
            continue
        latency_ok = all(r["added_ms"][c]["p50_ms"] <= GOAL_ADDED_P50_MS for c in COMMANDS)
        rate_ok = r["ratio_vs_local"] >= GOAL_RATIO
        goals[side] = {"added_p50_ms": {c: r["added_ms"][c]["p50_ms"] for c in COMMANDS}, "latency_pass": latency_ok,
                       "ratio_vs_local": r["ratio_vs_local"], "throughput_pass": rate_ok}
        print(f"goal, {name(side)}: added latency per exec at p50 <= {GOAL_ADDED_P50_MS:g} ms: "
              + ", ".join(f"{c} {r['added_ms'][c]['p50_ms']:+.2f} ms" for c in COMMANDS)
              + f" -> {'PASS' if latency_ok else 'FAIL'}")
        print(f"goal, {name(side)}: judged programs/s >= {GOAL_RATIO:g}x local: {r['ratio_vs_local']:.2f}x "
              f"(per round {', '.join(f'{x:.2f}x' for x in r['ratio_vs_local_per_round'])}) "
              f"-> {'PASS' if rate_ok else 'FAIL'}")
    all_right = all(r["passed"] == r["count"] for r in results.values())
    print(f"verdicts: {'all passed' if all_right else 'NOT all passed'}")
    clean = not (left["ours_alive"] or left["with_our_session"] or left["new_bwrap"])
    print(f"leftovers after shutdown: {'none' if clean else left} (raylets on the machine before/after: "
          f"{raylets_before}/{left['raylets_on_machine']}, other clusters' included)")
    info["loadavg_at_end"] = os.getloadavg()
    print(f"cluster: head {cluster.head_s:.1f} s to start; resizes: "
          + (", ".join(f"{x['nodes']} nodes {x['seconds']:.1f} s" for x in resize_s) or "none"))
    print(f"machine: {info['cores']} cores, {info['cpu_model']}, kernel {info['kernel']}, python {info['python']}, "
          f"ray {info['ray']}, {info['bwrap']}, load average {info['loadavg_at_start'][0]:.2f} -> "
          f"{info['loadavg_at_end'][0]:.2f}; whole run {total_s:.0f} s")

    report = {
        "benchmark": "HumanEval canonical solutions, judged, through the ray provider vs the local provider",
        "settings": vars(args) | {"timeout_s": TIMEOUT, "output": str(args.output), "nodes": node_counts},
        "machine": info,
        "cluster": {"head_start_s": cluster.head_s, "resizes": resize_s, "node_cpus": os.cpu_count(),
                    "node_resources": {"sandbox": args.sandboxes}, "head_cpus": 0, "address": "127.0.0.1"},
        "goals": {"added_p50_ms_at_most": GOAL_ADDED_P50_MS, "ratio_vs_local_at_least": GOAL_RATIO, "by_side": goals},
        "results": {name(side): r for side, r in results.items()},
        "ray_own_rss_mb": {name(side): mb for side, mb in ray_own.items()},
        "all_verdicts_right": all_right,
        "leftovers": left,
        "wall_s": total_s,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()

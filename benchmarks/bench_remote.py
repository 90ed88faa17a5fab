"""One GRPO batch on a remote provider: the trl-sandbox pool next to the bare SDK used as the
vendors' examples use it.

    .venv/bin/python benchmarks/bench_remote.py [--completions 64] [--pool 16] [--seeds 1,2,3] [--rounds 1]
    .venv/bin/python benchmarks/bench_remote.py --launcher 200   # what issue 36's isolation costs per program

Against the fake Daytona of ``plugins/daytona/tests`` (the real ``daytona`` SDK on loopback; each
fake sandbox a bubblewrap container of its own, so leftovers behave as on the service) with
injected latency (create 1 s, exec 50 ms), a batch of ``completions`` programs runs these ways:

* ``trl-sandbox pool``: ``SandboxPool`` of ``pool`` sandboxes, started before the batch (in
  training it starts with ``on_train_begin``, behind model loading: its warm-up is reported
  apart); every lease is clean (``trl_sandbox.remote.lease``: each program in a PID namespace of
  its own, the reset carried by the next exec, no request of its own).
* ``trl-sandbox pool (reset by its own exec)``: the same with ``clean_leases=False``, the provider
  before the lease launcher (the reset is one more exec round trip; leftovers survive).
* ``bare: create per completion``: ``AsyncDaytona.create`` + ``process.exec`` + ``delete`` for each
  completion, all at once (CoreWeave's and E2B's RL examples).
* ``trl-sandbox pool (no resident launcher)``: clean leases with a launcher sent with every exec
  (``resident_launcher=False``: a second Python interpreter per program).
* ``bare: round-robin pool``: ``pool`` sandboxes created up front, completions spread over them in
  turn, no reset between programs (a shared, dirty sandbox): all at once, several per sandbox.
* ``bare: round-robin pool (one program per sandbox at a time)``: the same, a sandbox running one program
  at a time as a lease does (what cleanliness costs, apart from sharing a sandbox between programs).

Each runs once quiet and then once per seed with 20% transient faults on creates and execs and 5%
vanishing sandboxes. Reported per run: the batch's latency (the reward call), programs scored
correctly, sandboxes created, and sandboxes left alive afterwards. Writes
``benchmarks/results/remote.json`` with the machine it ran on and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from machine import machine

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "plugins" / "daytona" / "tests"))

from daytona_fake import API_KEY, FakeDaytona  # noqa: E402

from trl_sandbox.plugins import make_provider  # noqa: E402
from trl_sandbox.pool.sandbox_pool import PoolSettings, SandboxPool  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "remote.json"
LATENCY = {"create": 1.0, "exec": 0.05}


def program(i: int) -> list[str]:
    return ["python3", "-c", f"print({i} * {i})"]


def correct(i: int, stdout: str | None, exit_code: int | None) -> bool:
    return exit_code == 0 and stdout == f"{i * i}\n"


def run_pool(fake: FakeDaytona, work: str, n: int, size: int, clean: bool = True, resident: bool = True) -> dict:
    provider = make_provider("daytona", {"api_key": API_KEY, "api_url": fake.api_url, "work_dir": f"{work}/{{id}}",
                                         "clean_leases": clean, "resident_launcher": resident})
    settings = PoolSettings(backoff_initial_s=0.05, backoff_max_s=0.5, lease_timeout_s=120.0, outage_s=120.0)
    pool = SandboxPool(provider, size=size, settings=settings, made_by="benchmark")
    t0 = time.perf_counter()
    pool.start(wait=False)
    deadline = time.monotonic() + 120
    while pool.members < size and time.monotonic() < deadline:
        time.sleep(0.01)
    warm = time.perf_counter() - t0

    async def batch() -> list:
        return await asyncio.gather(*(pool.aexec(program(i), timeout=10) for i in range(n)), return_exceptions=True)

    try:
        t1 = time.perf_counter()
        results = pool.loop.run(batch())
        latency = time.perf_counter() - t1
    finally:
        pool.close()
    scored = sum(1 for i, r in enumerate(results) if not isinstance(r, BaseException) and correct(i, r.stdout, r.exit_code))
    return {"latency_s": latency, "warmup_s": warm, "scored": scored}


async def _bare_client():
    from daytona import AsyncDaytona, DaytonaConfig

    return AsyncDaytona(DaytonaConfig(api_key=API_KEY, api_url=FAKE_URL[0]))


FAKE_URL = [""]


def _params():
    from daytona import CreateSandboxFromSnapshotParams

    return CreateSandboxFromSnapshotParams(labels={"bench": "bare"}, ephemeral=True)


def _command(i: int) -> str:
    return f"python3 -c 'print({i} * {i})'"


async def _bare_per_completion(n: int) -> dict:
    client = await _bare_client()

    async def one(i: int) -> bool:
        try:
            sandbox = await client.create(_params(), timeout=60)
        except Exception:
            return False
        try:
            response = await sandbox.process.exec(_command(i), timeout=10)
            return correct(i, response.result, response.exit_code)
        except Exception:
            return False
        finally:
            try:
                await client.delete(sandbox)
            except Exception:
                pass

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(n)))
    latency = time.perf_counter() - t0
    await client.close()
    return {"latency_s": latency, "warmup_s": 0.0, "scored": sum(results)}


async def _bare_round_robin(n: int, size: int, one_at_a_time: bool = False) -> dict:
    client = await _bare_client()
    t0 = time.perf_counter()
    made = await asyncio.gather(*(client.create(_params(), timeout=60) for _ in range(size)), return_exceptions=True)
    sandboxes = [s for s in made if not isinstance(s, BaseException)]
    warm = time.perf_counter() - t0

    turns = [asyncio.Semaphore(1 if one_at_a_time else n) for _ in sandboxes]

    async def one(i: int) -> bool:
        if not sandboxes:
            return False
        try:
            async with turns[i % len(sandboxes)]:
                response = await sandboxes[i % len(sandboxes)].process.exec(_command(i), timeout=10)
            return correct(i, response.result, response.exit_code)
        except Exception:
            return False

    t1 = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(n)))
    latency = time.perf_counter() - t1
    for sandbox in sandboxes:
        try:
            await client.delete(sandbox)
        except Exception:
            pass
    await client.close()
    return {"latency_s": latency, "warmup_s": warm, "scored": sum(results)}


def measure(way: str, n: int, size: int, seed: int | None) -> dict:
    fake = FakeDaytona(page_size=100).start()
    fake.latency = dict(LATENCY)
    FAKE_URL[0] = fake.api_url
    try:
        fake.chaos(seed)
        with tempfile.TemporaryDirectory() as work:
            if way == "trl-sandbox pool":
                row = run_pool(fake, work, n, size)
            elif way == "trl-sandbox pool (reset by its own exec)":
                row = run_pool(fake, work, n, size, clean=False)
            elif way == "trl-sandbox pool (no resident launcher)":
                row = run_pool(fake, work, n, size, resident=False)
            elif way == "bare: create per completion":
                row = asyncio.run(_bare_per_completion(n))
            elif way == "bare: round-robin pool (one program per sandbox at a time)":
                row = asyncio.run(_bare_round_robin(n, size, one_at_a_time=True))
            else:
                row = asyncio.run(_bare_round_robin(n, size))
        fake.chaos(None)
        row.update(way=way, seed=seed, created=len(fake.created_labels), left_alive=len(fake.live()),
                   exec_requests=fake.count("exec"))
    finally:
        fake.stop()
    return row


# What issue 36 added to every lease, taken out again for the side-by-side "before" (the program's own
# network, IPC and UTS namespaces; /proc's kernel interfaces read-only; fresh keyrings; the output
# copied through the launcher's pipes).
BEFORE_ISSUE_36 = (('    private_namespaces(spec.get("network"))\n', "    pass\n"),
                   ("                private_namespaces(False)", "                pass"),
                   ("    seal_proc()\n", "    pass\n"), ("        fresh_keyrings()\n", "        pass\n"),
                   ("    ends = streams(spec)\n", "    ends = streams({})\n"),
                   ('    sockets = () if spec.get("network") else listening_sockets()\n', "    sockets = ()\n"),
                   ('        if not sweep_mode and spec.get("user") is not None:\n',
                    "        if False:\n"))


def launcher_cost(n: int) -> dict:
    """Milliseconds of one exec of ``true`` through the resident launcher in a fake sandbox (a
    container of its own), as built and without issue 36's namespaces and pipes: two sandboxes
    side by side, their execs alternating, in one run."""
    import shlex
    import statistics
    import subprocess

    from trl_sandbox.remote import lease
    from trl_sandbox.remote.fake_container import FakeContainer

    def probed(source: str) -> tuple[FakeContainer, lease.Lease]:
        container = FakeContainer()
        argv = [*lease.LAUNCHER_ARGV[:-1], source, lease.probe_argv()[-1]]
        found = lease.Lease.from_probe(container.run_outside(argv), "bench", "bench")
        assert found is not None and found.resident, "the fake sandbox should get a resident launcher"
        return container, found

    before = lease.LAUNCHER_SOURCE
    for old, new in BEFORE_ISSUE_36:
        assert old in before, old
        before = before.replace(old, new)
    sandboxes = {"as built": probed(lease.LAUNCHER_SOURCE), "before issue 36": probed(before)}
    times: dict[str, list[float]] = {name: [] for name in sandboxes}
    try:
        for i in range(n):
            for name, (container, found) in (sandboxes.items() if i % 2 else reversed(sandboxes.items())):
                argv, _ = found.argv(["true"], work="/tmp/w", cwd=None, limits=None, timeout=10,
                                     cap=16 << 20 if name == "as built" else None)
                t0 = time.perf_counter()
                done = subprocess.run(container.argv(argv), env=container.env, capture_output=True)
                times[name].append((time.perf_counter() - t0) * 1000)
                assert done.returncode == 0, (name, shlex.join(argv[:3]), done)
    finally:
        for container, _ in sandboxes.values():
            container.kill()
    return {name: {"median_ms": statistics.median(t), "mean_ms": statistics.fmean(t)} for name, t in times.items()}


def paired_ratios(rows: list[dict], rounds: int, way: str, base: str) -> list[float]:
    """``way``'s latency over ``base``'s, per quiet round in which both ran."""
    ratios = []
    for i in range(rounds):
        got = {r["way"]: r["latency_s"] for r in rows if r["round"] == i and r["seed"] is None}
        if way in got and base in got:
            ratios.append(got[way] / got[base])
    return ratios


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--completions", type=int, default=64)
    ap.add_argument("--pool", type=int, default=16)
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--rounds", type=int, default=1, help="quiet rounds, the ways alternating within each")
    ap.add_argument("--ways", default="", help="comma-separated subset of the ways (default: all)")
    ap.add_argument("--launcher", type=int, default=0, metavar="N",
                    help="only the launcher's cost per program: N execs as built and N without issue 36's "
                         "namespaces and pipes, side by side (writes results/remote_launcher.json)")
    ap.add_argument("--e2b", action="store_true",
                    help="the e2b provider's rows instead: its pool and the bare e2b SDK on the plugin's fake "
                         "(benchmarks/bench_remote_e2b.py; writes results/remote_e2b.json)")
    args = ap.parse_args()
    if args.e2b:  # the e2b plugin's rows (benchmarks/bench_remote_e2b.py)
        from bench_remote_e2b import e2b_rows

        seeds = [None] * max(1, args.rounds) + [int(s) for s in args.seeds.split(",") if s]
        rows = e2b_rows(args.completions, args.pool, seeds, RESULTS.with_name("remote_e2b.json"), machine())
        print(f"| way | faults | reward-call latency (s) | scored / {args.completions} | exec requests | created "
              "| left alive | warm-up (s) |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows[:-1] if rows and "ratios" in rows[-1] else rows:
            faults = "none" if r["seed"] is None else f"20%+5% (seed {r['seed']})"
            print(f"| {r['way']} | {faults} | {r['latency_s']:.2f} | {r['scored']} | {r['exec_requests']} "
                  f"| {r['created']} | {r['left_alive']} | {r['warmup_s']:.2f} |")
        if rows and "ratios" in rows[-1]:
            print("e2b clean lease / bare round-robin one at a time (quiet rounds): "
                  + ", ".join(f"{x:.2f}x" for x in rows[-1]["ratios"]))
        return
    if args.launcher:
        cost = launcher_cost(args.launcher)
        print("| launcher | median ms per exec | mean ms per exec |")
        print("|---|---|---|")
        for name, row in cost.items():
            print(f"| {name} | {row['median_ms']:.1f} | {row['mean_ms']:.1f} |")
        RESULTS.with_name("remote_launcher.json").write_text(json.dumps(
            {"machine": machine(), "execs": args.launcher, "launcher": cost}, indent=2))
        return
    seeds = [None] * max(1, args.rounds) + [int(s) for s in args.seeds.split(",") if s]
    ways = ["trl-sandbox pool", "bare: round-robin pool", "trl-sandbox pool (no resident launcher)",
            "bare: round-robin pool (one program per sandbox at a time)", "trl-sandbox pool (reset by its own exec)",
            "bare: create per completion"]
    if args.ways:
        ways = [w for w in ways if w in args.ways.split(",")]
    rows = []
    for i, seed in enumerate(seeds):
        for way in ways if i % 2 == 0 else ways[::-1]:  # alternate the order: drift hits every way alike
            rows.append(measure(way, args.completions, args.pool, seed))
            rows[-1]["round"] = i
    print(f"| way | faults | reward-call latency (s) | scored / {args.completions} | exec requests | created "
          "| left alive | warm-up (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        faults = "none" if r["seed"] is None else f"20%+5% (seed {r['seed']})"
        print(f"| {r['way']} | {faults} | {r['latency_s']:.2f} | {r['scored']} | {r['exec_requests']} | {r['created']} "
              f"| {r['left_alive']} | {r['warmup_s']:.2f} |")
    ratios = paired_ratios(rows, len(seeds), "trl-sandbox pool", "bare: round-robin pool")
    if ratios:
        print("clean lease / bare round-robin (quiet rounds): " + ", ".join(f"{r:.2f}x" for r in ratios))
    exclusive = paired_ratios(rows, len(seeds), "trl-sandbox pool", "bare: round-robin pool (one program per sandbox at a time)")
    if exclusive:
        print("clean lease / bare round-robin one at a time (quiet rounds): "
              + ", ".join(f"{r:.2f}x" for r in exclusive))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    from importlib.metadata import version

    RESULTS.write_text(json.dumps({"machine": {**machine(), "daytona": version("daytona")}, "latency": LATENCY,
                                   "completions": args.completions, "pool": args.pool, "rows": rows,
                                   "clean_over_round_robin": ratios,
                                   "clean_over_round_robin_one_at_a_time": exclusive}, indent=2))


# -- Modal (trl-sandbox-modal): the pool next to the bare ``modal`` SDK on the fake Modal ----------
#
#     .venv/bin/python benchmarks/bench_remote.py --modal [--completions 64] [--pool 16] [--seeds 1,2,3]
#
# The fake (``trl_sandbox_modal.fake``: the real SDK over gRPC on loopback, each sandbox a container of
# its own) with the same injected latency (create 1 s, exec start 50 ms). Ways: the trl-sandbox pool
# (clean leases), and the bare SDK as Modal's examples use it: ``pool`` sandboxes made up front
# (``Sandbox.create("sleep", "infinity")``), each completion an ``exec`` with its streams read and its
# ``wait``, round-robin with one program per sandbox at a time (like for like with a lease), and all at
# once (several per sandbox, no reset). Writes ``benchmarks/results/remote_modal.json``.

MODAL_LATENCY = {"SandboxCreateV2": 1.0, "TaskExecStart": 0.05}
MODAL_WAYS = ["trl-sandbox pool", "bare: round-robin pool (one program per sandbox at a time)",
              "bare: round-robin pool"]


async def _modal_bare_round_robin(n: int, size: int, one_at_a_time: bool) -> dict:
    import modal
    from trl_sandbox_modal.fake import TOKEN_ID, TOKEN_SECRET

    client = await modal.Client.from_credentials.aio(TOKEN_ID, TOKEN_SECRET)  # this round's fake
    app = await modal.App.lookup.aio("bench", create_if_missing=True, client=client)
    image = modal.Image.from_registry("python:3.12-slim")
    t0 = time.perf_counter()
    made = await asyncio.gather(*(modal.Sandbox.create.aio("sleep", "infinity", app=app, image=image, timeout=600,
                                                           tags={"bench": "bare"}, client=client)
                                  for _ in range(size)),
                                return_exceptions=True)
    sandboxes = [s for s in made if not isinstance(s, BaseException)]
    warm = time.perf_counter() - t0
    turns = [asyncio.Semaphore(1 if one_at_a_time else n) for _ in sandboxes]

    async def one(i: int) -> bool:
        try:
            async with turns[i % len(sandboxes)]:
                process = await sandboxes[i % len(sandboxes)].exec.aio(*program(i), timeout=10)
                out, _ = await asyncio.gather(process.stdout.read.aio(), process.stderr.read.aio())
                code = await process.wait.aio()
            return correct(i, out, code)
        except Exception:
            return False

    t1 = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(n))) if sandboxes else []
    latency = time.perf_counter() - t1
    await asyncio.gather(*(s.terminate.aio() for s in sandboxes), return_exceptions=True)
    return {"latency_s": latency, "warmup_s": warm, "scored": sum(results)}


def _modal_pool(n: int, size: int, work: str) -> dict:
    provider = make_provider("modal", {"work_dir": f"{work}/{{id}}"})
    settings = PoolSettings(backoff_initial_s=0.05, backoff_max_s=0.5, lease_timeout_s=120.0, outage_s=120.0)
    pool = SandboxPool(provider, size=size, settings=settings, made_by="benchmark")
    t0 = time.perf_counter()
    pool.start(wait=False)
    deadline = time.monotonic() + 120
    while pool.members < size and time.monotonic() < deadline:
        time.sleep(0.01)
    warm = time.perf_counter() - t0

    async def batch() -> list:
        return await asyncio.gather(*(pool.aexec(program(i), timeout=10) for i in range(n)), return_exceptions=True)

    try:
        t1 = time.perf_counter()
        results = pool.loop.run(batch())
        latency = time.perf_counter() - t1
    finally:
        pool.close()
    scored = sum(1 for i, r in enumerate(results) if not isinstance(r, BaseException) and correct(i, r.stdout, r.exit_code))
    return {"latency_s": latency, "warmup_s": warm, "scored": scored}


def modal_measure(way: str, n: int, size: int, seed: int | None) -> dict:
    import os

    from trl_sandbox_modal.fake import FakeModal

    fake = FakeModal().start()
    saved = {k: os.environ.get(k) for k in [*fake.env(), "MODAL_MAX_THROTTLE_WAIT"]}
    os.environ.update(fake.env())
    fake.latency = MODAL_LATENCY
    try:
        fake.chaos(seed)
        with tempfile.TemporaryDirectory() as work:
            if way == "trl-sandbox pool":
                row = _modal_pool(n, size, work)
            else:
                row = asyncio.run(_modal_bare_round_robin(n, size, one_at_a_time="one program" in way))
        fake.chaos(None)
        row.update(way=way, seed=seed, created=len(fake.created_tags), left_alive=len(fake.live()),
                   exec_requests=fake.count("TaskExecStart"))
    finally:
        fake.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return row


def modal_main(argv: list[str]) -> None:
    """The Modal rows: each way once quiet per round and once per seed with faults, then a table."""
    ap = argparse.ArgumentParser(prog="bench_remote.py --modal")
    ap.add_argument("--modal", action="store_true")
    ap.add_argument("--completions", type=int, default=64)
    ap.add_argument("--pool", type=int, default=16)
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args(argv)
    seeds = [None] * max(1, args.rounds) + [int(s) for s in args.seeds.split(",") if s]
    rows = []
    for i, seed in enumerate(seeds):
        for way in MODAL_WAYS if i % 2 == 0 else MODAL_WAYS[::-1]:
            rows.append({**modal_measure(way, args.completions, args.pool, seed), "round": i})
    print(f"| modal: way | faults | reward-call latency (s) | scored / {args.completions} | exec requests | created "
          "| left alive | warm-up (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        faults = "none" if r["seed"] is None else f"20%+5% (seed {r['seed']})"
        print(f"| {r['way']} | {faults} | {r['latency_s']:.2f} | {r['scored']} | {r['exec_requests']} | {r['created']} "
              f"| {r['left_alive']} | {r['warmup_s']:.2f} |")
    exclusive = paired_ratios(rows, len(seeds), "trl-sandbox pool",
                              "bare: round-robin pool (one program per sandbox at a time)")
    if exclusive:
        print("modal: clean lease / bare round-robin one at a time (quiet rounds): "
              + ", ".join(f"{r:.2f}x" for r in exclusive))
    from importlib.metadata import version

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.with_name("remote_modal.json").write_text(json.dumps(
        {"machine": {**machine(), "modal": version("modal")}, "latency": MODAL_LATENCY,
         "completions": args.completions, "pool": args.pool, "rows": rows,
         "clean_over_round_robin_one_at_a_time": exclusive}, indent=2))


if __name__ == "__main__":
    if "--modal" in sys.argv[1:]:
        modal_main(sys.argv[1:])
    else:
        main()

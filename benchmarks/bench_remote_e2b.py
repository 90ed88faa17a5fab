"""The e2b provider's rows of ``bench_remote.py``: its pool next to the bare ``e2b`` SDK, like for like.

    .venv/bin/python benchmarks/bench_remote.py --e2b [--completions 64] [--pool 16] [--seeds 1,2,3] [--rounds 1]

Against the fake E2B that ships with the plugin (``trl_sandbox_e2b.fake``: the real, unmodified
``e2b`` SDK on loopback; each fake sandbox a bubblewrap container of its own) with injected latency
(create 1 s, exec 50 ms), a batch of ``completions`` programs runs these ways:

* ``e2b: trl-sandbox pool``: ``SandboxPool`` of ``pool`` e2b sandboxes started before the batch,
  every lease clean (the lease launcher; the reset carried by the next exec).
* ``e2b: bare round-robin pool (one program per sandbox at a time)``: ``pool`` sandboxes made with
  ``AsyncSandbox.create`` up front, each program one ``commands.run`` on the next sandbox in turn,
  one at a time per sandbox as a lease is (the like-for-like baseline: no cleaning, no isolation).
* ``e2b: bare create per completion``: ``create`` + ``commands.run`` + ``kill`` per program, all at
  once (open-r1's ``E2BProvider`` and the E2B cookbook's first example).

Each runs once quiet and then once per seed with 20% transient faults (503, 502, 429, dropped
connections) on creates and execs and 5% vanishing sandboxes. Writes
``benchmarks/results/remote_e2b.json``; returns the rows for ``bench_remote.py`` to print.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins" / "e2b"))

LATENCY = {"create": 1.0, "exec": 0.05}
WAYS = ["e2b: trl-sandbox pool", "e2b: bare round-robin pool (one program per sandbox at a time)",
        "e2b: bare create per completion"]


def _program(i: int) -> list[str]:
    return ["python3", "-c", f"print({i} * {i})"]


def _correct(i: int, stdout: str | None, exit_code: int | None) -> bool:
    return exit_code == 0 and stdout == f"{i * i}\n"


def _pool(fake: Any, work: str, n: int, size: int) -> dict:
    from trl_sandbox.plugins import make_provider
    from trl_sandbox.pool.sandbox_pool import PoolSettings, SandboxPool

    provider = make_provider("e2b", {"api_key": fake.env()["E2B_API_KEY"], "api_url": fake.url,
                                     "sandbox_url": fake.url, "work_dir": f"{work}/{{id}}", "rate_limit_wait_s": 0.1})
    settings = PoolSettings(backoff_initial_s=0.05, backoff_max_s=0.5, lease_timeout_s=120.0, outage_s=120.0)
    pool = SandboxPool(provider, size=size, settings=settings, made_by="benchmark")
    t0 = time.perf_counter()
    pool.start(wait=False)
    deadline = time.monotonic() + 120
    while pool.members < size and time.monotonic() < deadline:
        time.sleep(0.01)
    warm = time.perf_counter() - t0

    async def batch() -> list:
        return await asyncio.gather(*(pool.aexec(_program(i), timeout=10) for i in range(n)), return_exceptions=True)

    try:
        t1 = time.perf_counter()
        results = pool.loop.run(batch())
        latency = time.perf_counter() - t1
    finally:
        pool.close()
    scored = sum(1 for i, r in enumerate(results) if not isinstance(r, BaseException) and _correct(i, r.stdout, r.exit_code))
    return {"latency_s": latency, "warmup_s": warm, "scored": scored}


async def _run(sandbox: Any, i: int) -> bool:
    """One program the bare SDK's way; a non-zero exit comes as ``CommandExitException``."""
    from e2b import CommandExitException

    try:
        result = await sandbox.commands.run(shlex.join(_program(i)), timeout=10)
        return _correct(i, result.stdout, result.exit_code)
    except CommandExitException as exc:
        return _correct(i, exc.stdout, exc.exit_code)


async def _bare_per_completion(client: Any, n: int) -> dict:
    async def one(i: int) -> bool:
        try:
            sandbox = await client.AsyncSandbox.create(timeout=300, metadata={"bench": "bare"})
        except Exception:
            return False
        try:
            return await _run(sandbox, i)
        except Exception:
            return False
        finally:
            try:
                await sandbox.kill()
            except Exception:
                pass

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(n)))
    return {"latency_s": time.perf_counter() - t0, "warmup_s": 0.0, "scored": sum(results)}


async def _bare_round_robin(client: Any, n: int, size: int) -> dict:
    t0 = time.perf_counter()
    made = await asyncio.gather(*(client.AsyncSandbox.create(timeout=300, metadata={"bench": "bare"})
                                  for _ in range(size)), return_exceptions=True)
    sandboxes = [s for s in made if not isinstance(s, BaseException)]
    warm = time.perf_counter() - t0
    turns = [asyncio.Semaphore(1) for _ in sandboxes]

    async def one(i: int) -> bool:
        if not sandboxes:
            return False
        try:
            async with turns[i % len(sandboxes)]:
                return await _run(sandboxes[i % len(sandboxes)], i)
        except Exception:
            return False

    t1 = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(n)))
    latency = time.perf_counter() - t1
    for sandbox in sandboxes:
        try:
            await sandbox.kill()
        except Exception:
            pass
    return {"latency_s": latency, "warmup_s": warm, "scored": sum(results)}


def measure(way: str, n: int, size: int, seed: int | None) -> dict:
    from e2b import E2B
    from trl_sandbox_e2b.fake import FakeE2B

    fake = FakeE2B(page_size=100).start()
    fake.latency = dict(LATENCY)
    try:
        fake.chaos(seed)
        client = E2B(api_key=fake.env()["E2B_API_KEY"], api_url=fake.url, sandbox_url=fake.url)  # SDK defaults
        with tempfile.TemporaryDirectory() as work:
            if way == WAYS[0]:
                row = _pool(fake, work, n, size)
            elif way == WAYS[1]:
                row = asyncio.run(_bare_round_robin(client, n, size))
            else:
                row = asyncio.run(_bare_per_completion(client, n))
        fake.chaos(None)
        row.update(way=way, seed=seed, created=len(fake.created_metadata), left_alive=len(fake.live()),
                   exec_requests=fake.count("exec"))
    finally:
        fake.stop()
    return row


def e2b_rows(n: int, size: int, seeds: list[int | None], results: Path, machine: dict) -> list[dict]:
    """Every way once per entry of ``seeds`` (None: quiet), the order alternating; writes ``results``."""
    from importlib.metadata import version

    rows = []
    for i, seed in enumerate(seeds):
        for way in WAYS if i % 2 == 0 else WAYS[::-1]:
            rows.append(measure(way, n, size, seed))
            rows[-1]["round"] = i
    ratios = []
    for i in range(len(seeds)):
        got = {r["way"]: r["latency_s"] for r in rows if r["round"] == i and r["seed"] is None}
        if WAYS[0] in got and WAYS[1] in got:
            ratios.append(got[WAYS[0]] / got[WAYS[1]])
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps({"machine": {**machine, "e2b": version("e2b")}, "latency": LATENCY,
                                   "completions": n, "pool": size, "rows": rows,
                                   "clean_over_round_robin_one_at_a_time": ratios}, indent=2))
    if ratios:
        rows.append({"ratios": ratios})
    return rows

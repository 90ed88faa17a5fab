"""The host-wide create limiter, shared by separate processes through its directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trl_sandbox import ConfigError
from trl_sandbox.pool.host_limit import HostLimiter
from trl_sandbox.pool.sandbox_pool import PoolSettings

RATE = 20.0  # creates per second, host-wide
CONCURRENT = 2

# One "rank": takes `n` create slots through the limiter and records, for each, the start time the
# rate limit reserved, when it actually started, and when it ended (holding its concurrency slot).
RANK = r"""
import asyncio, json, sys, time
from trl_sandbox.pool.host_limit import HostLimiter

directory, n, rate, concurrent, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
limiter = HostLimiter("daytona", rate_per_s=rate, concurrent=concurrent, directory=directory)
records = []

async def one():
    async with limiter.create_slot() as slot:
        started = time.time()
        await asyncio.sleep(0.03)  # the create call
        records.append({"slot": slot, "start": started, "end": time.time()})

async def main():
    await asyncio.gather(*(one() for _ in range(n)))

asyncio.run(main())
json.dump(records, open(out, "w"))
"""


def _two_ranks(tmp_path: Path, dirs: tuple[str, str], n: int = 8) -> list[dict]:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    outs = [tmp_path / f"rank{i}.json" for i in range(2)]
    procs = [subprocess.Popen([sys.executable, str(script), d, str(n), str(RATE), str(CONCURRENT), str(o)])
             for d, o in zip(dirs, outs)]
    for proc in procs:
        assert proc.wait(timeout=60) == 0
    return [r for o in outs for r in json.loads(o.read_text())]


def _max_overlap(records: list[dict]) -> int:
    events = sorted([(r["start"], 1) for r in records] + [(r["end"], -1) for r in records],
                    key=lambda e: (e[0], e[1]))
    now = peak = 0
    for _, delta in events:
        now += delta
        peak = max(peak, now)
    return peak


def test_two_processes_share_the_rate_and_the_concurrency(tmp_path):
    shared = str(tmp_path / "limits")
    records = _two_ranks(tmp_path, (shared, shared))
    slots = sorted(r["slot"] for r in records)
    gaps = [b - a for a, b in zip(slots, slots[1:])]
    assert len(slots) == 16 and min(gaps) >= 1 / RATE - 1e-6  # one start every 1/RATE s, host-wide
    assert all(r["start"] >= r["slot"] for r in records)  # nobody started before its slot
    assert _max_overlap(records) <= CONCURRENT


def test_positive_control_separate_limiters_do_not_see_each_other(tmp_path):
    """The same two ranks with a limiter each (separate directories) collide: the sharing above is
    what spaces them."""
    records = _two_ranks(tmp_path, (str(tmp_path / "a"), str(tmp_path / "b")))
    slots = sorted(r["slot"] for r in records)
    assert min(b - a for a, b in zip(slots, slots[1:])) < 1 / RATE - 1e-6


@pytest.mark.parametrize("shared", [True, False])
def test_concurrency_slots_are_shared_through_the_directory(tmp_path, shared):
    """Two limiters (as two ranks would have) hold at most CONCURRENT creates together when they
    share a directory; apart (the positive control) each allows CONCURRENT on its own."""
    import asyncio
    import time

    dirs = [tmp_path / "s", tmp_path / "s"] if shared else [tmp_path / "a", tmp_path / "b"]
    limiters = [HostLimiter("daytona", concurrent=CONCURRENT, directory=str(d)) for d in dirs]
    records: list[dict] = []

    async def one(limiter: HostLimiter) -> None:
        async with limiter.create_slot():
            start = time.time()
            await asyncio.sleep(0.1)
            records.append({"start": start, "end": time.time()})

    async def main() -> None:
        await asyncio.gather(*(one(limiter) for limiter in limiters for _ in range(4)))

    asyncio.run(main())
    assert len(records) == 8
    assert (_max_overlap(records) <= CONCURRENT) if shared else (_max_overlap(records) > CONCURRENT)


def test_bad_limits_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="rate"):
        HostLimiter("x", rate_per_s=0, directory=str(tmp_path))
    with pytest.raises(ConfigError, match="host_create_concurrency"):
        PoolSettings(host_create_concurrency=0)


def test_a_pool_creates_through_the_host_limiter(flaky_provider, tmp_path, monkeypatch):
    import trl_sandbox.pool.host_limit as host_limit

    monkeypatch.setattr(host_limit, "default_dir", lambda: str(tmp_path))
    settings = PoolSettings(host_create_rate=50.0, host_create_concurrency=1)
    from trl_sandbox.pool.sandbox_pool import SandboxPool

    with SandboxPool.open(flaky_provider(), size=3, pool_settings=settings) as pool:
        assert pool.run(["python3", "-c", "print(1)"], timeout=5).stdout == "1\n"
    assert (tmp_path / "flaky.rate").exists() and (tmp_path / "flaky.slot0").exists()

"""The ray provider on a real Ray cluster of three nodes on this machine (``conftest.cluster``):
the pool contract through actors, placement over nodes, verdicts equal to the local provider's,
known hacks, lost nodes and actors, a killed driver, and construction errors."""

from __future__ import annotations

import asyncio
import random
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

pytest.register_assert_rewrite("trl_sandbox.plugins.testing")

from conftest import NODE_SANDBOXES, actor_table, bwrap_pids, wait_until  # noqa: E402
from trl_sandbox_ray import RayProvider  # noqa: E402
from trl_sandbox_ray.cluster import actor_name as cluster_name  # noqa: E402
from trl_sandbox_ray.cluster import parse_name  # noqa: E402

from trl_sandbox import ConfigError, ResourceLimits, SandboxSpec  # noqa: E402
from trl_sandbox.plugins import providers, testing  # noqa: E402
from trl_sandbox.plugins.testing import FAST  # noqa: E402
from trl_sandbox.pool.sandbox_pool import SandboxPool  # noqa: E402
from trl_sandbox.scoring.scorer import Scorer  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
TAGS = {"trl-sandbox": "1", "trl-sandbox-run": "ray-test"}
# A Ray cluster per test process and ~1 min of it: the main suite only (scripts/test-matrix.sh).
pytestmark = pytest.mark.slow
LIVE_STATES = ("ALIVE", "PENDING_CREATION", "DEPENDENCIES_UNREADY", "RESTARTING")


@pytest.fixture(scope="module")
def make(cluster):
    """A provider factory on the test cluster: half a CPU and one ``sandbox`` unit per sandbox."""

    def make(**settings):
        provider = RayProvider(address=cluster.address, cpus_per_sandbox=0.5, resources={"sandbox": 1},
                               probe=settings.pop("probe", False), **settings)
        make.last = provider
        return provider

    make(probe=True)  # connect this process once, through the provider's own path
    return make


def live() -> list[str]:
    return [parse_name(a["Name"])[0] for a in actor_table() if a["State"] in LIVE_STATES]


def nodes_of(ids) -> set[str]:
    return {a["Address"]["NodeID"] for a in actor_table() if parse_name(a["Name"])[0] in ids}


def test_address_local_starts_a_one_machine_ray_for_trying_it_out():
    """A Ray started by the provider itself, in a fresh process: its GCS and raylet stay up past
    the connection (Ray ties them to the thread that started them), so the probe runs there."""
    built = _construct({"address": "local", "cpus_per_sandbox": 0.5})
    assert built.stdout.strip().endswith("built"), built.stdout + built.stderr[-2000:]


def test_registered_from_its_own_distribution():
    registration = providers()["ray"]
    assert registration.distribution == "trl-sandbox-ray" and registration.obj is RayProvider


# -- the conformance kit -------------------------------------------------------------------------


def test_exec_stdin_and_streams(make):
    testing.check_exec(make)


def test_cwd_env_and_limits(make):
    testing.check_cwd_env_and_limits(make)


def test_files_reset_and_alive(make):
    testing.check_files_reset_and_alive(make)


def test_list_by_tags_and_destroy_from_another_instance(make):
    """As the kit's ``check_list_by_tags_and_destroy``, except for the end: a closed ray provider
    ends the actors it still holds (as the local provider stops its sandboxes), where a remote
    one leaves them to the service's lifetime."""
    from trl_sandbox.plugins.testing import closing, run

    p = make()
    mine, other = {**TAGS, "batch": "a"}, {**TAGS, "batch": "b"}

    async def go():
        created = [await p.create(SandboxSpec(tags=mine)) for _ in range(3)]
        stranger = await p.create(SandboxSpec(tags=other))
        listed = await p.list(mine)
        await p.destroy(created[0].id)
        await p.destroy(created[0].id)  # already gone: quiet
        fresh = make()
        try:
            await fresh.destroy(created[1].id)  # an id this provider instance did not create
            await fresh.destroy("ray-000000000000")
            seen_by_fresh = await fresh.list(mine)
        finally:
            await fresh.aclose()
        after = await p.list(mine)
        return created, stranger, listed, after, seen_by_fresh, sorted(live())

    created, stranger, listed, after, seen_by_fresh, live_before_close = run(closing(p, go()))
    assert sorted(i.id for i in listed) == sorted(s.id for s in created)
    assert all(i.tags == mine and i.state == "running" and i.created_at for i in listed)
    assert [i.id for i in after] == [created[2].id]
    assert [i.id for i in seen_by_fresh] == [created[2].id]  # found without the creating instance
    assert live_before_close == sorted([created[2].id, stranger.id])
    assert live() == []


def test_a_sandbox_whose_actor_is_killed_is_replaced(make):
    import ray

    def vanish(sandbox_id: str) -> None:
        (name,) = [a["Name"] for a in actor_table() if parse_name(a["Name"])[0] == sandbox_id and a["State"] == "ALIVE"]
        ray.kill(ray.get_actor(name, namespace="trl-sandbox"), no_restart=True)

    testing.check_a_sandbox_that_vanishes_is_replaced(make, TAGS, vanish=vanish, live=live)


def test_scorer_end_to_end(make):
    testing.check_scorer_end_to_end_on_the_sorting_task(make, TAGS, live=live)
    testing.check_io_programs_end_to_end(make, TAGS, live=live)


def test_fault_matrix_with_actors_killed_at_random(make):
    """The remote fault matrix, its faults made by Ray itself: sandbox actors of the run are killed
    at random moments, most of them up (idle or mid-exec), some while they start. Up is what the
    provider under test has started (its sandboxes); the kill is Ray's own ``ray.kill``."""
    import ray

    stop = threading.Event()
    killed: list[str] = []

    def chaos(seed):
        stop.set()
        if seed is None:
            return
        stop.clear()
        rng = random.Random(seed)
        state = {"hit_start": False}

        def killer():
            while not stop.wait(rng.uniform(0.05, 0.25)):
                provider = make.last
                up = [cluster_name(s.id, s.tags) for s in list(provider._sandboxes.values())]
                starting = [a["Name"] for a in actor_table() if a["State"] in LIVE_STATES and f"-s{seed}" in a["Name"]
                            and a["Name"] not in up]
                # A sandbox that is up (idle or mid-exec) while the pool is whole, so that one is
                # always left to make progress however slow the machine; after a tenth of those
                # kills, its replacement too, in its start (a failed create).
                if len(up) >= 2:  # the kit's pool size
                    names, state["hit_start"] = up, rng.random() < 0.1
                elif state["hit_start"] and starting:
                    names, state["hit_start"] = starting, False
                else:
                    names = []
                if names:
                    name = rng.choice(names)
                    try:
                        ray.kill(ray.get_actor(name, namespace="trl-sandbox"), no_restart=True)
                        killed.append(name)
                    except ValueError:
                        pass

        threading.Thread(target=killer, daemon=True).start()

    seen: dict[str, dict] = {}  # every sandbox actor the cluster ever had, in the order first seen

    def created_tags():
        for a in actor_table():
            seen.setdefault(a["ActorID"], parse_name(a["Name"])[1])
        return list(seen.values())

    report = testing.check_rides_out_faults(make, TAGS, chaos=chaos, live=live, created_tags=created_tags,
                                            seeds=(1, 2), programs=300)
    print(report, len(killed))
    assert killed and sum(row["replaced"] + row["create_failures"] for row in report) > 0  # faults were ridden out
    # Positive control: the same kills against a pool that never retries cost programs (the kit
    # allows a tenth lost, so a run may also pass it: then its report shows the loss).
    try:
        lost = sum(row["programs"] - row["scored"] for row in testing.check_rides_out_faults(
            make, TAGS, chaos=chaos, live=live, created_tags=created_tags, seeds=(3, 4), programs=300,
            settings=replace(testing.MATRIX, max_attempts=1)))
    except AssertionError as exc:
        lost = str(exc)
    assert lost, "killing sandboxes under a pool that never retries lost no program"


def test_odd_and_flooding_output_comes_back_as_locally(make):
    """What a program prints reaches the host through Ray exactly as from the local provider:
    undecodable bytes, NULs, a stream past the output cap (truncated), a crash by signal."""
    from trl_sandbox.local import LocalProvider
    from trl_sandbox.plugins.testing import closing, run

    programs = [
        ["python3", "-c", "import os; os.write(1, bytes(range(256)) * 3); os.write(2, b'\\xff\\xfe\\x00err')"],
        ["python3", "-c", "import sys; sys.stdout.write('x' * (40 << 20))"],
        ["python3", "-c", "import os, signal; print('bye', flush=True); os.kill(os.getpid(), signal.SIGSEGV)"],
        ["sh", "-c", "printf '\\342\\202'; exit 7"],
    ]
    spec = SandboxSpec(limits=ResourceLimits(output_bytes=1 << 20))

    def results(provider):
        async def go():
            sandbox = await provider.create(spec)
            return [await sandbox.exec(argv, timeout=10) for argv in programs]

        return [r.__class__(**{**r.__dict__, "duration_s": 0.0}) for r in run(closing(provider, go()))]

    on_ray, on_local = results(make()), results(LocalProvider())
    assert on_ray == on_local
    assert on_ray[1].truncated and len(on_ray[1].stdout) == 1 << 20 and on_ray[2].exit_code == -11
    assert on_ray[3].exit_code == 7


# -- placement and verdicts ------------------------------------------------------------------------


def _humaneval_samples():
    from trl_sandbox_humaneval import problems

    p = problems()
    return [
        ("HumanEval/0", p["HumanEval/0"]["canonical_solution"]), ("HumanEval/0", "    return False\n"),
        ("HumanEval/2", "    return number - int(number)\n"), ("HumanEval/2", "    return round(number % 1.0, 1)\n"),
        ("HumanEval/4", "    raise ValueError('no idea')\n"), ("HumanEval/7", ""),
        ("HumanEval/23", "    while True:\n        pass\n"),
        ("HumanEval/38", p["HumanEval/38"]["canonical_solution"]),
        ("HumanEval/32", p["HumanEval/32"]["canonical_solution"]), ("HumanEval/53", "    return x + y\n"),
    ] + [(f"HumanEval/{i}", p[f"HumanEval/{i}"]["canonical_solution"]) for i in range(100, 120)]


def _score(provider, samples, size):
    from trl_sandbox_humaneval import HumanEvalTasks

    from trl_sandbox.judge.verdict import score_cases

    with SandboxPool.open(provider, size=size, spec=SandboxSpec(tags=TAGS), pool_settings=FAST) as pool:
        outcomes = score_cases(pool, HumanEvalTasks(timeout=0.5), [(c, {"task_id": t}) for t, c in samples])
        used = {s for s in getattr(provider, "_sandboxes", {})}
    return [(o.status, o.passed, o.total) for o in outcomes], used


def test_humaneval_batch_spread_over_nodes_scores_as_local(make):
    samples = _humaneval_samples()
    on_ray, used = _score(make(), samples, size=4)
    on_local, _ = _score("local", samples, size=2)
    assert on_ray == on_local
    assert [s for s, _, _ in on_ray[:10]] == ["passed", "failed", "passed", "failed", "error", "no_code",
                                              "timeout", "passed", "passed", "passed"]
    assert len(nodes_of(used)) == 2, "the pool's sandboxes should be spread over both worker nodes"
    assert live() == []


def test_known_hacks_do_not_pay_through_ray(make):
    """The hack suite's tricks (tests/test_hacks.py) through the ray provider: the judge on the
    node is the local one, so none pays; the honest controls next to them do."""
    sys.path.insert(0, str(ROOT))
    try:
        from tests.task_helpers import KADANE
        from tests.test_hacks import CALL_HACKS, CHECK_HACKS, CHECK_ROW, NONCE_HUNT
    finally:
        sys.path.remove(str(ROOT))
    from trl_sandbox.tasks.builtin import TASKS
    from trl_sandbox.tasks.generic import tasks_from_dict

    call_row = tasks_from_dict({"max_subarray": {**TASKS["max_subarray"], "timeout": 0.5}}, extract="raw")[0]
    completions = [KADANE, "    return number % 1.0\n", NONCE_HUNT, *CALL_HACKS.values(), *CHECK_HACKS.values()]
    rows = [call_row, CHECK_ROW, call_row] + [call_row] * len(CALL_HACKS) + [CHECK_ROW] * len(CHECK_HACKS)
    with SandboxPool.open(make(), size=4, spec=SandboxSpec(tags=TAGS), pool_settings=FAST) as pool:
        outcomes = Scorer(pool, cache_size=0).score(completions, rows)
    assert [(o.status, o.reward) for o in outcomes[:2]] == [("passed", 1.0), ("passed", 1.0)]
    hunt = outcomes[2]  # the real judge saw 5 every time: only the single-element test [5] is right
    assert hunt.status in ("failed", "error") and hunt.passed <= 1 and hunt.reward is not None and hunt.reward < 1
    paid = [(name, o) for name, o in zip([*CALL_HACKS, *CHECK_HACKS], outcomes[3:])
            if o.status == "passed" or o.reward is None or o.reward > 0]
    assert paid == []


def test_a_node_lost_mid_batch_costs_time_not_scores(cluster, make):
    """A third node joins, hosts sandboxes, and is removed while a batch runs: every completion is
    still scored exactly, the lost ones on the other nodes, and no bwrap outlives the pool."""
    import ray

    doomed = cluster.add_node(num_cpus=4, resources={"sandbox": NODE_SANDBOXES}, node_ip_address="127.0.0.1")
    cluster.wait_for_nodes()
    doomed_id = doomed.node_id
    slow_right = "    import time\n    time.sleep(0.3)\n    return number - int(number)\n"
    samples = [("HumanEval/2", slow_right), ("HumanEval/2", "    return round(number % 1.0, 1)\n")] * 15
    from trl_sandbox_humaneval import HumanEvalTasks

    from trl_sandbox.judge.verdict import score_cases

    provider = make()
    result: dict = {}
    with SandboxPool.open(provider, size=6, spec=SandboxSpec(tags=TAGS), pool_settings=FAST) as pool:
        on_doomed = wait_until(lambda: [s for s in provider._sandboxes.values() if s.node_id == doomed_id], 30)
        assert on_doomed, "SPREAD placed no sandbox on the third node"

        def batch():
            result["outcomes"] = score_cases(pool, HumanEvalTasks(timeout=2.0), [(c, {"task_id": t}) for t, c in samples])

        worker = threading.Thread(target=batch)
        worker.start()
        wait_until(lambda: pool.drain_stats().counts["execs"] > 0 or not worker.is_alive(), 30, 0.02)
        cluster.remove_node(doomed)
        worker.join(120)
        assert not worker.is_alive()
        stats = pool.drain_stats()
        hosts = {s.node_id for s in provider._sandboxes.values()}
        print("node lost:", dict(stats.counts))
    outcomes = result["outcomes"]
    assert [o.status for o in outcomes] == ["passed", "failed"] * 15
    assert stats.counts["replaced"] >= 1 or stats.counts["created"] > 6
    assert doomed_id not in hosts
    assert live() == []
    assert wait_until(lambda: not bwrap_pids(), 20) or bwrap_pids() == []
    assert doomed_id not in {n["NodeID"] for n in ray.nodes() if n["Alive"]}


def test_a_killed_driver_takes_its_sandboxes_along(cluster, make, tmp_path):
    """The process that made the pool is SIGKILLed: Ray ends its actors, bwrap dies with them."""
    import os
    import signal
    import subprocess

    script = tmp_path / "driver.py"
    script.write_text(
        "import sys, time\n"
        "from trl_sandbox.plugins import make_provider\n"
        "from trl_sandbox.pool.sandbox_pool import SandboxPool\n"
        "from trl_sandbox import SandboxSpec\n"
        f"settings = dict(address={cluster.address!r}, cpus_per_sandbox=0.5, resources='sandbox=1', probe='false')\n"
        "pool = SandboxPool(make_provider('ray', settings), size=3, spec=SandboxSpec(tags={'trl-sandbox-run': 'doomed-driver'}))\n"
        "pool.start(wait=True)\n"
        "print(pool.run(['echo', 'ready'], timeout=10).stdout, flush=True)\n"
        "time.sleep(600)\n")
    before = set(bwrap_pids())
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert driver.stdout.readline().strip() == "ready"
        def alive_ones():
            return [a for a in actor_table() if "doomed-driver" in a["Name"] and a["State"] == "ALIVE"]

        # "ready" comes once one sandbox is up; the pool fills up to its three behind it.
        wait_until(lambda: len(alive_ones()) == 3 and len(set(bwrap_pids()) - before) >= 3, 60)
        assert len(alive_ones()) == 3 and set(bwrap_pids()) - before
        driver.send_signal(signal.SIGKILL)
        driver.wait(10)
        gone = wait_until(lambda: not [a for a in actor_table() if "doomed-driver" in a["Name"]
                                       and a["State"] in LIVE_STATES], 30)
        assert gone, [a["State"] for a in actor_table() if "doomed-driver" in a["Name"]]
        assert wait_until(lambda: not (set(bwrap_pids()) - before), 20), "bwrap outlived its actor"
    finally:
        driver.kill()


# -- construction ------------------------------------------------------------------------------------


def _construct(settings: dict) -> subprocess.CompletedProcess:
    """Build the provider in a fresh process (this one is connected already), as a trainer would."""
    import os
    import subprocess

    code = ("from trl_sandbox.plugins import make_provider\n"
            "from trl_sandbox import ConfigError\n"
            "try:\n"
            f"    make_provider('ray', {settings!r})\n"
            "    print('built')\n"
            "except ConfigError as exc:\n"
            "    print('ConfigError:', exc)\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})


import subprocess  # noqa: E402


def test_construction_errors_say_what_to_do(cluster):
    unreachable = _construct({"address": "127.0.0.1:1", "connect_timeout_s": 5})
    assert "ConfigError: ray provider: no Ray cluster answers at address='127.0.0.1:1'" in unreachable.stdout
    assert "ray start --head" in unreachable.stdout
    no_node = _construct({"address": cluster.address, "resources": "gpu_free_cpu_node=1"})
    assert "ConfigError: ray provider: no node of the cluster" in no_node.stdout and "gpu_free_cpu_node" in no_node.stdout
    too_big = _construct({"address": cluster.address, "cpus_per_sandbox": 64})
    assert "ConfigError: ray provider: no node of the cluster" in too_big.stdout
    no_bwrap = _construct({"address": cluster.address, "cpus_per_sandbox": 0.5, "bwrap": "/nonexistent/bwrap"})
    assert "ConfigError: ray provider: a node cannot host the local sandbox" in no_bwrap.stdout
    assert "bubblewrap" in no_bwrap.stdout
    typo = _construct({"address": cluster.address, "cpu_per_sandbox": 1})
    assert "ConfigError: ray provider: unknown setting(s) cpu_per_sandbox" in typo.stdout
    control = _construct({"address": cluster.address, "cpus_per_sandbox": 0.5})
    assert control.stdout.strip().endswith("built"), control.stdout + control.stderr


def test_settings_are_checked_before_connecting():
    for settings, words in [({"strategy": "RANDOM"}, "SPREAD or DEFAULT"),
                            ({"cpus_per_sandbox": "many"}, "must be a number"),
                            ({"resources": "sandbox"}, "KEY=VALUE"),
                            ({"start_timeout_s": 0}, "positive")]:
        with pytest.raises(ConfigError, match=words):
            RayProvider(address="127.0.0.1:1", **settings)


# -- model code and the cluster ----------------------------------------------------------------------

REACH_RAY = r"""
import json, os, socket, sys
host, port = sys.argv[1].rsplit(":", 1)
seen = {}
try:
    socket.create_connection((host, int(port)), timeout=2).close()
    seen["gcs"] = "connected"
except OSError as exc:
    seen["gcs"] = type(exc).__name__
seen["ray_dir"] = sorted(os.listdir("/tmp/ray")) if os.path.isdir("/tmp/ray") else None
cmdlines = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        cmdlines.append(open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace"))
    except OSError:
        pass
seen["ray_processes"] = [c for c in cmdlines if "raylet" in c or "gcs_server" in c or "ray::" in c]
seen["ray_env"] = sorted(k for k in os.environ if k.startswith("RAY"))
print(json.dumps(seen))
"""


def test_model_code_cannot_reach_the_cluster(cluster, make):
    """From inside a sandbox on a node: no connection to the cluster's GCS, no Ray session files,
    no Ray process in sight, no Ray variable in the environment. Positive control: the same
    program run beside the actor, as the actor's own process sees the node, finds all four."""
    import json
    import os
    import subprocess

    from trl_sandbox.plugins.testing import closing, run

    p = make()

    async def go():
        sandbox = await p.create(SandboxSpec(tags=TAGS))
        return await sandbox.exec(["python3", "-c", REACH_RAY, cluster.address], timeout=10)

    inside = json.loads(run(closing(p, go())).stdout)
    assert inside["gcs"] != "connected" and inside["ray_dir"] is None
    assert inside["ray_processes"] == [] and inside["ray_env"] == []
    outside = subprocess.run([sys.executable, "-c", REACH_RAY, cluster.address], capture_output=True, text=True,
                             env={**os.environ, "RAY_ADDRESS": cluster.address}, timeout=30)
    seen = json.loads(outside.stdout)
    assert seen["gcs"] == "connected" and seen["ray_dir"] and seen["ray_processes"] and seen["ray_env"]


def test_ls_and_reap_from_another_process_find_sandboxes_by_tags(cluster, make):
    """``trl-sandbox ls`` / ``reap`` from a separate process list and end another driver's
    sandboxes by their tags, through the cluster's actor directory; other runs' are untouched."""
    import os
    import subprocess

    cli = [str(Path(sys.executable).parent / "trl-sandbox")]
    common = ["--provider", "ray", "--setting", f"address={cluster.address}", "--setting", "probe=false"]
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    mine, other = {**TAGS, "trl-sandbox-run": "cli-mine"}, {**TAGS, "trl-sandbox-run": "cli-other"}
    with SandboxPool.open(make(), size=2, spec=SandboxSpec(tags=mine), pool_settings=FAST) as pool, \
            SandboxPool.open(make(), size=1, spec=SandboxSpec(tags=other), pool_settings=FAST) as bystander:
        ids = sorted(pool._members)
        listed = subprocess.run(cli + ["ls", *common, "--tag", "trl-sandbox-run=cli-mine"], capture_output=True,
                                text=True, env=env, timeout=120)
        assert sorted(line.split("\t")[0] for line in listed.stdout.splitlines()) == ids, listed.stderr
        reaped = subprocess.run(cli + ["reap", *common, "--tag", "trl-sandbox-run=cli-mine"], capture_output=True,
                                text=True, env=env, timeout=120)
        assert "2 sandbox(es) reaped" in reaped.stderr, reaped.stderr
        assert wait_until(lambda: not set(ids) & set(live()), 20)
        assert bystander.run(["echo", "untouched"], timeout=10).stdout == "untouched\n"
        assert pool.run(["echo", "replaced"], timeout=10).stdout == "replaced\n"  # the pool heals
    assert live() == []


def test_train_the_cpu_demo_on_the_cluster(cluster, make, tmp_path, monkeypatch):
    """``trl-sandbox train --preset cpu-demo --sandbox_provider ray`` for 4 steps (warm start cut
    to 40 steps): every completion scored on the cluster's sandboxes, none as infrastructure."""
    import dataclasses
    import functools
    import json

    from trl_sandbox.commands import train
    from trl_sandbox.training.presets import PRESETS, cpu_demo

    quick = dataclasses.replace(PRESETS["cpu-demo"], builder=functools.partial(
        cpu_demo.build_cpu_demo, warm_start_settings={"steps": 40}, progress=False))
    monkeypatch.setitem(PRESETS, "cpu-demo", quick)
    out = tmp_path / "run"
    settings = f"address={cluster.address},cpus_per_sandbox=0.5,resources=sandbox=1"
    rc = train.main(["--preset", "cpu-demo", "--sandbox_provider", "ray", "--sandbox_provider_settings", settings,
                     "--output_dir", str(out), "--max_steps", "4", "--disable_tqdm", "true"])
    assert rc == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    stepped = [r for r in records if "sandbox/infra" in r]
    assert len(stepped) == 4
    for r in stepped:
        counted = sum(r[f"sandbox/{s}"] for s in ("passed", "failed", "error", "timeout", "banned", "no_code", "infra"))
        assert counted == cpu_demo.CONFIG_OVERRIDES["per_device_train_batch_size"] and r["sandbox/infra"] == 0
        assert r["sandbox/isolation_mode"] in ("cgroup-v1", "cgroup-v2", "none")  # the nodes' sandboxes
        assert "sandbox/cpu_s" not in r  # spent on the nodes, not competing with training here
    assert live() == []


def test_a_recurring_large_argument_crosses_once_per_sandbox(make):
    """The judge's source (48 KB with every judged program) is sent whole while new, then the
    actor keeps it and later execs send its digest; a one-off large argument is never kept."""
    from trl_sandbox.judge.verdict import JUDGE_SOURCE
    from trl_sandbox.plugins.testing import closing, run

    p = make()
    probe = "import sys; print(len(sys.argv[1]), sys.argv[1] == sys.argv[2])"
    argv = ["python3", "-c", probe, JUDGE_SOURCE, JUDGE_SOURCE[:100]]

    async def go():
        sandbox = await p.create(SandboxSpec())
        outs, held = [], []
        for _ in range(3):
            outs.append((await sandbox.exec(argv, timeout=10)).stdout)
            held.append(set(sandbox._held))
        one_off = "#" + "y" * 9000
        odd = await sandbox.exec(["python3", "-c", probe, one_off, "z"], timeout=10)
        # The actor itself, asked with the digest alone: it holds the source.
        by_digest = await sandbox._handle.exec.remote(False, ["python3", "-c", probe, "", "z"], None, 10.0, None, None,
                                                      {3: p.digest(JUDGE_SOURCE)[0]}, ())
        return outs, held, odd, set(sandbox._held), by_digest

    outs, held, odd, held_after_odd, by_digest = run(closing(p, go()))
    digest = p.digest(JUDGE_SOURCE)[0]
    assert outs == [f"{len(JUDGE_SOURCE)} False\n"] * 3
    assert held == [set(), {digest}, {digest}]  # recurring from the second exec on: kept by the actor
    assert odd.stdout == "9001 False\n" and held_after_odd == {digest}  # the one-off is not kept
    assert by_digest[0] == "ok" and by_digest[1].stdout == f"{len(JUDGE_SOURCE)} False\n"


def test_an_actor_without_a_digest_gets_the_argument_again(make):
    from trl_sandbox.judge.verdict import JUDGE_SOURCE
    from trl_sandbox.plugins.testing import closing, run

    p = make()
    argv = ["python3", "-c", "import sys; print(len(sys.argv[1]))", JUDGE_SOURCE]

    async def go():
        sandbox = await p.create(SandboxSpec())
        await sandbox.write_file("left-by-the-last-lease.txt", b"x")
        assert sandbox.defer_reset()  # the pool took the sandbox back: the reset rides with the next call
        p.digest(JUDGE_SOURCE)  # seen before: it recurs
        sandbox._held.add(p.digest(JUDGE_SOURCE)[0])  # the driver wrongly believes the actor holds it
        assert set(sandbox._intern(list(argv))[1]) == {3}  # it would go as its digest alone
        result = await sandbox.exec(argv, timeout=10)
        listing = await sandbox.exec(["ls", "-A"], timeout=10)
        return result, set(sandbox._held), listing

    result, held, listing = run(closing(p, go()))
    assert result.stdout == f"{len(JUDGE_SOURCE)}\n" and held == set()
    assert listing.stdout == ""  # the reset that rode with the refused call still happened


def test_two_ranks_share_the_cluster_each_with_its_own_pool(cluster, make, tmp_path):
    """``accelerate launch`` with two CPU processes and ``--sandbox_provider ray``: both ranks
    connect to the one cluster, each makes its own pool there (its sandboxes tagged with its rank
    and pid), every completion of the run is scored, and nothing of either rank is left."""
    import json
    import os
    import subprocess

    sys.path.insert(0, str(ROOT))
    try:
        from tests import tiny
    finally:
        sys.path.remove(str(ROOT))
    model_dir = tmp_path / "model"
    tiny.model().save_pretrained(model_dir)
    tiny.tokenizer().save_pretrained(model_dir)
    before = {a["ActorID"] for a in actor_table()}
    launch = [str(Path(sys.executable).with_name("accelerate")), "launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    settings = f"address={cluster.address},cpus_per_sandbox=0.5,resources=sandbox=1"
    cmd = [*launch, "-m", "trl_sandbox.commands.train", "--no_plot", "--use_cpu", "true", "--bf16", "false",
           "--model", str(model_dir), "--max_steps", "2", "--per_device_train_batch_size", "2",
           "--num_generations", "2", "--max_completion_length", "8", "--sandbox_pool_size", "2",
           "--sandbox_provider", "ray", "--sandbox_provider_settings", settings,
           "--output_dir", str(tmp_path / "out"), "--report_to", "none", "--logging_steps", "1"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "sandbox/reward_call_s" in r]
    assert len(steps) == 2 and all(r["sandbox/infra"] == 0 for r in steps)
    assert all(sum(r[f"sandbox/{s}"] for s in ("passed", "failed", "error", "timeout", "banned", "no_code")) == 4
               for r in steps)
    made = [(a, parse_name(a["Name"])[1]) for a in actor_table() if a["ActorID"] not in before]
    pools = {(tags.get("rank"), tags.get("trl-sandbox-pid")) for _, tags in made
             if "trl-sandbox-probe" not in tags}
    assert {rank for rank, _ in pools} == {"0", "1"} and len(pools) == 2, pools  # one pool per rank
    assert len({tags.get("trl-sandbox-run") for _, tags in made if "trl-sandbox-probe" not in tags}) == 1
    assert [a for a, _ in made if a["State"] in LIVE_STATES] == []


def test_floods_of_output_cannot_cost_a_neighbour_its_result(make):
    """Programs that each fill both streams to the cap (2 x 16 MiB, default limits) at once, more
    than the test nodes' object stores hold together, next to honest programs: every one comes
    back as a result (the floods truncated), the honest ones exact, no job lost to Ray."""
    flood = ["python3", "-c", "import os\nchunk = b'x' * (1 << 20)\nfor _ in range(20):\n"
             "    os.write(1, chunk); os.write(2, chunk)\n"]
    honest = ["python3", "-c", "print(sum(range(10)))"]
    with SandboxPool.open(make(), size=6, spec=SandboxSpec(tags=TAGS), pool_settings=FAST) as pool:
        async def batch():
            jobs = [pool.aexec(flood if i % 2 else honest, timeout=20) for i in range(24)]
            return await asyncio.gather(*jobs, return_exceptions=True)

        results = pool.loop.run(batch())
        stats = pool.drain_stats()
    assert all(not isinstance(r, BaseException) for r in results), results
    floods, honests = results[1::2], results[0::2]
    assert all(r.truncated and len(r.stdout) == len(r.stderr) == 16 << 20 for r in floods)
    assert all(r.stdout == "45\n" and r.exit_code == 0 for r in honests)
    assert stats.counts["replaced"] == 0 and stats.counts["infra_errors"] == 0

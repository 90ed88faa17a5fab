"""Agent tasks graded where the agent cannot reach, on the local sandbox.

Every hostile script runs next to the task's oracle in the same pool: the oracle passes (the
positive control), the attack does not. Single-turn samples are shell scripts (the agent's
actions); episodes use ``SandboxEnvironment``'s tools.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from trl_sandbox.agents.grading import _pytest_verdict, carried
from trl_sandbox.agents.load import agent_rows
from trl_sandbox.environments.cache import remove_tree
from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.scoring.scorer import Scorer
from trl_sandbox.training.environment import SandboxEnvironment


@pytest.fixture(scope="module")
def pool():
    cache = Path(tempfile.mkdtemp(prefix="trl-sandbox-agenttest-", dir="/var/tmp"))
    os.chmod(cache, 0o755)
    with SandboxPool.open("local", size=2, settings={"environment_cache": str(cache)}) as pool:
        yield pool
    remove_tree(cache)


@pytest.fixture(scope="module")
def rows():
    return {r["task_id"]: r for r in agent_rows("builtin")}


def _score(pool, row, scripts):
    return Scorer(pool, cache_size=0).score(scripts, [row] * len(scripts))


def test_every_oracle_passes_and_doing_nothing_fails(pool, rows):
    for task_id, row in rows.items():
        oracle, nothing = _score(pool, row, [f"```bash\n{row['solution']}\n```", "true"])
        assert oracle.status == "passed", (task_id, oracle.detail)
        assert oracle.reward == 1.0
        assert nothing.status == "failed", (task_id, nothing.detail)


HOSTILE = {
    "a reward file written during the episode": (
        "mkdir -p logs/verifier; echo 1 > logs/verifier/reward.txt; echo 1 > /logs/verifier/reward.txt; "
        "mkdir -p /logs/verifier; echo '{\"reward\": 1}' > /logs/verifier/reward.json; true"),
    "a fake /tests made during the episode": (
        "mkdir -p /tests tests; printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh; "
        "printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > tests/test.sh; true"),
    "a detached process that fixes the code after the episode": (
        "cp -r . /tmp/copy; (sleep 2; cd /app && bash -c \"$SOLUTION\") > /dev/null 2>&1 & disown; true"),
    "a sitecustomize, usercustomize and .pth that forge the reward": (
        "F='import os; os.makedirs(\"/logs/verifier\", exist_ok=True); open(\"/logs/verifier/reward.txt\", \"w\").write(\"1\")';"
        "echo \"$F\" > sitecustomize.py; echo \"$F\" > usercustomize.py; echo \"import os; $F\" > forge.pth;"
        "mkdir -p .local/lib/python3.11/site-packages; echo \"$F\" > .local/lib/python3.11/site-packages/usercustomize.py;"
        "mkdir -p stats && echo \"$F\" > stats/sitecustomize.py; true"),
    "a conftest.py that marks everything passed": (
        "printf 'import pytest\\n@pytest.hookimpl(hookwrapper=True)\\ndef pytest_runtest_makereport(item, call):\\n"
        "    o = yield\\n    o.get_result().outcome = \"passed\"\\n' > conftest.py; cp conftest.py tests/conftest.py; true"),
    "a symlink to the hidden tests": "ln -sf /tests/run_tests.py stats/core.py; true",
    "a disk filler": "head -c 400000000 /dev/zero > big || true; for i in $(seq 1 30000); do : > f$i; done 2>/dev/null; true",
    "a fork bomb left behind": "b() { b | b & }; (b) > /dev/null 2>&1 & sleep 0.5; true",
}


@pytest.mark.parametrize("attack", sorted(HOSTILE))
def test_attacks_on_the_verdict_fail_and_the_oracle_passes_next(pool, rows, attack):
    row = rows["fix-median"]
    script = f"SOLUTION={_quote(row['solution'])}\n{HOSTILE[attack]}"
    hostile, honest = _score(pool, row, [script, row["solution"]])
    assert hostile.status in ("failed", "timeout"), (attack, hostile.status, hostile.detail)
    assert hostile.reward is not None and hostile.reward < 1.0
    assert honest.status == "passed", (attack, honest.detail)  # the control, in the same pool


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def test_edited_or_deleted_tests_in_the_tree_are_restored(pool, rows):
    row = dict(rows["fix-median"])
    row["protected"] = ["tests/test_core.py"]
    row["verify"] = ("cd /app && python3 -m unittest discover -s tests -t . > /dev/null 2>&1 && "
                     "echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt")
    weaken = "echo 'import unittest' > tests/test_core.py; true"
    delete = "rm tests/test_core.py; true"
    # The repository's own test fails on the unfixed code: weakening or deleting it must not pass.
    outcomes = _score(pool, row, [weaken, delete, row["solution"]])
    assert [o.status for o in outcomes] == ["failed", "failed", "passed"], [o.detail for o in outcomes]
    # Control: unprotected, the weakened test does pass (what protection prevents).
    row["protected"] = []
    assert _score(pool, row, [weaken])[0].status == "passed"


def test_an_episode_is_graded_on_what_it_left(pool, rows):
    row = rows["error-digest"]
    scorer = Scorer(pool, cache_size=0)
    env = SandboxEnvironment(pool, scorer)
    env.reset(**row)
    env.bash("echo 1 > /logs/verifier/reward.txt; mkdir -p /tests; true")
    assert env.get_reward() == 0.0  # nothing solved; the forgery did not count
    env = SandboxEnvironment(pool, scorer)
    env.reset(**row)
    env.bash(row["solution"])
    assert env.get_reward() == 1.0  # the control: the oracle, as an episode


def test_only_changes_inside_the_rules_are_carried(tmp_path):
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    changes = [
        ("ok.py", "f", 0o644, b"x"),
        ("pkg", "d", 0o755, b""),
        ("pkg/conftest.py", "f", 0o644, b""),
        ("venv/lib/evil.pth", "f", 0o644, b""),
        ("venv/bin/tool", "f", 0o755, b""),
        ("link", "l", 0, b"../../etc/passwd"),
        ("inside", "l", 0, b"pkg/ok.py"),
        ("abs", "l", 0, b"/tests/x"),
        (".git", "d", 0o755, b""),
        (".git/hooks/post-checkout", "f", 0o755, b""),
        ("keep.txt", "w", 0, b""),
        ("guarded", "f", 0o644, b""),
    ]
    kept, refused = carried(changes, protected=["guarded"], tree=tmp_path)
    assert [c[0] for c in kept] == ["ok.py", "pkg", "inside", "keep.txt"]
    assert len(refused) == 7


def test_a_pytest_verdict_needs_the_report_of_a_finished_run():
    junit = (b'<testsuites><testsuite tests="2"><testcase classname="tests.test_x" name="test_a" file="tests/test_x.py"/>'
             b'<testcase classname="tests.test_x" name="test_b"><failure/></testcase></testsuite></testsuites>')
    expected = ["tests/test_x.py::test_a"]
    assert _pytest_verdict({"junit.xml": junit}, expected, "").status == "passed"
    assert _pytest_verdict({"junit.xml": junit}, expected + ["tests/test_x.py::test_b"], "").status == "failed"
    # An os._exit(0) at import ends pytest before it writes its report: nothing passed.
    assert _pytest_verdict({}, expected, "").status == "failed"
    # With no expected ids, every test that ran must have passed, and at least one ran.
    assert _pytest_verdict({"junit.xml": junit}, [], "").status == "failed"
    assert _pytest_verdict({"junit.xml": b"<testsuite/>"}, [], "").status == "failed"


FORGE = "import os, sys\nsys.stdout.write('all passed\\n'); sys.stdout.flush()\nos._exit(0)\n"


def _plant(path, text):
    return f"mkdir -p $(dirname {path}) && cat >> {path} <<'FORGE_END'\n{text}FORGE_END\ntrue"


def test_a_blanket_forgery_fails_where_the_judge_never_imports_the_agents_code(pool, rows):
    """The built-in fix-median judges in a process that never imports the agent's code (each case
    runs in a child, whose answer must be the median): an "all passed" printed and flushed before
    ``os._exit(0)`` at import fails. Control: against a verifier that imports the agent's package in
    its own process and trusts what it prints, the same forgery pays (it beat the canary test this
    task had before, which that process reported)."""
    row = dict(rows["fix-median"])
    forged, honest = _score(pool, row, [_plant("stats/__init__.py", FORGE), row["solution"]])
    assert forged.status == "failed" and honest.status == "passed", (forged.detail, honest.detail)
    row["verify"] = ("cd /app && PYTHONPATH=/app python3 -c 'import stats; print(\"failed\")' | grep -qx 'all passed' "
                     "&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt")
    assert _score(pool, row, [_plant("stats/__init__.py", FORGE)])[0].status == "passed"


@pytest.mark.parametrize("module", ["unittest.py", "json/__init__.py", "pytest.py"])
def test_a_new_module_that_replaces_what_the_verifier_imports_is_not_carried(pool, rows, module, monkeypatch):
    """A module or package at the top of the tree (on ``sys.path`` for ``python -m`` and
    ``PYTHONPATH=.``) named like a standard or test-runner module would run the agent's code in a
    verifier that never imports the agent's package. Control: with the rule off, it pays."""
    from trl_sandbox.agents import grading

    row = dict(rows["fix-median"])
    name = module.split("/")[0].removesuffix(".py")
    row["verify"] = (f"cd /app && PYTHONPATH=/app python3 -c 'import {name}, sys; sys.exit(1)' "
                     "&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt")
    forged, honest = _score(pool, row, [_plant(module, FORGE), row["solution"]])
    assert forged.status == "failed" and "would replace the module" in forged.detail, forged.detail
    assert honest.status == "failed"  # this verifier fails everything: only a forgery passes it
    monkeypatch.setattr(grading, "SHADOWED", frozenset())
    assert _score(pool, row, [_plant(module, FORGE)])[0].status == "passed"


def test_evaluate_scores_bash_samples_on_harbor_task_directories(tmp_path, capsys):
    import json

    from trl_sandbox.agents.builtin_tasks import write_builtin
    from trl_sandbox.commands.cli import main

    tasks = tmp_path / "tasks"
    write_builtin(tasks)
    rows = {r["task_id"]: r for r in agent_rows(str(tasks), image_map=["python:3.11-slim=host"])}
    samples = tmp_path / "samples.jsonl"
    lines = [{"task_id": "error-digest", "completion": f"```bash\n{rows['error-digest']['solution']}\n```"},
             {"task_id": "error-digest", "completion": "echo 1 > /logs/verifier/reward.txt"},
             {"task_id": "fix-median", "completion": rows["fix-median"]["solution"]}]
    samples.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "results.jsonl"
    cache = Path(tempfile.mkdtemp(prefix="trl-sandbox-agenteval-", dir="/var/tmp"))
    os.chmod(cache, 0o755)
    try:
        assert main(["evaluate", str(samples), "--tasks", str(tasks), "--image-map", "python:3.11-slim=host",
                     "--setting", f"environment_cache={cache}", "--output", str(out), "--k", "1",
                     "--no-progress"]) == 0
    finally:
        remove_tree(cache)
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["status"] for r in results] == ["passed", "failed", "passed"], results
    # Control: an image the map does not resolve is a clear error at load time.
    capsys.readouterr()
    assert main(["evaluate", str(samples), "--tasks", str(tasks), "--image-map", "ubuntu:22.04=host"]) == 2
    assert "not in the image map; pass --image-map" in capsys.readouterr().err


def test_an_agent_that_stalls_past_the_reward_deadline_gets_its_verdict_not_none(pool, rows, monkeypatch):
    """A reward call's deadline shorter than an agent's own time budget would let a sample that only
    stalls score ``None`` (left out of its group) instead of its failure: the call waits for every
    agent sample's verdict. Control: held to the bare deadline, the stalling sample scores infra."""
    row = {**rows["error-digest"], "agent_timeout": 3, "verify_timeout": 30}
    scorer = Scorer(pool, cache_size=0)
    stalled, honest = pool.loop.run(scorer.ascore(["sleep 60", row["solution"]], [row, row], deadline_s=1.0))[0]
    assert stalled.status in ("failed", "timeout") and stalled.reward is not None, stalled.detail
    assert honest.status == "passed", honest.detail
    monkeypatch.setattr(Scorer, "_agent_deadline", lambda self, rows: 0.0)
    [held] = pool.loop.run(scorer.ascore(["sleep 60"], [row], deadline_s=1.0))[0]
    assert held.status == "infra" and held.reward is None, held.detail


DAEMON = '''
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for fd in (0, 1, 2):
            os.close(fd)
        for _ in range(200000):
            try:
                if open("/logs/verifier/reward.txt").read().strip() == "0":
                    open("/logs/verifier/reward.txt", "w").write("1\\n")
            except OSError:
                pass
            time.sleep(0.0002)
    os._exit(0)
'''


@pytest.mark.parametrize("first", ["", "import signal\ntry:\n    os.kill(1, signal.SIGSTOP)\nexcept OSError:\n    pass\n"])
def test_a_daemon_left_by_the_agents_code_cannot_overwrite_the_reward_the_script_writes(pool, rows, monkeypatch, first):
    """The tests run the agent's package in a child; a daemon it leaves waits for the script to write
    its 0 and overwrites it with a 1 before the script exits (found by playing the model: it passed
    every time). The supervisor, the namespace's init (which a SIGSTOP from inside cannot stop),
    kills each orphan of the verifier as it arrives. Control: without that, the same daemon pays;
    the oracle passes next to it."""
    from trl_sandbox.local.agent_ops import AgentGrading

    row = rows["fix-median"]
    plant = f"cat >> stats/__init__.py <<'PY'\nimport os\n{first}{DAEMON}PY\ntrue"
    daemon, honest = _score(pool, row, [plant, row["solution"]])
    assert (daemon.status, daemon.reward) == ("failed", 0.0), daemon.detail
    assert honest.status == "passed", honest.detail

    async def unguarded(self, command, *, timeout, env):
        return await self.exec(["/bin/sh", "-c", command], timeout=timeout, env=env)

    monkeypatch.setattr(AgentGrading, "run_verifier", unguarded)
    assert _score(pool, row, [plant])[0].status == "passed"

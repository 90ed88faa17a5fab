"""SandboxGRPOTrainer: wiring, metrics, teardown and construction-time errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from datasets import Dataset

from tests import tiny
from trl_sandbox import ConfigError, SandboxGRPOConfig, SandboxGRPOTrainer, SandboxReward

ROOT = Path(__file__).resolve().parent.parent


def echo_dataset(n: int = 4) -> Dataset:
    return Dataset.from_list(
        [{"prompt": "print", "sandbox_task": "echo", "task_id": "four", "expected": "4"} for _ in range(n)]
    )


def test_two_steps_with_metrics_and_teardown(tmp_path):
    journal = tmp_path / "journal"
    args = SandboxGRPOConfig(
        **tiny.grpo_kwargs(tmp_path), sandbox_provider="flaky",
        sandbox_provider_settings={"journal": str(journal)}, sandbox_pool_size=2, sandbox_tags="team=rl,exp=7",
    )
    trainer = SandboxGRPOTrainer(
        model=tiny.model(), args=args, train_dataset=echo_dataset(), processing_class=tiny.tokenizer()
    )
    assert isinstance(trainer.reward_funcs[0], SandboxReward)
    trainer.train()
    assert trainer.state.global_step == 2

    logs = [r for r in trainer.state.log_history if "sandbox/pass_rate" in r]
    assert len(logs) == 2
    for key in ("sandbox/reward_call_s", "sandbox/exec_p95_s", "sandbox/warm_lease_rate", "sandbox/error",
                "sandbox/infra", "sandbox/retries", "sandbox/reward_time_share", "rewards/sandbox/mean"):
        assert key in logs[-1], key
    assert 0 < logs[-1]["sandbox/reward_time_share"] <= 1

    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "sandbox/pass_rate" in r] == [1, 2]

    events = [line.split() for line in journal.read_text().splitlines()]
    created = {i for e, i in events if e == "create"}
    destroyed = {i for e, i in events if e == "destroy"}
    assert len(created) >= 2 and created == destroyed
    assert trainer.sandbox_pool.members == 0


def test_every_sandbox_carries_the_run_tags(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_RUN_ID", "wb123")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    args = SandboxGRPOConfig(**tiny.grpo_kwargs(tmp_path), sandbox_provider="flaky", sandbox_pool_size=2,
                             sandbox_tags={"exp": "seven"})
    trainer = SandboxGRPOTrainer(model=tiny.model(), args=args, train_dataset=echo_dataset(),
                                 processing_class=tiny.tokenizer())
    trainer.start_sandboxes()
    try:
        trainer.sandbox_pool.wait_ready()
        provider = trainer.sandbox_pool.provider
        tags = [s.tags for s in provider.live.values()]
        assert tags
        for t in tags:
            assert t["wandb-run"] == "wb123" and t["slurm-job"] == "4242"
            assert t["exp"] == "seven" and t["team"] == "tests"  # user tags and a plugin's tags
            assert t["rank"] == "0" and t["model"] == "Qwen2ForCausalLM"
            assert t["trl-sandbox-run"] == trainer.sandbox_run.run_id
            assert t["trl-sandbox-pid"] == str(os.getpid())
    finally:
        trainer.close_sandboxes()


TEARDOWN_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    sys.path.insert(0, {root!r})
    from datasets import Dataset
    from transformers import TrainerCallback
    from tests import tiny
    from trl_sandbox import SandboxGRPOConfig, SandboxGRPOTrainer

    mode, journal, out, provider = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]

    class Trouble(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 1:
                if provider == "local":  # the host pids of the live bubblewrap sandboxes
                    # Warm-up runs beside training: on a loaded machine the second sandbox may still be starting.
                    deadline = time.monotonic() + 120
                    while trainer.sandbox_pool.members < 2 and time.monotonic() < deadline:
                        time.sleep(0.05)
                    pids = [str(s.pid) for s in trainer.sandbox_pool._members.values()]
                    with open(journal, "w") as fh:
                        fh.write(" ".join(pids))
                if mode == "exception":
                    raise RuntimeError("boom inside train()")
                if mode == "sigterm":
                    os.kill(os.getpid(), signal.SIGTERM)
                if mode == "interrupt":
                    raise KeyboardInterrupt

    ds = Dataset.from_list([{{"prompt": "p", "sandbox_task": "echo", "task_id": "four", "expected": "4"}}] * 4)
    settings = {{"journal": journal}} if provider == "flaky" else {{}}
    args = SandboxGRPOConfig(**tiny.grpo_kwargs(out, max_steps=5), sandbox_provider=provider,
                             sandbox_provider_settings=settings, sandbox_pool_size=2)
    trainer = SandboxGRPOTrainer(model=tiny.model(), args=args, train_dataset=ds,
                                 processing_class=tiny.tokenizer(), callbacks=[Trouble()])
    trainer.train()
    """
)


ENDINGS = [("normal", 0), ("exception", 1), ("interrupt", -2), ("sigterm", 143)]


def _train_and_end(tmp_path: Path, mode: str, record: Path, provider: str) -> subprocess.CompletedProcess:
    """Train in a subprocess that ends as ``mode`` says; ``record`` gets its journal or sandbox pids."""
    script = tmp_path / "run.py"
    script.write_text(TEARDOWN_SCRIPT.format(root=str(ROOT)))
    return subprocess.run([sys.executable, str(script), mode, str(record), str(tmp_path / "out"), provider],
                          capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("mode,returncode", ENDINGS)
def test_pool_is_torn_down_however_training_ends(tmp_path, mode, returncode):
    """TRL does not fire on_train_end on errors: the trainer's try/finally and SIGTERM handler must."""
    journal = tmp_path / "journal"
    proc = _train_and_end(tmp_path, mode, journal, "flaky")
    assert proc.returncode == returncode, proc.stderr[-3000:]
    events = [line.split() for line in journal.read_text().splitlines()]
    created = {i for e, i in events if e == "create"}
    destroyed = {i for e, i in events if e == "destroy"}
    assert created, proc.stderr[-2000:]
    assert created == destroyed, f"leaked: {created - destroyed}"


def test_a_sigterm_during_teardown_waits_until_it_is_done():
    """A launcher SIGTERMs every rank once one failed; on a rank already tearing down its pool, that
    signal must not cut the teardown short. It is raised once the teardown is over."""
    from trl_sandbox.training.trainer import TrainingTerminated, _raise_on_sigterm

    before = signal.getsignal(signal.SIGTERM)
    done: list[str] = []
    with pytest.raises(TrainingTerminated) as ended:
        with _raise_on_sigterm() as sigterm, sigterm.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # the handler has run by now
            done.append("teardown finished")
    assert done == ["teardown finished"] and ended.value.code == 143
    # Control: outside deferred() the same signal ends the block where it is.
    with pytest.raises(TrainingTerminated):
        with _raise_on_sigterm():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            done.append("not reached")
    assert done == ["teardown finished"]
    assert signal.getsignal(signal.SIGTERM) == before  # the caller's handler is back


def test_unknown_provider_fails_at_construction(tmp_path):
    args = SandboxGRPOConfig(**tiny.grpo_kwargs(tmp_path), sandbox_provider="nonexistent")
    with pytest.raises(ConfigError, match="Installed sandbox providers:.*flaky"):
        SandboxGRPOTrainer(model=tiny.model(), args=args, train_dataset=echo_dataset(),
                           processing_class=tiny.tokenizer())


def test_dataset_without_prompt_is_rejected(tmp_path):
    args = SandboxGRPOConfig(**tiny.grpo_kwargs(tmp_path), sandbox_provider="flaky")
    bad = Dataset.from_list([{"question": "x", "sandbox_task": "echo", "expected": "4"}])
    with pytest.raises(ConfigError, match="'prompt'"):
        SandboxGRPOTrainer(model=tiny.model(), args=args, train_dataset=bad, processing_class=tiny.tokenizer())


def test_dataset_missing_task_columns_names_them(tmp_path):
    args = SandboxGRPOConfig(**tiny.grpo_kwargs(tmp_path), sandbox_provider="flaky")
    bad = Dataset.from_list([{"prompt": "x", "sandbox_task": "echo", "task_id": "four"}])
    with pytest.raises(ConfigError, match="expected"):
        SandboxGRPOTrainer(model=tiny.model(), args=args, train_dataset=bad, processing_class=tiny.tokenizer())


def test_unknown_task_set_is_rejected(tmp_path):
    args = SandboxGRPOConfig(**tiny.grpo_kwargs(tmp_path), sandbox_provider="flaky")
    bad = Dataset.from_list([{"prompt": "x", "sandbox_task": "no-such-tasks"}])
    with pytest.raises(ConfigError, match="unknown task set 'no-such-tasks'"):
        SandboxGRPOTrainer(model=tiny.model(), args=args, train_dataset=bad, processing_class=tiny.tokenizer())


def test_config_fields_parse_from_the_command_line():
    from trl import TrlParser

    parser = TrlParser(SandboxGRPOConfig)
    (config,) = parser.parse_args_and_config(
        ["--output_dir", "o", "--use_cpu", "true", "--bf16", "false", "--sandbox_provider", "flaky",
         "--sandbox_pool_size", "7", "--sandbox_provider_settings", '{"journal": "j"}',
         "--sandbox_tags", "a=1,b=2", "--sandbox_reward_scheme", "binary"]
    )
    assert config.sandbox_pool_size == 7
    assert config.sandbox_provider_settings == {"journal": "j"}
    assert config.sandbox_tags == {"a": "1", "b": "2"}
    assert config.sandbox_reward_scheme == "binary"
    assert config.sandbox_spec().lifetime_s > 0
    helps = {a.dest: a.help for a in parser._actions}
    assert all(helps[f].strip() for f in helps if f.startswith("sandbox_"))


def test_start_reaps_sandboxes_of_dead_runs_on_this_host(tmp_path):
    import asyncio
    import socket

    from trl_sandbox import SandboxSpec
    from trl_sandbox.plugins import make_provider
    from trl_sandbox.pool.tags import HOST_TAG, MANAGED_TAG, PID_TAG, clean

    server = make_provider("flaky", {"shared": True})
    server.live.clear()
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True).stdout.strip()
    mine = {MANAGED_TAG: "1", HOST_TAG: clean(socket.gethostname())}
    stale = asyncio.run(server.create(SandboxSpec(tags={**mine, PID_TAG: dead_pid})))
    other_host = asyncio.run(server.create(SandboxSpec(tags={MANAGED_TAG: "1", HOST_TAG: "elsewhere", PID_TAG: "1"})))

    args = SandboxGRPOConfig(**tiny.grpo_kwargs(tmp_path), sandbox_provider="flaky",
                             sandbox_provider_settings={"shared": "true"}, sandbox_pool_size=1)
    trainer = SandboxGRPOTrainer(model=tiny.model(), args=args, train_dataset=echo_dataset(),
                                 processing_class=tiny.tokenizer())
    trainer.start_sandboxes()
    try:
        trainer.sandbox_pool.wait_ready()
        import time

        deadline = time.time() + 5
        while stale.id in server.live and time.time() < deadline:
            time.sleep(0.02)
        assert stale.id not in server.live
        assert other_host.id in server.live  # another host's run may still be alive
    finally:
        trainer.close_sandboxes()
        server.live.clear()


def _descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, command name) of every live descendant of ``pid``, from /proc."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] == "Z":
            continue
        parents[int(entry)], names[int(entry)] = int(fields[1]), name
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent:
                found.append((child, names[child]))
                frontier.append(child)
    return found


def test_two_steps_on_builtin_tasks_with_the_local_sandbox(tmp_path):
    from trl_sandbox import load_tasks

    args = SandboxGRPOConfig(**tiny.grpo_kwargs(tmp_path, max_completion_length=24), sandbox_pool_size=2)
    trainer = SandboxGRPOTrainer(model=tiny.model(), args=args, train_dataset=load_tasks("builtin"),
                                 processing_class=tiny.tokenizer())
    assert trainer.sandbox_pool.provider.name == "local"
    trainer.train()
    assert trainer.state.global_step == 2
    logs = [r for r in trainer.state.log_history if "sandbox/pass_rate" in r]
    assert len(logs) == 2
    # A random model writes garbage: every completion must still get a verdict, none an infra failure.
    assert all(r["sandbox/infra"] == 0 for r in logs)
    assert all(r["rewards/sandbox/mean"] is not None for r in logs)
    assert sum(r[f"sandbox/{s}"] for r in logs for s in ("passed", "failed", "error", "timeout", "banned", "no_code")) > 0
    assert not [p for p in _descendants(os.getpid()) if p[1] in ("bwrap", "python3")], "sandbox processes left"


def test_missing_bwrap_fails_at_construction_saying_how_to_install(tmp_path):
    args = SandboxGRPOConfig(**tiny.grpo_kwargs(tmp_path), sandbox_provider_settings={"bwrap": "/nonexistent/bwrap"})
    with pytest.raises(ConfigError, match="bubblewrap"):
        SandboxGRPOTrainer(model=tiny.model(), args=args, train_dataset=echo_dataset(),
                           processing_class=tiny.tokenizer())


@pytest.mark.parametrize("mode,returncode", ENDINGS)
def test_no_local_sandbox_process_survives_however_training_ends(tmp_path, mode, returncode):
    import time

    pid_file = tmp_path / "pids"
    proc = _train_and_end(tmp_path, mode, pid_file, "local")
    assert proc.returncode == returncode, proc.stderr[-3000:]
    pids = [int(p) for p in pid_file.read_text().split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in pids if os.path.exists(f"/proc/{p}") and "Z" not in _state(p)]
        time.sleep(0.05)
    assert not alive, f"sandbox processes still running: {alive}"


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_a_plain_grpo_config_gets_the_sandbox_defaults(tmp_path):
    from trl import GRPOConfig

    plain = GRPOConfig(**tiny.grpo_kwargs(tmp_path, beta=0.0))
    trainer = SandboxGRPOTrainer(model=tiny.model(), args=plain, train_dataset=echo_dataset(),
                                 processing_class=tiny.tokenizer())
    try:
        assert isinstance(trainer.args, SandboxGRPOConfig)
        assert trainer.args.sandbox_provider == "local" and trainer.args.sandbox_pool_size == 4
        assert trainer.args.num_generations == 2 and trainer.args.use_cpu
        assert trainer.args.output_dir == str(tmp_path)
    finally:
        trainer.close_sandboxes()


def test_a_sandbox_environment_factory_gets_the_trainers_pool_and_no_transcript_reward(tmp_path):
    """``SandboxEnvironment.factory(...)`` is made for trainers that bind no pool; handed to
    ``SandboxGRPOTrainer`` it is taken as its class and episode settings. Control: the class
    itself, the documented way, ends up the same."""
    from trl.chat_template_utils import qwen2_5_chat_template

    from trl_sandbox import SandboxEnvironment

    tokenizer = tiny.chat_tokenizer(qwen2_5_chat_template)
    built = {}
    for label, factory in (("factory", SandboxEnvironment.factory(provider="flaky", max_attempts=2)),
                           ("class", SandboxEnvironment)):
        args = SandboxGRPOConfig(**tiny.grpo_kwargs(tmp_path / label), sandbox_provider="flaky", sandbox_pool_size=2,
                                 max_tool_calling_iterations=1)
        trainer = SandboxGRPOTrainer(model=tiny.model(tok=tokenizer), args=args, train_dataset=echo_dataset(),
                                     processing_class=tokenizer, environment_factory=factory)
        try:
            assert trainer.sandbox_rewards == [], f"{label}: the episode's own reward only"
            environment = trainer.environment_factories[None]()
            assert environment._pool is trainer.sandbox_pool, label
            built[label] = environment
        finally:
            trainer.close_sandboxes()
    assert built["factory"].max_attempts == 2 and built["class"].max_attempts is None


def test_a_language_without_its_toolchain_fails_at_construction(tmp_path, monkeypatch):
    from trl_sandbox.judge.languages import Language, languages

    table = languages()
    monkeypatch.setattr(table, "_by_name", dict(table._by_name))
    monkeypatch.setattr(table, "_alias", dict(table._alias))
    table.register(Language("pascal", "main.pas", ("./main",), ("trl-sandbox-no-fpc", "main.pas"),
                            toolchain=("trl-sandbox-no-fpc",), package="fp-compiler"))
    args = SandboxGRPOConfig(**tiny.grpo_kwargs(tmp_path), sandbox_provider="local")
    rows = [{"prompt": "sum", "task_id": "s", "tests": [{"input": "1 2\n", "output": "3\n"}], "language": lang}
            for lang in ("cpp", "pascal")]
    with pytest.raises(ConfigError, match="install fp-compiler"):
        SandboxGRPOTrainer(model=tiny.model(), args=args, train_dataset=Dataset.from_list(rows),
                           processing_class=tiny.tokenizer())
    # Positive control: the same dataset without the missing language builds (g++ is installed).
    trainer = SandboxGRPOTrainer(model=tiny.model(), args=args, train_dataset=Dataset.from_list(rows[:1]),
                                 processing_class=tiny.tokenizer())
    trainer.sandbox_pool.close()


def test_rows_in_a_heap_flag_language_under_a_tight_address_space_are_warned_of(tmp_path, caplog):
    """Java rows under the default 1 GiB per process: a warning at construction naming the setting;
    with room enough, or in C++, none."""
    rows = [{"prompt": "sum", "task_id": "s", "tests": [{"input": "1 2\n", "output": "3\n"}], "language": "java"}]
    cases = [(rows, {}, True), (rows, {"sandbox_memory_mb": 2048}, False), ([{**rows[0], "language": "cpp"}], {}, False)]
    for dataset, settings, warned in cases:
        caplog.clear()
        args = SandboxGRPOConfig(**tiny.grpo_kwargs(tmp_path), sandbox_provider="local", **settings)
        with caplog.at_level("WARNING", logger="trl_sandbox"):
            trainer = SandboxGRPOTrainer(model=tiny.model(), args=args, train_dataset=Dataset.from_list(dataset),
                                         processing_class=tiny.tokenizer())
        trainer.sandbox_pool.close()
        said = [r.getMessage() for r in caplog.records if "sandbox_memory_mb" in r.getMessage()]
        assert bool(said) == warned, (settings, said)
        if warned:
            assert "java" in said[0] and "1792" in said[0]

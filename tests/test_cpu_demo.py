"""The ``cpu-demo`` preset and the reward plot: examples, tokenizer, warm start, a shortened run.

The full run (150 GRPO steps, the reward gain) is measured by ``benchmarks/bench_cpu_demo.py``;
here ``trl-sandbox train --preset cpu-demo`` runs a few steps after a shortened warm start.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import math
from pathlib import Path

import pytest

from trl_sandbox.commands.plotting import pass_rate_of, plot_rewards, read_metrics, reward_gain, reward_of
from trl_sandbox.sandbox import ConfigError
from trl_sandbox.training.presets import PRESETS, cpu_demo, get_preset

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def score(task_id: str, bodies: list[str]) -> list:
    """Outcomes of ``bodies`` for ``task_id`` from the built-in task in the local sandbox."""
    from trl_sandbox import SandboxReward

    reward = SandboxReward(provider="local", pool_size=2)
    prompt = cpu_demo.prompts()[task_id]
    try:
        asyncio.run(reward([prompt] * len(bodies), bodies, task_id=[task_id] * len(bodies),
                           sandbox_task=["builtin"] * len(bodies)))
        return reward.last_outcomes
    finally:
        reward.close()


@pytest.mark.parametrize("task_id", ["sorting", "max_subarray"])
def test_example_bodies_are_what_they_claim_in_the_local_sandbox(task_id):
    correct, wrong = cpu_demo.CORRECT_BODIES[task_id], cpu_demo.WRONG_BODIES[task_id]
    assert len(correct) >= 4 and len(wrong) >= 4
    assert len(set(correct + wrong)) == len(correct) + len(wrong)
    outcomes = score(task_id, [*correct, *wrong])
    for body, outcome in zip(correct, outcomes[: len(correct)]):
        assert outcome.status == "passed" and outcome.reward == 1.0, (outcome, body)
    wrong_outcomes = outcomes[len(correct):]
    for body, outcome in zip(wrong, wrong_outcomes):
        assert outcome.status in ("failed", "error") and outcome.reward < 1.0, (outcome, body)
    # Some wrong bodies crash (-1) and some pass a few tests: the reward separates all three kinds.
    assert {o.status for o in wrong_outcomes} == {"failed", "error"}
    assert all(o.reward == -1.0 for o in wrong_outcomes if o.status == "error")
    assert all(0.0 <= o.reward < 1.0 for o in wrong_outcomes if o.status == "failed")


def test_sorting_examples_respect_the_original_bans():
    banned = ("sorted(", ".sort(", "heapq", "import ", "__import__")
    for body in (*cpu_demo.CORRECT_BODIES["sorting"], *cpu_demo.WRONG_BODIES["sorting"]):
        assert not any(p in body.lower() for p in banned), body


def test_tokenizer_round_trips_is_deterministic_and_keeps_bodies_short():
    tok = cpu_demo.build_tokenizer()
    again = cpu_demo.build_tokenizer()
    assert tok.get_vocab() == again.get_vocab()
    assert tok.eos_token == "<eos>" and tok.pad_token == "<pad>" and tok.eos_token_id != tok.pad_token_id
    assert len(tok) <= cpu_demo.VOCAB_SIZE
    limit = cpu_demo.CONFIG_OVERRIDES["max_completion_length"]
    for task_id, prompt in cpu_demo.prompts().items():
        assert tok.decode(tok(prompt)["input_ids"]) == prompt
        for body in (*cpu_demo.CORRECT_BODIES[task_id], *cpu_demo.WRONG_BODIES[task_id]):
            ids = tok(body, add_special_tokens=False)["input_ids"]
            assert tok.decode(ids) == body
            assert len(ids) + 1 <= limit, (len(ids), body)  # the body and its <eos> fit the completion budget
    # Any text round-trips (byte-level alphabet), even what the corpus never saw.
    odd = "    return ñ ∑ {'a': 1}\t\n"
    assert tok.decode(tok(odd, add_special_tokens=False)["input_ids"]) == odd


def test_warm_start_examples_end_with_eos_and_weigh_wrong_bodies_more():
    tok = cpu_demo.build_tokenizer()
    examples = cpu_demo.warm_start_examples(tok)
    settings = cpu_demo.WARM_START
    expected = sum(
        settings.correct_weight * len(cpu_demo.CORRECT_BODIES[t]) + settings.wrong_weight * len(cpu_demo.WRONG_BODIES[t])
        for t in cpu_demo.prompts()
    )
    assert len(examples) == expected
    assert settings.wrong_weight > settings.correct_weight
    for prompt_ids, body_ids in examples:
        assert body_ids[-1] == tok.eos_token_id and tok.eos_token_id not in body_ids[:-1]
        assert prompt_ids and tok.decode(prompt_ids) in cpu_demo.prompts().values()


@pytest.mark.slow
def test_short_warm_start_lowers_the_loss_and_is_repeatable(tmp_path):
    short = {"steps": 60}
    a = cpu_demo.build_cpu_demo(seed=3, output_dir=tmp_path, warm_start_settings=short, progress=False)
    b = cpu_demo.build_cpu_demo(seed=3, warm_start_settings=short, progress=False)
    assert a.warm_start["first_loss"] > 4.0  # about ln(vocab) for a random model
    assert a.warm_start["final_loss"] < a.warm_start["first_loss"] / 3
    assert a.warm_start["losses"] == b.warm_start["losses"]
    assert 200_000 < a.warm_start["parameters"] < 1_000_000
    recorded = json.loads((tmp_path / "warm_start.json").read_text())
    assert recorded["steps"] == 60 and recorded["seed"] == 3
    assert a.train_dataset.column_names == ["prompt", "task_id", "sandbox_task"]
    assert sorted(a.train_dataset["task_id"]) == ["max_subarray", "sorting"]
    assert a.config_overrides == cpu_demo.CONFIG_OVERRIDES and a.config_overrides is not cpu_demo.CONFIG_OVERRIDES


def test_preset_registry():
    preset = get_preset("cpu-demo")
    assert preset is PRESETS["cpu-demo"]
    overrides = preset.config_overrides
    assert overrides["beta"] == 0.0 and overrides["use_cpu"] is True and overrides["use_vllm"] is False
    assert overrides["per_device_train_batch_size"] % overrides["num_generations"] == 0
    with pytest.raises(ConfigError, match="known presets: cpu-demo"):
        get_preset("gpu-demo")


@pytest.mark.slow
def test_train_cli_short_run_writes_metrics_plot_and_summary(tmp_path, monkeypatch):
    """``trl-sandbox train --preset cpu-demo`` for 4 steps (warm start cut to 40 steps)."""
    from trl_sandbox.commands import train

    quick = dataclasses.replace(
        PRESETS["cpu-demo"],
        builder=functools.partial(cpu_demo.build_cpu_demo, warm_start_settings={"steps": 40}, progress=False),
    )
    monkeypatch.setitem(PRESETS, "cpu-demo", quick)
    out = tmp_path / "run"
    rc = train.main(["--preset", "cpu-demo", "--output_dir", str(out), "--max_steps", "4", "--disable_tqdm", "true"])
    assert rc == 0

    records = read_metrics(out / "metrics.jsonl")
    stepped = [r for r in records if reward_of(r) is not None]
    assert [r["step"] for r in stepped] == [1, 2, 3, 4]
    for r in stepped:
        assert -1.0 <= reward_of(r) <= 1.0
        assert 0.0 <= pass_rate_of(r) <= 1.0
        # The preset's settings reached the trainer: 16 completions of at most 64 tokens, all scored.
        assert r["completions/max_length"] <= cpu_demo.CONFIG_OVERRIDES["max_completion_length"]
        counted = sum(r[f"sandbox/{s}"] for s in ("passed", "failed", "error", "timeout", "banned", "no_code", "infra"))
        assert counted == cpu_demo.CONFIG_OVERRIDES["per_device_train_batch_size"]
        assert r["sandbox/infra"] == 0
        # The local provider's usage: how the sandboxes were bounded, and the CPU they used.
        assert r["sandbox/isolation_mode"] in ("cgroup-v1", "cgroup-v2", "none")
        assert r["sandbox/cgroups"] == (0.0 if r["sandbox/isolation_mode"] == "none" else 1.0)
        assert r["sandbox/cpu_s"] > 0 and r["sandbox/cpu_cores"] > 0

    png = (out / "rewards.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 10_000
    import matplotlib.image

    height, width = matplotlib.image.imread(out / "rewards.png").shape[:2]
    assert width > 400 and height > 300

    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 4
    gain = reward_gain(records)
    assert math.isclose(summary["reward_gain"], gain["gain"]) and gain["window"] == 2
    assert json.loads((out / "warm_start.json").read_text())["steps"] == 40
    assert (out / "tokenizer.json").exists() and (out / "config.json").exists()  # the trained model is saved


# -- plotting -------------------------------------------------------------------------------------


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_reward_gain_windows_and_missing_values():
    records = [{"step": i + 1, "reward": r} for i, r in enumerate([-1, -1, -1, 1, 1, 1])]
    records.insert(3, {"step": 99, "train_runtime": 1.0})  # a record without a reward is ignored
    g = reward_gain(records, window=10)
    assert g == {"first": -1.0, "last": 1.0, "gain": 2.0, "window": 3, "steps": 6}
    g2 = reward_gain([0.0, 0.5, 1.0, 1.0], window=1)
    assert g2["first"] == 0.0 and g2["last"] == 1.0 and g2["window"] == 1
    # TRL's per-function key is read when the aggregate is missing; NaN/None are skipped.
    alt = [{"rewards/sandbox/mean": 0.2}, {"reward": float("nan")}, {"reward": None}, {"rewards/sandbox/mean": 0.6}]
    assert reward_gain(alt)["gain"] == pytest.approx(0.4)
    with pytest.raises(ValueError, match="at least two"):
        reward_gain([{"reward": 1.0}])
    with pytest.raises(ValueError):
        reward_gain([0.0, 1.0], window=0)


def test_plot_rewards_accepts_either_key_set_and_skips_a_torn_last_line(tmp_path):
    trl_style = [{"step": i, "reward": -0.5 + i / 40, "sandbox/pass_rate": i / 40} for i in range(1, 41)]
    path = write_jsonl(tmp_path / "a.jsonl", trl_style)
    with open(path, "a") as fh:
        fh.write('{"step": 41, "rew')  # a run killed mid-write
    assert len(read_metrics(path)) == 40
    png = plot_rewards(path, tmp_path / "plots" / "a.png")
    assert png.read_bytes().startswith(PNG_MAGIC)

    other = [{"step": i, "rewards/sandbox/mean": 0.1 * i, "pass_rate": 0.05 * i} for i in range(1, 6)]
    png2 = plot_rewards(write_jsonl(tmp_path / "b.jsonl", other), tmp_path / "b.png", title="custom")
    assert png2.read_bytes().startswith(PNG_MAGIC)

    only_pass = [{"step": i, "sandbox/pass_rate": 0.5} for i in range(1, 4)]
    assert plot_rewards(write_jsonl(tmp_path / "c.jsonl", only_pass), tmp_path / "c.png").exists()

    with pytest.raises(ValueError, match="no record has a reward or a pass rate"):
        plot_rewards(write_jsonl(tmp_path / "d.jsonl", [{"step": 1, "loss": 0.1}]), tmp_path / "d.png")
    assert not (tmp_path / "d.png").exists()

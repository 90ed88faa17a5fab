"""``trl-sandbox train``: every check that needs no model runs before the model is built, presets
apply wherever they are set, and runs never mix their files."""

from __future__ import annotations

import json

import pytest

from trl_sandbox import ConfigError, SandboxGRPOConfig
from trl_sandbox.commands import train
from trl_sandbox.commands.run_dir import MANIFEST, RunDirectory
from trl_sandbox.training import presets as presets_module
from trl_sandbox.training.presets.cpu_demo import CONFIG_OVERRIDES


@pytest.fixture
def no_model_building(monkeypatch):
    """Fail the test if a preset's model is built or a model is looked up: checks must come first."""
    preset = presets_module.PRESETS["cpu-demo"]

    def refuse(**_):
        raise AssertionError("the model was built before the mistake was reported")

    monkeypatch.setitem(presets_module.PRESETS, "cpu-demo", presets_module.Preset(
        name=preset.name, description=preset.description, builder=refuse, config_overrides=preset.config_overrides))
    monkeypatch.setattr(train, "load_model_or_fail", lambda model: pytest.fail("the model was loaded first"))


def test_a_preset_in_the_yaml_file_applies_like_the_flag(tmp_path):
    config_file = tmp_path / "run.yaml"
    config_file.write_text("preset: cpu-demo\nmax_steps: 3\n")
    from_yaml, args_yaml = train.parse(["--config", str(config_file), "--output_dir", str(tmp_path / "a")])
    from_flag, args_flag = train.parse(["--preset", "cpu-demo", "--max_steps", "3", "--output_dir", str(tmp_path / "a")])
    assert args_yaml.preset == args_flag.preset == "cpu-demo"
    for key in CONFIG_OVERRIDES:
        assert getattr(from_yaml, key) == getattr(from_flag, key), key
    plain, _ = train.parse(["--output_dir", str(tmp_path / "a")])
    changed = [k for k in CONFIG_OVERRIDES if getattr(plain, k) != getattr(from_yaml, k)]
    assert "learning_rate" in changed and from_yaml.learning_rate == CONFIG_OVERRIDES["learning_rate"]
    assert from_yaml.max_steps == 3


@pytest.mark.parametrize("extra,message", [
    (["--sandbox_provider", "dayton"], "did you mean 'daytona'?"),
    (["--sandbox_provider", "daytona"], "DAYTONA_API_KEY"),
    (["--sandbox_reward_scheme", "binray"], "unknown reward scheme"),
    (["--sandbox_timeout", "0"], "sandbox_timeout must be a positive"),
])
def test_mistakes_are_reported_before_the_preset_builds_its_model(tmp_path, monkeypatch, capsys,
                                                                 no_model_building, extra, message):
    monkeypatch.delenv("DAYTONA_API_KEY", raising=False)
    monkeypatch.delenv("DAYTONA_JWT_TOKEN", raising=False)
    rc = train.main(["--preset", "cpu-demo", "--output_dir", str(tmp_path / "out"), *extra])
    assert rc == 2
    assert message in capsys.readouterr().err


def test_an_unwritable_output_dir_is_reported_before_the_model(tmp_path, capsys, no_model_building):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert train.main(["--preset", "cpu-demo", "--output_dir", str(blocker)]) == 2
    assert "is a file" in capsys.readouterr().err
    assert train.main(["--tasks", "humaneva", "--output_dir", str(tmp_path / "o")]) == 2
    assert "did you mean 'humaneval'?" in capsys.readouterr().err


def test_an_earlier_run_is_refused_unless_replaced_and_only_its_files_go(tmp_path, capsys, no_model_building):
    out = tmp_path / "out"
    first = RunDirectory(out)
    first.claim()
    for name in ("metrics.jsonl", "summary.json", "model.safetensors"):
        (out / name).write_text("old")
    first.finish()
    (out / "my-notes.txt").write_text("the user's own file")
    assert json.loads((out / MANIFEST).read_text())["files"] == ["metrics.jsonl", "model.safetensors", "summary.json"]

    assert train.main(["--preset", "cpu-demo", "--output_dir", str(out)]) == 2
    assert "holds an earlier run" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="--overwrite_output_dir"):
        RunDirectory(out)
    second = RunDirectory(out, overwrite=True)
    second.claim()
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "my-notes.txt"]


def test_an_interrupted_run_is_an_earlier_run_too(tmp_path):
    out = tmp_path / "out"
    RunDirectory(out).claim()
    (out / "metrics.jsonl").write_text("{}\n")  # stopped before finish()
    with pytest.raises(ConfigError, match="earlier run"):
        RunDirectory(out)


def test_the_quickstart_config_builds_on_a_cpu_as_written(tmp_path):
    args = SandboxGRPOConfig(output_dir=str(tmp_path), sandbox_provider="local", sandbox_pool_size=16,
                             sandbox_timeout=1.0)
    assert args.bf16 is False and args.use_cpu is True  # no accelerator here: full precision on the CPU
    assert SandboxGRPOConfig(output_dir=str(tmp_path), bf16=False).bf16 is False

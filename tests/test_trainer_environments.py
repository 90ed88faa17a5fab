"""SandboxGRPOTrainer with a dataset's ``environment`` column: checked at construction, built
ahead along TRL's sampler order (``sandbox_env_prefetch``), its metrics logged per step.

Real parts throughout: TRL's trainer and sampler, a tiny model built in-process, the local
bubblewrap sandbox building each environment (a setup that sleeps, so a build is slow enough to
be waited on) and leasing an overlay of it per program.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from datasets import Dataset

from tests import tiny
from trl_sandbox import ConfigError, SandboxGRPOConfig, SandboxGRPOTrainer
from trl_sandbox.environments.cache import remove_tree


@pytest.fixture
def cache_dir():
    # Where the sandbox's unprivileged uid can reach it (pytest's own tmp_path is private to root).
    path = Path(tempfile.mkdtemp(prefix="trl-sandbox-trainenv-", dir="/var/tmp"))
    os.chmod(path, 0o755)
    yield path
    remove_tree(path)


def rows(n: int = 4, environment=lambda i: {"files": {"n.txt": str(i)}, "setup": ["sleep 1"]}) -> Dataset:
    return Dataset.from_list([{"prompt": "print", "sandbox_task": "echo", "task_id": f"t{i}", "expected": "4",
                               "environment": environment(i)} for i in range(n)])


def build(tmp_path, dataset, provider="local", settings=None, **overrides):
    args = SandboxGRPOConfig(**tiny.grpo_kwargs(tmp_path, **overrides), sandbox_provider=provider,
                             sandbox_provider_settings=settings, sandbox_pool_size=2, sandbox_cache_size=0)
    return SandboxGRPOTrainer(model=tiny.model(), args=args, train_dataset=dataset, processing_class=tiny.tokenizer())


# -- construction ----------------------------------------------------------------------------------


def test_a_malformed_environment_fails_at_construction_naming_its_row(tmp_path, cache_dir):
    settings = {"environment_cache": str(cache_dir)}
    # A dict column with an absolute path in row 2; a column of JSON text with row 3 not JSON.
    bad = {2: lambda i: {"files": {"/etc/passwd" if i == 2 else "a": str(i)}},
           3: lambda i: "{not json" if i == 3 else json.dumps({"files": {"a": str(i)}})}
    for index, environment in bad.items():
        with pytest.raises(ConfigError, match=rf"train_dataset row {index} \(task_id 't{index}'\): environment"):
            build(tmp_path, rows(environment=environment), settings=settings)
    # Control: the same rows, well formed, build a trainer that knows every row's environment.
    trainer = build(tmp_path, rows(environment=lambda i: {"files": {"a": str(i)}}), settings=settings)
    specs = trainer.sandbox_env_prefetch.specs
    assert [dict(s.files)["a"] for s in specs] == ["0", "1", "2", "3"]
    trainer.close_sandboxes()


def test_a_provider_that_cannot_prepare_environments_is_refused_naming_those_that_can(tmp_path):
    with pytest.raises(ConfigError, match=r"'flaky' provider cannot prepare; the providers that can: .*local"):
        build(tmp_path, rows(), provider="flaky")
    # Controls: the same provider takes the rows without the column, and a column of empty cells.
    build(tmp_path, rows().remove_columns("environment"), provider="flaky").close_sandboxes()
    trainer = build(tmp_path, rows(environment=lambda i: None), provider="flaky")
    assert trainer.sandbox_env_prefetch is None
    trainer.close_sandboxes()


def test_prefetch_is_a_non_negative_count(tmp_path):
    with pytest.raises(ConfigError, match="sandbox_env_prefetch"):
        SandboxGRPOConfig(**tiny.grpo_kwargs(tmp_path), sandbox_env_prefetch=-1)
    assert SandboxGRPOConfig(**tiny.grpo_kwargs(tmp_path), sandbox_env_prefetch=0).sandbox_env_prefetch == 0


# -- prefetch along the sampler's order, and the per-step metrics ------------------------------------


def train(tmp_path, cache_dir, prefetch: int):
    """Two steps over four rows, each with its own environment (a 1 s setup): step 1 leases two
    keys, step 2 the other two (one epoch, TRL's shuffled order)."""
    trainer = build(tmp_path, rows(), settings={"environment_cache": str(cache_dir)}, sandbox_env_prefetch=prefetch)
    trainer.train()
    assert trainer.state.global_step == 2
    logs = [r for r in trainer.state.log_history if "env/builds" in r]
    assert len(logs) == 2, trainer.state.log_history
    assert all(r["sandbox/infra"] == 0 for r in trainer.state.log_history if "sandbox/infra" in r)
    assert len(list(cache_dir.glob("*/tree"))) == 4
    return trainer, logs


def test_the_next_batch_is_built_while_the_current_one_runs(tmp_path, cache_dir):
    trainer, (step1, step2) = train(tmp_path, cache_dir, prefetch=4)
    # At step 1's generation the prefetch sent step 2's two keys ahead: every lease of step 2
    # found its key built or building (a hit); no key was built twice.
    assert trainer.sandbox_env_prefetch.lookaheads[0] == 2
    assert step2["env/hit_rate"] == 1.0, (step1, step2)
    assert step1["env/builds"] + step2["env/builds"] == 4
    assert step1["env/build_s"] >= 1.0 and "env/lease_ms_p50" in step2 and step2["env/failures"] == 0


def test_without_prefetch_each_key_is_built_at_its_first_lease(tmp_path, cache_dir):
    # Control for the test above: the same run with prefetching off builds step 2's keys in step 2.
    trainer, (step1, step2) = train(tmp_path, cache_dir, prefetch=0)
    assert trainer.sandbox_env_prefetch is None
    assert step1["env/builds"] == 2 and step2["env/builds"] == 2
    assert step2["env/hit_rate"] < 1.0


def test_prefetch_sends_at_most_its_limit_of_keys_ahead(tmp_path, cache_dir):
    trainer, (step1, step2) = train(tmp_path, cache_dir, prefetch=1)
    lookaheads = trainer.sandbox_env_prefetch.lookaheads
    assert lookaheads[0] == 1 and max(lookaheads) <= 1
    # One of step 2's keys was ready ahead, the other built at its first lease (a miss).
    assert step2["env/hit_rate"] < 1.0
    assert step1["env/builds"] + step2["env/builds"] == 4


def test_agent_tasks_on_a_provider_that_cannot_grade_them_fail_at_construction(tmp_path):
    """Agent rows need a provider that grades out of the agent's reach (the local sandbox); any
    other is refused when the trainer is built, and so is a scorer's first agent row."""
    from trl_sandbox.agents.load import load_agent_tasks
    from trl_sandbox.pool.sandbox_pool import SandboxPool
    from trl_sandbox.scoring.scorer import Scorer

    dataset = load_agent_tasks("builtin")
    with pytest.raises(ConfigError, match=r"agent tasks .*'flaky' provider cannot grade.*sandbox_provider='local'"):
        build(tmp_path, dataset, provider="flaky")
    with SandboxPool.open("flaky", size=1) as pool:  # a scorer never raises: the row scores infra, saying why
        [outcome] = Scorer(pool, cache_size=0).score(["true"], [dataset[0]])
    assert outcome.status == "infra" and "cannot grade out of the agent's reach" in outcome.detail
    # Control: the local provider passes the same check.
    from trl_sandbox.agents.task import check_grades_agent_tasks
    from trl_sandbox.local.provider import LocalProvider

    check_grades_agent_tasks(LocalProvider)

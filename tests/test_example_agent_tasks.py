"""``examples/agent_tasks.py``: an agent on repository and terminal tasks, graded out of its reach.

The dry run replays one scripted episode in a real local sandbox: the task's oracle earns 1.0, and
the control, an episode that forges a reward file and a fake /tests, earns 0.0.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from trl_sandbox import ConfigError

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "agent_tasks.py"


def _main(argv: list[str]):
    return runpy.run_path(str(EXAMPLE), run_name="agent_tasks")["main"](argv)


@pytest.mark.parametrize("task", ["error-digest", "fix-median"])
def test_dry_run_of_the_oracle_earns_full_reward_and_a_forgery_none(task, capsys):
    assert _main(["--dry-run", "--task_ids", task]) == 1.0
    out = capsys.readouterr().out
    assert f"Episode: {task}" in out and out.rstrip().endswith("Final reward: 1.0")
    assert _main(["--dry-run", "--task_ids", task, "--script", "forge"]) == 0.0


def test_mistakes_are_config_errors():
    with pytest.raises(ConfigError, match="oracle"):
        _main(["--dry-run", "--script", "nope"])
    with pytest.raises(ConfigError):
        _main(["--dry-run", "--task_ids", "no-such-task"])

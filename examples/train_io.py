"""Train on whole programs judged on stdin/stdout: the built-in ``io-basics`` set or a published
competitive-programming dataset, as it is published.

    accelerate launch examples/train_io.py --model Qwen/Qwen2.5-Coder-1.5B-Instruct
    accelerate launch examples/train_io.py --dataset deepmind/code_contests --split "train[:2000]" \\
        --prompt_column description --language cpp
    python examples/train_io.py --dataset rows.jsonl --prompt_column question --max_steps 10

``--dataset`` takes a hub id or a local JSON/JSONL/Parquet file in any layout the generic task reads
(APPS/TACO ``input_output``, CodeContests, LiveCodeBench, ``verification_info``, DeepCoder,
open-r1's Codeforces, or our ``tests`` column; see ``trl_sandbox.tasks.io_layouts``). Each row's
prompt is its ``--prompt_column`` with an instruction to answer with a whole program in
``--language`` (or in Python or C++, the model's choice, when it is ``any``). Rows whose tests call a
function instead (APPS's ``fn_name``) are dropped with a count: this prompt asks for a program (the
generic task scores such rows too, through the function judge, given a prompt that asks for the
function). Every SandboxGRPOConfig field is also a flag.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trl import TrlParser

from trl_sandbox import ConfigError, SandboxGRPOConfig, SandboxGRPOTrainer, load_tasks

INSTRUCTION = ("\n\nWrite a complete program that reads the input from standard input and writes the answer to "
               "standard output, {which}.\n")
WHICH = {"any": "in Python 3 (a ```python fenced block) or C++17 (a ```cpp fenced block)",
         "python": "in Python 3, in a ```python fenced block", "cpp": "in C++17, in a ```cpp fenced block"}


@dataclass
class ScriptArguments:
    model: str = field(default="Qwen/Qwen2.5-Coder-1.5B-Instruct", metadata={"help": "Hub id or local path."})
    dataset: str = field(default="io-basics", metadata={"help": "io-basics, a hub dataset id, or a local file."})
    split: str = field(default="train", metadata={"help": "Split of a hub dataset (e.g. train[:2000])."})
    prompt_column: str = field(default="description", metadata={"help": "The column with the problem statement."})
    language: str = field(default="any", metadata={"help": "any, python or cpp: what the prompt asks for."})


def io_dataset(script: ScriptArguments) -> Any:
    """The training rows: ``io-basics``, or the dataset's rows with a prompt and a ``task_id``."""
    if script.language not in WHICH:
        raise ConfigError(f"--language {script.language!r}: use one of {', '.join(WHICH)}")
    if script.dataset == "io-basics":
        return load_tasks("io-basics", repeat=16, language=None if script.language == "any" else script.language)
    from datasets import load_dataset

    from trl_sandbox.tasks.io import IOTask
    from trl_sandbox.tasks.io_layouts import io_task_of

    if script.dataset.endswith((".json", ".jsonl", ".parquet")):
        kind = "parquet" if script.dataset.endswith(".parquet") else "json"
        rows = load_dataset(kind, data_files=script.dataset, split="train")
    else:
        rows = load_dataset(script.dataset, split=script.split)
    if script.prompt_column not in rows.column_names:
        raise ConfigError(f"--prompt_column {script.prompt_column!r} is not a column of {script.dataset} "
                          f"(columns: {', '.join(rows.column_names)})")

    def prepare(row: dict, index: int) -> dict:
        extra = {"prompt": str(row[script.prompt_column]) + INSTRUCTION.format(which=WHICH[script.language]),
                 "task_id": str(row.get("task_id") or row.get("name") or row.get("problem_id") or index)}
        if script.language != "any":
            extra["language"] = script.language
        return extra

    rows = rows.map(prepare, with_indices=True)

    def judged_on_stdin(row: dict) -> bool:
        try:
            return isinstance(io_task_of(row), IOTask)  # the prompt asks for a program, not a function
        except ConfigError:
            return False

    kept = rows.filter(judged_on_stdin)
    dropped = len(rows) - len(kept)
    if dropped:
        print(f"train_io: dropped {dropped} of {len(rows)} rows that are not stdin/stdout problems")
    if not len(kept):
        raise ConfigError(f"{script.dataset}: no row has stdin/stdout tests in a layout trl-sandbox reads")
    return kept


def main(argv: list[str] | None = None) -> SandboxGRPOTrainer:
    parser = TrlParser((SandboxGRPOConfig, ScriptArguments))
    parser.set_defaults_with_config(
        output_dir="training_results_io", per_device_train_batch_size=8, num_generations=8,
        max_completion_length=1024, learning_rate=2e-6, max_steps=200, loss_type="dapo", beta=0.0,
        sandbox_pool_size=8, logging_steps=1, sandbox_reward_scheme="partial",
    )
    config, script = parser.parse_args_and_config(args=argv)
    trainer = SandboxGRPOTrainer(model=script.model, args=config, train_dataset=io_dataset(script))
    trainer.train()
    trainer.save_model(config.output_dir)
    return trainer


if __name__ == "__main__":
    main()

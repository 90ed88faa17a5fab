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

from trl_sandbox import ConfigError, SandboxGRPOConfig, SandboxGRPOTrainer, load_io_dataset, load_tasks


@dataclass
class ScriptArguments:
    model: str = field(default="Qwen/Qwen2.5-Coder-1.5B-Instruct", metadata={"help": "Hub id or local path."})
    dataset: str = field(default="io-basics", metadata={"help": "io-basics, a hub dataset id, or a local file."})
    split: str = field(default="train", metadata={"help": "Split of a hub dataset (e.g. train[:2000])."})
    prompt_column: str = field(default="description", metadata={"help": "The column with the problem statement."})
    language: str = field(default="any", metadata={"help": "any, python or cpp: what the prompt asks for."})


def io_dataset(script: ScriptArguments) -> Any:
    """The training rows: ``io-basics``, or the dataset's problems with a prompt and a ``task_id``."""
    if script.dataset == "io-basics":
        if script.language not in ("any", "python", "cpp"):
            raise ConfigError(f"--language {script.language!r}: use any, python or cpp")
        return load_tasks("io-basics", repeat=16, language=None if script.language == "any" else script.language)
    return load_io_dataset(script.dataset, split=script.split, prompt_column=script.prompt_column,
                           language=script.language)


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

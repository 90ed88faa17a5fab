"""Train a code model with sandbox rewards: the original TRL + Daytona example, on any provider.

    accelerate launch examples/train.py --model Qwen/Qwen3-1.7B-Base --sandbox_provider local
    accelerate launch examples/train.py --config my_run.yaml --sandbox_pool_size 32

Every SandboxGRPOConfig field is a flag or a YAML key (TRL's TrlParser). `trl-sandbox train`
is the same job with the original example's settings as defaults and a `--preset cpu-demo`.
"""

from dataclasses import dataclass, field

from trl import TrlParser

from trl_sandbox import SandboxGRPOConfig, SandboxGRPOTrainer, load_tasks


@dataclass
class ScriptArguments:
    model: str = field(default="Qwen/Qwen3-1.7B-Base", metadata={"help": "Hub id or local path."})
    tasks: str = field(default="builtin", metadata={"help": "Task set (`trl-sandbox tasks` lists them)."})


def main() -> None:
    parser = TrlParser((SandboxGRPOConfig, ScriptArguments))
    parser.set_defaults_with_config(
        output_dir="training_results", per_device_train_batch_size=10, num_generations=5,
        max_completion_length=512, learning_rate=5e-6, max_steps=64, loss_type="dapo", beta=0.01,
        sandbox_pool_size=10, sandbox_timeout=1.0, logging_steps=1,
    )
    config, script = parser.parse_args_and_config()
    trainer = SandboxGRPOTrainer(model=script.model, args=config, train_dataset=load_tasks(script.tasks))
    trainer.train()
    trainer.save_model(config.output_dir)


if __name__ == "__main__":
    main()

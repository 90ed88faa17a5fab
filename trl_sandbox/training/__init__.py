"""What TRL calls: the trainer, its config, the reward function, and multi-turn environments.

``trainer.SandboxGRPOTrainer`` (a ``trl.GRPOTrainer``) owns the pool through its callbacks;
``config.SandboxGRPOConfig`` adds the sandbox fields; ``rewards.SandboxReward`` is the reward
function; ``environment`` and ``environment_factory`` give TRL's ``environment_factory`` a sandbox
per episode; ``rank_metrics`` gathers outcome counts across processes; ``presets`` holds the CPU
demo.

Imports: anything below it (scoring, tasks, pool, judge, plugins, sandbox); never ``commands``.
"""

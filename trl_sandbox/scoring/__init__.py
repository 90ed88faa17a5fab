"""Completions in, outcomes out.

``scorer.Scorer`` builds each completion's program through its task, runs it on the pool (deduped
within a batch and cached across batches, bounded in bytes), and scores the result;
``schemes`` turns outcomes into rewards; ``clip`` bounds what is kept of a program's output.

Imports: ``trl_sandbox.sandbox``, ``trl_sandbox.judge``, ``trl_sandbox.pool``, ``trl_sandbox.tasks``.
"""

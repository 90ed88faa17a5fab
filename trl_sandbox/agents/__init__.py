"""Agent tasks: rows whose reward is the verdict of hidden tests on the tree an agent left behind.

Loaders for the published layouts (Harbor task directories, terminal-bench 0.2 ``task.yaml``
directories, SWE-style rows with a repository, a commit and a test patch), the Dockerfile subset
they prepare their environments with, the image map, and a small built-in set. The row's columns
are documented in ``trl_sandbox.agents.columns``; ``load_agent_tasks`` is the entry point. The
``agent`` task (``task.py``) grades them out of the agent's reach (``grading.py``): after the
episode, in a fresh copy that carries only the agent's changes, with the hidden tests brought in
from the host and the verdict read from the verifier's own run.
"""

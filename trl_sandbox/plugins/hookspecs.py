"""The plugin contract: the hooks a ``trl_sandbox`` plugin may implement.

A plugin is a module named in its distribution's ``[project.entry-points.trl_sandbox]`` table.
Built-in plugins (the local provider, the built-in tasks, the default tags) use the same hooks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("trl_sandbox")
hookimpl = pluggy.HookimplMarker("trl_sandbox")


@hookspec
def trl_sandbox_register_providers(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register sandbox providers: ``register(name, factory)``.

    ``factory(**settings)`` must return an object satisfying ``trl_sandbox.sandbox.Provider``.
    ``settings`` come from ``SandboxGRPOConfig.sandbox_provider_settings`` (or ``--setting KEY=VALUE``
    on the command line). The factory runs when the trainer is built: raise
    ``trl_sandbox.ConfigError`` there, with a message saying what to set, if a key or binary is missing.
    """


@hookspec
def trl_sandbox_register_tasks(register: Callable[[str, Any], None]) -> None:
    """Register task sets: ``register(name, task)``.

    ``task`` satisfies ``trl_sandbox.tasks.Task``: it lists its dataset rows, turns a completion
    into a ``Program`` and an execution into an ``Outcome``. ``load_tasks(name)`` builds a dataset from it.
    """


@hookspec
def trl_sandbox_register_languages(register: Callable[[Any], None]) -> None:
    """Register languages for programs judged on stdin/stdout: ``register(Language(...))``.

    ``Language`` is ``trl_sandbox.judge.languages.Language``: the source file's name, a compile
    command (or none), a run command, and the toolchain's commands with the package that provides
    them. A language registered under a built-in name (``cpp``, ``python``...) replaces it, for example
    to compile C++ with other flags.
    """


@hookspec
def trl_sandbox_run_tags(run: Any) -> dict[str, str] | None:
    """Return tags to put on every sandbox of this run; the results of all plugins are merged.

    ``run`` is a ``trl_sandbox.pool.tags.RunInfo`` (run id, model name, rank, host, and the trainer
    arguments when a trainer is running). Keys and values are short strings; providers may
    normalise them to their label syntax.
    """

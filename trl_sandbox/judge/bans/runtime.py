"""The run-time layer of a ban: what the sandboxed judge takes away from the candidate's process.

The AST rules stop every spelling we know of; this layer makes the banned thing *absent* in the
candidate's process, so a spelling nobody thought of finds nothing to call. The judge
(``trl_sandbox/judge/candidate.py``, ``_candidate``) applies it in the forked candidate process only,
before the candidate's code is compiled; the judge's own process and every other program keep the
interpreter untouched.

* ``removals``: builtins dropped from the candidate's namespace (its ``__builtins__`` table): the
  banned builtins and, while any ban is active, the escape hatches (``getattr``, ``eval``...).
* ``deletions``: the banned builtins deleted from the process's real ``builtins`` module too, so a
  walk to the real module (``enum.bltns``, a frame's ``f_builtins``) finds nothing either.
* ``method_removals``: for an attribute ban (``.sort(``), the attribute deleted from every class in
  ``builtins`` that defines it (``list.sort``; ``bytearray``'s and ``str``'s methods likewise for
  other names). The judge edits each class's real dict (``gc.get_referents(cls.__dict__)[0]``) and
  invalidates the interpreter's method caches (``PyType_Modified``), after capturing the few methods
  its own reply path uses. Dunder names are never removed (the interpreter's slots stand behind
  them, and the AST rules ban them anyway).
* ``module_blocks``: banned modules (``heapq``) leave ``sys.modules``, and a finder placed first on
  ``sys.meta_path`` refuses them (and their accelerators, ``_heapq``) to any importer, library code
  evaluating a string with the real ``__import__`` included. Where builtins are deleted, the same
  finder refuses a fresh import of ``builtins`` (its new copy would be built from the interpreter's
  saved dict, deleted builtins included).
* ``allowed_imports``: the candidate's ``__import__`` refuses every other top-level module.
"""

from __future__ import annotations

import builtins
from collections.abc import Collection
from typing import Protocol

from trl_sandbox.judge.bans.rules import ESCAPE_CALLABLES, is_dunder


class BanPolicy(Protocol):
    """What the run-time layer reads of a ``trl_sandbox.judge.bans.BanPolicy``."""

    @property
    def active(self) -> bool: ...

    names: Collection[str]
    attributes: Collection[str]
    modules: Collection[str]
    no_imports: bool
    allowed_imports: Collection[str]


def removals(policy: BanPolicy) -> list[str]:
    """Builtins the judge removes from the candidate's namespace."""
    if not policy.active:
        return []
    builtin_names = set(dir(builtins))
    removed = {n for n in policy.names if n in builtin_names}
    removed |= {n for n in ESCAPE_CALLABLES if n in builtin_names}
    if policy.no_imports:
        removed.add("__import__")
    return sorted(removed)


def deletions(policy: BanPolicy) -> list[str]:
    """Banned builtins deleted from the candidate process's real ``builtins`` module. Only the task's
    own banned names: escape hatches such as ``getattr`` stay there, as library code needs them."""
    builtin_names = set(dir(builtins))
    return sorted(n for n in policy.names if n in builtin_names)


def method_removals(policy: BanPolicy) -> list[str]:
    """Attribute names the judge deletes from the builtin classes that define them (not dunders)."""
    return sorted(n for n in policy.attributes if not is_dunder(n))


def module_blocks(policy: BanPolicy) -> list[str]:
    """Banned module names (identifiers written without a call, ``heapq``) blocked in the candidate's process."""
    return sorted(m for m in policy.modules if m.isidentifier() and not is_dunder(m))


def allowed_imports(policy: BanPolicy) -> list[str] | None:
    """Top-level modules the candidate may import at run time; ``None`` = no restriction."""
    if not policy.active:
        return None
    if policy.no_imports:
        return []
    return sorted(policy.allowed_imports)

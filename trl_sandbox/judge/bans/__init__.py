"""Banned patterns: the original substring check, plus rules on the AST that spelling cannot dodge.

A task lists ``banned_patterns`` as the original example did (``["sorted(", ".sort(", "heapq",
"import ", "__import__"]``). ``BanPolicy.from_patterns`` keeps the original check (a
case-insensitive substring match, on the code with its comments stripped) and derives AST rules:

* ``name(`` or ``name`` (an identifier): the identifier is banned everywhere it can be spelled:
  a name (``sorted(xs)``, ``f = sorted``), an attribute (``builtins.sorted``), an import or its
  alias, a definition, a keyword, a ``match`` class pattern attribute, and string constants that
  parse to code using it (annotations in quotes are evaluated by ``typing.get_type_hints``).
  An identifier that is a module (``heapq``) cannot be imported either.
* ``.name(``: the attribute is banned however it is reached (``xs.sort()``, ``list.sort(xs)``,
  ``f = xs.sort``, ``case list(sort=f)``).
* ``import`` (``"import "``): no ``import`` or ``from ... import`` statement at all.

When a task bans anything, the dynamic escape hatches are banned too, because each of them turns a
string into a name at run time: ``getattr``/``setattr``/``delattr``, ``eval``/``exec``/``compile``,
``globals``/``locals``/``vars``, ``__import__``, ``__builtins__``, ``builtins``, ``importlib``,
frame and generator internals (``f_globals``, ``gi_frame``...), and dunder attributes other than
a few harmless ones (``__init__``, ``__name__``, comparison and container methods). Imports are then
limited to a list of plain modules (``DEFAULT_ALLOWED_IMPORTS``). Code that does not parse cannot be
checked on the AST, so it is rejected before it runs (its program would fail to compile anyway).

Beyond the escape hatches, every other route from a string to an attribute is banned too (positional
class patterns that read ``__match_args__``, code-object internals, private attributes of modules,
computed annotations, three-argument ``type``...): see ``trl_sandbox.judge.bans.checker``.

The sandboxed judge also takes the banned things away at run time (``trl_sandbox.judge.bans.runtime``):
the banned builtins and the escape hatches leave the candidate's namespace, the banned builtins leave
the process's ``builtins`` module, and a banned method (``.sort(``) is deleted from the builtin
classes that define it (``list.sort``), so a spelling the AST rules missed still finds nothing.

Layout: ``rules`` (what counts as an escape hatch, ``Violation``), ``checker`` (the AST visitor),
``runtime`` (the run-time layer), and this module (``BanPolicy``, ``strip_comments``).
"""

from __future__ import annotations

import ast
import io
import tokenize
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field

from trl_sandbox.judge.bans import runtime
from trl_sandbox.judge.bans.checker import AstChecker
from trl_sandbox.judge.bans.rules import (
    DEFAULT_ALLOWED_IMPORTS,
    ESCAPE_CALLABLES,
    ESCAPE_IDENTIFIERS,
    IDENTIFIER_PATTERN,
    SAFE_DUNDER_ATTRIBUTES,
    SAFE_DUNDER_NAMES,
    SELF_MATCHING_CLASSES,
    Violation,
)

__all__ = [
    "DEFAULT_ALLOWED_IMPORTS",
    "ESCAPE_CALLABLES",
    "ESCAPE_IDENTIFIERS",
    "SAFE_DUNDER_ATTRIBUTES",
    "SAFE_DUNDER_NAMES",
    "SELF_MATCHING_CLASSES",
    "BanPolicy",
    "Violation",
    "strip_comments",
]


@dataclass(frozen=True)
class BanPolicy:
    """What a task bans. Empty (``BanPolicy()``) bans nothing and costs nothing."""

    patterns: tuple[str, ...] = ()
    names: frozenset[str] = frozenset()
    attributes: frozenset[str] = frozenset()
    modules: frozenset[str] = frozenset()
    no_imports: bool = False
    allowed_imports: frozenset[str] = field(default=DEFAULT_ALLOWED_IMPORTS)

    @classmethod
    def from_patterns(
        cls, patterns: Iterable[str] | None, *, allowed_imports: Iterable[str] | None = None
    ) -> BanPolicy:
        """The policy for the original example's ``banned_patterns`` (see the module docstring)."""
        patterns = tuple(p for p in (patterns or ()) if p and p.strip())
        names: set[str] = set()
        attributes: set[str] = set()
        modules: set[str] = set()
        no_imports = False
        for pattern in patterns:
            text = pattern.strip()
            if text.lower() in ("import", "from") or text.lower().startswith(("import ", "from ")):
                no_imports = True
                continue
            match = IDENTIFIER_PATTERN.fullmatch(text)
            if not match:
                continue
            name = match.group("name")
            if match.group("dot"):
                attributes.add(name)
            else:
                names.add(name)
                if not match.group("paren"):
                    modules.add(name)
        allowed = frozenset(allowed_imports) if allowed_imports is not None else DEFAULT_ALLOWED_IMPORTS
        allowed = frozenset(m for m in allowed if m not in modules and m not in names)
        return cls(
            patterns=patterns,
            names=frozenset(names),
            attributes=frozenset(attributes),
            modules=frozenset(modules),
            no_imports=no_imports,
            allowed_imports=allowed,
        )

    @property
    def active(self) -> bool:
        """True when the policy bans anything (and so also bans the escape hatches)."""
        return bool(self.patterns or self.names or self.attributes or self.modules or self.no_imports)

    # -- checks -----------------------------------------------------------------------------

    def violations(self, code: str, *, first_line: int = 1) -> list[Violation]:
        """Every banned use in ``code``, counting only lines ``>= first_line`` (1-based).

        ``first_line`` lets a task check a program made of a trusted prompt followed by the model's
        code: the prompt's own lines (its comments and docstring may name banned things) are skipped.
        """
        if not self.active:
            return []
        found: list[Violation] = []
        found.extend(self._substring_violations(code, first_line))
        try:
            with warnings.catch_warnings():  # a SyntaxWarning about model text is no news to the user
                warnings.simplefilter("ignore")
                tree = ast.parse(code)
        except Exception as exc:  # SyntaxError, ValueError, RecursionError, MemoryError, SystemError (3.12), ...
            line = getattr(exc, "lineno", 0) or 0
            found.append(Violation("code", f"it does not parse ({exc.__class__.__name__}: {exc.msg if isinstance(exc, SyntaxError) else exc})", line))
            return found
        found.extend(AstChecker(self, first_line).run(tree))
        return found

    def check(self, code: str, *, first_line: int = 1) -> Violation | None:
        """The first banned use in ``code`` (or ``None``)."""
        found = self.violations(code, first_line=first_line)
        return found[0] if found else None

    def _substring_violations(self, code: str, first_line: int) -> list[Violation]:
        if not self.patterns:
            return []
        lines = strip_comments(code).splitlines()
        text = "\n".join(lines[first_line - 1 :]).lower()
        out = []
        for pattern in self.patterns:
            index = text.find(pattern.lower())
            if index >= 0:
                out.append(Violation("pattern", repr(pattern), first_line + text.count("\n", 0, index)))
        return out

    # -- run-time layer (see ``trl_sandbox.judge.bans.runtime``) ----------------------------------------

    def runtime_removals(self) -> list[str]:
        """Builtins the judge removes from the candidate's namespace."""
        return runtime.removals(self)

    def runtime_deletions(self) -> list[str]:
        """Banned builtins the judge deletes from the candidate process's real ``builtins`` module."""
        return runtime.deletions(self)

    def runtime_method_removals(self) -> list[str]:
        """Attributes the judge deletes from every builtin class that defines them (``.sort(`` -> ``list.sort``)."""
        return runtime.method_removals(self)

    def runtime_module_blocks(self) -> list[str]:
        """Banned modules the judge unloads and blocks for every importer in the candidate's process."""
        return runtime.module_blocks(self)

    def runtime_allowed_imports(self) -> list[str] | None:
        """Top-level modules the candidate may import at run time; ``None`` = no restriction."""
        return runtime.allowed_imports(self)


def strip_comments(code: str) -> str:
    """``code`` with its comments blanked out (lines keep their numbers); unchanged if it does not tokenize."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except Exception:  # whatever the tokenizer of this Python raises on model text
        return code
    lines = code.splitlines(keepends=True)
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            line = lines[row - 1]
            end = col + len(tok.string)
            lines[row - 1] = line[:col] + " " * (end - col) + line[end:]
    return "".join(lines)

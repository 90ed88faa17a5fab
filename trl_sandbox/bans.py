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

The sandboxed judge also removes the banned builtins and the escape hatches from the candidate's
namespace at run time (``runtime_removals``) and deletes the banned builtins from the candidate
process's ``builtins`` module (``runtime_deletions``), so a spelling the AST rules missed still fails.
"""

from __future__ import annotations

import ast
import builtins
import io
import re
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass, field

# Call-only escape hatches: banned as names (``re.compile`` as an attribute stays fine).
ESCAPE_CALLABLES = frozenset(
    {"getattr", "setattr", "delattr", "eval", "exec", "compile", "globals", "locals", "vars", "breakpoint"}
)
# Banned everywhere they can be spelled (names, attributes, imports).
ESCAPE_IDENTIFIERS = frozenset(
    {
        "__import__",
        "__builtins__",
        "builtins",
        "importlib",
        "import_module",
        "get_type_hints",
        "ForwardRef",
        "attrgetter",
        "methodcaller",
        "_getframe",
        "f_globals",
        "f_locals",
        "f_builtins",
        "f_back",
        "f_code",
        "gi_frame",
        "gi_code",
        "cr_frame",
        "ag_frame",
        "tb_frame",
        "tb_next",
        "co_code",
        "co_consts",
    }
)
# Dunder attributes that cannot reach a namespace, a class hierarchy or code objects.
SAFE_DUNDER_ATTRIBUTES = frozenset(
    {
        "__init__",
        "__name__",
        "__doc__",
        "__len__",
        "__iter__",
        "__next__",
        "__repr__",
        "__str__",
        "__hash__",
        "__bool__",
        "__eq__",
        "__ne__",
        "__lt__",
        "__le__",
        "__gt__",
        "__ge__",
        "__contains__",
        "__getitem__",
        "__setitem__",
        "__delitem__",
        "__add__",
        "__sub__",
        "__mul__",
        "__neg__",
        "__call__",
        "__enter__",
        "__exit__",
    }
)
SAFE_DUNDER_NAMES = frozenset({"__name__", "__doc__", "__debug__"})
# Modules a candidate may import when a task bans something (and does not ban imports altogether).
DEFAULT_ALLOWED_IMPORTS = frozenset(
    {
        "__future__",
        "abc",
        "array",
        "bisect",
        "cmath",
        "collections",
        "copy",
        "datetime",
        "decimal",
        "enum",
        "fractions",
        "functools",
        "heapq",
        "itertools",
        "math",
        "numbers",
        "random",
        "re",
        "statistics",
        "time",
        "typing",
    }
)

_IDENTIFIER_PATTERN = re.compile(r"(?P<dot>\.)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*(?P<paren>\()?")
_STRING_CODE_MAX = 400  # string constants longer than this are not parsed as code


@dataclass(frozen=True)
class Violation:
    """One banned use: what was found, where (1-based line in the checked code, 0 when unknown)."""

    rule: str
    what: str
    line: int = 0

    def __str__(self) -> str:
        where = f" (line {self.line})" if self.line else ""
        return f"banned {self.rule}: {self.what}{where}"


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
            match = _IDENTIFIER_PATTERN.fullmatch(text)
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
            tree = ast.parse(code)
        except (SyntaxError, ValueError) as exc:
            line = getattr(exc, "lineno", 0) or 0
            found.append(Violation("code", f"it does not parse ({exc.__class__.__name__}: {exc.msg if isinstance(exc, SyntaxError) else exc})", line))
            return found
        found.extend(_AstChecker(self, first_line).run(tree))
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

    # -- run-time layer -------------------------------------------------------------------------

    def runtime_removals(self) -> list[str]:
        """Builtins the judge removes from the candidate's namespace."""
        if not self.active:
            return []
        builtin_names = set(dir(builtins))
        removed = {n for n in self.names if n in builtin_names}
        removed |= {n for n in ESCAPE_CALLABLES if n in builtin_names}
        if self.no_imports:
            removed.add("__import__")
        return sorted(removed)

    def runtime_deletions(self) -> list[str]:
        """Banned builtins the judge deletes from the candidate process's real ``builtins`` module,
        so that even a walk to the real module (which the AST rules stop earlier) finds nothing.
        Only the task's own banned names: escape hatches such as ``getattr`` stay, as library code needs them."""
        builtin_names = set(dir(builtins))
        return sorted(n for n in self.names if n in builtin_names)

    def runtime_allowed_imports(self) -> list[str] | None:
        """Top-level modules the candidate may import at run time; ``None`` = no restriction."""
        if not self.active:
            return None
        if self.no_imports:
            return []
        return sorted(self.allowed_imports)


class _AstChecker(ast.NodeVisitor):
    def __init__(self, policy: BanPolicy, first_line: int, line_offset: int = 0):
        self.p = policy
        self.first_line = first_line
        self.offset = line_offset
        self.found: list[Violation] = []

    def run(self, tree: ast.AST) -> list[Violation]:
        self.visit(tree)
        return self.found

    def _line(self, node: ast.AST) -> int:
        return (getattr(node, "lineno", 0) or 0) + self.offset

    def _add(self, node: ast.AST, rule: str, what: str) -> None:
        line = self._line(node)
        if line and line < self.first_line:
            return
        self.found.append(Violation(rule, what, line))

    def _identifier(self, node: ast.AST, ident: str | None, *, as_name: bool) -> None:
        """Check one identifier spelled in the code. ``as_name``: it is a plain name (not an attribute)."""
        if not ident:
            return
        if ident in self.p.names:
            self._add(node, "name", f"`{ident}`")
        elif ident in ESCAPE_IDENTIFIERS:
            self._add(node, "dynamic access", f"`{ident}`")
        elif as_name and ident in ESCAPE_CALLABLES:
            self._add(node, "dynamic access", f"`{ident}`")
        elif as_name and _is_dunder(ident) and ident not in SAFE_DUNDER_NAMES:
            self._add(node, "dunder name", f"`{ident}`")

    def _attribute(self, node: ast.AST, attr: str) -> None:
        if attr in self.p.attributes:
            self._add(node, "attribute", f"`.{attr}`")
        elif _is_dunder(attr) and attr not in SAFE_DUNDER_ATTRIBUTES:
            self._add(node, "dunder attribute", f"`.{attr}`")
        else:
            self._identifier(node, attr, as_name=False)

    # names and attributes
    def visit_Name(self, node: ast.Name) -> None:
        self._identifier(node, node.id, as_name=True)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._attribute(node, node.attr)
        self.generic_visit(node)

    def visit_keyword(self, node: ast.keyword) -> None:
        self._identifier(node, node.arg, as_name=True)
        self.generic_visit(node)

    def visit_arg(self, node: ast.arg) -> None:
        self._identifier(node, node.arg, as_name=True)
        self.generic_visit(node)

    def _definition(self, node: ast.AST, name: str) -> None:
        if name in self.p.names or name in ESCAPE_IDENTIFIERS:
            self._identifier(node, name, as_name=True)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._definition(node, node.name)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._definition(node, node.name)
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        for name in node.names:
            self._identifier(node, name, as_name=True)

    visit_Nonlocal = visit_Global

    # imports
    def _import(self, node: ast.AST, module: str, level: int = 0) -> None:
        top = module.split(".")[0] if module else ""
        if self.p.no_imports:
            self._add(node, "import", f"`{module or '.'}` (this task allows no imports)")
        elif level:
            self._add(node, "import", "relative imports")
        elif top in self.p.modules or top in self.p.names:
            self._add(node, "import", f"`{module}`")
        elif top not in self.p.allowed_imports:
            self._add(node, "import", f"`{module}` (not in this task's allowed modules)")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._import(node, alias.name)
            for part in alias.name.split("."):
                self._identifier(node, part, as_name=False)
            self._identifier(node, alias.asname, as_name=True)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self._import(node, node.module or "", node.level or 0)
        for alias in node.names:
            if alias.name == "*":
                self._add(node, "import", "`*` imports")
            self._identifier(node, alias.name, as_name=True)
            self._identifier(node, alias.asname, as_name=True)

    # pattern matching: ``case list(sort=f)`` reads the attribute ``sort``
    def visit_MatchClass(self, node: ast.AST) -> None:
        for attr in getattr(node, "kwd_attrs", ()):
            self._attribute(node, attr)
        self.generic_visit(node)

    def visit_MatchAs(self, node: ast.AST) -> None:
        self._identifier(node, getattr(node, "name", None), as_name=True)
        self.generic_visit(node)

    def visit_MatchStar(self, node: ast.AST) -> None:
        self._identifier(node, getattr(node, "name", None), as_name=True)

    def visit_MatchMapping(self, node: ast.AST) -> None:
        self._identifier(node, getattr(node, "rest", None), as_name=True)
        self.generic_visit(node)

    # strings that are code (quoted annotations, anything handed to an evaluator)
    def visit_Constant(self, node: ast.Constant) -> None:
        value = node.value
        if not isinstance(value, str) or not value.strip() or len(value) > _STRING_CODE_MAX:
            return
        text = value.strip()
        if text in self.p.names or text in self.p.attributes or text in self.p.modules:
            self._add(node, "string", repr(text))
            return
        try:
            sub = ast.parse(text, mode="eval")
        except (SyntaxError, ValueError):
            return
        inner = _AstChecker(self.p, 0, 0)
        inner.run(sub)
        for violation in inner.found:
            self._add(node, f"{violation.rule} in a string", violation.what)


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def strip_comments(code: str) -> str:
    """``code`` with its comments blanked out (lines keep their numbers); unchanged if it does not tokenize."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return code
    lines = code.splitlines(keepends=True)
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            line = lines[row - 1]
            end = col + len(tok.string)
            lines[row - 1] = line[:col] + " " * (end - col) + line[end:]
    return "".join(lines)

"""The AST visitor behind ``BanPolicy.violations``: every place code can spell a banned thing.

Two kinds of rules. The task's own bans: a banned identifier wherever it is spelled (name,
attribute, keyword, import, definition, class-pattern keyword, string constant that parses as code
or names it). And, once a policy is active, the routes from a *string* to a name or attribute at run
time, because a banned call reached through one of them never spells its name:

* the escape hatches of ``rules`` (``getattr``, ``eval``, ``attrgetter``, ``get_field``, frames,
  code objects and their ``replace(co_names=...)``, ``gc``, ``ctypes``, non-allowed modules reached
  as attributes of allowed ones such as ``typing.sys`` or ``enum.bltns``);
* dunder names and attributes (``__match_args__``, ``__dict__``, ``__getattribute__``, ...), except a
  few that reach nothing;
* positional class patterns (``case C(s)``): they read the attributes named in
  ``C.__match_args__``, which ``type('C', (list,), {'__match' + '_args__': ('so' + 'rt',)})`` (or an
  enum, a dataclass field...) builds from strings. Keyword patterns spell their attributes and stay;
  so does ``case list(x)`` on the builtin classes that match the subject itself;
* private attributes (``_x``) the code reads but never defines (``typing._eval_type`` evaluates a
  string as code; ``random._os`` and ``collections._sys`` are modules), read from a module, or named
  like a private name of an allowed module or its classes (``ForwardRef._evaluate``): defining a
  method ``_evaluate`` does not make ``ref._evaluate`` the code's own;
* annotations computed at run time (``x: 'so' + 'rt'``): ``typing.get_type_hints`` (called by
  ``functools.singledispatch`` and others) evaluates a string annotation as code;
* a three-argument ``type(name, bases, namespace)`` call: a class whose attribute names are strings;
* format strings whose fields reach a banned or dunder attribute (``'{0.__class__}'.format(x)``).
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import string
import types
from collections.abc import Iterable

from trl_sandbox.judge.bans.rules import (
    ESCAPE_CALLABLES,
    ESCAPE_IDENTIFIERS,
    SAFE_DUNDER_ATTRIBUTES,
    SAFE_DUNDER_NAMES,
    SELF_MATCHING_CLASSES,
    STRING_CODE_MAX,
    Violation,
    is_dunder,
    is_internal_attribute,
    is_private,
)

# ``re.compile`` is a common, harmless attribute; the other call-only hatches are banned as attributes
# too (``enum.bltns.getattr`` is the real ``getattr``).
_ESCAPE_ATTRIBUTES = ESCAPE_CALLABLES - {"compile"}
_ESCAPE_ATTRIBUTES_EXTRA = frozenset({"modules"})  # ``sys.modules`` under any alias of ``sys``


@functools.lru_cache(maxsize=16)
def _allowed_module_attrs(allowed: frozenset[str]) -> tuple[tuple[str, object], ...]:
    """``(attribute, value)`` of every allowed module and of the allowed modules they hold, once."""
    pairs: list[tuple[str, object]] = []
    seen: set[str] = set()
    todo = [name for name in allowed if name != "__future__"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            module = importlib.import_module(name)
        except Exception:
            continue
        for attr, value in list(vars(module).items()):
            pairs.append((attr, value))
            if isinstance(value, types.ModuleType) and value.__name__.split(".")[0] in allowed:
                todo.append(value.__name__)
    return tuple(pairs)


@functools.lru_cache(maxsize=16)
def module_aliases(allowed: frozenset[str]) -> frozenset[str]:
    """Attribute names under which an allowed module (or one of its allowed submodules) holds a module
    that is *not* allowed: ``typing.sys``, ``enum.bltns`` (builtins), ``fractions.operator``..."""
    return frozenset(
        attr for attr, value in _allowed_module_attrs(allowed)
        if isinstance(value, types.ModuleType) and value.__name__.split(".")[0] not in allowed
    )


@functools.lru_cache(maxsize=16)
def library_private_names(allowed: frozenset[str]) -> frozenset[str]:
    """Private names of the allowed modules, of their classes and of the classes of builtins' objects
    (``typing.ForwardRef._evaluate``, ``typing._eval_type``, ``license._Printer__filenames``): never
    the code's own, even where the code defines the same name to make the read look like its own."""
    found: set[str] = set()
    objects: list[object] = list(vars(builtins).values())
    for attr, value in _allowed_module_attrs(allowed):
        if is_private(attr):
            found.add(attr)
        if not isinstance(value, types.ModuleType):
            objects.append(value)
    for value in objects:
        for cls in (value if isinstance(value, type) else type(value)).__mro__:
            found.update(attr for attr in vars(cls) if is_private(attr))
    return frozenset(found)


def _bound_names(tree: ast.AST) -> set[str]:
    """Every name the code binds somewhere (so ``list = C`` makes ``case list(s)`` a user class)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names.update(node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        else:
            for attr in ("name", "rest"):  # MatchAs, MatchStar, MatchMapping
                value = getattr(node, attr, None) if type(node).__name__.startswith("Match") else None
                if isinstance(value, str):
                    names.add(value)
    return names


def _imported_names(tree: ast.AST) -> set[str]:
    """Names bound by ``import`` statements: modules, whose private attributes are never the code's own."""
    return {
        (alias.asname or alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }


def _defined_attributes(tree: ast.AST) -> set[str]:
    """Attribute names the code defines itself: assigned (``self._x = ...``) or defined in a class body."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load):
            names.add(node.attr)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(item.name)
                elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                    targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                    names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _static_annotation(node: ast.AST | None, depth: int = 0) -> bool:
    """An annotation that names a type (possibly in quotes) rather than computing one."""
    if node is None or isinstance(node, ast.Name):
        return True
    if isinstance(node, ast.Constant):
        if not isinstance(node.value, str):
            return True
        if depth > 3 or len(node.value) > STRING_CODE_MAX:
            return False
        try:  # a quoted annotation is evaluated as code: it must name a type too
            return _static_annotation(ast.parse(node.value.strip(), mode="eval").body, depth + 1)
        except Exception:  # any parser failure on model text
            return True  # cannot evaluate either
    if isinstance(node, ast.Attribute):
        return _static_annotation(node.value, depth)
    if isinstance(node, ast.Subscript):
        return _static_annotation(node.value, depth) and _static_annotation(node.slice, depth)
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_static_annotation(e, depth) for e in node.elts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _static_annotation(node.left, depth) and _static_annotation(node.right, depth)
    return False


def _format_fields(text: str) -> Iterable[str]:
    """Attribute names reached by the replacement fields of a format string (``{0.sort}`` -> sort)."""
    if "{" not in text:
        return
    try:
        parsed = list(string.Formatter().parse(text))
    except (ValueError, TypeError):
        return
    for _, field_name, spec, _ in parsed:
        for part in (field_name or "", spec or ""):
            for piece in part.split(".")[1:]:
                yield piece.split("[")[0]
            if spec and "{" in spec:
                yield from _format_fields(spec)


class AstChecker(ast.NodeVisitor):
    """Collects the violations of ``policy`` in one tree (see the module docstring)."""

    def __init__(self, policy, first_line: int, line_offset: int = 0, *, context: ast.AST | None = None):
        self.p = policy
        self.first_line = first_line
        self.offset = line_offset
        self.found: list[Violation] = []
        self.aliases = module_aliases(frozenset(policy.allowed_imports))
        self.library_private = library_private_names(frozenset(policy.allowed_imports))
        self.context = context  # the whole program, for code nested in a string constant

    def run(self, tree: ast.AST) -> list[Violation]:
        whole = self.context or tree
        self.bound = _bound_names(whole)
        self.defined = _defined_attributes(whole)
        self.imported = _imported_names(whole)
        self.visit(tree)
        return self.found

    def _line(self, node: ast.AST) -> int:
        return (getattr(node, "lineno", 0) or 0) + self.offset

    def _add(self, node: ast.AST, rule: str, what: str) -> None:
        line = self._line(node)
        if line and line < self.first_line:
            return
        self.found.append(Violation(rule, what, line))

    def _escape(self, ident: str) -> bool:
        return ident in ESCAPE_IDENTIFIERS and ident not in self.p.allowed_imports

    def _identifier(self, node: ast.AST, ident: str | None, *, as_name: bool) -> None:
        """Check one identifier spelled in the code. ``as_name``: it is a plain name (not an attribute)."""
        if not ident:
            return
        if ident in self.p.names:
            self._add(node, "name", f"`{ident}`")
        elif self._escape(ident):
            self._add(node, "dynamic access", f"`{ident}`")
        elif as_name and ident in ESCAPE_CALLABLES:
            self._add(node, "dynamic access", f"`{ident}`")
        elif as_name and is_dunder(ident) and ident not in SAFE_DUNDER_NAMES:
            self._add(node, "dunder name", f"`{ident}`")

    def _attribute(self, node: ast.AST, attr: str, *, read: bool = True, module: bool = False) -> None:
        """``module``: the attribute is read from a name bound by ``import``."""
        if attr in self.p.attributes:
            self._add(node, "attribute", f"`.{attr}`")
        elif is_dunder(attr) and attr not in SAFE_DUNDER_ATTRIBUTES:
            self._add(node, "dunder attribute", f"`.{attr}`")
        elif is_internal_attribute(attr):
            self._add(node, "dynamic access", f"`.{attr}` (code, frame and generator internals)")
        elif attr in _ESCAPE_ATTRIBUTES or attr in _ESCAPE_ATTRIBUTES_EXTRA or attr in self.aliases:
            self._add(node, "dynamic access", f"`.{attr}`")
        elif read and is_private(attr) and (module or attr not in self.defined or attr in self.library_private):
            self._add(node, "private attribute", f"`.{attr}` (only private attributes the code defines may be read)")
        else:
            self._identifier(node, attr, as_name=False)

    # names and attributes
    def visit_Name(self, node: ast.Name) -> None:
        self._identifier(node, node.id, as_name=True)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        module = isinstance(node.value, ast.Name) and node.value.id in self.imported
        self._attribute(node, node.attr, read=isinstance(node.ctx, ast.Load), module=module)
        self.generic_visit(node)

    def visit_keyword(self, node: ast.keyword) -> None:
        self._identifier(node, node.arg, as_name=True)
        if node.arg and is_internal_attribute(node.arg):  # code.replace(co_names=...)
            self._add(node, "dynamic access", f"`{node.arg}=` (code, frame and generator internals)")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        # type(name, bases, namespace): a class whose attribute names are strings, dunders included
        if isinstance(node.func, ast.Name) and node.func.id == "type" and (
            len(node.args) + len(node.keywords) >= 2 or any(isinstance(a, ast.Starred) for a in node.args)
        ):
            self._add(node, "dynamic access", "`type(name, bases, namespace)` (attribute names from strings)")
        self.generic_visit(node)

    def visit_arg(self, node: ast.arg) -> None:
        self._identifier(node, node.arg, as_name=True)
        self._annotation(node.annotation)
        self.generic_visit(node)

    def _annotation(self, node: ast.AST | None) -> None:
        if not _static_annotation(node):
            self._add(node, "annotation", "an annotation computed at run time (annotations may be evaluated as code)")

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._annotation(node.annotation)
        self.generic_visit(node)

    def _definition(self, node: ast.AST, name: str) -> None:
        if name in self.p.names or self._escape(name):
            self._identifier(node, name, as_name=True)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._definition(node, node.name)
        self._annotation(node.returns)
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
            elif is_private(alias.name) or alias.name in self.aliases:
                self._add(node, "import", f"`{alias.name}` (a module's private name or a module it imported)")
            self._identifier(node, alias.name, as_name=True)
            self._identifier(node, alias.asname, as_name=True)

    # pattern matching: ``case C(sort=f)`` reads ``sort``; ``case C(f)`` reads C.__match_args__[0]
    def visit_MatchClass(self, node: ast.AST) -> None:
        for attr in getattr(node, "kwd_attrs", ()):
            self._attribute(node, attr)
        positional = getattr(node, "patterns", ())
        cls = getattr(node, "cls", None)
        self_matching = (
            isinstance(cls, ast.Name) and cls.id in SELF_MATCHING_CLASSES and cls.id not in self.bound
            and len(positional) == 1
        )
        if positional and not self_matching:
            self._add(node, "class pattern", "positional sub-patterns read the attributes named by "
                      "`__match_args__`, which can be built from strings; use keyword patterns (`C(x=x)`)")
        self.generic_visit(node)

    def visit_MatchAs(self, node: ast.AST) -> None:
        self._identifier(node, getattr(node, "name", None), as_name=True)
        self.generic_visit(node)

    def visit_MatchStar(self, node: ast.AST) -> None:
        self._identifier(node, getattr(node, "name", None), as_name=True)

    def visit_MatchMapping(self, node: ast.AST) -> None:
        self._identifier(node, getattr(node, "rest", None), as_name=True)
        self.generic_visit(node)

    # strings that are code (quoted annotations, anything handed to an evaluator) or format fields
    def visit_Constant(self, node: ast.Constant) -> None:
        value = node.value
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                return
        if not isinstance(value, str) or not value.strip() or len(value) > STRING_CODE_MAX:
            return
        text = value.strip()
        if text in self.p.names or text in self.p.attributes or text in self.p.modules:
            self._add(node, "string", repr(text))
            return
        for attr in _format_fields(value):
            if attr in self.p.attributes or (is_dunder(attr) and attr not in SAFE_DUNDER_ATTRIBUTES):
                self._add(node, "format field", f"`.{attr}` in {text[:60]!r}")
        try:
            sub = ast.parse(text, mode="eval")
        except Exception:  # any parser failure on model text
            return
        inner = AstChecker(self.p, 0, 0, context=self.context or sub)
        inner.bound, inner.defined, inner.imported = self.bound, self.defined, self.imported
        inner.visit(sub)
        for violation in inner.found:
            self._add(node, f"{violation.rule} in a string", violation.what)

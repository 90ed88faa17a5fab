"""What the AST rules treat as an escape hatch, and what stays allowed, when a task bans anything.

Every entry here is a route from a *string* to a name or an attribute at run time (or to code that
does such a lookup): a banned call spelled through one of them would be invisible to a check of the
identifiers written in the code. The checker (``trl_sandbox.judge.bans.checker``) bans them all as soon
as a policy is active, so the only way left to reach an attribute is to spell its name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Call-only escape hatches: banned as names (``re.compile`` as an attribute stays fine).
ESCAPE_CALLABLES = frozenset(
    {"getattr", "setattr", "delattr", "eval", "exec", "compile", "globals", "locals", "vars", "breakpoint"}
)
# Banned everywhere they can be spelled (names, attributes, keywords, imports). Each one looks a name
# up from a string (``attrgetter``, ``get_field``, ``get_type_hints``...), hands out a namespace
# (``f_globals``, ``modules``...) or gives access to the interpreter's insides (``gc``, ``ctypes``).
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
        "get_field",  # string.Formatter().get_field("0.sort", (xs,), {}) returns xs.sort
        "formatter_field_name_split",
        "_getframe",
        "sys",  # typing.sys.modules['builtins'] reaches the real builtins from an allowed module
        "modules",
        "gc",
        "get_referents",
        "get_referrers",
        "ctypes",
        "pythonapi",
        "copyreg",
        "FunctionType",
        "CodeType",
        "LambdaType",
    }
)
# Attributes of code objects, frames, generators, coroutines, async generators and tracebacks:
# ``coroutine.cr_code.replace(co_names=(...))`` builds a function whose attribute and global
# lookups come from strings; frames hand out namespaces. Every name with these prefixes is banned
# as an attribute or keyword (``f_`` names are listed one by one: ``f_x`` is a common variable).
INTERNAL_PREFIXES = ("co_", "cr_", "ag_", "gi_", "tb_")
FRAME_ATTRIBUTES = frozenset(
    {
        "f_back",
        "f_builtins",
        "f_code",
        "f_globals",
        "f_lasti",
        "f_lineno",
        "f_locals",
        "f_trace",
        "f_trace_lines",
        "f_trace_opcodes",
        "f_generator",
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
# Builtin classes whose class pattern with one positional sub-pattern matches the subject itself
# (PEP 634): ``case list(xs)`` binds the subject and reads no attribute. Every other class reads
# the attributes named by its ``__match_args__``, which code can build from strings at run time.
SELF_MATCHING_CLASSES = frozenset(
    {"bool", "bytearray", "bytes", "dict", "float", "frozenset", "int", "list", "set", "str", "tuple"}
)
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

IDENTIFIER_PATTERN = re.compile(r"(?P<dot>\.)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*(?P<paren>\()?")
STRING_CODE_MAX = 400  # string constants longer than this are not parsed as code


@dataclass(frozen=True)
class Violation:
    """One banned use: what was found, where (1-based line in the checked code, 0 when unknown)."""

    rule: str
    what: str
    line: int = 0

    def __str__(self) -> str:
        where = f" (line {self.line})" if self.line else ""
        return f"banned {self.rule}: {self.what}{where}"


def is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def is_private(name: str) -> bool:
    """``_x`` or ``__x`` (not a dunder): a name its owner keeps to itself."""
    return name.startswith("_") and not is_dunder(name)


def is_internal_attribute(name: str) -> bool:
    """An attribute of a code object, frame, generator, coroutine or traceback (see above)."""
    return name in FRAME_ATTRIBUTES or (name.startswith(INTERNAL_PREFIXES) and len(name) > 3)

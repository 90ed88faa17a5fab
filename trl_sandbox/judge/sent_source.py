"""Source text sent with every exec (the I/O judge, the remote lease launcher), made small.

The interpreter in the sandbox compiles what it is sent on every exec (about 0.3 ms per KB on a slow
machine), so docstrings, comment lines and functions a mode never calls are left out; the files
keep them. The text is cut, never regenerated: ``ast.unparse`` writes the host's Python (3.12's
f-strings reuse their quotes inside), which an older interpreter in the sandbox cannot read.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable


def _docstring(node: ast.AST) -> ast.Expr | None:
    body = getattr(node, "body", None)
    if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
            and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        return body[0]
    return None


def bare_source(text: str, drop: Iterable[str] = ()) -> str:
    """``text`` without docstrings, comment lines and the top-level functions named in ``drop``."""
    unused = set(drop)
    tree = ast.parse(text)
    lines = text.splitlines()
    cut: dict[int, str] = {}  # 0-based line -> what replaces it ("" removes it)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in unused:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            for i in range(first - 1, node.end_lineno):
                cut[i] = ""
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):  # a part's own docstring
            for i in range(node.lineno - 1, node.end_lineno):
                cut[i] = ""
    for node in ast.walk(tree):
        doc = _docstring(node) if not isinstance(node, ast.Module) else None
        if doc is not None and (doc.lineno - 1) not in cut:
            indent = lines[doc.lineno - 1][: len(lines[doc.lineno - 1]) - len(lines[doc.lineno - 1].lstrip())]
            for i in range(doc.lineno - 1, doc.end_lineno):
                cut[i] = ""
            cut[doc.lineno - 1] = indent + "pass"  # the body may hold nothing else
    kept = []
    for i, line in enumerate(lines):
        line = cut.get(i, line)
        if line.strip() and not line.lstrip().startswith("#"):
            kept.append(line)
    return "\n".join(kept) + "\n"

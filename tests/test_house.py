"""The package's shape: folders by job, small modules, imports that run one way.

Every import counts here, also those inside functions and under ``TYPE_CHECKING``: a circle that
only a type checker or a late call walks is still a circle a reader has to untangle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "trl_sandbox"
MAX_TOP_LEVEL = 14  # the folders DESIGN.md lays out (environments/, agents/ included) and three modules
MAX_LINES = 420  # "about 400"

# Each folder's place, lowest first: a module may import its own folder and any folder ranked
# below it, never one above. ``plugins.testing`` is the conformance kit for plugin authors, a leaf
# that exercises the whole package and that nothing in it imports.
RANKS = {
    "trl_sandbox.sandbox": 0,
    "trl_sandbox.plugins": 1,
    "trl_sandbox.judge": 2,
    "trl_sandbox.environments": 2,
    "trl_sandbox.local": 3,
    "trl_sandbox.remote": 3,
    "trl_sandbox.pool": 4,
    "trl_sandbox.tasks": 5,
    "trl_sandbox.agents": 5,
    "trl_sandbox.scoring": 6,
    "trl_sandbox.training": 7,
    "trl_sandbox.commands": 8,
    "trl_sandbox.plugins.testing": 9,
    "trl_sandbox.train": 9,
    "trl_sandbox": 9,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str) -> set[str]:
    """The package's modules that ``name`` imports (a package means its ``__init__``)."""
    path = MODULES[name]
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in MODULES else module
                       for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in MODULES and t != name)
    return found


GRAPH = {name: imports(name) for name in MODULES}


def rank(name: str) -> int:
    while name not in RANKS:
        name = name.rpartition(".")[0]
    return RANKS[name]


def folder(name: str) -> str:
    while name not in RANKS:
        name = name.rpartition(".")[0]
    return name


def circles() -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return groups


def test_the_graph_sees_imports_of_every_kind():
    # Positive controls: a relative import inside a function (supervisor), an absolute one at
    # the top, one under TYPE_CHECKING, and a package's __init__.
    assert "trl_sandbox.local.supervisor.resident" in GRAPH["trl_sandbox.local.supervisor.main"]
    assert "trl_sandbox.sandbox" in GRAPH["trl_sandbox.pool.sandbox_pool"]
    assert "trl_sandbox.plugins" in GRAPH["trl_sandbox.pool.sandbox_pool"]
    assert "trl_sandbox.local.cgroups" in GRAPH["trl_sandbox.local.usage"]  # under TYPE_CHECKING only
    assert len(MODULES) > 80


def test_no_import_circle_anywhere():
    assert circles() == []


def test_the_circle_finder_finds_a_circle():
    saved = dict(GRAPH)
    try:
        GRAPH["trl_sandbox.sandbox"] = {"trl_sandbox.judge.verdict"}  # verdict imports sandbox
        assert any("trl_sandbox.sandbox" in group for group in circles())
    finally:
        GRAPH.clear()
        GRAPH.update(saved)


def test_imports_run_one_way_between_folders():
    upward = sorted(f"{a} -> {b}" for a, targets in GRAPH.items() for b in targets
                    if folder(a) != folder(b) and rank(b) > rank(a))
    assert upward == []


def test_the_one_way_check_sees_an_upward_import():
    assert rank("trl_sandbox.judge.verdict") < rank("trl_sandbox.pool.sandbox_pool")
    assert folder("trl_sandbox.local.supervisor.main") == "trl_sandbox.local"


def test_the_top_level_holds_at_most_fourteen_entries():
    entries = sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__")
    assert len(entries) <= MAX_TOP_LEVEL, entries


@pytest.mark.parametrize("folder_path", sorted(p for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__"),
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_folder_says_what_it_is_for(folder_path: Path):
    init = folder_path / "__init__.py"
    assert init.is_file(), f"{folder_path} has no __init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
    assert doc and len(doc) > 40, f"{init} needs a docstring that says what the folder is for"


def test_no_module_is_too_long():
    long = {name: n for name, path in MODULES.items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}

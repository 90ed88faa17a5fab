"""Grading an agent task where the agent cannot reach: its changes, carried into a fresh copy.

When the episode (or a single-turn sample's shell script) ends, every process of it is ended and
its changes to the working tree are read from its copy's writable layer by the sandbox's
supervisor. Only some are carried (``carried``): never a protected path (those stay as prepared,
which restores them), a ``conftest.py``, a ``sitecustomize.py``/``usercustomize.py``, a ``.pth``
file, anything under ``.git``, a ``site-packages``/``dist-packages`` directory or a virtual
environment of the prepared tree, nor a symlink that leaves the tree. They are written into a
fresh copy of the same prepared environment in another lease; the hidden tests arrive from the
host, read-only at ``/tests``, with an empty ``/logs/verifier``; the verifier runs with a fresh
``HOME`` and no user site directory; its verdict is read by the supervisor once every process has
ended: the expected test ids all passed in its JUnit report (SWE style), else its reward file
(``reward.json``'s ``reward``, or ``reward.txt``), else its exit status.

What remains possible: the tests import the agent's code, which then runs inside the verifier and
can write the reward file or the report itself (a blanket ``os._exit(0)`` reports nothing, which
fails an expected-ids task). See docs/agents.md.
"""

from __future__ import annotations

import json
import math
import posixpath
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trl_sandbox.local.agent_ops import Change
from trl_sandbox.sandbox import Outcome

REFUSED_NAMES = frozenset({"conftest.py", "sitecustomize.py", "usercustomize.py"})
REFUSED_PARTS = frozenset({".git", "site-packages", "dist-packages", "__pycache__"})
VERIFY_ENV = {"HOME": "/tmp", "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
JUNIT = "/logs/verifier/junit.xml"  # where a pytest verifier's report goes (PYTEST_ADDOPTS)


def _venvs(tree: Path | None) -> set[str]:
    """Relative paths of the virtual environments in the prepared tree (a ``pyvenv.cfg`` inside)."""
    if tree is None or not tree.is_dir():
        return set()
    return {str(p.parent.relative_to(tree)) for p in tree.glob("**/pyvenv.cfg") if p.is_file()}


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots if r)


def _parents(path: str) -> list[str]:
    parents = []
    while "/" in path:
        path = path.rsplit("/", 1)[0]
        parents.append(path)
    return parents


def carried(changes: Sequence[Change], protected: Sequence[str] = (),
            tree: Path | None = None) -> tuple[list[Change], list[str]]:
    """The changes a verifier gets, and a note for each refused one."""
    protected = [posixpath.normpath(p).lstrip("/") for p in protected]
    # The directories above a protected path: deleting or replacing one would take it along.
    above = {parent for p in protected for parent in _parents(p)}
    venvs = sorted(_venvs(tree))
    kept: list[Change] = []
    refused: list[str] = []
    dropped: list[str] = []
    for change in changes:
        path, kind, _, payload = change
        parts = path.split("/")
        why = ""
        if _under(path, dropped):
            continue  # inside a refused directory
        if path in above and kind == "o":  # its own files, over the prepared ones it keeps
            change = (path, "d", change[2], b"")
            refused.append(f"{path}: replaced, but it holds a protected path (kept)")
        if path in above and kind not in ("d", "o"):
            why = "it holds a protected path (restored)"
        elif _under(path, protected):
            why = "protected (restored)"
        elif parts[-1] in REFUSED_NAMES or path.endswith(".pth"):
            why = "refused file name"
        elif REFUSED_PARTS & set(parts):
            why = "refused place"
        elif _under(path, venvs):
            why = "inside a virtual environment"
        elif kind == "l":
            target = payload.decode("utf-8", "surrogateescape")
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
            if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
                why = "a symlink that leaves the tree"
        if why:
            refused.append(f"{path}: {why}")
            if kind in ("d", "o"):
                dropped.append(path)
            continue
        kept.append(change)
    return kept, refused


def _junit(data: bytes) -> tuple[set[str], int, list[str]]:
    """Test ids that passed (as ``file::name``, ``file::Class::name``, ``classname.name`` and
    ``name``), how many ran, and the names of those that did not pass."""
    root = ET.fromstring(data)
    passed: set[str] = set()
    failed: list[str] = []
    ran = 0
    for case in root.iter("testcase"):
        ran += 1
        name, classname, file = case.get("name", ""), case.get("classname", ""), case.get("file", "")
        if any(child.tag in ("failure", "error", "skipped") for child in case):
            failed.append(f"{classname}.{name}")
            continue
        passed.update((f"{classname}.{name}", name))
        if file:
            passed.add(f"{file}::{name}")
        parts = classname.split(".")
        for cut in range(1, len(parts) + 1):  # module a.b.test_x, maybe followed by a class
            module, rest = "/".join(parts[:cut]) + ".py", parts[cut:]
            passed.add("::".join([module, *rest, name]))
    return passed, ran, failed


def _number(data: bytes, json_file: bool) -> float | None:
    """A reward file's number: ``reward.json``'s ``reward`` (or a bare number), ``reward.txt``'s text;
    ``None`` for anything else (a string, a boolean, nested data, infinity, NaN). Never raises: the
    file may be the agent's own."""
    try:
        if not json_file:
            value: Any = float(data.decode("utf-8", "replace").strip())
        else:
            loaded = json.loads(data)
            value = loaded.get("reward") if isinstance(loaded, dict) else loaded
    except (ValueError, RecursionError):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _pytest_verdict(reports: Mapping[str, bytes], expected: list[str], note: str) -> Outcome:
    """Every expected test id passed in the verifier's JUnit report (with none expected: every test
    it ran, at least one). A report that never got written (``os._exit`` at import) passes nothing."""
    total = max(1, len(expected))
    if "junit.xml" not in reports:
        return Outcome("failed", 0, total, detail=f"the verifier reported no tests{note}")
    try:
        passed, ran, failed = _junit(reports["junit.xml"])
    except ET.ParseError as exc:
        return Outcome("failed", 0, total, detail=f"the verifier's report is not JUnit XML: {exc}{note}")
    if not expected:
        ok = ran > 0 and not failed
        return Outcome("passed" if ok else "failed", ran - len(failed), max(ran, 1),
                       detail=f"{ran - len(failed)}/{ran} tests passed{note}")
    ok = [t for t in expected if t in passed]
    missing = [t for t in expected if t not in passed][:3]
    detail = f"{len(ok)}/{len(expected)} expected tests passed ({ran} ran)" + (f"; not passed: {missing}" if missing else "")
    return Outcome("passed" if len(ok) == len(expected) else "failed", len(ok), len(expected), detail=detail + note)


def verdict(reports: Mapping[str, bytes], exit_code: int, timed_out: bool, row: Mapping[str, Any],
            refused: Sequence[str] = ()) -> Outcome:
    """The outcome from the verifier's own run (see the module docstring)."""
    note = f"; not carried: {', '.join(refused[:5])}" if refused else ""
    if timed_out:
        return Outcome("timeout", 0, 1, detail=f"the verifier ran past its time{note}")
    parser = row.get("parser") or ("pytest" if row.get("expected") else "reward_file")
    if exit_code != 0 and parser != "exit_code":
        # A report counts only from a verifier that ended as it was written to: code of the agent's
        # that the tests import can write the report, then kill the script before it overwrites it.
        return Outcome("failed", 0, 1, detail=f"the verifier exited {exit_code}; its report does not count{note}")
    if parser == "pytest":
        return _pytest_verdict(reports, list(row.get("expected") or ()), note)
    if parser == "exit_code":
        return Outcome("passed" if exit_code == 0 else "failed", int(exit_code == 0), 1,
                       detail=f"the verifier exited {exit_code}{note}")
    value = None
    if "reward.json" in reports:
        value = _number(reports["reward.json"], json_file=True)
        if value is None:
            return Outcome("failed", 0, 1, detail=f"reward.json holds no reward{note}")
    elif "reward.txt" in reports:
        value = _number(reports["reward.txt"], json_file=False)
        if value is None:
            return Outcome("failed", 0, 1, detail=f"reward.txt holds no number{note}")
    if value is not None:
        status = "passed" if value >= 1.0 else "failed"
        return Outcome(status, int(value >= 1.0), 1, detail=f"the verifier's reward: {value:g}{note}")
    status = "passed" if exit_code == 0 else "failed"
    return Outcome(status, int(exit_code == 0), 1, detail=f"the verifier exited {exit_code}{note}")

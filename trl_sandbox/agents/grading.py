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
ended: the expected test ids all passed in its JUnit report (``parser: pytest``), its reward
files (``reward.json``'s ``reward``, ``reward.txt``'s number; the lower of the two; none is a
failure) or its exit status (``parser: exit_code``).

What remains possible: the tests import the agent's code, which then runs inside the verifier and
can write the reward file or the report itself (a blanket ``os._exit(0)`` reports nothing, which
fails an expected-ids task). See docs/agents.md.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import posixpath
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trl_sandbox.agents.canary import forged
from trl_sandbox.local.agent_ops import Change
from trl_sandbox.sandbox import Outcome

REFUSED_NAMES = frozenset({"conftest.py", "sitecustomize.py", "usercustomize.py"})
REFUSED_PARTS = frozenset({".git", "site-packages", "dist-packages", "__pycache__"})
# Packaging metadata: a ``*.dist-info`` on the verifier's path can register a pytest plugin (its
# ``pytest11`` entry point), loaded before any test runs.
REFUSED_SUFFIXES = (".dist-info", ".egg-info", ".egg-link", ".pth")
# Configuration files that pytest reads, which can load a plugin (``addopts = -p module``): they stay
# as prepared, whatever they say (a check of their text was beaten by a TOML escape, and pytest 9
# added pytest.toml).
RUNNER_CONFIGS = frozenset({"pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "pyproject.toml", "setup.cfg",
                            "tox.ini"})
# Modules a verifier imports from outside the tree, which a new module or package of the same name
# at the top of the tree (the verifier's working directory, on ``sys.path`` for ``python -m`` and
# ``PYTHONPATH=.``) would replace: the standard library and the test runners.
RUNNER_MODULES = frozenset({"pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging", "pygments", "nose",
                            "nose2", "hypothesis", "coverage", "xdist", "pip", "setuptools", "pkg_resources",
                            "_distutils_hack", "exceptiongroup", "tomli"})
SHADOWED = frozenset(sys.stdlib_module_names) | RUNNER_MODULES
VERIFY_ENV = {"HOME": "/tmp", "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
# Longer paths (relative to the working directory) are not carried: with the working directory in
# front they could pass the kernel's PATH_MAX (4096) when written into the fresh copy.
MAX_PATH_BYTES = 3000
JUNIT = "/logs/verifier/junit.xml"  # where a pytest verifier's report goes (PYTEST_ADDOPTS)
DECIMAL = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")  # what reward.txt may hold


def _venvs(tree: Path | None) -> frozenset[str]:
    """Relative paths of the virtual environments in the prepared tree (a ``pyvenv.cfg`` inside)."""
    if tree is None or not tree.is_dir():
        return frozenset()
    return _venvs_in(str(tree))


@functools.lru_cache(maxsize=64)
def _venvs_in(tree: str) -> frozenset[str]:
    """Walked once per tree, not once per graded sample: a prepared tree is read-only and its path
    (``<cache>/<content key>/tree``) names its content."""
    return frozenset(str(p.parent.relative_to(tree)) for p in Path(tree).glob("**/pyvenv.cfg") if p.is_file())


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots if r)


def parents(path: str) -> list[str]:
    """The directories above a relative path, nearest first."""
    found = []
    while "/" in path:
        path = path.rsplit("/", 1)[0]
        found.append(path)
    return found


def _module(name: str) -> str:
    return name.split(".", 1)[0]


def _shadows(parts: list[str], tree: Path | None) -> bool:
    """Whether a change makes a new module or package at the top of the tree named like one of
    ``SHADOWED``. One the prepared tree already had was the task's own choice."""
    top = parts[0]
    if _module(top) not in SHADOWED or (tree is not None and os.path.lexists(tree / top)):
        return False
    return len(parts) > 1 or top.endswith((".py", ".pyc", ".pyw", ".so")) or "." not in top


def carried(changes: Sequence[Change], protected: Sequence[str] = (),
            tree: Path | None = None) -> tuple[list[Change], list[str]]:
    """The changes a verifier gets, and a note for each refused one."""
    protected = [posixpath.normpath(p).lstrip("/") for p in protected]
    # The directories above a protected path: deleting or replacing one would take it along.
    above = {parent for p in protected for parent in parents(p)}
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
        if len(path.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
            refused.append(f"{path[:60]}...: a path too long to carry")
            dropped.append(path)
            continue
        if path in above and kind == "o":  # its own files, over the prepared ones it keeps
            change = (path, "d", change[2], b"")
            refused.append(f"{path}: replaced, but it holds a protected path (kept)")
        if path in above and kind not in ("d", "o"):
            why = "it holds a protected path (restored)"
        elif _under(path, protected):
            why = "protected (restored)"
        elif parts[-1] in REFUSED_NAMES:
            why = "refused file name"
        elif parts[-1] in RUNNER_CONFIGS:
            why = "a test runner's configuration (kept as prepared)"
        elif REFUSED_PARTS & set(parts) or any(part.endswith(REFUSED_SUFFIXES) for part in parts):
            why = "refused place"
        elif _shadows(parts, tree):
            why = f"it would replace the module {_module(parts[0])!r} the verifier imports"
        elif _under(path, venvs):
            why = "inside a virtual environment"
        elif kind == "l":
            target = payload.decode("utf-8", "surrogateescape")
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
            steps = [step for step in target.split("/") if step not in ("", ".")]
            ups = len(steps) - len(list(itertools.dropwhile(lambda step: step == "..", steps)))
            # ".." only at the start: past another link ("a/x/.." where a/x is one) it could leave.
            if target.startswith("/") or resolved == ".." or resolved.startswith("../") or ".." in steps[ups:]:
                why = "a symlink that leaves the tree, or may"
        if why:
            refused.append(f"{path}: {why}")
            if kind in ("d", "o"):
                dropped.append(path)
            continue
        kept.append(change)
    return kept, refused


def _forms(classname: str, name: str, file: str) -> set[str]:
    """The ids one testcase answers to: ``file::name``, ``file::Class::name``, ``classname.name``."""
    forms = {f"{classname}.{name}", name}
    if file:
        forms.add(f"{file}::{name}")
    parts = classname.split(".")
    for cut in range(1, len(parts) + 1):  # module a.b.test_x, maybe followed by a class
        module, rest = "/".join(parts[:cut]) + ".py", parts[cut:]
        forms.add("::".join([module, *rest, name]))
    return forms


def _junit(data: bytes) -> tuple[set[str], int, list[str], list[str]]:
    """Test ids that passed (every form of ``_forms``; none that some other testcase of the report
    also answers to without passing), how many ran, the names of those that did not pass, and the
    ``classname.name`` of testcases reported more than once (a test can rename itself in the report
    with pytest's ``record_xml_attribute``: a passing copy of a failing expected test was counted)."""
    root = ET.fromstring(data)
    passed: set[str] = set()
    not_passed: set[str] = set()
    failed: list[str] = []
    seen: Counter[str] = Counter()
    ran = 0
    for case in root.iter("testcase"):
        ran += 1
        name, classname, file = case.get("name", ""), case.get("classname", ""), case.get("file", "")
        seen[f"{classname}.{name}"] += 1
        forms = _forms(classname, name, file)
        if any(child.tag in ("failure", "error", "skipped") for child in case):
            failed.append(f"{classname}.{name}")
            not_passed |= forms
        else:
            passed |= forms
    return passed - not_passed, ran, failed, sorted(k for k, n in seen.items() if n > 1)


def _number(data: bytes, json_file: bool) -> float | None:
    """A reward file's number in [0, 1]: ``reward.json``'s ``reward`` (or a bare number),
    ``reward.txt``'s text (ASCII decimal only); ``None`` for anything else (a string, a boolean,
    nested data, infinity, NaN, out of range). Never raises: the file may be the agent's own."""
    try:
        if not json_file:
            text = data.decode("ascii").strip()  # float() also reads "１", "1_0" and "١"
            if not DECIMAL.fullmatch(text):
                return None
            value: Any = float(text)
        else:
            loaded = json.loads(data)
            value = loaded.get("reward") if isinstance(loaded, dict) else loaded
    except (ValueError, RecursionError):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value) if 0.0 <= value <= 1.0 else None  # a reward is a fraction: 2 is no "passed"


def _pytest_verdict(reports: Mapping[str, bytes | None], expected: list[str], note: str,
                    canaries: Sequence[str] = ()) -> Outcome:
    """Every expected test id passed in the verifier's JUnit report (with none expected: every test
    it ran, at least one), and every planted canary failed (``canary``). A report that never got
    written (``os._exit`` at import) passes nothing."""
    total = max(1, len(expected))
    if reports.get("junit.xml") is None:  # none, or not a regular file
        return Outcome("failed", 0, total, detail=f"the verifier reported no tests{note}")
    try:
        passed, ran, failed, twice = _junit(reports["junit.xml"])  # type: ignore[arg-type]
    except ET.ParseError as exc:
        return Outcome("failed", 0, total, detail=f"the verifier's report is not JUnit XML: {exc}{note}")
    if twice:
        return Outcome("failed", 0, total, detail=f"the report names {twice[0]} more than once: the run was forged{note}")
    why = forged(passed, failed, canaries)
    if why:
        return Outcome("failed", 0, total, detail=why + note)
    if not expected:
        ok = ran > 0 and not failed
        return Outcome("passed" if ok else "failed", ran - len(failed), max(ran, 1),
                       detail=f"{ran - len(failed)}/{ran} tests passed{note}")
    ok = [t for t in expected if t in passed]
    missing = [t for t in expected if t not in passed][:3]
    detail = f"{len(ok)}/{len(expected)} expected tests passed ({ran} ran)" + (f"; not passed: {missing}" if missing else "")
    return Outcome("passed" if len(ok) == len(expected) else "failed", len(ok), len(expected), detail=detail + note)


def verdict(reports: Mapping[str, bytes | None], exit_code: int, timed_out: bool, row: Mapping[str, Any],
            refused: Sequence[str] = (), canaries: Sequence[str] = ()) -> Outcome:
    """The outcome from the verifier's own run (see the module docstring)."""
    note = f"; not carried: {', '.join(refused[:5])}" if refused else ""
    if timed_out:
        return Outcome("timeout", 0, 1, detail=f"the verifier ran past its time{note}")
    parser = row.get("parser") or ("pytest" if row.get("expected") else "reward_file")
    # pytest exits 1 when some test failed: its report is whole (a failing test outside ``expected``,
    # or the canary, is normal). Any other status means the run did not end as written.
    if exit_code != 0 and parser != "exit_code" and not (parser == "pytest" and exit_code == 1):
        # A report counts only from a verifier that ended as it was written to: code of the agent's
        # that the tests import can write the report, then kill the script before it overwrites it.
        return Outcome("failed", 0, 1, detail=f"the verifier exited {exit_code}; its report does not count{note}")
    if parser == "pytest":
        return _pytest_verdict(reports, list(row.get("expected") or ()), note, canaries)
    if parser == "exit_code":
        return Outcome("passed" if exit_code == 0 else "failed", int(exit_code == 0), 1,
                       detail=f"the verifier exited {exit_code}{note}")
    # Harbor: the script writes reward.txt (a number) or reward.json. Code of the agent's that the
    # tests run can add the other one, or put a link, a directory or a FIFO in a report's place
    # (which the script then writes through): each is a failure, and with both files the lower
    # value counts. No reward at all is a failure too, never the exit status (which such code can
    # also make 0).
    values = []
    for name in ("reward.json", "reward.txt"):
        if name not in reports:
            continue
        if reports[name] is None:
            return Outcome("failed", 0, 1, detail=f"{name} is not a regular file{note}")
        value = _number(reports[name], json_file=name.endswith(".json"))
        if value is None:
            return Outcome("failed", 0, 1, detail=f"{name} holds no {'reward' if name.endswith('.json') else 'number'}{note}")
        values.append(value)
    if not values:
        return Outcome("failed", 0, 1, detail=f"the verifier wrote no reward file (exit status {exit_code}){note}")
    value = min(values)
    status = "passed" if value >= 1.0 else "failed"
    return Outcome(status, int(value >= 1.0), 1, detail=f"the verifier's reward: {value:g}{note}")

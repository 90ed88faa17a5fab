"""SWE-style rows (a repository at a commit, a test patch, FAIL_TO_PASS/PASS_TO_PASS) as agent rows.

Input columns: ``instance_id``, ``repo`` (a local git repository: a path), ``base_commit``,
``problem_statement`` (the prompt), ``test_patch`` (a ``git diff`` of the test files),
``FAIL_TO_PASS`` and ``PASS_TO_PASS`` (lists of test ids, or their JSON text, as SWE-bench
publishes them). Optional: ``image`` (the base, through the image map; default ``host``),
``setup`` (commands that install the repository, e.g. ``pip install -e .``), ``verify`` (the test
command; by default ``python3 -m pytest -rA -p no:cacheprovider`` on the files of the expected
pytest ids: ids of another form need an explicit ``verify``), ``workdir`` (default ``/testbed``,
SWE-bench's), ``agent_timeout``, ``verify_timeout``.

How the repository gets into the environment: the build runs in a sandbox that cannot see host
paths, so the repository is read here, on the host, at ``base_commit`` (``git archive``: tracked
files only, no ``.git``, no submodules) into the environment's ``files``; executable files get a
``chmod +x`` setup step, symlinks an ``ln -s`` step. A binary file cannot be carried as text:
``binary_files="error"`` (the default) refuses the row, ``"skip"`` leaves such files out. Then,
if the base has ``git``, a setup step commits the tree as it is (fixed author and dates), so the
agent can ``git diff``. A large repository makes a large ``environment`` cell, repeated in every
row of that repository at that commit (they still share one build: the key is the content).

The test patch is applied here too, on copies of the files it touches, never in the
environment: the patched files are the row's hidden ``tests`` (``tests_dir`` = the working
directory, so they overwrite the repository's own at grading time) and their paths are its
``protected`` files. A patch that deletes a file, or that does not apply, is a ``ConfigError``.
``expected`` = ``FAIL_TO_PASS`` + ``PASS_TO_PASS``; ``parser`` = ``pytest``.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trl_sandbox.agents.columns import AGENT_TASK, relative_path
from trl_sandbox.agents.images import resolve
from trl_sandbox.sandbox import TASK_COLUMN, ConfigError

WORKDIR = "/testbed"
AGENT_TIMEOUT = 1800.0
VERIFY_TIMEOUT = 900.0
GIT_SETUP = ("if command -v git >/dev/null 2>&1; then git init -q && git add -A && "
             "GIT_AUTHOR_DATE=2000-01-01T00:00:00Z GIT_COMMITTER_DATE=2000-01-01T00:00:00Z "
             "git -c user.name=trl-sandbox -c user.email=trl-sandbox@localhost commit -q -m base; fi")
DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)


def is_swe_row(row: Mapping[str, Any]) -> bool:
    return "repo" in row and "base_commit" in row


def _git(repo: str, *args: str, what: str, input: bytes | None = None) -> bytes:
    try:
        done = subprocess.run(["git", "-C", repo, *args], input=input, capture_output=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"{what}: git {args[0]} failed ({exc}); is git installed?") from None
    if done.returncode != 0:
        raise ConfigError(f"{what}: git {' '.join(args[:2])} failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def _archive(repo: str, commit: str, what: str) -> list[tuple[str, str, bytes | str, bool]]:
    """``(path, kind, data or link target, executable)`` for every tracked file at ``commit``."""
    data = _git(repo, "archive", "--format=tar", commit, what=what)
    out = []
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            if member.isdir() or member.name == "pax_global_header":
                continue
            path = relative_path(member.name, what)
            if member.issym():
                out.append((path, "link", member.linkname, False))
            elif member.isfile():
                out.append((path, "file", tar.extractfile(member).read(), bool(member.mode & 0o111)))
    return out


def _patched(files: dict[str, bytes], patch: str, what: str) -> dict[str, str]:
    """The files ``patch`` touches, after it: applied on copies in a scratch directory."""
    touched = sorted({p for pair in DIFF_HEADER.findall(patch) for p in pair})
    if not touched:
        raise ConfigError(f"{what}: test_patch has no `diff --git a/... b/...` header; give a git diff")
    with tempfile.TemporaryDirectory(prefix="trl-sandbox-swe-") as scratch:
        for path in touched:
            if path in files:
                target = Path(scratch, relative_path(path, what))
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(files[path])
        env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(Path(scratch).parent))
        done = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], cwd=scratch, env=env,
                              input=patch.encode(), capture_output=True, timeout=120)
        if done.returncode != 0:
            raise ConfigError(f"{what}: test_patch does not apply at base_commit: "
                              f"{done.stderr.decode(errors='replace').strip()[:500]}")
        out = {}
        for path in touched:
            target = Path(scratch, path)
            if not target.exists():
                if path in files:
                    raise ConfigError(f"{what}: test_patch deletes {path}; a deleted test file cannot be restored "
                                      "as a hidden test")
                continue  # the old name of a rename
            try:
                out[path] = target.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise ConfigError(f"{what}: test_patch makes {path} binary; hidden tests are text") from None
    return out


def _ids(row: Mapping[str, Any], column: str, what: str) -> list[str]:
    value = row.get(column) or []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ConfigError(f"{what}: {column} must be a list of test ids or its JSON text") from None
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{what}: {column} must be a list of test ids (strings)")
    return list(value)


def swe_row(row: Mapping[str, Any], *, image_map: Mapping[str, str] | None = None,
            binary_files: str = "error", git_init: bool = True, setup_network: bool = False) -> dict[str, Any]:
    """One SWE-style row as an agent row (unchecked: ``columns.row_of`` checks it)."""
    name = row.get("instance_id") or row.get("task_id")
    what = f"SWE row {name}"
    if not isinstance(name, str) or not name:
        raise ConfigError("a SWE row needs an instance_id (or task_id)")
    if binary_files not in ("error", "skip"):
        raise ConfigError(f"binary_files={binary_files!r}: use 'error' or 'skip'")
    repo, commit = row.get("repo"), row.get("base_commit")
    if not isinstance(repo, str) or not Path(repo).is_dir():
        raise ConfigError(f"{what}: repo={repo!r} must be the path of a local git repository (clone it first: the "
                          "build's sandbox cannot fetch it)")
    if not isinstance(commit, str) or not commit:
        raise ConfigError(f"{what}: base_commit must name a commit of {repo}")
    commit = _git(repo, "rev-parse", "--verify", f"{commit}^{{commit}}", what=what).decode().strip()
    prompt = row.get("problem_statement") or row.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ConfigError(f"{what}: no problem_statement (the prompt)")
    workdir = row.get("workdir") or WORKDIR
    files: dict[str, str] = {}
    raw: dict[str, bytes] = {}
    setup: list[str] = []
    executable: list[str] = []
    skipped: list[str] = []
    for path, kind, data, is_exec in _archive(repo, commit, what):
        if kind == "link":
            setup.append(f"mkdir -p -- {shlex.quote(os.path.dirname(path) or '.')} && "
                         f"ln -sfn -- {shlex.quote(str(data))} {shlex.quote(path)}")
            continue
        raw[path] = data
        try:
            files[path] = data.decode("utf-8")
        except UnicodeDecodeError:
            if binary_files == "error":
                raise ConfigError(f"{what}: {path} is a binary file and an environment carries text; pass "
                                  "binary_files='skip' to leave binary files out") from None
            skipped.append(path)
            continue
        if is_exec:
            executable.append(path)
    if executable:
        setup.insert(0, "chmod +x -- " + " ".join(shlex.quote(p) for p in executable))
    if git_init:
        setup.append(GIT_SETUP)
    extra = row.get("setup") or []
    setup.extend([extra] if isinstance(extra, str) else list(extra))
    image = row.get("image")
    base = resolve(image, image_map or {}, what) if image else "host"
    tests = _patched(raw, row.get("test_patch") or "", what)
    expected = _ids(row, "FAIL_TO_PASS", what) + _ids(row, "PASS_TO_PASS", what)
    verify = row.get("verify")
    if not verify:
        if not expected or not all("::" in test for test in expected):
            raise ConfigError(f"{what}: the expected ids are not all pytest ids (FILE::TEST); give the row a verify "
                              "command that runs them and prints a pytest -rA style report")
        test_files = sorted({test.split("::", 1)[0] for test in expected})
        verify = "python3 -m pytest -rA -p no:cacheprovider " + " ".join(shlex.quote(f) for f in test_files)
    return {
        "task_id": name,
        "prompt": prompt,
        TASK_COLUMN: AGENT_TASK,
        "environment": {"files": files, "setup": setup, "base": base, "workdir": workdir,
                        "setup_network": setup_network},
        "env": {},
        "tests": tests,
        "tests_dir": workdir,
        "verify": verify,
        "verify_env": {},
        "parser": "pytest",
        # The test-patch files and every file an expected test lives in (PASS_TO_PASS ones too: an
        # agent that broke the code and weakened such a test passed).
        "protected": sorted(set(tests) | {test.split("::", 1)[0] for test in expected if "::" in test}),
        "expected": expected,
        "agent_timeout": row.get("agent_timeout") or AGENT_TIMEOUT,
        "verify_timeout": row.get("verify_timeout") or VERIFY_TIMEOUT,
        "solution": _solution(row.get("patch")),
        "solution_files": {},
    }


def _solution(patch: Any) -> str | None:
    """SWE-bench's gold ``patch``, as an oracle script that applies it."""
    if not isinstance(patch, str) or not patch.strip():
        return None
    marker = "TRL_SANDBOX_PATCH_END"
    while marker in patch:
        marker += "_"
    return f"git apply --whitespace=nowarn - <<'{marker}'\n{patch.rstrip(chr(10))}\n{marker}\n"

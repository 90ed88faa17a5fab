"""The README and docs/ cannot drift from the program: their code compiles, their commands and
flags exist, every module and file they name is there, and the README stays a guide."""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUIDE = (ROOT / "README.md").read_text(encoding="utf-8")
PAGES = sorted((ROOT / "docs").glob("*.md"))
# The README and every page of docs/, checked alike.
README = "\n".join([GUIDE, *(page.read_text(encoding="utf-8") for page in PAGES)])
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```", README, re.S | re.M)


def _command_lines() -> list[str]:
    lines = []
    for lang, body in BLOCKS:
        if lang in ("", "bash", "sh", "console"):
            for line in body.splitlines():
                line = line.split("#", 1)[0].strip()
                if line:
                    lines.append(line)
    return lines


def test_every_python_block_compiles():
    blocks = [body for lang, body in BLOCKS if lang == "python"]
    assert blocks
    for body in blocks:
        compile(body, "<README>", "exec")


def test_every_make_target_and_script_the_readme_names_exists():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    named = re.findall(r"`make ([\w-]+)", README)
    named += [m for line in _command_lines() for m in re.findall(r"^make ([\w-]+)", line)]
    assert named
    for target in named:
        assert target in targets, f"README names `make {target}`, which the Makefile lacks"
    for script in re.findall(r"\b(scripts/[\w./-]+|benchmarks/[\w./-]+\.py|examples/[\w./-]+\.py)", README):
        assert (ROOT / script.rstrip(".")).exists(), script


def _flags_of(command: str) -> set[str]:
    from trl_sandbox.commands.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return {opt for action in sub.choices[command]._actions for opt in action.option_strings}


def _train_flags() -> set[str]:
    from trl_sandbox.commands.train import TrainArguments
    from trl_sandbox.training.trainer import SandboxGRPOConfig

    names = {f.name for f in dataclasses.fields(SandboxGRPOConfig)} | {f.name for f in dataclasses.fields(TrainArguments)}
    return {f"--{n}" for n in names} | {"--no_plot", "--config"}


def test_every_trl_sandbox_command_line_uses_real_subcommands_and_flags():
    checked = 0
    for line in _command_lines():
        try:
            words = shlex.split(line.replace("|", " | "))
        except ValueError:  # a line that is not a shell command (a table, a fragment)
            words = line.split()
        for i, word in enumerate(words):
            if not word.endswith("trl-sandbox") or i + 1 >= len(words):
                continue
            command = words[i + 1].split("|")[0]
            if command in ("plugins", "providers", "tasks", "ls", "reap", "exec", "evaluate"):
                known = _flags_of(command)
            elif command == "train":
                known = _train_flags()
            else:
                pytest.fail(f"README runs an unknown sub-command: {line}")
            for flag in (w.split("=")[0] for w in words[i + 2:] if w.startswith("--")):
                assert flag in known, f"README uses {flag} with `trl-sandbox {command}`, which has no such flag: {line}"
            checked += 1
    assert checked >= 5, checked


def _example_flags(script: str) -> set[str]:
    """The flags of ``examples/NAME.py``: its argparse parser, or SandboxGRPOConfig and its own dataclasses."""
    import runpy

    from trl_sandbox.training.trainer import SandboxGRPOConfig

    module = runpy.run_path(str(ROOT / script), run_name="readme_check")
    if "build_parser" in module:
        return {opt for action in module["build_parser"]()._actions for opt in action.option_strings}
    classes = [SandboxGRPOConfig] + [v for v in module.values() if isinstance(v, type) and dataclasses.is_dataclass(v)]
    names = {f.name for cls in classes for f in dataclasses.fields(cls)}
    return {f"--{n}" for n in names} | {f"--{n.replace('_', '-')}" for n in names} | {"--config"}


def test_every_example_command_line_uses_flags_the_example_has():
    checked = 0
    for line in _command_lines():
        try:
            words = shlex.split(line)
        except ValueError:  # not a shell command (a table row, a fragment)
            continue
        scripts = [i for i, w in enumerate(words) if re.fullmatch(r"examples/\w+\.py", w)]
        if not scripts:
            continue
        known = _example_flags(words[scripts[0]])
        for flag in (w.split("=")[0] for w in words[scripts[0] + 1:] if w.startswith("--")):
            assert flag in known, f"README uses {flag} with {words[scripts[0]]}, which has no such flag: {line}"
        checked += 1
    assert checked >= 4, checked


DOCS = {path: path.read_text(encoding="utf-8")
        for path in [ROOT / "README.md", *PAGES, *sorted(ROOT.glob("plugins/*/README.md"))]}


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module of the package, or a name reached from one by attributes."""
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for name in parts[i:]:
            if not hasattr(target, name):
                return False
            target = getattr(target, name)
        return True
    return False


def test_every_module_path_the_docs_name_exists():
    named = {(doc.name if doc.parent == ROOT else str(doc.relative_to(ROOT)), m.group(0).rstrip("."))
             for doc, text in DOCS.items() for m in re.finditer(r"\btrl_sandbox(?:\.\w+)+", text)}
    files = {(doc.name, m.group(0)) for doc, text in DOCS.items() for m in re.finditer(r"\btrl_sandbox/[\w/.]+", text)}
    assert len(named) >= 5 and len(files) >= 5  # the docs name several; the patterns find them
    assert sorted(f"{doc}: {p}" for doc, p in named if not _resolves(p)) == []
    assert sorted(f"{doc}: {p}" for doc, p in files if not (ROOT / p.rstrip(".")).exists()) == []


def test_the_path_check_catches_a_moved_module():
    assert _resolves("trl_sandbox.pool.sandbox_pool.SandboxPool")
    assert not _resolves("trl_sandbox.pool_settings")  # before the folders: now trl_sandbox.pool.settings
    assert not _resolves("trl_sandbox.judge.verdict.no_such_name")


def test_the_readme_is_a_guide_that_links_its_pages():
    assert len(GUIDE.splitlines()) <= 350
    assert len(PAGES) >= 4
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", GUIDE))
    assert {page.name for page in PAGES} <= linked, "every page of docs/ is linked from the README"


def test_every_link_between_pages_lands():
    for doc, text in DOCS.items():
        for target, anchor in re.findall(r"\]\(((?:docs/)?[\w-]+\.md)(?:#([\w-]+))?\)", text):
            path = (doc.parent / target) if not target.startswith("docs/") else ROOT / target
            assert path.is_file(), f"{doc.name} links {target}"
            if anchor:
                headings = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.M)
                slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}
                assert anchor in slugs, f"{doc.name} links {target}#{anchor}, not a heading there"

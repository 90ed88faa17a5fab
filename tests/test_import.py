"""Every module of the project compiles and imports on this Python (the matrix runs it on each).

Where the training stack (torch, TRL, transformers, ...) is not installed, as in the torch-free
environments of other Pythons, a module may fail to import only for want of one of those.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

import trl_sandbox

ROOT = Path(__file__).resolve().parent.parent
TRAINING_STACK = {"torch", "trl", "transformers", "accelerate", "datasets", "tokenizers", "vllm"}
MODULES = sorted(m.name for m in pkgutil.walk_packages(trl_sandbox.__path__, "trl_sandbox."))
SOURCES = sorted(p for d in ("trl_sandbox", "plugins") for p in (ROOT / d).rglob("*.py") if "build" not in p.parts)


def test_every_source_file_compiles_on_this_python(tmp_path):
    for path in SOURCES:
        py_compile.compile(str(path), cfile=str(tmp_path / "out.pyc"), doraise=True)


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        root = (exc.name or "").split(".")[0]
        assert root in TRAINING_STACK and importlib.util.find_spec(root) is None, exc


def test_cli_starts_without_the_training_stack():
    """``trl-sandbox providers`` and ``tasks`` answer without importing torch (a fast CLI start)."""
    code = ("import sys; from trl_sandbox.commands.cli import main; rc = main(['providers']); "
            "assert 'torch' not in sys.modules, 'the CLI imported torch'; sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "local" in out.stdout

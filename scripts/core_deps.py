"""Print, one per line, the requirements of trl-sandbox and its plugins minus the training stack
(or, with ``--plugins``, the plugin directories whose ``requires-python`` admits this interpreter).

Used by ``SCOPE=core scripts/setup.sh``: an environment for the torch-free tests (import, CLI,
scoring, the content fuzz) on every Python the project claims, without several GB of torch per
interpreter. Reads the pyproject files with the standard library only (``tomllib`` on 3.11+, a
minimal reader of the ``dependencies`` arrays before that).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAINING_STACK = {"torch", "trl", "transformers", "accelerate", "vllm", "peft", "trl-sandbox"}


def _arrays(text: str, key: str) -> list[str]:
    match = re.search(rf"^{re.escape(key)}\s*=\s*\[(.*?)\]", text, re.S | re.M)
    return re.findall(r'"([^"]+)"', match.group(1)) if match else []


def supports_this_python(pyproject: str) -> bool:
    """Whether ``requires-python`` (clauses such as ``>=3.11`` and ``<4``) admits this interpreter."""
    match = re.search(r'^requires-python\s*=\s*"([^"]*)"', pyproject, re.M)
    here = sys.version_info[:2]
    for clause in (match.group(1).split(",") if match else ()):
        op, version = re.match(r"\s*([<>=!~]*)\s*([\d.]+)", clause).groups()
        bound = tuple(int(x) for x in version.split(".")[:2])
        ok = {">=": here >= bound, ">": here > bound, "<": here < bound, "<=": here <= bound,
              "==": here == bound, "~=": here >= bound}.get(op, True)
        if not ok:
            return False
    return True


def plugins() -> list[Path]:
    """The plugin directories whose distribution supports this interpreter."""
    return [p.parent for p in sorted((ROOT / "plugins").glob("*/pyproject.toml")) if supports_this_python(p.read_text())]


def requirements(extras: str) -> list[str]:
    root = (ROOT / "pyproject.toml").read_text()
    found = _arrays(root, "dependencies")
    for extra in filter(None, extras.split(",")):
        found += _arrays(root, extra)
    for plugin in plugins():
        found += _arrays((plugin / "pyproject.toml").read_text(), "dependencies")
    out = []
    for req in found:
        name = re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower().replace("_", "-")
        if name not in TRAINING_STACK and req not in out:
            out.append(req)
    return out


if __name__ == "__main__":
    if sys.argv[1:2] == ["--plugins"]:  # the plugin directories to install on this interpreter
        print("\n".join(str(p.relative_to(ROOT)) + "/" for p in plugins()))
    else:
        print("\n".join(requirements(sys.argv[1] if len(sys.argv) > 1 else "test")))

"""The built-in agent tasks, as the files of Harbor task directories.

Three small tasks that run on the sandbox's own system (their ``FROM python:3.11-slim`` maps to
``host`` by default: ``BUILTIN_IMAGE_MAP``), each with its oracle and hidden tests that need only
``python3``'s standard library (no pytest) and write ``/logs/verifier/reward.txt``:

``fix-median``
    a bug in a small repository with a failing unit test: ``median`` neither sorts nor averages
    the two middle values.
``error-digest``
    a file-manipulation terminal task: collect the ``ERROR`` lines of several logs into one file,
    remove the temporary files, leave the logs as they are.
``venv-wordcount``
    a command-line tool that only runs in the virtual environment the Dockerfile prepares
    (``python3 -m venv`` in a ``RUN``): it miscounts words separated by anything but one space.

``agents.load`` writes them out with ``write_builtin`` and reads them back as any Harbor
directory, so they exercise the same loader; ``write_builtin(DIR)`` also gives a user a set of
examples to copy.
"""

from __future__ import annotations

from pathlib import Path

BUILTIN_IMAGE_MAP = {"python:3.11-slim": "host"}

TEST_SH = """#!/bin/bash
# Harbor's convention: the verdict is the number this script writes to /logs/verifier/reward.txt.
mkdir -p /logs/verifier
if {command}; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""


def _toml(category: str, agent: int, verifier: int) -> str:
    return f"""version = "1.0"

[metadata]
difficulty = "easy"
category = "{category}"
tags = ["trl-sandbox-builtin"]

[agent]
timeout_sec = {agent}.0

[verifier]
timeout_sec = {verifier}.0

[environment]
build_timeout_sec = 120.0
"""


FIX_MEDIAN = {
    "task.toml": _toml("debugging", 300, 60),
    "instruction.md": """The repository in /app is a small statistics package, `stats`. Its unit test
`python3 -m unittest discover -s tests` fails: `stats.median` gives wrong answers. Fix the bug in
the package (do not change the tests). `median` must work on any non-empty list of numbers, in any
order, and raise `ValueError` on an empty list.
""",
    "environment/Dockerfile": """FROM python:3.11-slim
WORKDIR /app
COPY repo/ ./
""",
    "environment/repo/stats/__init__.py": '"""A small statistics package."""\n\nfrom stats.core import mean, median\n\n'
                                          '__all__ = ["mean", "median"]\n',
    "environment/repo/stats/core.py": '''"""Mean and median of a list of numbers."""


def mean(values):
    if not values:
        raise ValueError("mean of an empty list")
    return sum(values) / len(values)


def median(values):
    if not values:
        raise ValueError("median of an empty list")
    middle = len(values) // 2
    return values[middle]
''',
    "environment/repo/tests/__init__.py": "",
    "environment/repo/tests/test_core.py": '''import unittest

from stats import mean, median


class TestStats(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2, 3, 4]), 2.5)

    def test_median_odd(self):
        self.assertEqual(median([3, 1, 2]), 2)


if __name__ == "__main__":
    unittest.main()
''',
    # The judging process never imports the agent's code: each case runs in a child that imports
    # ``stats`` and prints its answer, which this process compares. A blanket forgery in the
    # agent's code (an "OK" printed, os._exit(0), a reward file written) can end or fake only the
    # child's answer, which must then equal the median. The judge runs without the tree on its path.
    "tests/test.sh": TEST_SH.format(command="cd /app && python3 -I /tests/run_tests.py"),
    "tests/run_tests.py": '''"""Hidden tests of stats.median, judged out of the agent's reach."""
import json
import os
import subprocess
import sys

CASES = [[9, 1, 5, 3, 7], [4, 1, 3, 2], [7], [3, 1, 2], [2.5, -1, 10, 4, 4, 0], []]
EXPECTED = [5, 2.5, 7, 2, 3.25, "ValueError"]
CHILD = """
import json, sys
from stats import median
values = json.loads(sys.argv[1])
before = list(values)
try:
    answer = median(values)
except ValueError:
    answer = "ValueError"
print(json.dumps({"answer": answer, "unchanged": values == before}))
"""


def answer(values):
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": os.getcwd(), "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        run = subprocess.run([sys.executable, "-c", CHILD, json.dumps(values)], env=env, capture_output=True,
                             text=True, timeout=30)
        return json.loads(run.stdout.strip().splitlines()[-1]) if run.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        return None


failed = [values for values, want in zip(CASES, EXPECTED)
          if (got := answer(values)) is None or got.get("answer") != want or got.get("unchanged") is not True]
print("all passed" if not failed else f"failed: {failed}")
sys.exit(1 if failed else 0)
''',
    "solution/solve.sh": '''#!/bin/bash
set -e
cat > stats/core.py <<'PY'
"""Mean and median of a list of numbers."""


def mean(values):
    if not values:
        raise ValueError("mean of an empty list")
    return sum(values) / len(values)


def median(values):
    if not values:
        raise ValueError("median of an empty list")
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2
PY
''',
}

ERROR_DIGEST = {
    "task.toml": _toml("file-operations", 300, 60),
    "instruction.md": """The directory /app/logs holds log files (`*.log`) and leftovers (`*.tmp`).
1. Write /app/errors.txt: every line that contains `ERROR` from the `.log` files, taking the files
   in name order and the lines in their order, each prefixed by its file's name and a colon
   (`api.log:2024-05-01 ERROR timeout`).
2. Delete every `.tmp` file in /app/logs.
Leave the `.log` files as they are.
""",
    "environment/Dockerfile": """FROM python:3.11-slim
WORKDIR /app
COPY logs/ logs/
""",
    "environment/logs/api.log": "2024-05-01 INFO start\n2024-05-01 ERROR timeout\n2024-05-01 INFO retry\n"
                                "2024-05-02 ERROR bad gateway\n",
    "environment/logs/db.log": "2024-05-01 INFO connected\n2024-05-03 WARN slow query\n",
    "environment/logs/auth.log": "2024-05-01 ERROR token expired\n2024-05-04 INFO login\n",
    "environment/logs/cache.tmp": "scratch\n",
    "environment/logs/old.tmp": "scratch\n",
    "tests/test.sh": TEST_SH.format(command="python3 /tests/test_outputs.py"),
    "tests/test_outputs.py": '''import pathlib
import sys

LOGS = {
    "api.log": "2024-05-01 INFO start\\n2024-05-01 ERROR timeout\\n2024-05-01 INFO retry\\n2024-05-02 ERROR bad gateway\\n",
    "db.log": "2024-05-01 INFO connected\\n2024-05-03 WARN slow query\\n",
    "auth.log": "2024-05-01 ERROR token expired\\n2024-05-04 INFO login\\n",
}
EXPECTED = ["api.log:2024-05-01 ERROR timeout", "api.log:2024-05-02 ERROR bad gateway",
            "auth.log:2024-05-01 ERROR token expired"]

app = pathlib.Path("/app")
problems = []
errors = app / "errors.txt"
if not errors.is_file() or errors.is_symlink():
    problems.append("no /app/errors.txt")
elif errors.read_text().splitlines() != sorted(EXPECTED, key=lambda line: line.split(":")[0]):
    problems.append(f"errors.txt is {errors.read_text()!r}")
left = sorted(p.name for p in (app / "logs").glob("*.tmp"))
if left:
    problems.append(f".tmp files left: {left}")
for name, text in LOGS.items():
    path = app / "logs" / name
    if not path.is_file() or path.read_text() != text:
        problems.append(f"{name} changed")
print("\\n".join(problems) or "ok")
sys.exit(1 if problems else 0)
''',
    "solution/solve.sh": '''#!/bin/bash
set -e
cd /app/logs
for f in $(ls *.log | LC_ALL=C sort); do
  grep ERROR "$f" | sed "s/^/$f:/" || true
done > /app/errors.txt
rm -f -- *.tmp
''',
}

VENV_WORDCOUNT = {
    "task.toml": _toml("python-environment", 300, 60),
    "instruction.md": """/app holds a small command-line tool, `wordcount`, installed in the virtual
environment /app/.venv (run it as `/app/.venv/bin/python -m wordcount FILE`). It should print the
number of words in FILE, words being separated by any whitespace (spaces, tabs, newlines, several
in a row), but it miscounts. Fix the tool's source in /app/src; keep using the virtual environment.
""",
    "environment/Dockerfile": """FROM python:3.11-slim
WORKDIR /app
COPY src/ src/
# The tool is importable only from the virtual environment: a .pth file puts /app/src on its path.
RUN python3 -m venv --without-pip .venv
RUN .venv/bin/python -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], 'app-src.pth').write_text('/app/src\\n')"
ENV PATH=/app/.venv/bin:$PATH
""",
    "environment/src/wordcount/__init__.py": '"""Count the words of a file."""\n',
    "environment/src/wordcount/__main__.py": '''import sys


def count(text):
    return len(text.split(" "))


def main(argv):
    if len(argv) != 2:
        print("usage: python -m wordcount FILE", file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as handle:
        print(count(handle.read()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
''',
    "tests/test.sh": TEST_SH.format(command="python3 /tests/test_wordcount.py"),
    "tests/test_wordcount.py": '''import pathlib
import subprocess
import sys
import tempfile

VENV_PYTHON = "/app/.venv/bin/python"
CASES = {"one two three": 3, "one  two\\tthree\\nfour\\n": 4, "": 0, "  lead and trail  \\n\\n": 3}

problems = []
if not pathlib.Path("/app/.venv/pyvenv.cfg").is_file():
    problems.append("the virtual environment /app/.venv is gone")
with tempfile.TemporaryDirectory() as scratch:
    for number, (text, words) in enumerate(CASES.items()):
        path = pathlib.Path(scratch, f"case{number}.txt")
        path.write_text(text)
        done = subprocess.run([VENV_PYTHON, "-m", "wordcount", str(path)], capture_output=True, text=True,
                              timeout=30, cwd="/")
        if done.returncode != 0 or done.stdout.strip() != str(words):
            problems.append(f"{text!r}: expected {words}, got {done.stdout.strip()!r} {done.stderr.strip()[-200:]}")
print("\\n".join(problems) or "ok")
sys.exit(1 if problems else 0)
''',
    "solution/solve.sh": '''#!/bin/bash
set -e
sed -i 's/return len(text.split(" "))/return len(text.split())/' /app/src/wordcount/__main__.py
''',
}

TASKS = {"fix-median": FIX_MEDIAN, "error-digest": ERROR_DIGEST, "venv-wordcount": VENV_WORDCOUNT}
EXECUTABLE = ("tests/test.sh", "solution/solve.sh")


def write_builtin(directory: str | Path, task_ids: list[str] | None = None) -> list[Path]:
    """Write the built-in tasks as Harbor task directories under ``directory``; their paths."""
    out = []
    for name, files in TASKS.items():
        if task_ids is not None and name not in task_ids:
            continue
        for rel, text in files.items():
            path = Path(directory, name, rel)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            if rel in EXECUTABLE:
                path.chmod(0o755)
        out.append(Path(directory, name))
    return out

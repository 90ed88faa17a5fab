"""Forgeries against a pytest-graded SWE-style task, with the real pytest inside the sandbox.

The sandbox's Python has no pytest of its own, so the test binds a copy of the test machine's
pytest (and what it imports) read-only at ``/opt/pytest-lib``, on the verifier's ``PYTHONPATH``
only, as a task's prepared environment would hold it. Each forgery runs next to the task's oracle
in the same pool (the oracle must pass), and each has its control: with the one rule that stops
it switched off, the same forgery pays.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from importlib.metadata import distribution
from pathlib import Path

import pytest

from trl_sandbox.agents import grading, task
from trl_sandbox.agents.load import agent_rows
from trl_sandbox.environments.cache import remove_tree
from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.scoring.scorer import Scorer

from .test_agent_tasks import needs_bwrap, swe_repo  # noqa: F401  (a fixture)

pytestmark = needs_bwrap
RUNNER = ("pytest", "pluggy", "iniconfig", "packaging", "pygments")
PLUGIN = ("import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
          "    outcome = yield\n    report = outcome.get_result()\n    report.outcome, report.longrepr = 'passed', None\n")


@pytest.fixture(scope="module")
def pool():
    root = Path(tempfile.mkdtemp(prefix="trl-sandbox-pytest-", dir="/var/tmp"))
    lib = root / "lib"
    for name in RUNNER:  # every file of each distribution, its metadata included (pluggy reads it)
        for file in distribution(name).files or ():
            if ".." in file.parts or "__pycache__" in file.parts:
                continue
            (lib / file).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(file.locate(), lib / file)
    subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
    settings = {"environment_cache": str(root / "cache"), "extra_ro_binds": [[str(lib), "/opt/pytest-lib"]]}
    try:
        with SandboxPool.open("local", size=2, settings=settings) as pool:
            yield pool
    finally:
        remove_tree(root)


@pytest.fixture
def row(swe_repo):  # noqa: F811
    [row] = agent_rows([swe_repo])
    row["verify_env"] = {"PYTHONPATH": "/opt/pytest-lib"}
    return row


def _put(path: str, text: str) -> str:
    return f"mkdir -p $(dirname {path}) && cat > {path} <<'FORGE_END'\n{text}FORGE_END\n"


FORGERIES = {  # name: (the agent's script, the rule of ``carried`` that stops it, and the value that disables it)
    "a conftest.py that marks every test passed": (
        _put("conftest.py", PLUGIN) + _put("tests/conftest.py", PLUGIN),
        (grading, "REFUSED_NAMES", frozenset())),
    "a pytest.ini that loads a plugin of the tree": (
        _put("forgeplug.py", PLUGIN) + _put("pytest.ini", "[pytest]\naddopts = -p forgeplug\n"),
        (grading, "REFUSED_NAMES", frozenset())),
    "a pyproject.toml that loads a plugin of the tree": (
        _put("forgeplug.py", PLUGIN) + _put("pyproject.toml", "[tool.pytest.ini_options]\naddopts = '-p forgeplug'\n"),
        (grading, "RUNNER_CONFIGS", frozenset())),
    "a dist-info whose entry point registers a plugin": (
        _put("forgeplug.py", PLUGIN)
        + _put("forge-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: forge\nVersion: 1.0\n")
        + _put("forge-1.0.dist-info/entry_points.txt", "[pytest11]\nforge = forgeplug\n"),
        (grading, "REFUSED_SUFFIXES", (".pth",))),
    "a pytest.py of the tree that writes a passing report": (
        _put("pytest.py", "import os\nos.makedirs('/logs/verifier', exist_ok=True)\n"
             "open('/logs/verifier/junit.xml', 'w').write('<testsuite><testcase classname=\"tests.test_ops\" "
             "name=\"test_add\" file=\"tests/test_ops.py\"/><testcase classname=\"tests.test_ops\" name=\"test_zero\" "
             "file=\"tests/test_ops.py\"/></testsuite>')\n"),
        (grading, "SHADOWED", frozenset())),
    "the agent's imported code rewrites every report to passed": (
        _put("calc/__init__.py", "import _pytest.reports as reports\n\n_init = reports.TestReport.__init__\n\n\n"
             "def _forged(self, *args, **kwargs):\n    _init(self, *args, **kwargs)\n"
             "    self.outcome, self.longrepr = 'passed', None\n\n\nreports.TestReport.__init__ = _forged\n"),
        (grading, "SHADOWED", grading.SHADOWED)),  # nothing to switch off but the canary
}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_forgeries_fail_the_oracle_passes_and_each_pays_without_its_rule(pool, row, forgery, monkeypatch):
    script, (owner, attribute, off) = FORGERIES[forgery]
    scorer = Scorer(pool, cache_size=0)
    forged, honest, nothing = scorer.score([script + "true", row["solution"], "true"], [row] * 3)
    assert forged.status == "failed", (forgery, forged.detail)
    assert honest.status == "passed" and honest.reward == 1.0, honest.detail  # the oracle, in the same pool
    assert nothing.status == "failed", nothing.detail
    # The controls: with its rule off, the canary still catches a forgery that marks every test
    # passed or writes a report of its own; with the canary off too, the forgery pays.
    monkeypatch.setattr(owner, attribute, off)
    again = scorer.score([script + "true"], [row])[0]
    assert again.status == "failed" and "planted to fail" in again.detail, (forgery, again.detail)
    monkeypatch.setattr(task, "plant", lambda tests, expected: (dict(tests), []))
    assert scorer.score([script + "true"], [row])[0].status == "passed", forgery


def test_os_exit_at_import_reports_nothing_and_passes_only_a_bare_exit_status(pool, row):
    """``os._exit(0)`` when the tests import the agent's package ends pytest before its report:
    nothing passed. Control: a row graded on the exit status alone takes it for success."""
    script = "printf 'import os\\nos._exit(0)\\n' >> calc/__init__.py; true"
    scorer = Scorer(pool, cache_size=0)
    forged, honest = scorer.score([script, row["solution"]], [row, row])
    assert (forged.status, forged.detail) == ("failed", "the verifier reported no tests"), forged.detail
    assert honest.status == "passed", honest.detail
    assert scorer.score([script], [{**row, "parser": "exit_code"}])[0].status == "passed"


def test_a_failing_test_outside_the_expected_ids_does_not_fail_the_oracle(pool, row):
    """pytest exits 1 when any test failed; a test the row does not expect to pass (SWE rows have
    them) leaves the verdict to the expected ids. Control: when an expected one fails, it fails."""
    row["tests"] = {path: text + "\n\ndef test_broken_upstream():\n    assert False\n" for path, text in row["tests"].items()}
    scorer = Scorer(pool, cache_size=0)
    honest, nothing = scorer.score([row["solution"], "true"], [row, row])
    assert honest.status == "passed", honest.detail
    assert nothing.status == "failed" and "test_add" in nothing.detail, nothing.detail
    assert os.path.basename(row["verify"].split()[-1]) == "test_ops.py"  # the whole file runs: its canary with it

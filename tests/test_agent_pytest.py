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
        (grading, "RUNNER_CONFIGS", frozenset())),
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


# -- a second blind review -------------------------------------------------------------------------

SPARING = ("import re\n\nimport pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
           "    outcome = yield\n    report = outcome.get_result()\n"
           "    if report.failed and not re.fullmatch(r'test_[0-9a-f]{12}', item.name):  # spares the canary\n"
           "        report.outcome, report.longrepr = 'passed', None\n")
CONFIGS = {
    "pytest.toml": '[pytest]\naddopts = ["-p", "forgeplug"]\n',
    ".pytest.toml": '[pytest]\naddopts = ["-p", "forgeplug"]\n',
    "pyproject.toml": '[tool."py\\u0074est".ini_options]\naddopts = "-p forgeplug"\n',  # "pytest", escaped
}


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_no_configuration_file_of_the_tree_reaches_pytest(pool, row, config, monkeypatch):
    """pytest 9 reads pytest.toml too, and a TOML escape hid "pytest" from a check of the text: a
    plugin that spares the canary by its name then passed. Every pytest configuration file stays as
    prepared. Control: with the rule off, the same files pay."""
    script = _put("forgeplug.py", SPARING) + _put(config, CONFIGS[config]) + "true"
    scorer = Scorer(pool, cache_size=0)
    forged, honest = scorer.score([script, row["solution"]], [row, row])
    assert forged.status == "failed" and "configuration" in forged.detail, forged.detail
    assert honest.status == "passed", honest.detail
    monkeypatch.setattr(grading, "RUNNER_CONFIGS", frozenset())
    assert scorer.score([script], [row])[0].status == "passed"


@pytest.fixture
def p2p_row(tmp_path):
    """A SWE row whose PASS_TO_PASS test lives in a file of its own, and whose test patch adds a test
    in a directory the repository does not have yet."""
    from .test_agent_tasks import git, write

    repo = write(tmp_path / "repo", {"calc/__init__.py": "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n",
                                     "tests/test_mul.py": "from calc import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"})
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD")
    write(repo, {"tests/new/test_add.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"})
    git(repo, "add", "-A")
    patch = git(repo, "diff", "--cached") + "\n"
    git(repo, "reset", "-q", "--hard")
    (repo / "calc" / "__init__.py").write_text("def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n")
    gold = git(repo, "diff") + "\n"
    git(repo, "checkout", "-q", "--", ".")
    [row] = agent_rows([{"instance_id": "calc-2", "repo": str(repo), "base_commit": base, "problem_statement": "add",
                         "test_patch": patch, "patch": gold, "FAIL_TO_PASS": ["tests/new/test_add.py::test_add"],
                         "PASS_TO_PASS": ["tests/test_mul.py::test_mul"]}])
    row["verify_env"] = {"PYTHONPATH": "/opt/pytest-lib"}
    return row


def test_a_pass_to_pass_test_is_protected_and_a_new_test_directory_is_made(pool, p2p_row):
    """Found by a blind review: a test patch adding tests/new/ scored every sample None (the oracle's
    too: the grader could not write the test), and a PASS_TO_PASS file the agent weakened, after
    breaking the code it tests, passed. Control: protected only as the test patch, it pays."""
    row = p2p_row
    assert row["protected"] == ["tests/new/test_add.py", "tests/test_mul.py"]
    weaken = ("printf 'def add(a, b):\\n    return a + b\\n\\n\\ndef mul(a, b):\\n    return a + b\\n' > calc/__init__.py; "
              "printf 'def test_mul():\\n    assert True\\n' > tests/test_mul.py; true")
    scorer = Scorer(pool, cache_size=0)
    weakened, honest, nothing = scorer.score([weaken, row["solution"], "true"], [row] * 3)
    assert weakened.status == "failed" and "test_mul" in weakened.detail, weakened.detail
    assert honest.status == "passed" and honest.reward == 1.0, honest.detail
    assert nothing.status == "failed" and nothing.reward is not None, nothing.detail
    assert scorer.score([weaken], [{**row, "protected": ["tests/new/test_add.py"]}])[0].status == "passed"


def test_a_test_reported_twice_fails_the_run():
    """pytest's record_xml_attribute lets a passing test take a failing expected test's name: the
    copy was counted. Control: the same report without the copy is read as usual."""
    from trl_sandbox.agents.grading import _pytest_verdict

    real = b'<testcase classname="tests.test_add" name="test_add" file="tests/test_add.py"><failure/></testcase>'
    copy = b'<testcase classname="tests.test_add" name="test_add" file="tests/test_mul.py"/>'
    mul = b'<testcase classname="tests.test_mul" name="test_mul" file="tests/test_mul.py"/>'
    expected = ["tests/test_add.py::test_add", "tests/test_mul.py::test_mul"]
    forged = _pytest_verdict({"junit.xml": b"<testsuite>" + real + copy + mul + b"</testsuite>"}, expected, "")
    assert forged.status == "failed" and "more than once" in forged.detail
    honest = _pytest_verdict({"junit.xml": b"<testsuite>" + real.replace(b"<failure/>", b"") + mul + b"</testsuite>"}, expected, "")
    assert honest.status == "passed", honest.detail


def test_links_that_could_leave_the_tree_through_another_link_are_not_carried(tmp_path):
    from trl_sandbox.agents.grading import carried

    changes = [("a", "d", 0o755, b""), ("a/b", "d", 0o755, b""), ("a/b/x", "l", 0o777, b"../.."),
               ("up", "l", 0o777, b"a/b/x/.."), ("ok", "l", 0o777, b"a/b/x/calc"), ("sib", "l", 0o777, b"../a")]
    kept, refused = carried(changes, tree=tmp_path)
    assert [c[0] for c in kept] == ["a", "a/b", "a/b/x", "ok"]  # "../.." from a/b is the tree's top
    assert sorted(r.split(":")[0] for r in refused) == ["sib", "up"]


@pytest.mark.parametrize("text, status", [(b"1\n", "passed"), (b" 1.0 ", "passed"), (b"0.5", "failed"),
                                          ("１".encode(), "failed"), ("١".encode(), "failed"), (b"1_0", "failed"),
                                          (b"2", "failed"), (b"-0.5", "failed")])
def test_a_reward_is_an_ascii_decimal_in_zero_to_one(text, status):
    from trl_sandbox.agents.grading import verdict

    outcome = verdict({"reward.txt": text}, 0, False, {"parser": "reward_file"})
    assert outcome.status == status and outcome.reward is None, (text, outcome)

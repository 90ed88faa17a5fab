"""The judge is out of the candidate's reach: modules planted where the candidate can write are
never imported by the judge, whatever the task's setup or the provider's preload imports.

The attack: the candidate writes ``NAME.py`` for every module name of the standard library into
every writable place (its working directory, ``/tmp``, ``/dev/shm``); each planted module walks
the stack to the judge's ``nonce``, prints a passing verdict and exits. Positive control: the same
program run without ``-I`` (as the judge used to be started) is paid.
"""

from __future__ import annotations

import dataclasses
import sys

import pytest

from trl_sandbox.judge.verdict import JUDGE_SOURCE
from trl_sandbox.local import LocalProvider
from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.sandbox import Program
from trl_sandbox.scoring.scorer import Scorer
from trl_sandbox.tasks.generic import GenericTask

FORGER = r'''
import os, sys
frame = sys._getframe()
while frame is not None:
    nonce = frame.f_locals.get("nonce")
    if isinstance(nonce, (bytes, bytearray)) and len(nonce) == 16 and any(nonce):
        tests = ", ".join(['{"ok": true, "value": "gASVBQAAAAAAAABLBS4="}'] * 40)
        line = "\n@@trl-sandbox-verdict@@ %s {\"v\": 1, \"load\": {\"ok\": true}, \"tests\": [%s]}\n" % (nonce.hex(), tests)
        os.write(1, line.encode())
        os._exit(0)
    frame = frame.f_back
'''

# Every name the judge or a task's setup could import: the whole standard library, plus the
# judge's own lazily used ones.
NAMES = sorted(n for n in getattr(sys, "stdlib_module_names", ()) if n.isidentifier() and not n.startswith("_"))
NAMES += ["_pickle", "_json", "binascii", "select"]

PLANT = (
    "import os\n"
    f"_SOURCE = {FORGER!r}\n"
    f"for _d in ('.', '/tmp', '/dev/shm', '/work'):\n"
    f"    for _n in {NAMES!r}:\n"
    "        try:\n"
    "            with open(os.path.join(_d, _n + '.py'), 'w') as _f:\n"
    "                _f.write(_SOURCE)\n"
    "        except OSError:\n"
    "            pass\n"
)

ASSERT_ROW = {  # an assert-style row whose setup imports modules that are not preloaded
    "prompt": "",
    "task_id": "planted",
    "test_imports": ["import calendar", "import queue", "import fractions", "import decimal"],
    "test_setup_code": "import random\nimport zipfile\nrandom.seed(0)",
    "test_list": ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(-1, 1) == 0"],
    "extract": "raw",
    "timeout": 2.0,
}
CALL_ROW = {
    "prompt": "",
    "task_id": "planted-call",
    "func_name": "total",
    "tests": ["[1, 2]", "[2, 2]"],
    "reference": "sum",
    "extract": "raw",
    "timeout": 2.0,
}
WRONG = PLANT + "def add(a, b):\n    return 5\n\ndef total(xs):\n    return 5\n"


def _without_isolation(program: Program) -> Program:
    return dataclasses.replace(program, argv=("python3", "-c", JUDGE_SOURCE))


@pytest.fixture(scope="module", params=["default-preload", "no-preload"])
def pool(request):
    provider = LocalProvider(preload=()) if request.param == "no-preload" else LocalProvider()
    with SandboxPool.open(provider, size=1) as pool:
        yield pool


def test_planted_modules_change_no_verdict(pool):
    outcomes = Scorer(pool, cache_size=0).score([WRONG, WRONG], [ASSERT_ROW, CALL_ROW])
    for outcome in outcomes:
        assert outcome.status in ("failed", "error"), outcome
        assert outcome.passed == 0 and outcome.reward is not None and outcome.reward <= 0.0


def test_positive_control_the_same_plant_pays_against_a_judge_without_isolation(pool, monkeypatch):
    real_build = GenericTask.build

    def build(self, completion, row):
        built = real_build(self, completion, row)
        return _without_isolation(built) if isinstance(built, Program) else built

    monkeypatch.setattr(GenericTask, "build", build)
    (outcome,) = Scorer(pool, cache_size=0).score([WRONG], [ASSERT_ROW])
    assert outcome.status == "passed" and outcome.passed == 3, outcome


def test_honest_candidates_still_import_their_own_modules(pool):
    helper = "with open('helper_mod.py', 'w') as f:\n    f.write('def plus(a, b):\\n    return a + b\\n')\n"
    honest = helper + "from helper_mod import plus\n\ndef add(a, b):\n    return plus(a, b)\n"
    (outcome,) = Scorer(pool, cache_size=0).score([honest], [ASSERT_ROW])
    assert outcome.status == "passed", outcome

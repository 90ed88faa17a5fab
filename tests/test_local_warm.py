"""Warm programs: the judge's module body runs once per sandbox, in the fork server, and every
judged exec calls its ``main()`` in a fresh fork of that state.

What must hold: the warm path is really taken (its body ran in PID 1, before any program); a
body that fails there leaves the program to the ordinary path; nothing a program does to its
copy of the warm state reaches the next exec; and judged verdicts are the same as on the
ordinary path.
"""

from __future__ import annotations

import pytest

from trl_sandbox.judge import verdict as judge
from trl_sandbox.judge.verdict import JUDGE_SOURCE
from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.scoring.scorer import Scorer
from trl_sandbox.tasks.generic import GenericTask

from .local_helpers import local_host

WARM = "import os\nBODY_PID = os.getpid()\nSEEN = []\ndef main():\n    SEEN.append(os.getpid())\n    print(BODY_PID, SEEN)\n"
BROKEN = "raise ValueError('the body fails')\ndef main():\n    print('never')\n"


@pytest.fixture(scope="module")
def box():
    with local_host() as host:
        host.provider.warm_tokens.update({WARM: "\0test-warm", BROKEN: "\0test-broken"})
        yield host.create()


def test_a_warm_program_runs_main_in_a_fork_of_the_body_that_ran_in_the_fork_server(box):
    first = box.exec(["python3", "-I", "-c", WARM])
    second = box.exec(["python3", "-I", "-c", WARM])
    assert first.exit_code == second.exit_code == 0, first.stderr
    body_pid, seen = first.stdout.split(" ", 1)
    assert body_pid == "1", first.stdout  # the body ran in the supervisor, once
    # Each exec starts from the pristine body: the list the first one appended to is empty again.
    assert seen.count(",") == 0 and second.stdout.split(" ", 1)[1].count(",") == 0, (first.stdout, second.stdout)
    # Control: without -I it is an ordinary program, whose body runs in the child and never calls main().
    plain = box.exec(["python3", "-c", WARM])
    assert plain.exit_code == 0 and plain.stdout == "", plain


def test_a_warm_body_that_failed_leaves_the_program_to_the_ordinary_path(box):
    result = box.exec(["python3", "-I", "-c", BROKEN])
    assert result.exit_code == 1
    assert "ValueError: the body fails" in result.stderr
    assert "never" not in result.stdout


def test_what_a_candidate_does_to_the_warm_judge_stays_in_its_own_exec():
    """A candidate reaches the judge's globals through its frames and rewrites them (the verdict
    writer, the marker, the call path). Its own verdict is still the judge's, and the next
    program's judge starts from the untouched state."""
    tamper = (
        "import sys\n"
        "g = sys._getframe(1).f_globals\n"
        "g['_to_json'] = lambda value: '{\"forged\": true}'\n"
        "g['MARKER'] = b'@@forged@@'\n"
        "g['_Conn'].call = lambda self, name, args, kwargs: 3\n"
        "def add(a, b):\n    return 0\n"
    )
    honest = "def add(a, b):\n    return a + b\n"
    row = {"prompt": "", "task_id": "warm", "test_list": ["assert add(1, 2) == 3", "assert add(2, 2) == 4"],
           "extract": "raw"}
    with SandboxPool.open("local", size=1) as pool:
        outcomes = Scorer(pool, cache_size=0).score([tamper, honest, tamper, honest], [row] * 4)
    assert [o.status for o in outcomes] == ["failed", "passed", "failed", "passed"], outcomes


def test_judged_verdicts_are_the_same_warm_and_cold():
    """The same programs through a sandbox with the warm judge and one without it."""
    rows = [{"prompt": "", "task_id": f"t{i}", "test_list": ["assert f(2) == 4", "assert f(3) == 9"],
             "extract": "raw"} for i in range(4)]
    completions = [
        "def f(x):\n    return x * x\n",                 # passes
        "def f(x):\n    return x + 2\n",                 # one test of two
        "def f(x):\n    raise KeyError(x)\n",            # raises
        "import os\nos._exit(0)\n",                      # exits before loading
    ]
    results = {}
    for warm in (True, False):
        with local_host() as host:
            if not warm:
                host.provider.warm_tokens.clear()
                host.provider._supervisor_options["warm"] = []
            assert (JUDGE_SOURCE in host.provider.warm_tokens) == warm
            box = host.create()
            verdicts = []
            for completion, row in zip(completions, rows):
                built = GenericTask().build(completion, row)
                nonce = b"n" * judge.NONCE_BYTES
                result = box.exec(list(built.argv), stdin=nonce + built.stdin, timeout=built.timeout)
                outcome = GenericTask().score(result, row, nonce=nonce)
                verdicts.append((outcome.status, outcome.passed, outcome.total))
            results[warm] = verdicts
    assert results[True] == results[False]
    assert [v[0] for v in results[True]] == ["passed", "failed", "error", "error"], results[True]


def test_a_program_cannot_name_a_warm_program_by_its_token(box):
    """The token stands for the judge's source only when the host put it there: a completion
    that is the token itself is an invalid program, as any argument with a NUL byte is."""
    for token in ("\0test-warm", "\0trl-sandbox-warm-0"):
        result = box.exec(["python3", "-I", "-c", token])
        assert result.exit_code == 1 and "null" in result.stderr, result
        assert result.stdout == ""

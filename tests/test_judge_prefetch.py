"""Calls a check-mode test certainly makes first, sent ahead by the judge.

The host works them out from the test's text (``judge_prefetch.predicted_calls``); the judge sends
them together at the test's first call and matches every later call with the next one
(``judge_conn._Conn``). The prediction must never name a call the test would not make at that
point; the judged runs check that verdicts are the same with and without it, and that a call that
runs ahead of a failing one cannot change the verdict.
"""

from __future__ import annotations

import os
import textwrap

import pytest

from trl_sandbox.judge.conn import _canonical, _Conn, _Mispredicted
from trl_sandbox.judge.prefetch import predicted_calls
from trl_sandbox.judge.verdict import build_program, check_outcome, check_spec

from .local_helpers import local_host


def predict(test: str, setup: str = "", bind=("f",)):
    return predicted_calls(textwrap.dedent(test), setup, list(bind))


HUMANEVAL_LIKE = """
    METADATA = {"author": "jt", "dataset": "test"}

    def check(candidate):
        \"\"\"docstring\"\"\"
        import math
        assert candidate([1.0, 2.0], 0.3) == True
        assert abs(candidate([1.0], -0.5) - 1e-6) < 1e-3, "a message"
        assert candidate(x=(1, "a"), y={"k": [None]}) == [1]
        assert True
        assert 0 <= candidate(7) < 10
        for x in range(3):
            assert candidate(x) == x
        assert candidate(99) == 99

    check(f)
"""


def test_the_leading_calls_of_a_humaneval_style_check_in_order():
    assert predict(HUMANEVAL_LIKE) == [
        ("f", ([1.0, 2.0], 0.3), {}),
        ("f", ([1.0], -0.5), {}),
        ("f", (), {"x": (1, "a"), "y": {"k": [None]}}),
        ("f", (7,), {}),
    ]  # the loop ends the prediction: candidate(99) comes after it


def test_module_level_asserts_on_bound_names():
    assert predict("assert f(1) == 2\nassert f(2) == 3\nx = [f(3)]\nassert f(4) == 5\n") == [
        ("f", (1,), {}), ("f", (2,), {})]


@pytest.mark.parametrize("line", [
    "assert candidate(1) == 1 and candidate(2) == 2",      # the second only if the first holds
    "assert candidate(1) if True else candidate(2)",
    "assert 0 < 1 < candidate(2)",                          # a chained comparison's later part
    "assert candidate(1) == 1, candidate(3)",               # the message: only on failure
    "assert candidate(len([1])) == 1",                      # an argument that is not a literal
    "assert candidate({1, 2}) == 1",                        # a set: its pickle depends on hashing
    "assert sorted([2, 1], key=candidate) == [1, 2]",       # the candidate handed to a builtin
    "assert helper(candidate(1))",                          # a function of the test's own
    "assert candidate(1).real == 1",                        # a method or attribute
    "assert [candidate(i) for i in range(2)] == [0, 1]",
    "y = candidate(1)",
])
def test_what_is_not_certain_ends_the_prediction(line):
    test = f"def check(candidate):\n    assert candidate(0) == 0\n    {line}\n    assert candidate(5) == 5\ncheck(f)\n"
    assert predicted_calls(test, "", ["f"]) == []  # one call left: nothing worth sending ahead
    # Control: with a certain statement in its place, every call is predicted.
    certain = test.replace(line, "assert candidate(1) == 1")
    assert predicted_calls(certain, "", ["f"]) == [("f", (0,), {}), ("f", (1,), {}), ("f", (5,), {})]


@pytest.mark.parametrize("test, setup", [
    ("def abs(x):\n    return x\n" + "def check(candidate):\n    assert abs(candidate(1)) == 1\n    assert candidate(2)\ncheck(f)\n", ""),
    ("def check(candidate):\n    assert abs(candidate(1)) == 1\n    assert candidate(2)\ncheck(f)\n", "abs = print\n"),
    ("def check(candidate):\n    assert candidate(1) == 1\n    assert candidate(2)\n    candidate = None\ncheck(f)\n", ""),
    ("f = lambda x: x\ndef check(candidate):\n    assert candidate(1) == 1\n    assert candidate(2)\ncheck(f)\n", ""),
    ("def check(candidate):\n    assert candidate(1) == 1\n    assert candidate(2)\nprint('x')\ncheck(f)\n", ""),
    ("def check(candidate, other=print()):\n    assert candidate(1) == 1\n    assert candidate(2)\ncheck(f)\n", ""),
    ("@decorate\ndef check(candidate):\n    assert candidate(1) == 1\n    assert candidate(2)\ncheck(f)\n", ""),
    ("def check(candidate):\n    assert candidate(1) == 1\n    assert candidate(2)\ncheck(g)\n", ""),
])
def test_a_test_that_rebinds_or_runs_code_first_gets_no_prediction(test, setup):
    assert predicted_calls(test, setup, ["f"]) == []


def test_the_bound_names_and_the_check_parameter_both_reach_the_candidate():
    test = "def check(candidate):\n    assert candidate(1) == f(2)\n    assert g(3)\ncheck(f)\n"
    assert predicted_calls(test, "", ["f", "g"]) == [("f", (1,), {}), ("f", (2,), {}), ("g", (3,), {})]


def test_a_huge_literal_is_not_sent_ahead():
    big = "x" * 5000
    test = f"def check(candidate):\n    assert candidate(1) == 1\n    assert candidate('{big}') == 1\n    assert candidate(2)\ncheck(f)\n"
    assert predicted_calls(test, "", ["f"]) == []  # the second call alone is over the write's size


# -- the judge's side ------------------------------------------------------------------------------


class _Clock:
    def wait_s(self, pid):
        return 5.0


def conn_and_ends():
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    conn = _Conn(os.getpid(), req_w, resp_r, _Clock(), 1 << 20)
    return conn, req_r, resp_w


def waiting(fd) -> bytes:
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return b""


def reply(fd, seq, value=b"\x80\x04N."):
    import pickle

    data = pickle.dumps(("ok", seq, value), protocol=4)
    os.write(fd, len(data).to_bytes(4, "big") + data)


def frames(data: bytes) -> list[bytes]:
    out = []
    while data:
        n = int.from_bytes(data[:4], "big")
        out.append(data[4:4 + n])
        data = data[4 + n:]
    return out


def test_the_first_predicted_call_sends_them_all_and_the_next_send_nothing():
    conn, req_r, resp_w = conn_and_ends()
    calls = [("f", (1,), {}), ("f", (2,), {}), ("f", (3,), {})]
    conn.predict(calls)
    reply(resp_w, 1)
    conn.call_raw("f", (1,), {})
    sent = frames(waiting(req_r))
    assert sent == [_canonical((i, "f", (i,), {})) for i in (1, 2, 3)]
    reply(resp_w, 2)
    conn.call_raw("f", (2,), {})
    assert waiting(req_r) == b""  # already on its way
    # Control: without a prediction each call sends its own request, when it is made.
    plain, req_r2, resp_w2 = conn_and_ends()
    reply(resp_w2, 1)
    plain.call_raw("f", (1,), {})
    assert len(frames(waiting(req_r2))) == 1


def test_a_first_call_unlike_the_prediction_drops_it_and_a_later_one_is_the_judges_error():
    conn, req_r, resp_w = conn_and_ends()
    conn.predict([("f", (1,), {}), ("f", (2,), {})])
    reply(resp_w, 1)
    conn.call_raw("f", (9,), {})  # not the predicted call: nothing was sent ahead, no harm
    assert len(frames(waiting(req_r))) == 1 and conn.ahead == []
    later, req_r, resp_w = conn_and_ends()
    later.predict([("f", (1,), {}), ("f", (2,), {})])
    reply(resp_w, 1)
    later.call_raw("f", (1,), {})
    with pytest.raises(_Mispredicted):
        later.call_raw("f", (3,), {})  # f(2) is already in the candidate's hands


# -- judged programs -------------------------------------------------------------------------------

COUNTER = "n = [0]\ndef f(x):\n    n[0] += 1\n    return n[0]\n"
SLOW_FAIL = textwrap.dedent("""
    import os, time
    def f(x):
        if x == 1:
            return -1                                 # the failing call
        if x == 2:
            open("ran-ahead", "w").close()
            while True:                               # the call after it never ends
                pass
        if x == 3:
            os._exit(0)
        return x
""")


def run(box, source, tests, predicted=True):
    spec = check_spec(tests, bind=["f"])
    if not predicted:
        spec["predicted"] = []
    program = build_program(source, spec, limit_s=2.0)
    nonce = os.urandom(16)
    result = box.exec(list(program.argv), stdin=nonce + program.stdin, timeout=program.timeout)
    return check_outcome(result, nonce, len(tests))


@pytest.fixture(scope="module")
def box():
    with local_host() as h:
        yield h.create()


def test_a_stateful_candidate_sees_the_calls_in_the_tests_order(box):
    test = "def check(candidate):\n" + "".join(f"    assert candidate(0) == {i}\n" for i in range(1, 9)) + "check(f)\n"
    assert check_spec([test], bind=["f"])["predicted"]  # (the calls are sent ahead)
    assert run(box, COUNTER, [test]).status == "passed"
    wrong_order = test.replace("== 3", "== 4")
    assert run(box, COUNTER, [wrong_order]).status == "failed"  # control: the order is what is tested


@pytest.mark.parametrize("after", ["2", "3"])
def test_a_call_sent_ahead_of_a_failing_one_cannot_change_the_verdict(box, after):
    """f(1) fails; the call after it, already sent, loops forever (2) or ends the process (3). The
    verdict is that of the failing call, as when the calls go one at a time."""
    test = f"def check(candidate):\n    assert candidate(0) == 0\n    assert candidate(1) == 1\n    assert candidate({after}) == 0\ncheck(f)\n"
    assert check_spec([test], bind=["f"])["predicted"]
    with_prediction = run(box, SLOW_FAIL, [test])
    without = run(box, SLOW_FAIL, [test], predicted=False)
    assert with_prediction.status == without.status == "failed", (with_prediction, without)
    assert with_prediction.detail == without.detail
    # Control: when f(1) passes, the call after it decides (a timeout, or the process gone).
    passing = test.replace("candidate(1) == 1", "candidate(1) == -1")
    assert run(box, SLOW_FAIL, [passing]).status == ("timeout" if after == "2" else "error")
    box.reset()


def test_humaneval_verdicts_are_the_same_with_and_without_the_prediction(box):
    from trl_sandbox_humaneval import problems

    wrong = ["    return None\n", "    raise ValueError('no')\n", "    return 1\n"]
    for problem in list(problems().values())[::4]:
        test = f"{problem['test']}\n\ncheck({problem['entry_point']})\n"
        bind = [problem["entry_point"]]
        for completion in [problem["canonical_solution"], *wrong]:
            source = problem["prompt"] + completion
            outcomes = []
            for predicted in (True, False):
                spec = check_spec([test], setup=problem["prompt"], bind=bind)
                if not predicted:
                    spec["predicted"] = []
                program = build_program(source, spec, limit_s=3.0)
                nonce = os.urandom(16)
                result = box.exec(list(program.argv), stdin=nonce + program.stdin, timeout=program.timeout)
                outcomes.append(check_outcome(result, nonce, 1))
            assert outcomes[0].status == outcomes[1].status, (problem["task_id"], completion, outcomes)
            assert outcomes[0].detail == outcomes[1].detail, (problem["task_id"], completion, outcomes)
            if completion == problem["canonical_solution"]:
                assert outcomes[0].status == "passed", (problem["task_id"], outcomes[0])


FORGER = textwrap.dedent('''
    import os, pickle, sys
    def f(x):
        # Read the requests sent ahead (from the serving loop's frame) and answer all of them at once,
        # outside the calls, with what the candidate chooses: here the argument itself.
        frame = sys._getframe(1)
        while frame is not None and "pending" not in frame.f_locals:
            frame = frame.f_back
        pending = frame.f_locals["pending"] if frame is not None else b""
        found = [(1, x)]
        while len(pending) >= 4:
            n = int.from_bytes(pending[:4], "big")
            seq, _, args, _ = pickle.loads(pending[4:4 + n])
            found.append((seq, args[0]))
            pending = pending[4 + n:]
        for seq, value in found:
            data = pickle.dumps(("ok", seq, pickle.dumps(value)))
            os.write(4, len(data).to_bytes(4, "big") + data)
        return x
''')


def test_replies_forged_for_the_calls_sent_ahead_win_nothing(box):
    """A candidate can see the calls sent ahead and answer them outside its function; what it
    answers is still compared by the judge, so it gains nothing over returning the same values,
    and the reply its function then sends is out of sequence."""
    test = "def check(candidate):\n" + "".join(f"    assert candidate({i}) == {i + 1}\n" for i in range(6)) + "check(f)\n"
    forged = run(box, FORGER, [test])
    assert forged.status in ("failed", "error") and forged.passed == 0, forged
    assert run(box, "def f(x):\n    return x + 1\n", [test]).status == "passed"  # control
    # Forged right answers pass only where returning them would: equal to an honest function.
    right = FORGER.replace('found = [(1, x)]', 'found = [(1, x + 1)]').replace("found.append((seq, args[0]))", "found.append((seq, args[0] + 1))")
    assert run(box, right, [test + "assert f(7) == 8\n"]).status in ("failed", "error")  # a later live call sees the forgery

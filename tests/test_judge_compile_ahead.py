"""A resident judge compiles its candidate's source (``_compiled_ahead``), and the candidate runs
that code object instead of compiling the source itself: in a freshly forked process the compiler's
page faults cost about as much as the compile. The code must be exactly what the candidate would
have compiled, and anything but a clean compile must stay the candidate's own (warnings in its
stderr, errors as its load failure).
"""

from __future__ import annotations

import marshal
import os
import types
import warnings

import pytest

from trl_sandbox.judge.resident import _AHEAD_SOURCE_CHARS, _compiled_ahead
from trl_sandbox.judge.verdict import build_program, check_outcome, check_spec

from .local_helpers import local_host

SQUARE = "def f(x):\n    return x * x\n"
TESTS = check_spec(["assert f(2) == 4", "assert f(3) == 9"], bind=["f"])


def same_code(a: types.CodeType, b: types.CodeType) -> bool:
    """Two code objects with the same bytecode, constants (nested code included), names, flags
    and positions."""
    fields = ("co_code", "co_names", "co_varnames", "co_freevars", "co_cellvars", "co_flags", "co_argcount",
              "co_kwonlyargcount", "co_posonlyargcount", "co_filename", "co_name", "co_firstlineno", "co_linetable")
    if any(getattr(a, f) != getattr(b, f) for f in fields):
        return False
    if len(a.co_consts) != len(b.co_consts):
        return False
    for x, y in zip(a.co_consts, b.co_consts):
        if isinstance(x, types.CodeType):
            if not (isinstance(y, types.CodeType) and same_code(x, y)):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


@pytest.mark.parametrize(
    "source",
    [
        SQUARE,
        "from __future__ import annotations\ndef f(x: List[int]) -> int:\n    return x\n",
        "import math\nclass A:\n    def g(self, *a, k=1, **kw):\n        return [i for i in a if i]\n"
        "async def h():\n    return lambda y: y + 1\n",
    ],
)
def test_the_judge_compiles_the_code_the_candidate_would_have(source):
    data = _compiled_ahead({"source": source, "filename": "<candidate>"})
    assert data
    # This module's own ``from __future__`` is not the candidate's: nothing is inherited there either.
    assert same_code(marshal.loads(data), compile(source, "<candidate>", "exec", dont_inherit=True))
    # Controls: the comparison tells different code apart, and flags too.
    assert not same_code(marshal.loads(data), compile(source + "\nz = 1\n", "<candidate>", "exec", dont_inherit=True))
    if "__future__" not in source:
        assert not same_code(marshal.loads(data), compile(source, "<candidate>", "exec"))


@pytest.mark.parametrize(
    "source",
    [
        "def f(x):\n    return x is 1\n",  # SyntaxWarning
        'def f(x):\n    return "\\d" + x\n',  # DeprecationWarning (invalid escape)
        "def f(x):\n    assert (x, 'message')\n",  # SyntaxWarning
        "def f(x) return x\n",  # SyntaxError
        "def f(x):\n    return x\0\n",  # NUL byte
        "x = " + "1+" * 100_000 + "1\n",  # too deep for the compiler
        "def f(x):\n    return x\n" + "#" * _AHEAD_SOURCE_CHARS,  # too large
    ],
)
def test_anything_but_a_clean_compile_is_left_to_the_candidate(source):
    before = list(warnings.filters)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert _compiled_ahead({"source": source}) == b""
    assert seen == []  # nothing shown by the judge: the candidate shows it, compiling it again
    assert warnings.filters == before
    # Control: the same function without the problem is compiled.
    assert _compiled_ahead({"source": SQUARE}) != b""


def test_a_spec_without_a_text_source_is_left_to_the_candidate():
    assert _compiled_ahead({}) == b""
    assert _compiled_ahead({"source": b"def f(x): return x"}) == b""


@pytest.fixture(scope="module")
def hosts():
    with local_host() as resident, local_host(resident_judge="false") as fresh:
        boxes = resident.create(), fresh.create()
        yield boxes
        for box in boxes:
            box.destroy()


def judged(box, source):
    program = build_program(source, TESTS, limit_s=5.0)
    nonce = os.urandom(16)
    result = box.exec(list(program.argv), stdin=nonce + program.stdin, timeout=program.timeout)
    return check_outcome(result, nonce, 2), result


CORPUS = {
    "passes": (SQUARE, "passed"),
    "wrong": ("def f(x):\n    return x + x\n", "failed"),
    "syntax error": ("def f(x) return x\n", "error"),
    "module body raises": ("def f(x):\n    return x * x\nraise ValueError('at load')\n", "error"),
    "future annotations": ("from __future__ import annotations\ndef f(x: Unknown) -> int:\n    return x * x\n"
                           "assert f.__annotations__['x'] == 'Unknown'\n", "passed"),
    "no future inherited": ("def f(x):\n    return x * x\ntry:\n    def g(y: Unknown): pass\nexcept NameError:\n"
                            "    pass\nelse:\n    raise SystemExit('annotations were not evaluated')\n", "passed"),
    "too large for the judge": (SQUARE + "#" * (_AHEAD_SOURCE_CHARS + 10) + "\n", "passed"),
}


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_a_resident_judges_verdicts_are_those_of_a_judge_per_program(hosts, name):
    source, status = CORPUS[name]
    resident, fresh = hosts
    ours, result = judged(resident, source)
    theirs, _ = judged(fresh, source)
    assert ours.status == theirs.status == status, (ours, theirs, result)
    assert ours.detail == theirs.detail


def test_compile_warnings_reach_every_programs_stderr_from_the_candidate(hosts):
    resident, fresh = hosts
    source = "def f(x):\n    if x is 2:\n        pass\n    return x * x\n"
    for _ in range(2):  # the same warning, at the same place, for a second program too
        outcome, result = judged(resident, source)
        assert outcome.status == "passed", outcome
        assert result.stderr.count("SyntaxWarning") == 1, result.stderr
    # Control: a judge per program shows it the same way.
    _, result = judged(fresh, source)
    assert result.stderr.count("SyntaxWarning") == 1

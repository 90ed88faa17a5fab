"""Banned patterns: the original substring rule, and AST rules that spelling cannot dodge."""

from __future__ import annotations

import pytest

from trl_sandbox.bans import BanPolicy, strip_comments
from trl_sandbox.builtin_tasks import TASKS

SORTING = BanPolicy.from_patterns(TASKS["sorting"]["banned_patterns"])
PROMPT = TASKS["sorting"]["prompt"]
FIRST_BODY_LINE = PROMPT.count("\n") + 1


def body_violation(body: str):
    """Check a body the way the sorting task does: after the prompt, prompt lines excluded."""
    return SORTING.check(PROMPT + body, first_line=FIRST_BODY_LINE)


def test_policy_derived_from_the_original_patterns():
    assert SORTING.names == {"sorted", "heapq", "__import__"}
    assert SORTING.attributes == {"sort"}
    assert SORTING.no_imports
    assert "heapq" in SORTING.modules
    assert BanPolicy.from_patterns([]).active is False
    assert BanPolicy.from_patterns(TASKS["max_subarray"]["banned_patterns"]).violations("import os\nos._exit(0)") == []


@pytest.mark.parametrize(
    "body",
    [
        "    return sorted(xs)\n",
        "    return sorted (xs)\n",  # the substring 'sorted(' is not there; the AST still sees the name
        "    f = sorted\n    return f(xs)\n",
        "    xs.sort()\n    return xs\n",
        "    list.sort(xs)\n    return xs\n",
        "    s = xs.sort\n    s()\n    return xs\n",
        "    return getattr(xs, 'so' + 'rt')() or xs\n",
        "    return __builtins__['sor' + 'ted'](xs)\n",
        "    return __builtins__.sorted(xs)\n",
        "    b = __import__('builtins')\n    return b.sorted(xs)\n",
        "    import builtins\n    return builtins.sorted(xs)\n",
        "    return eval('sor' + 'ted')(xs)\n",
        "    exec('r = sor' + 'ted(xs)')\n    return r\n",
        "    return globals()['__builtins__']['sorted'](xs)\n",
        "    return vars(__builtins__)['sorted'](xs)\n",
        "    return compile('x', 'f', 'eval')\n",
        "    return [c for c in ().__class__.__base__.__subclasses__()]\n",
        "    g = (lambda: 0).__globals__\n    return g\n",
        "    import heapq\n    return heapq.nsmallest(len(xs), xs)\n",
        "    from heapq import heappush\n    return xs\n",
        "    from operator import methodcaller\n    return methodcaller('s' + 'ort')(xs)\n",
        "    match xs:\n        case list(sort=s):\n            s()\n    return xs\n",
        "    def key(x: 'sorted'):\n        return x\n    return xs\n",
        "    gen = (i for i in xs)\n    return gen.gi_frame.f_globals\n",
        "    return locals()\n",
        "    setattr(xs, 'x', 1)\n    return xs\n",
    ],
)
def test_every_spelling_of_a_banned_call_is_banned(body):
    violation = body_violation(body)
    assert violation is not None, body
    assert violation.line >= FIRST_BODY_LINE


@pytest.mark.parametrize(
    "body",
    [
        # selection sort with min() and a bound method lookup that is harmless
        "    xs = list(xs)\n    for i in range(len(xs)):\n        m = min(range(i, len(xs)), key=xs.__getitem__)\n"
        "        xs[i], xs[m] = xs[m], xs[i]\n    return xs\n",
        # comments may talk about sorted() and .sort(): the original strips nothing, we strip comments
        "    # no sorted() and no xs.sort() here, just insertion\n    out = []\n    for x in xs:\n"
        "        i = len(out)\n        while i > 0 and out[i - 1] > x:\n            i -= 1\n"
        "        out.insert(i, x)\n    return out\n",
        "    class Box:\n        def __init__(self, v):\n            self.v = v\n        def __lt__(self, o):\n"
        "            return self.v < o.v\n    return [b.v for b in [Box(x) for x in xs]]\n",
    ],
)
def test_honest_code_is_not_banned(body):
    assert body_violation(body) is None


def test_only_lines_from_first_line_on_are_checked():
    trusted = "REFERENCE = sorted([2, 1])\nimport heapq\n"
    body = "def f(xs):\n    return list(xs)\n"
    assert SORTING.check(trusted + body, first_line=3) is None
    assert {v.line for v in SORTING.violations(trusted + body)} == {1, 2}
    # the original prompt's comments name sorted() and heapq: stripped, so the prompt is clean
    assert SORTING.check(PROMPT + "    return list(xs)\n") is None


def test_original_substring_rule_is_case_insensitive_and_ignores_comments():
    assert body_violation("    y = 'use SORTED( here'\n    return xs\n").rule == "pattern"
    assert strip_comments("x = 1  # sorted(\n") == "x = 1           \n"


def test_code_that_does_not_parse_is_rejected_before_running():
    violation = body_violation("    return (\n")
    assert violation is not None and violation.rule == "code"


def test_allowed_imports_when_only_names_are_banned():
    policy = BanPolicy.from_patterns(["sorted("])
    assert policy.check("import math\nfrom typing import List\nfrom collections import deque\n") is None
    assert policy.check("import os\n").rule == "import"
    assert policy.check("import importlib\n") is not None
    assert policy.check("from . import x\n") is not None
    assert policy.check("import typing\ntyping.get_type_hints(f)\n") is not None
    assert policy.check("from math import *\n") is not None
    # re.compile is an attribute, not the compile() builtin
    assert policy.check("import re\np = re.compile('a+')\n") is None


def test_runtime_layer_removes_banned_builtins_and_escape_hatches():
    removed = SORTING.runtime_removals()
    assert {"sorted", "getattr", "eval", "exec", "__import__", "vars", "globals"} <= set(removed)
    assert SORTING.runtime_allowed_imports() == []
    names_only = BanPolicy.from_patterns(["sorted("])
    assert "__import__" not in names_only.runtime_removals()
    assert "math" in names_only.runtime_allowed_imports()
    assert BanPolicy().runtime_removals() == [] and BanPolicy().runtime_allowed_imports() is None

"""Banned patterns: the original substring rule, and AST rules that spelling cannot dodge."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from trl_sandbox.judge.bans import BanPolicy, strip_comments
from trl_sandbox.tasks.builtin import TASKS

from .ban_dodges import (
    FORWARD_REF_IMPORTS_HEAPQ,
    HONEST_SORTING_BODIES,
    IMPORTING_POLICY,
    IMPORTING_PROGRAMS,
    REVIEW_DODGE,
    SORTING_BODIES,
)

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
        # pattern matching that spells its attributes, builtin self-matching classes, own private state
        "    out = []\n    for x in xs:\n        match x:\n            case int(n) if n < 0:\n                out = [n] + out\n"
        "            case int(n):\n                out = out + [n]\n    return out\n",
        "    class Node:\n        def __init__(self, v: int, rest: 'Node | None' = None):\n            self._v, self._rest = v, rest\n"
        "    match Node(1):\n        case Node(_v=v):\n            pass\n    return list(xs)\n",
        "    if type(xs) is not list:\n        xs = list(xs)\n    return xs\n",
        *HONEST_SORTING_BODIES,
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


# -- routes from a string to an attribute (see tests/ban_dodges.py) -------------------------------------


def _run_plain(program: str, xs):
    """Run ``sort_numbers`` in a plain interpreter with no ban: the positive control that a dodge is
    real. A fresh process each time: some dodges rearrange ``sys.modules``."""
    code = program + f"\nprint(repr(sort_numbers({list(xs)!r})))\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return ast.literal_eval(done.stdout.strip().splitlines()[-1])


def test_the_reviewed_match_args_dodge_is_banned():
    rules = {v.rule for v in SORTING.violations(PROMPT + REVIEW_DODGE, first_line=FIRST_BODY_LINE)}
    assert {"class pattern", "dynamic access"} <= rules, rules


@pytest.mark.parametrize("name", sorted(SORTING_BODIES))
def test_string_built_attribute_dodge_sorts_without_a_ban_and_is_banned(name):
    body = SORTING_BODIES[name]
    assert _run_plain("def sort_numbers(xs):\n" + body, [3, 1, 2]) == [1, 2, 3]  # the trick is real
    violation = body_violation(body)
    assert violation is not None, name
    assert violation.line >= FIRST_BODY_LINE


@pytest.mark.parametrize("name", sorted(IMPORTING_PROGRAMS))
def test_library_internals_dodge_sorts_without_a_ban_and_is_banned(name):
    import enum

    program = IMPORTING_PROGRAMS[name]
    # Some routes exist only on some Pythons (enum.bltns since 3.11): the control runs where they do,
    # and the ban holds on every version (the sandbox's Python may differ from the host's).
    if {"enum_module_holds_builtins": hasattr(enum, "bltns")}.get(name, True):
        assert _run_plain(program, [3, 1, 2]) == [1, 2, 3]
    assert IMPORTING_POLICY.violations(program), name
    assert BanPolicy.from_patterns([]).violations(program) == []  # nothing banned: nothing checked


def test_positional_class_patterns():
    point = "class Point:\n    __match_args__ = ('x', 'y')\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n"
    positional = point + "def f(p):\n    match p:\n        case Point(x, y):\n            return x + y\n"
    # a task that bans nothing: honest pattern matching is untouched (and works)
    assert BanPolicy.from_patterns([]).violations(positional) == []
    namespace: dict = {}
    exec(positional, namespace)
    assert namespace["f"](namespace["Point"](1, 2)) == 3
    # a task that bans something: positional sub-patterns on a class read __match_args__
    names_only = BanPolicy.from_patterns(["sorted("])
    match = "def f(p):\n    match p:\n        case {}:\n            return 1\n"
    assert names_only.check(match.format("Point(x, y)")).rule == "class pattern"
    assert names_only.check(match.format("Point(x=x, y=y)")) is None  # keyword patterns spell the attribute
    assert names_only.check(match.format("list(x)")) is None  # self-matching builtin: binds the subject
    assert names_only.check(match.format("int(n) | float(n)")) is None
    assert names_only.check(match.format("list(a, b)")).rule == "class pattern"
    assert names_only.check("list = dict\n" + match.format("list(x)")).rule == "class pattern"  # rebound


def test_format_fields_that_reach_banned_or_dunder_attributes():
    template = "{0.sort}"
    assert "sort" in template.format([1])  # the lookup really happens
    assert body_violation("    return '{.sort}'.format(xs) and xs\n").rule == "format field"
    assert body_violation("    return '{0.sort}'.format(xs) and xs\n").rule == "format field"
    assert body_violation("    return '{0.__class__}'.format(xs) and xs\n").rule == "format field"
    assert body_violation("    return '{0.real:>{1}} {name!r}'.format(1, 2, name=3) and xs\n") is None


def test_private_attributes_only_where_the_code_defines_them():
    policy = BanPolicy.from_patterns(["sorted("])
    own = ("class Stack:\n    _limit = 3\n    def __init__(self):\n        self._items = []\n"
           "    def full(self, other):\n        return len(self._items) + len(other._items) >= self._limit\n")
    assert policy.check(own) is None
    assert policy.check("import typing\nf = typing._eval_type\n").rule == "private attribute"
    assert policy.check("import random\nf = random._inst\n").rule == "private attribute"
    assert policy.check("import random\nf = random._os\n").rule == "dynamic access"  # a module it imported
    # defining the name somewhere does not make a module's private attribute the code's own
    assert IMPORTING_POLICY.check(FORWARD_REF_IMPORTS_HEAPQ).rule == "private attribute"
    assert policy.check("class K:\n    _eval_type = 0\nimport typing\nf = typing._eval_type\n").rule == "private attribute"


def test_annotations_must_name_types():
    policy = BanPolicy.from_patterns(["sorted("])
    for ok in ("def f(x: list[int], y: 'Node', z: 'list[Node]' = None) -> int | None:\n    pass\n",
               "from typing import Optional\nv: Optional['Node'] = None\n"):
        assert policy.check(ok) is None, ok
    for bad in ("def f(x: 'a' + 'b'):\n    pass\n", "def f(x) -> g():\n    pass\n", "v: \"'a' + 'b'\" = 1\n",
                "from typing import List\nv: List[\"'a' + 'b'\"] = 1\n"):
        assert policy.check(bad).rule == "annotation", bad


def test_code_frame_and_generator_internals_and_class_building():
    for body in ("    return (lambda: 0).__code__ and xs\n", "    return (x for x in xs).gi_code.co_names and xs\n",
                 "    c = g()\n    return c.cr_code\n", "    return c.replace(co_names=())\n",
                 "    return type('C', (), {})\n", "    return type(*args)\n"):
        assert body_violation(body) is not None, body
    assert body_violation("    if type(xs) is list:\n        return list(xs)\n    return xs\n") is None
    assert body_violation("    f_x = xs\n    return f_x\n") is None


def test_runtime_method_removals_and_module_blocks():
    assert SORTING.runtime_module_blocks() == ["heapq"]
    assert BanPolicy().runtime_module_blocks() == []
    assert SORTING.runtime_method_removals() == ["sort"]
    assert BanPolicy().runtime_method_removals() == []
    assert BanPolicy.from_patterns([".__len__(", ".count("]).runtime_method_removals() == ["count"]  # no dunders


@pytest.mark.parametrize("task_id", sorted(TASKS))
def test_honest_solutions_of_the_builtin_tasks_are_not_banned(task_id):
    task = TASKS[task_id]
    policy = BanPolicy.from_patterns(task["banned_patterns"])
    assert policy.violations(task["prompt"] + task["solution"]) == []

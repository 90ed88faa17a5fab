"""Which calls to the candidate a check-mode test will make first, worked out from its text.

The judge runs the task's tests in its own process and forwards each call of the candidate's
function to the candidate process: one round trip, two process switches, per call. HumanEval's
``check(candidate)`` is mostly a straight run of ``assert candidate(<literals>) == <literal>``
statements, so the calls it makes, and their order, are known before it runs, up to the first
statement that fails (which ends the test). The judge sends those calls ahead, in one write, and the
candidate answers them one after another without waiting for the judge (``judge_conn._Conn``).

The candidate then sees the same calls in the same order as it would one at a time; the only
difference is that after a failing call it may already be working on the next ones, which nothing
reads (the verdict is written when the test ends, and the candidate is killed). So a prediction
must never name a call the test would not make at that point. It covers only what is certain:

* the test module's leading statements (docstrings, imports, assignments and ``def``s that call
  nothing) and then ``check(NAME)``, NAME a name the judge binds to the candidate, ``check`` one of
  those ``def``s with a single plain parameter;
* in ``check``'s body, ``assert`` statements whose condition calls only the candidate, with literal
  arguments, and a few builtins (not rebound anywhere), with no short-circuit (``and``, ``or``,
  ``if``-expressions, chained comparisons beyond the first, comprehensions) around a call, and
  whose message calls nothing;
* the first statement of any other kind ends the prediction (a loop, an assignment, a helper call);
  the calls after it are made one at a time, as before.

Only the judge's own trusted test text is read here; the candidate's source never is.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import Any

from trl_sandbox.judge.conn import _AHEAD_BYTES, _canonical
from trl_sandbox.judge.content_guard import parse_untrusted

# Builtins a test may call around the candidate's results: on plain data they run no code of the
# test's nor the candidate's. A test (or its setup) that binds one of these names loses it.
SAFE_BUILTINS = frozenset({
    "abs", "all", "any", "bool", "bytes", "complex", "dict", "float", "frozenset", "int", "isinstance",
    "len", "list", "max", "min", "repr", "round", "set", "sorted", "str", "sum", "tuple", "type",
})
# More calls than this are not worth their place in the judge part (the judge sends at most
# ``_AHEAD_BYTES`` of them, whatever the host predicts).
MAX_AHEAD_CALLS = 64

Call = tuple[str, tuple[Any, ...], dict[str, Any]]


def predicted_calls(test: str, setup: str, bind: Sequence[str]) -> list[Call]:
    """The calls ``(name, args, kwargs)`` that the check-mode ``test`` (run after ``setup``, with the
    names of ``bind`` forwarded to the candidate) certainly makes first, in order; [] when unsure."""
    tree = parse_untrusted(test)
    setup_tree = parse_untrusted(setup) if setup else ast.Module(body=[], type_ignores=[])
    if tree is None or setup_tree is None:
        return []
    test_bound = _bound_names(tree)
    bound = test_bound | _bound_names(setup_tree)
    proxies = set(bind)
    if proxies & test_bound:
        return []  # the test rebinds a name of the candidate's: too clever to predict
    safe = SAFE_BUILTINS - bound
    names = {p: p for p in proxies}
    functions: dict[str, ast.FunctionDef] = {}
    calls: list[Call] = []
    for statement in tree.body:
        if _inert(statement):
            if isinstance(statement, ast.FunctionDef):
                functions[statement.name] = statement
            continue
        call = statement.value if isinstance(statement, ast.Expr) else None
        if (
            isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in functions
            and len(call.args) == 1 and not call.keywords and isinstance(call.args[0], ast.Name)
            and call.args[0].id in proxies
        ):
            calls.extend(_body_calls(functions[call.func.id], call.args[0].id, proxies, safe))
            break  # where check's body stops being predictable is not known here: stop too
        found = _assert_calls(statement, names, safe)
        if found is None:
            break
        calls.extend(found)
    return _limit(calls)


def _limit(calls: list[Call]) -> list[Call]:
    """The leading calls that fit in the judge's one write, pickled as the judge pickles them."""
    kept: list[Call] = []
    size = 0
    for seq, (name, args, kwargs) in enumerate(calls[:MAX_AHEAD_CALLS], 1):
        try:
            size += 4 + len(_canonical((seq, name, args, kwargs)))
        except Exception:
            break
        if size > _AHEAD_BYTES:
            break
        kept.append((name, args, kwargs))
    return kept if len(kept) > 1 else []  # one call gains nothing from being sent ahead


def _bound_names(tree: ast.AST) -> set[str]:
    """Every name the code binds anywhere (assignment targets, ``def``/``class``, imports,
    parameters, ``global``/``nonlocal``, exception names, ``del``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names.update(node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchAs) and node.name:
            names.add(node.name)
    return names


def _calls_nothing(node: ast.AST) -> bool:
    return not any(isinstance(n, (ast.Call, ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom)) for n in ast.walk(node))


def _inert(statement: ast.stmt) -> bool:
    """A module-level statement that calls nothing (so cannot reach the candidate)."""
    if isinstance(statement, ast.Expr):
        return isinstance(statement.value, ast.Constant)
    if isinstance(statement, (ast.Import, ast.ImportFrom, ast.Pass)):
        return True
    if isinstance(statement, (ast.Assign, ast.AnnAssign)):
        return _calls_nothing(statement)
    if isinstance(statement, ast.FunctionDef):
        a = statement.args
        evaluated = [*statement.decorator_list, *a.defaults, *(d for d in a.kw_defaults if d is not None)]
        annotations = [x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg)
                       if x is not None and x.annotation is not None]
        if statement.returns is not None:
            annotations.append(statement.returns)
        return not statement.decorator_list and all(_calls_nothing(n) for n in evaluated + annotations)
    return False


def _body_calls(function: ast.FunctionDef, proxy: str, proxies: set[str], safe: frozenset[str]) -> list[Call]:
    a = function.args
    if a.posonlyargs or a.vararg or a.kwonlyargs or a.kwarg or a.defaults or len(a.args) != 1:
        return []
    local = _bound_names(ast.Module(body=function.body, type_ignores=[]))
    param = a.args[0].arg
    if param in local or local & safe:
        return []  # rebound inside: Python makes the name local for the whole body
    names = {param: proxy, **{p: p for p in proxies if p not in local and p != param}}
    calls: list[Call] = []
    for statement in function.body:
        found = _assert_calls(statement, names, safe)
        if found is None:
            break
        calls.extend(found)
    return calls


def _assert_calls(statement: ast.stmt, names: dict[str, str], safe: frozenset[str]) -> list[Call] | None:
    """The candidate calls of a statement that makes only certain ones: an ``assert`` (whose message
    calls nothing), an import, a docstring, ``pass``. None for any other statement."""
    if isinstance(statement, (ast.Pass, ast.Import, ast.ImportFrom)):
        return []
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
        return []
    if not isinstance(statement, ast.Assert):
        return None
    if statement.msg is not None and (not _calls_nothing(statement.msg) or _names_a_proxy(statement.msg, names)):
        return None  # evaluated only when the assertion fails
    return _expression_calls(statement.test, names, safe)


def _names_a_proxy(node: ast.AST, names: dict[str, str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


def _literal(node: ast.expr) -> tuple[bool, Any]:
    """A literal argument's value. Not a set: its order of iteration, so its pickle, depends on the
    process's string hashes, and a predicted call must pickle exactly as the test's call does."""
    try:
        value = ast.literal_eval(node)
    except Exception:
        return False, None
    return (False, None) if _has_set(value) else (True, value)


def _has_set(value: Any) -> bool:
    if isinstance(value, (set, frozenset)):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_set(v) for v in value)
    if isinstance(value, dict):
        return any(_has_set(k) or _has_set(v) for k, v in value.items())
    return False


def _expression_calls(node: ast.expr, names: dict[str, str], safe: frozenset[str]) -> list[Call] | None:
    """The candidate calls evaluating ``node`` makes, in order, if it certainly makes all of them
    (up to an exception); None when that is not certain."""

    def each(parts: Sequence[ast.expr | None]) -> list[Call] | None:
        out: list[Call] = []
        for part in parts:
            if part is None:
                continue
            found = _expression_calls(part, names, safe)
            if found is None:
                return None
            out.extend(found)
        return out

    if isinstance(node, ast.Constant):
        return []
    if isinstance(node, ast.Name):
        return None if node.id in names else []  # the candidate handed around as a value: unsure
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return None if any(isinstance(e, ast.Starred) for e in node.elts) else each(node.elts)
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            return None
        return each([x for pair in zip(node.keys, node.values) for x in pair])
    if isinstance(node, ast.UnaryOp):
        return each([node.operand])
    if isinstance(node, ast.BinOp):
        return each([node.left, node.right])
    if isinstance(node, ast.Compare):
        later = node.comparators[1:]
        if any(not _calls_nothing(c) or _names_a_proxy(c, names) for c in later):
            return None  # evaluated only while the comparisons before hold
        return each([node.left, node.comparators[0], *later])
    if isinstance(node, ast.Subscript):
        if isinstance(node.slice, ast.Slice):
            return each([node.value, node.slice.lower, node.slice.upper, node.slice.step])
        return each([node.value, node.slice])
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if any(isinstance(x, ast.Starred) for x in node.args) or any(k.arg is None for k in node.keywords):
            return None
        if node.func.id in names:
            args = []
            for x in node.args:
                ok, value = _literal(x)
                if not ok:
                    return None
                args.append(value)
            kwargs = {}
            for k in node.keywords:
                ok, value = _literal(k.value)
                if not ok:
                    return None
                kwargs[k.arg] = value
            return [(names[node.func.id], tuple(args), kwargs)]
        if node.func.id in safe:
            return each([*node.args, *(k.value for k in node.keywords)])
    return None

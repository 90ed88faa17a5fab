"""Completions a model might write, at random: token soup and grammar-built Python.

Used by ``tests/test_content_fuzz.py`` and runnable by hand for a longer soak::

    .venv/bin/python -m tests.content_fuzz --count 5000 --seed 7

Nothing here knows how the host parses code: the generator only aims at shapes that have broken
parsers before (lone surrogates, NUL bytes, deep nesting, huge literals, odd Unicode, every
statement kind) and at ordinary near-miss code, so that whatever the host's Python does with them
the scorer must still answer with an outcome of the candidate's, never ``infra``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

# Pieces of text a code model's vocabulary is made of, plus the odd ones a sampler can reach.
KEYWORDS = (
    "def", "return", "if", "elif", "else", "for", "while", "in", "not", "and", "or", "is", "lambda",
    "yield", "await", "async", "with", "as", "try", "except", "finally", "raise", "class", "match",
    "case", "global", "nonlocal", "del", "pass", "break", "continue", "import", "from", "assert",
    "None", "True", "False", "type", "print",
)
NAMES = ("xs", "x", "i", "j", "best", "current", "out", "sort_numbers", "max_subarray_sum", "sorted",
         "len", "range", "max", "min", "sum", "list", "self", "_", "__class__", "__dict__", "sort")
PUNCT = tuple("()[]{}:;,.=+-*/%<>!&|^~@\\'\"#`$?") + (
    "**", "//", "==", "!=", "<=", ">=", "->", ":=", "...", "'''", '"""', "f'", "b'", "r'", "rb'", "{{", "}}",
)
SPACE = (" ", "  ", "    ", "\t", "\n", "\n    ", "\n        ", "\r\n", "\r", "\x0c", "\x0b")
ODD = (
    "\x00", "\ud800", "\udfff", "\udc80", "\ufeff", "\u200b", "\u202e", "\u2028", "\u2029", "\x85",
    "\U0001f600", "\u0301", "ÿ", "µ", "ǅ", "ℌ", "𝔵", "ﬁ", "\uffff", "\U0010ffff", "\x1b[2J", "\\N{",
    "\\x", "\\u", "\\U0011", "0x", "0b2", "1e999", "1_", "9" * 50, "#!", "# -*- coding: latin-1 -*-\n",
    "# coding: utf-16\n", "```", "```python\n", "<answer>", "</answer>",
)


def token_soup(rng: random.Random, max_tokens: int = 60) -> str:
    """Random tokens, weighted towards code, like an untrained model's samples."""
    pools = ((KEYWORDS, 3), (NAMES, 4), (PUNCT, 4), (SPACE, 4), (ODD, 1))
    choices = [p for p, w in pools for _ in range(w)]
    n = rng.randint(0, max_tokens)
    return "".join(rng.choice(rng.choice(choices)) for _ in range(n))


def _expr(rng: random.Random, depth: int) -> str:
    if depth <= 0 or rng.random() < 0.3:
        return rng.choice(("xs", "x", "0", "1", "-1", "xs[0]", "len(xs)", "None", "'a'", "b'\\xff'", "1.5",
                           "10**100", "[]", "{}", "()", "...", "f'{x!r:>{x}}'", "'\\N{BULLET}'"))
    form = rng.randrange(12)
    a, b = _expr(rng, depth - 1), _expr(rng, depth - 1)
    return (
        f"({a} + {b})", f"[{a}, {b}]", f"{{{a}: {b}}}", f"{a}[{b}]", f"{a}({b})", f"(lambda v: {a})({b})",
        f"[v for v in {a} if {b}]", f"({a} if {b} else {a})", f"(y := {a})", f"not {a}", f"{a}.{rng.choice(NAMES)}",
        f"f'{{{a}}}{{{b}!s}}'",
    )[form]


def _stmt(rng: random.Random, depth: int, indent: str) -> str:
    e = _expr(rng, 3)
    inner = indent + "    "
    kind = rng.randrange(16)
    if depth <= 0 or kind < 5:
        return indent + rng.choice((f"return {e}", f"x = {e}", f"xs.append({e})", "pass", f"print({e})",
                                    f"assert {e}", f"raise ValueError({e})", f"del {e}", "yield x", "global xs"))
    body = _stmt(rng, depth - 1, inner)
    return {
        5: f"{indent}for x in {e}:\n{body}",
        6: f"{indent}while {e}:\n{body}\n{inner}break",
        7: f"{indent}if {e}:\n{body}\n{indent}else:\n{_stmt(rng, depth - 1, inner)}",
        8: f"{indent}try:\n{body}\n{indent}except Exception as err:\n{inner}return err",
        9: f"{indent}with open('f') as fh:\n{body}",
        10: f"{indent}def helper(v, *a, **k):\n{body}",
        11: f"{indent}class C(list):\n{inner}__match_args__ = ('sort',)\n{body}",
        12: f"{indent}match {e}:\n{inner}case [a, *rest] if a:\n{inner}    pass\n{inner}case C(s):\n{body}",
        13: f"{indent}async def co():\n{inner}await {e}\n{body}",
        14: f"{indent}@staticmethod\n{indent}def deco():\n{body}",
        15: f"{indent}x = [\n{body}",  # an unclosed bracket, as a sampler leaves it
    }[kind]


def grammar_program(rng: random.Random) -> str:
    """A function body (the built-in tasks continue a ``def``), sometimes malformed on purpose."""
    body = "\n".join(_stmt(rng, rng.randint(0, 4), "    ") for _ in range(rng.randint(1, 6))) + "\n"
    roll = rng.random()
    if roll < 0.08:
        body = "(" * rng.randint(100, 3000) + ")" * rng.randint(0, 3000)  # nesting past the parser's limit
    elif roll < 0.14:
        body = "    return " + "-" * rng.randint(1000, 200000) + "1\n"  # deep unary chain
    elif roll < 0.2:
        body = body.replace("x", rng.choice(ODD))  # odd characters spliced in
    elif roll < 0.24:
        body = f"    return {'[' * 150}xs{']' * 150}\n"
    elif roll < 0.28:
        body = "    return 1" + "0" * rng.randint(5000, 50000) + "\n"  # a huge literal
    elif roll < 0.32:
        body = "```python\n" + body + "```"
    return body


def completions(count: int, seed: int = 0) -> Iterator[str]:
    """``count`` completions: half token soup, half grammar-built programs, reproducible by seed."""
    rng = random.Random(seed)
    for i in range(count):
        yield token_soup(rng) if i % 2 == 0 else grammar_program(rng)


def main() -> None:  # a longer soak by hand: the same check as the test, any count
    import argparse
    import collections

    from trl_sandbox.pool.sandbox_pool import SandboxPool
    from trl_sandbox.scoring.scorer import Scorer
    from trl_sandbox.tasks.builtin import BuiltinTasks

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = [{**row, "sandbox_task": "builtin"} for row in BuiltinTasks().rows()]
    texts = list(completions(args.count, args.seed))
    batch = [rows[i % len(rows)] for i in range(len(texts))]
    with SandboxPool.open("local", size=2) as pool:
        outcomes = Scorer(pool).score(texts, batch)
    counts = collections.Counter(o.status for o in outcomes)
    print(dict(counts))
    for text, outcome in zip(texts, outcomes):
        if outcome.status == "infra":
            print(repr(text[:200]), outcome.detail)


if __name__ == "__main__":
    main()

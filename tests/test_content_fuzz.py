"""Content never becomes infrastructure: whatever a completion holds, its reward is never ``None``.

The fuzz runs thousands of random-token and grammar-built completions through the real
``Scorer`` and the local sandbox, on every Python the project is tested on (their parsers differ:
3.12 raised ``SystemError`` and ``UnicodeEncodeError`` where 3.11 raised ``SyntaxError``). A
second fuzz simulates such a parser on any Python: ``ast.parse`` and ``tokenize`` raise an
exception of a random class on marked content, and still nothing becomes ``infra``.
"""

from __future__ import annotations

import ast
import os
import random
import threading
import tokenize
from collections import Counter

import pytest

from tests.content_fuzz import completions
from trl_sandbox.judge.content_guard import build_guarded, score_guarded
from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.sandbox import ExecResult, Outcome, Program
from trl_sandbox.scoring.scorer import Scorer
from trl_sandbox.tasks.builtin import BuiltinTasks

COUNT = int(os.environ.get("TRL_SANDBOX_FUZZ_COUNT", "3000"))
ROWS = [{**row, "sandbox_task": "builtin"} for row in BuiltinTasks().rows()]
EXOTIC = (SystemError, MemoryError, RecursionError, ValueError, KeyError, TypeError, IndexError,
          AttributeError, OverflowError, LookupError, AssertionError, RuntimeError)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool.open("local", size=2) as pool:
        yield pool


def _batch(texts):
    return [ROWS[i % len(ROWS)] for i in range(len(texts))]


def test_random_completions_never_score_infra(pool):
    texts = list(completions(COUNT, seed=1))
    outcomes = Scorer(pool).score(texts, _batch(texts))
    statuses = Counter(o.status for o in outcomes)
    bad = [(t[:120], o.detail) for t, o in zip(texts, outcomes) if o.status == "infra" or o.reward is None]
    assert not bad, f"{len(bad)} completions scored infra/None: {bad[:5]}"
    # the fuzz reaches the sandbox and every early outcome, not only the parser
    assert statuses["no_code"] and statuses["error"] and statuses["failed"] + statuses["passed"] > 0, statuses


MARK = "# \u27e8boom\u27e9"


@pytest.fixture
def exploding_parser(monkeypatch):
    """``ast.parse`` and ``tokenize`` that raise an exception of a random class on marked text."""
    rng = random.Random(5)
    real_parse, real_tokens = ast.parse, tokenize.generate_tokens

    def boom() -> BaseException:
        cls = rng.choice(EXOTIC + (UnicodeEncodeError,))
        if cls is UnicodeEncodeError:
            return UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
        return cls("simulated parser failure")

    def parse(source, *args, **kwargs):
        if isinstance(source, str) and MARK in source:
            raise boom()
        return real_parse(source, *args, **kwargs)

    def generate_tokens(readline):
        for token in real_tokens(readline):
            if MARK in token.line:
                raise boom()
            yield token

    monkeypatch.setattr(ast, "parse", parse)
    monkeypatch.setattr(tokenize, "generate_tokens", generate_tokens)


def test_a_parser_that_raises_anything_on_content_never_makes_infra(pool, exploding_parser):
    rng = random.Random(3)
    texts = [t + ("\n    " + MARK + "\n" if rng.random() < 0.5 else "") for t in completions(600, seed=2)]
    texts += ["    return xs  " + MARK + "\n"] * 4  # code that would otherwise pass
    outcomes = Scorer(pool).score(texts, _batch(texts))
    bad = [(t[:80], o.detail) for t, o in zip(texts, outcomes) if o.status == "infra" or o.reward is None]
    assert not bad, bad[:5]
    # the simulated failures reached the host path: the sorting task's ban check parses every
    # completion, so every marked one is refused (unparsable), never run and never infra
    rows = _batch(texts)
    marked = [o for t, o, r in zip(texts, outcomes, rows) if MARK in t and r["task_id"] == "sorting"]
    assert marked and all(o.status in ("banned", "error", "no_code") for o in marked), marked[:3]
    assert any("does not parse" in o.detail for o in marked)


def test_positive_control_the_simulated_parser_raises_on_marked_text(exploding_parser):
    with pytest.raises(EXOTIC + (UnicodeEncodeError,)):
        ast.parse("x = 1  " + MARK)
    assert isinstance(ast.parse("x = 1"), ast.Module)
    task = BuiltinTasks()
    assert isinstance(task.build("    return xs\n", ROWS[0]), Program)  # the probe still builds


class _BrokenTask:
    """A task whose build and score raise for every input: that is the task's bug, not content's."""

    def build(self, completion, row):
        raise RuntimeError("task bug")

    def score(self, result, row, *, nonce):
        raise RuntimeError("task bug")


class _PickyTask:
    """Builds and scores fine, except on content that trips it (as a host codec would)."""

    def build(self, completion, row):
        if "\ud800" in completion:
            completion.encode()  # raises UnicodeEncodeError
        return Program(argv=("true",))

    def score(self, result, row, *, nonce):
        if "evil" in result.stdout:
            raise SystemError("returned a result with an exception set")
        return Outcome("passed", passed=1, total=1)


def test_who_caused_the_exception_decides_the_outcome():
    row = {"task_id": "t"}
    assert build_guarded(_PickyTask(), "x\ud800", row).status == "error"
    assert score_guarded(_PickyTask(), ExecResult(exit_code=0, stdout="evil"), row, None).status == "error"
    # positive control: a task broken for every input is infrastructure, never the completion's fault
    assert build_guarded(_BrokenTask(), "anything", row).status == "infra"
    assert score_guarded(_BrokenTask(), ExecResult(exit_code=0, stdout=""), row, None).status == "infra"


def test_results_are_decoded_off_the_event_loop(pool, monkeypatch):
    seen = []
    real = BuiltinTasks.score

    def score(self, result, row, *, nonce):
        seen.append(threading.current_thread().name)
        return real(self, result, row, nonce=nonce)

    monkeypatch.setattr(BuiltinTasks, "score", score)
    Scorer(pool, cache_size=0).score(["    return xs\n"], [ROWS[0]])
    assert seen and all(name.startswith("trl-sandbox-score") for name in seen), seen

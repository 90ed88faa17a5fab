"""The host side of the I/O judge: the program that judges a whole program on its tests
(``judge/io_runner.py``, sent with the exec) and the ``Outcome`` of its verdict.

The verdict line carries this execution's nonce (``Program.nonce_on_stdin``), exactly as the function
judge's (``trl_sandbox.judge.verdict``); per test it holds one of ``AC``, ``WA``, ``TLE``, ``MLE``,
``RE`` or ``skipped`` (after the first failure, when the task stops there), and the load part says
whether the program compiled (``CE``) or the sandbox lacks the toolchain (``toolchain``).

The outcome follows the function judge's rule: every test passed is ``passed``; a compile error,
a runtime error or a memory limit anywhere is ``error``; a time limit anywhere is ``timeout``;
otherwise wrong answers are ``failed``. ``passed``/``total`` count tests whatever the status, and
the detail names the kinds with their counts (``WA 2, TLE 1``), then the first failure. A missing
toolchain is ``infra`` for the language a row declares, and the program's ``error`` for one its
completion's fence chose (``missing_toolchain``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trl_sandbox.judge.languages import Language
from trl_sandbox.judge.sent_source import bare_source
from trl_sandbox.judge.verdict import _frame, verdict_of
from trl_sandbox.sandbox import ExecResult, Outcome, Program

# The guard's rules first: the runner puts them on itself (``io_process.guard``).
IO_SOURCE: str = bare_source("\n".join(Path(__file__).with_name(name).read_text(encoding="utf-8")
                                       for name in ("guard.py", "meter.py", "io_process.py", "io_warm.py", "io_compare.py",
                                                    "io_runner.py")))
# -I without -S: Python programs run in forks of this interpreter, with the site-packages a fresh
# ``python3 -I main.py`` would have.
IO_ARGV: tuple[str, ...] = ("python3", "-I", "-c", IO_SOURCE)
# Seconds on top of the sum of the limits: the runner's own work, forks, copies of the build.
MARGIN_S = 2.0
KINDS = ("WA", "TLE", "MLE", "RE", "CE")


def build_io_program(
    language: Language,
    source: str,
    tests: Sequence[Mapping[str, Any]],
    *,
    compare: str = "tokens",
    time_limit: float = 2.0,
    memory_mb: int = 256,
    compile_time: float = 10.0,
    compile_memory_mb: int = 1024,
    checker: tuple[Language, str] | None = None,
    checker_contract: str = "testlib",
    stop_on_fail: bool = False,
    warm: bool = True,
    total_time_limit: float = 60.0,
) -> Program:
    """The judged program for ``source``. ``tests`` are ``{input, output}`` (optionally with their
    own ``time_limit`` and ``memory_mb``); the expected outputs travel to the runner only. A
    ``checker`` runs under ``checker_contract`` (``io_compare.CHECKER_CONTRACTS``)."""
    cases = [{"input": str(t["input"]), "output": str(t["output"]),
              **({"time_limit": float(t["time_limit"])} if t.get("time_limit") else {}),
              **({"memory_mb": int(t["memory_mb"])} if t.get("memory_mb") else {})} for t in tests]
    payload: dict[str, Any] = {
        "lang": language.payload(source), "source": source, "compare": compare, "warm": warm,
        "time_limit": float(time_limit), "memory_mb": int(memory_mb), "compile_time": float(compile_time),
        "compile_memory_mb": int(compile_memory_mb), "stop_on_fail": bool(stop_on_fail),
        "total_time_limit": float(total_time_limit),
    }
    limits = [float(t.get("time_limit") or time_limit) for t in tests]
    # The runner stops a program after two time limits or its total: its budget is no more than that.
    budget = compile_time + min(sum(limits), total_time_limit + 2 * max(limits, default=0)) + MARGIN_S
    if checker is not None:
        checker_language, checker_source = checker
        payload["checker"] = {**checker_language.payload(checker_source), "source": checker_source,
                              "contract": checker_contract}
        # Per test, a checker run and (when it fails) a second one on the expected answer.
        budget += compile_time + sum(2 * max(2.0, 2 * float(t.get("time_limit") or time_limit)) for t in tests)
    # Two frames: the runner forks the warm interpreter after the first and before the tests.
    stdin = b"".join(_frame(json.dumps(part, ensure_ascii=False).encode("utf-8", "surrogatepass"))
                     for part in (payload, cases))
    return Program(argv=IO_ARGV, stdin=stdin, timeout=budget, nonce_on_stdin=True)


def io_outcome(result: ExecResult, nonce: bytes | None, total: int, *, fence_chosen: bool = False) -> Outcome:
    """Score one execution of the I/O judge (see the module docstring). ``fence_chosen``: the
    completion's fence chose the language (the row declares none)."""
    verdict = verdict_of(result, nonce, total)
    if isinstance(verdict, Outcome):
        return verdict
    if not verdict.loaded:
        load = verdict.load
        if load.get("kind") == "toolchain":
            return missing_toolchain(load, total, fence_chosen)
        if load.get("kind") == "infra":
            return Outcome("infra", total=total, detail=str(load.get("message", ""))[:500])
        return Outcome("error", total=total, detail=f"CE: {load.get('message', '')}"[:500], tests=(False,) * total)
    kinds = [str(t.get("v")) if isinstance(t, Mapping) else "RE" for t in verdict.tests[:total]]
    kinds += ["skipped"] * (total - len(kinds))
    passes = tuple(k == "AC" for k in kinds)
    counts = Counter(k for k in kinds if k in KINDS)
    first = next((t for t in verdict.tests[:total] if isinstance(t, Mapping) and t.get("v") in KINDS), None)
    if "TLE" in counts:
        status = "timeout"
    elif "RE" in counts or "MLE" in counts:
        status = "error"
    elif all(passes) and total > 0:
        status = "passed"
    else:
        status = "failed"
    detail = ", ".join(f"{k} {counts[k]}" for k in KINDS if counts[k])
    if first is not None:
        index = verdict.tests.index(first) + 1
        detail += f"; test {index}: {first.get('v')} {str(first.get('detail') or '')}".rstrip()
    return Outcome(status, passed=sum(passes), total=total, detail=detail[:500], tests=passes)


def missing_toolchain(load: Mapping[str, Any], total: int, fence_chosen: bool) -> Outcome:
    """The sandbox lacks the toolchain of the program's language. For a language the row declares,
    the task cannot be judged here (``infra``; the local sandbox refuses such a dataset before
    training). For a language the completion's fence chose, the model chose what cannot run: its
    program's failure, scored like a compile error, else writing in a missing language would be a
    way to turn a wrong answer into ``None``."""
    message = str(load.get("message", ""))
    if not fence_chosen:
        return Outcome("infra", total=total, detail=f"the sandbox lacks the toolchain: {message}"[:500])
    return Outcome("error", total=total, tests=(False,) * total,
                   detail=f"CE: the completion's fence chose {load.get('language') or 'a language'}, whose "
                          f"toolchain the sandbox lacks: {message}"[:500])

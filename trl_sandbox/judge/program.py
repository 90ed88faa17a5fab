# ruff: noqa: UP031  (runs on the sandbox's Python, 3.8+: plain %-formatting on purpose)
"""The judge: runs inside the sandbox as ``python3 -I -c SOURCE``; SOURCE is the text of
``judge/candidate.py`` and ``judge/resident.py`` (the candidate process's half), ``judge/clock.py`` (the candidate's time
budget) and ``judge/conn.py`` (the judge's side of the conversation) followed by this file's (the
judge's half: the tests, the verdict).

Standard library only, Python 3.8+. The source is sent byte-identical for every execution (a
sandbox may cache its compiled form); everything that changes per execution comes on stdin:

    stdin = NONCE (16 bytes, prepended by the runner)
          + u32 length + CANDIDATE PART (pickle: what the candidate process may see)
          + u32 length + JUDGE PART     (pickle: the tests; read only after the candidate is forked)

The host side is ``trl_sandbox.judge.verdict``. The judge makes itself non-dumpable (so that the candidate
cannot read its memory or its file descriptors through /proc or ptrace), forks the candidate
process (where the judge stays resident across programs, the local sandbox's forker has forked
it; see ``_ATTACH``), and talks to it over a pipe pair. The candidate process first zeroes its copy of the
nonce, closes stdin and the real stdout (its prints go to stderr), drops the task's banned
builtins, execs the candidate source and then serves call requests. Everything it sends back is
decoded with an unpickler that refuses every class but three exact value types, so only plain
data (None, bool, int, float, complex, str, bytes, bytearray, list, tuple, dict, set, frozenset,
fractions.Fraction, decimal.Decimal) can come back: no object with a rigged ``__eq__``. Whatever
the candidate does (exit, kill, loop, print), the judge alone writes to the real stdout, once:
``MARKER NONCE_HEX JSON``. The host accepts only a line with the right nonce.

Modes (from the judge part):

``call``  ``{"mode": "call", "func": NAME, "calls": [(args, kwargs), ...]}``: call NAME on each
          input; each result travels back to the host as a pickle that the host decodes the same
          restricted way and compares with the expected value computed from the task's reference.
``check`` ``{"mode": "check", "setup": CODE, "tests": [CODE, ...], "bind": [NAME, ...],
          "bind_defined": [NAME, ...], "predicted": [(NAME, args, kwargs), ...]}``: exec the
          trusted ``setup`` (e.g. a HumanEval prompt, for helpers such as ``poly``) in the judge's
          own namespace, bind each name of ``bind`` (and of ``bind_defined`` that the candidate
          defines) to a proxy that forwards calls to the candidate process, then exec each test; a
          test passes when it raises nothing. ``predicted``: the calls a single test certainly
          makes first, sent to the candidate together at the first of them
          (``trl_sandbox.judge.prefetch``); call mode sends its calls ahead the same way.
"""

import _json
import _pickle
import binascii
import os
import time

if "_start_candidate" not in globals():
    # Imported on the host (tests, tools): the candidate half is a module of its own. In the sandbox
    # this text runs right after judge/candidate.py's (``trl_sandbox.judge.verdict.JUDGE_SOURCE``), which
    # has already defined these names (as a program, or in the local fork server's warm-up).
    from trl_sandbox.judge.candidate import (
        _MAX_TEXT,
        NONCE_BYTES,
        _exc_text,
        _nondumpable,
        _read_message,
        _start_candidate,
        _write_all,
    )
    from trl_sandbox.judge.clock import _Clock
    from trl_sandbox.judge.conn import CandidateError, _Conn, _Dead, _Mispredicted, _Proxy
    from trl_sandbox.judge.resident import _compiled_ahead

# Set where the judge stays resident across programs (the local sandbox's): the candidate process
# is already forked (see ``_serve_candidate``); this sends it its part of the payload and its code
# as the judge compiled it (``_compiled_ahead``), and returns ``(pid, request fd, reply fd)``, in
# place of ``_start_candidate``.
_ATTACH = None
# Set by the local sandbox's supervisor when this judge runs as a plain exec there: the sandbox's
# PID namespace then holds nothing but PID 1, this judge and what its candidate started (every exec
# ends with a sweep), so every process there but PID 1 and the judge counts against the candidate,
# however it detached. Elsewhere (a remote sandbox may run its service's own processes beside
# ours) only the candidate's family and groups count.
_SOLE = False

MARKER = b"@@trl-sandbox-verdict@@"
VERSION = 1
# -- modes ------------------------------------------------------------------------------------------

_NOT_RUN = {"ok": False, "kind": "not_run", "message": "not run"}


def _run_call(conn, spec):
    results = []
    name = spec["func"]
    conn.predict([(name, args, kwargs) for args, kwargs in spec["calls"]])  # every call is known
    for args, kwargs in spec["calls"]:
        if conn.failure is not None:
            results.append(_NOT_RUN)
            continue
        try:
            reply = conn.call_raw(name, tuple(args), dict(kwargs))
        except _Dead:
            results.append(conn.failure)
            continue
        if reply[0] == "ok":
            try:
                conn.loads(reply[2])
            except Exception as exc:
                results.append({"ok": False, "kind": "not_plain", "type": "TypeError",
                                "message": "result is not plain data (%s)" % _exc_text(exc)})
                continue
            results.append({"ok": True, "value": reply[2]})
        else:
            results.append({"ok": False, "kind": reply[0], "type": reply[2], "message": reply[3]})
    return results


# The task's setup and tests, compiled: a judge that stays resident across programs (the local
# sandbox's) compiles each text once. Trusted text only: the candidate's source never comes here.
_COMPILED = {}
_COMPILED_MAX = 256


def _compiled(text, filename):
    key = (text, filename)
    code = _COMPILED.get(key)
    if code is None:
        code = compile(text, filename, "exec")
        if len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.clear()
        _COMPILED[key] = code
    return code


def _run_check(conn, spec, defined):
    namespace = {"__name__": "__judge__"}
    setup = spec.get("setup") or ""
    if setup:
        exec(_compiled(setup, "<setup>"), namespace)
    for name in spec.get("bind") or ():
        namespace[name] = _Proxy(conn, name)
    for name in spec.get("bind_defined") or ():
        if name in defined:
            namespace[name] = _Proxy(conn, name)
    results = []
    if len(spec["tests"]) == 1:  # a test ends at its first failure: nothing after it is read
        conn.predict(spec.get("predicted") or ())
    for test in spec["tests"]:
        if conn.failure is not None:
            results.append(_NOT_RUN)
            continue
        try:
            exec(_compiled(test, "<test>"), namespace)
            result = {"ok": True}
        except _Mispredicted:
            raise
        except _Dead:
            result = None
        except CandidateError as exc:
            result = {"ok": False, "kind": exc.kind, "type": exc.type_name, "message": _exc_text(exc)}
        except AssertionError as exc:
            result = {"ok": False, "kind": "assertion", "type": "AssertionError", "message": _exc_text(exc)}
        except BaseException as exc:
            result = {"ok": False, "kind": "wrong", "type": type(exc).__name__, "message": _exc_text(exc)}
        # Test code that swallowed the end of the candidate (a bare ``except:``) still fails.
        results.append(conn.failure if conn.failure is not None else result)
    return results


# -- the verdict ------------------------------------------------------------------------------------


def _to_json(value):
    """Minimal JSON for the verdict (plain data only); bytes become base64 strings."""
    t = type(value)
    if value is None:
        return "null"
    if t is bool:
        return "true" if value else "false"
    if t is int:
        return str(value)
    if t is float:
        return repr(value) if value == value and value not in (float("inf"), float("-inf")) else "null"
    if t is str:
        return _json.encode_basestring_ascii(value)
    if t is bytes:
        return '"' + binascii.b2a_base64(value, newline=False).decode("ascii") + '"'
    if t is dict:
        return "{" + ",".join(_to_json(str(k)) + ":" + _to_json(v) for k, v in value.items()) + "}"
    if t in (list, tuple):
        return "[" + ",".join(_to_json(v) for v in value) + "]"
    return _to_json(str(value))


def main():
    import _signal

    _signal.signal(_signal.SIGPIPE, _signal.SIG_IGN)
    guarded = _nondumpable()
    nonce = bytearray(NONCE_BYTES)
    view = memoryview(nonce)
    got = 0
    while got < NONCE_BYTES:
        n = os.readv(0, [view[got:]])
        if n <= 0:
            raise SystemExit("the judge needs a 16-byte nonce on stdin")
        got += n
    view.release()
    candidate_part = _read_message(0)
    candidate_spec = _pickle.loads(candidate_part)
    start = time.monotonic()
    limit = float(candidate_spec.get("limit", 1.0))
    clock = _Clock(start, limit, float(candidate_spec.get("wall_limit", limit)), candidate_spec.get("clock", "wall"))
    if _ATTACH is None:
        pid, wfd, rfd = _start_candidate(candidate_spec, nonce)
        if _SOLE:
            clock.exclude(())
    else:
        # A resident judge is told the candidate and its sandbox's other resident processes (the
        # forker): every other process there counts against the candidate's budget.
        attached = _ATTACH(candidate_part, _compiled_ahead(candidate_spec))
        pid, wfd, rfd = attached[:3]
        clock.exclude(attached[3:])
    judge_spec = _pickle.loads(_read_message(0))
    conn = _Conn(pid, wfd, rfd, clock, int(candidate_spec.get("max_bytes", 16 << 20)))
    verdict = {"v": VERSION, "nondumpable": guarded}
    defined = []
    try:
        reply = conn.recv()
        if reply[0] == "loaded" and len(reply) == 2 and type(reply[1]) is list:
            verdict["load"] = {"ok": True}
            defined = [d for d in reply[1] if type(d) is str]
        elif reply[0] == "load_error" and len(reply) == 3:
            verdict["load"] = {"ok": False, "kind": "raise", "type": str(reply[1])[:200], "message": str(reply[2])[:_MAX_TEXT]}
        else:
            verdict["load"] = {"ok": False, "kind": "protocol", "message": "protocol error: a malformed first message"}
    except _Dead:
        verdict["load"] = conn.failure
    verdict["tests"] = []
    if verdict["load"]["ok"]:
        try:
            if judge_spec["mode"] == "call":
                verdict["tests"] = _run_call(conn, judge_spec)
            else:
                verdict["tests"] = _run_check(conn, judge_spec, defined)
        except _Mispredicted as exc:  # the judge's own error: never the candidate's fault
            verdict["task_error"] = "the judge: %s" % _exc_text(exc)
        except Exception as exc:  # the task's own setup or tests are broken
            verdict["task_error"] = "%s: %s" % (type(exc).__name__, _exc_text(exc))
    conn.kill()  # nothing the candidate does from here on can reach the verdict
    verdict["elapsed"] = round(time.monotonic() - start, 6)
    # A leading newline: whatever reached the same stream before, the verdict starts its own line.
    line = b"\n" + MARKER + b" " + nonce.hex().encode("ascii") + b" " + _to_json(verdict).encode("ascii") + b"\n"
    _write_all(1, line)
    # The killed candidate is reaped by whoever outlives us (the sandbox's init); no need to wait.


if __name__ == "__main__":
    main()

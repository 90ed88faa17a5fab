# ruff: noqa: UP031  (runs on the sandbox's Python, 3.8+: plain %-formatting on purpose)
"""The candidate's half of the judge where the judge stays resident across programs (the local
sandbox's): the second part of the judge's source, right after ``judge/candidate.py``'s
(``trl_sandbox.judge.verdict.JUDGE_SOURCE``).

There the candidate is forked by the sandbox's forker, not by the judge, and takes its part of the
payload, and its code as the judge compiled it, from the judge over its request pipe
(``_serve_candidate``). The fork server runs the same path once on made-up data before any fork
(``_warm_serving``), so that a candidate, a fresh fork, does not pay for warming it up.
"""

import _pickle
import os

if "_candidate" not in globals():
    # Imported on the host (tests, tools): the candidate half is a module of its own. In the sandbox
    # this text runs right after judge/candidate.py's, which has defined these names.
    from trl_sandbox.judge.candidate import (
        _TYPE_MODIFIED,
        _candidate,
        _dict_get,
        _int_to_bytes,
        _load,
        _read_message,
        _send,
        _serve_requests,
        _write_all,
    )


# The largest source the judge compiles for its candidate (``_compiled_ahead``); a larger one is
# compiled by the candidate.
_AHEAD_SOURCE_CHARS = 256 << 10


def _compiled_ahead(spec):
    """The candidate's source compiled by a resident judge, as marshal data; b"" to have the
    candidate compile it itself.

    A freshly forked process pays a copy-on-write fault for every page the compiler touches, about
    as much CPU again as the compile; the resident judge's pages are its own. The judge and its
    candidates run the same interpreter (both are forks of the sandbox's fork server), so the code
    object is the one the candidate would have built: the same flags (none inherited), the same
    optimisation level. Compiling runs none of the source. Anything but a clean compile (a syntax
    error, a compile-time warning, a source too large, a compiler limit) is left to the candidate,
    which compiles the source again and reports it as any program does, under its own limits and
    with its stderr in place."""
    source = _dict_get(spec, "source")
    if type(source) is not str or len(source) > _AHEAD_SOURCE_CHARS:
        return b""
    import marshal
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the first warning ends the compile here
            code = compile(source, _dict_get(spec, "filename") or "<string>", "exec", dont_inherit=True)
        return marshal.dumps(code)
    except Exception:
        return b""


def _serve_candidate(rfd, wfd):
    """The candidate process of a judge that stays resident across programs (the local sandbox's):
    forked by the sandbox's forker (a pristine copy of its fork server), not by the judge (whose
    memory holds the tests of every program it judged), it reads its part of the payload from the
    judge first, then its code as the judge compiled it (``_compiled_ahead``; empty: compile it)."""
    spec = _pickle.loads(_read_message(rfd))
    compiled = _read_message(rfd)
    code = None
    if compiled:
        import marshal

        code = marshal.loads(compiled)
    _candidate(spec, rfd, wfd, _TYPE_MODIFIED if spec.get("remove_methods") else None, code)


# Values of the kinds results usually are, for ``_warm_serving``.
_WARM_VALUES = ([1, 2.5, "a", None, True, -3], {"k": (1, 2.0)}, "text", 7, 2.5, (1, "b"), b"x", {1, 2}, False, None)


def _warm_serving(rounds=24):
    """Run what every resident-judge candidate runs (reading its part and code, loading, serving
    calls, sending results) on made-up data, in the fork server the candidates descend from: a
    fresh fork then finds that code quickened and specialised, its names hashed and its lookups
    cached, where it would otherwise write each of them, one copy-on-write fault per page. Trusted
    code and made-up data only; nothing of it is kept (descriptors, modules, paths)."""
    import builtins
    import marshal

    source = "def f(x):\n    return x\n\ndef g(*a, **k):\n    return [a, k]\n"
    spec_data = _pickle.dumps({"source": source, "filename": "<string>"}, protocol=5)
    code_data = _compiled_ahead({"source": source})
    calls = [(i, "f", (v,), {}) for i, v in enumerate(_WARM_VALUES)] + [(99, "g", (1,), {"k": 2}), (100, "h", (), {})]
    requests = b"".join(_int_to_bytes(len(d), 4, "big") + d for d in (_pickle.dumps(c, protocol=5) for c in calls))
    for _ in range(rounds):
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        try:
            _write_all(req_w, _int_to_bytes(len(spec_data), 4, "big") + spec_data)
            _write_all(req_w, _int_to_bytes(len(code_data), 4, "big") + code_data + requests)
            os.close(req_w)
            req_w = -1
            spec = _pickle.loads(_read_message(req_r))
            namespace = {"__name__": "__candidate__", "__builtins__": builtins.__dict__}
            _send(resp_w, _load(namespace, marshal.loads(_read_message(req_r)), spec["source"], "<string>"))
            _serve_requests(namespace, req_r, resp_w)
        finally:
            for fd in (req_r, req_w, resp_r, resp_w):
                if fd >= 0:
                    os.close(fd)

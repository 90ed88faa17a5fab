"""How the I/O judge compares a program's output with a test's answer, and reads a checker's verdict.

Standard library only, Python 3.8+; sent into the sandbox with the runner's text
(``trl_sandbox.judge.io_verdict``). Everything here works on bytes, which is what a program prints:
no decoding (output that is not UTF-8 is compared as it is), and only ASCII counts as a digit, a
letter or whitespace (``bytes.split``, ``bytes.lower`` and the patterns below), so no Unicode
digit, full-width sign or odd space is read as a number.

Comparison never raises on what a program prints: a verdict lost to an exception would cost the
program its partial credit. No token goes through ``int()``, which refuses more than 4300 digits,
and a token reaches ``float()`` only when it is a plain decimal number (``float()`` alone would
take ``1_000``, ``infinity`` or ``nan``).
"""

import re

# A plain decimal integer and a plain decimal real, ASCII only: no ``_``, no ``0x``, no ``inf``/``nan``.
INTEGER = re.compile(rb"[+-]?[0-9]+\Z")
REAL = re.compile(rb"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")
DEFAULT_TOLERANCE = 1e-5

# A checker's convention: the files it is given, in the order of its arguments (each the test's
# input, the program's output or the test's answer), and how it says yes or no (``checker_verdict``).
CHECKER_CONTRACTS = {
    # testlib (Codeforces' own checkers): ``checker input output answer``; exit 0 accepts, 1 or 2 rejects.
    "testlib": (("input.txt", "input"), ("output.txt", "output"), ("answer.txt", "answer")),
    # open-r1's Codeforces harness: ``checker.py input correct_output solution_output``; it prints
    # ``1`` (accepts) or ``0`` (rejects) and exits 0.
    "open-r1": (("input.txt", "input"), ("correct_output.txt", "answer"), ("solution_output.txt", "output")),
}


def _real(token):
    """The finite value of a plain decimal ``token``, else None (a huge exponent is no number)."""
    if REAL.match(token) is None:
        return None
    value = float(token)
    return value if abs(value) != float("inf") else None


def same_token(got, want, tolerance):
    """One token: the answer's integers are their own text (``00000101`` is not ``101``, nor ``+7``
    ``7``: a padded number or a binary string is another answer, as testlib reads it); the answer's
    real numbers match any plain decimal within ``tolerance``, absolute or relative (``3`` for
    ``3.0``); any other word matches case-insensitively."""
    if got == want:
        return True
    if INTEGER.match(want) is not None:
        return False
    expected = _real(want)
    if expected is not None:
        value = _real(got)
        return value is not None and abs(value - expected) <= tolerance * max(1.0, abs(expected))
    return got.lower() == want.lower()


def same_tokens(got, want, tolerance=DEFAULT_TOLERANCE):
    """Whitespace-separated tokens, as many as the answer has, each matched by ``same_token``."""
    a, b = got.split(), want.split()
    if len(a) != len(b):
        return False
    if a == b:  # the common case of a right answer, at the speed of a list comparison
        return True
    for x, y in zip(a, b):
        if x != y and not same_token(x, y, tolerance):
            return False
    return True


def same_lines(got, want):
    """Line by line, each line stripped, trailing empty lines ignored."""
    a = [line.strip() for line in got.splitlines()]
    b = [line.strip() for line in want.splitlines()]
    while a and not a[-1]:
        a.pop()
    while b and not b[-1]:
        b.pop()
    return a == b


def same_output(got, want, compare):
    """``got`` (what the program printed) against ``want`` under the task's mode: ``exact``,
    ``lines``, ``tokens`` or ``float:TOL`` (the host has checked the mode and its tolerance)."""
    if compare == "exact":
        return got == want
    if compare == "lines":
        return same_lines(got, want)
    tolerance = float(compare[6:]) if compare.startswith("float:") else DEFAULT_TOLERANCE
    return same_tokens(got, want, tolerance)


def contract_files(contract, test_input, output, answer):
    """The checker's files, in the order of its arguments under ``contract``."""
    data = {"input": test_input, "output": output, "answer": answer}
    return [(name, data[role]) for name, role in CHECKER_CONTRACTS[contract]]


def checker_verdict(contract, exit_code, stdout):
    """``AC`` or ``WA`` from a checker run that ended with ``exit_code`` (None: killed, timed out or
    flooded) and printed ``stdout``; None when the checker failed instead of deciding."""
    if exit_code is None:
        return None
    if contract == "open-r1":
        said = stdout.strip() if exit_code == 0 else None
        return "AC" if said == b"1" else "WA" if said == b"0" else None
    return "AC" if exit_code == 0 else "WA" if exit_code in (1, 2) else None

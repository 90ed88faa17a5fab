"""The I/O judge's comparison of outputs and its reading of checkers (``trl_sandbox.judge.io_compare``),
attacked with what a model being trained could print, each attack next to the right answer that
passes. The comparison runs in the sandbox's Python, so the attacks run on every Python the judge
may meet (3.8 and 3.12 where pyenv has them), through the very text the judge sends."""

from __future__ import annotations

import glob
import json
import os
import random
import subprocess
import sys
import time

import pytest

from trl_sandbox.judge.io_compare import checker_verdict, contract_files, same_output
from trl_sandbox.judge.io_verdict import IO_SOURCE

# (output, answer, mode, same): every attack sits beside the output that passes.
CASES = [
    # An integer in the answer is its own text (testlib's reading), however near the value.
    (b"00000101", b"00000101", "tokens", True),
    (b"101", b"00000101", "tokens", False),
    (b"3", b"3", "tokens", True),
    (b"+00003", b"3", "tokens", False),
    (b"+7", b"7", "tokens", False),
    (b"0", b"0", "tokens", True),
    (b"-000", b"0", "tokens", False),
    (b"-0", b"0", "tokens", False),
    (b"3.0", b"3", "tokens", False),
    (b"1e18", b"1000000000000000000", "tokens", False),
    (b"1000000000000000003", b"1000000000000000003", "tokens", True),
    (b"1000000000000000000", b"1000000000000000003", "float:1", False),  # no tolerance for integers
    # Tokens that Python's int() or float() would take, or that made them raise: never a number.
    (b"+-4", b"4", "tokens", False),
    (b"--4", b"4", "tokens", False),
    (b"0x4", b"4", "tokens", False),
    (b"4_0", b"40", "tokens", False),
    ("٣".encode(), b"3", "tokens", False),  # ARABIC-INDIC DIGIT THREE: str.isdigit() and int() take it
    ("３".encode(), b"3", "tokens", False),  # FULLWIDTH DIGIT THREE
    (b"\xff\xfe", b"3", "tokens", False),  # not UTF-8
    (b"9" * 5000, b"9" * 5000, "tokens", True),  # past int()'s 4300 digits
    (b"9" * 4999 + b"8", b"9" * 5000, "tokens", False),
    (b"1" + b"0" * 5000, b"1e5000", "tokens", False),
    # A real number in the answer: any plain decimal within the tolerance, absolute or relative.
    (b"3", b"3.0", "tokens", True),
    (b"3.000001", b"3.0", "tokens", True),
    (b"3.1", b"3.0", "tokens", False),
    (b"0.3333333", b"0.333333333", "tokens", True),
    (b"1000000.5", b"1000000.0", "tokens", True),
    (b"2.5e-1", b"0.25", "tokens", True),
    (b"3." + b"0" * 100000, b"3.0", "tokens", True),
    (b"nan", b"3.0", "tokens", False),
    (b"NaN", b"0.5", "tokens", False),
    (b"-nan", b"0.5", "tokens", False),
    (b"inf", b"1e308", "tokens", False),
    (b"infinity", b"1.0", "tokens", False),
    (b"1e99999", b"3.0", "tokens", False),
    (b"-1e99999", b"-3.0", "tokens", False),
    (b"1e" + b"9" * 5000, b"3.0", "tokens", False),
    (b"3_0.0", b"30.0", "tokens", False),
    (b"0x1p1", b"2.0", "tokens", False),
    ("٣.0".encode(), b"3.0", "tokens", False),
    (b"+-3.0", b"3.0", "tokens", False),
    (b"3.0.0", b"3.0", "tokens", False),
    (b"1e400", b"1e400", "tokens", True),  # an answer past a float is its own text
    (b"1e401", b"1e400", "tokens", False),
    (b"nan", b"nan", "tokens", True),  # a word in the answer: the same word, nothing else
    (b"0.5", b"nan", "tokens", False),
    (b"0.1001", b"0.1", "float:1e-3", True),
    (b"0.102", b"0.1", "float:1e-3", False),
    (b"0.1", b"0.1", "float:0", True),
    (b"0.1000001", b"0.1", "float:0", False),
    (b"12345", b"0.5", "float:1e400", True),  # a tolerance past a float accepts any real, never raises
    (b"nan", b"0.5", "float:1e400", False),
    # Words: ASCII case-insensitive, bytes as printed.
    (b"YES", b"yes", "tokens", True),
    (b"YEP", b"yes", "tokens", False),
    (b"\xff\xfe", b"\xff\xfe", "tokens", True),
    (b"\xc3\x89", b"\xc3\xa9", "tokens", False),  # É is not é: only ASCII letters fold
    # Layout: whitespace is ASCII whitespace; the whole answer, nothing more.
    (b"  3 \n\n 4", b"3 4\n", "tokens", True),
    (b"3\xc2\xa04", b"3 4", "tokens", False),  # a no-break space separates nothing
    (b"3", b"3 4", "tokens", False),
    (b"3 4 5", b"3 4", "tokens", False),
    (b"", b"3", "tokens", False),
    (b"3 \n4\n\n", b"3\n4", "lines", True),
    (b"3\n4\n", b"3\n4\n5\n", "lines", False),
    (b"3\n", b"3", "exact", False),
]


@pytest.mark.parametrize(("got", "want", "mode", "same"), CASES, ids=lambda v: repr(v)[:40] if isinstance(v, bytes) else None)
def test_hostile_tokens_and_their_right_answers(got, want, mode, same):
    assert same_output(got, want, mode) is same


ALPHABET = [b"0", b"1", b"9", b"+", b"-", b".", b"e", b"E", b"_", b"x", b"n", b"a", b"i", b"f", b" ", b"\n", b"\t",
            b"\xff", "٣".encode(), b"\x00", b"\r", b"\x0c", b"inf", b"nan", b"9" * 4400]
MODES = ["tokens", "lines", "exact", "float:1e-6", "float:0", "float:1e400"]


def _fuzz_pairs(count, seed):
    rng = random.Random(seed)
    for _ in range(count):
        yield (b"".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 12))),
               b"".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 12))), rng.choice(MODES))


def test_comparison_never_raises_on_any_output():
    for got, want, mode in _fuzz_pairs(20000, seed=3):
        assert same_output(got, want, mode) in (True, False)
        assert same_output(want, want, mode) is True  # positive control: the answer itself always passes


def test_comparison_stays_fast_on_large_outputs():
    exact = b" ".join(b"%d" % i for i in range(1_000_000))
    reals = b"\n".join(b"%.9f" % (i / 7) for i in range(200_000))
    printed = b"\n".join(b"%.7f" % (i / 7) for i in range(200_000))  # every token differs in text
    start = time.perf_counter()
    assert same_output(exact, exact, "tokens") and same_output(printed, reals, "tokens")
    assert not same_output(exact.replace(b" 999999", b" 0999999"), exact, "tokens")
    assert time.perf_counter() - start < 10  # about 0.5 s unloaded


def test_each_checker_contract_gives_its_files_in_its_order_and_reads_its_verdict():
    assert contract_files("testlib", b"i", b"o", b"a") == [("input.txt", b"i"), ("output.txt", b"o"), ("answer.txt", b"a")]
    assert contract_files("open-r1", b"i", b"o", b"a") == [("input.txt", b"i"), ("correct_output.txt", b"a"),
                                                           ("solution_output.txt", b"o")]
    testlib = [(0, b""), (1, b""), (2, b""), (3, b""), (7, b""), (None, b"")]
    assert [checker_verdict("testlib", *r) for r in testlib] == ["AC", "WA", "WA", None, None, None]
    # open-r1's checkers exit 0 whatever they decide: read as testlib's, every output would pass.
    open_r1 = [(0, b"1\n"), (0, b"0\n"), (0, b""), (0, b"1 1"), (0, b"yes"), (1, b"1"), (None, b"1")]
    assert [checker_verdict("open-r1", *r) for r in open_r1] == ["AC", "WA", None, None, None, None, None]
    assert checker_verdict("testlib", 0, b"0\n") == "AC"  # the attack's means: the wrong contract accepts a "0"


_PROBE = """
import json, sys
namespace = {"__name__": "sent"}
exec(sys.stdin.read(), namespace)
with open(sys.argv[1]) as fh:
    cases, fuzz = json.load(fh)
same = namespace["same_output"]
b = lambda text: text.encode("latin-1")
print(json.dumps({"cases": [same(b(g), b(w), m) for g, w, m in cases],
                  "fuzz": [same(b(g), b(w), m) for g, w, m in fuzz]}))
"""


def _interpreters():
    """This Python and the oldest and newest the judge is tested on, where pyenv has them."""
    found = [sys.executable]
    for version in ("3.8", "3.12"):
        found += sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python")))[-1:]
    return found


@pytest.mark.parametrize("python", _interpreters(), ids=lambda path: path.split("/versions/")[-1].split("/")[0])
def test_the_sent_comparison_decides_alike_on_every_python(python, tmp_path):
    """The sent judge's text (not the host's module) on ``python``: the same verdicts, no exception."""
    cases = [(g.decode("latin-1"), w.decode("latin-1"), m) for g, w, m, _ in CASES]
    fuzz = [(g.decode("latin-1"), w.decode("latin-1"), m) for g, w, m in _fuzz_pairs(3000, seed=4)]
    (tmp_path / "cases.json").write_text(json.dumps([cases, fuzz]))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    run = subprocess.run([python, "-I", "-S", "-c", _PROBE, str(tmp_path / "cases.json")], input=IO_SOURCE,
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout)
    assert got["cases"] == [same for *_, same in CASES]
    assert got["fuzz"] == [same_output(g.encode("latin-1"), w.encode("latin-1"), m) for g, w, m in fuzz]

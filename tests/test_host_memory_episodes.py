"""What a multi-turn episode's observations cost the host: bounded bytes, whatever the commands print.

An observation (a tool call's answer) stays in the conversation for the rest of the episode. A
command may write 16 MiB of undecodable bytes to each stream and a file may be 64 MiB: the answer
must be at most ``max_output_chars`` bytes of UTF-8 with a ``... [N bytes cut] ...`` marker, and
building it must not cost the host another copy of the flood (joining the two decoded streams,
decoding a whole file with ``errors="replace"``). Real local sandboxes; ``tracemalloc`` measures
the host's Python heap, and each control measures the old way of building the same answer.
"""

from __future__ import annotations

import gc
import re
import tracemalloc

import pytest

from trl_sandbox import load_tasks
from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.sandbox import ExecResult
from trl_sandbox.scoring.scorer import Scorer
from trl_sandbox.training.environment import SandboxEnvironment
from trl_sandbox.training.episode_parts import _render

MIB = 1 << 20
LIMIT = 4000

FLOOD = ("python3 -c \"import os; os.write(1, b'head' + b'\\xff' * ({mib} << 20) + b'tail'); "
         "os.write(2, b'E' + b'\\xfe' * ({mib} << 20) + b'Z')\"")


@pytest.fixture(scope="module")
def episode():
    with SandboxPool.open("local", size=3) as pool:
        env = SandboxEnvironment(pool=pool, scorer=Scorer(pool, cache_size=0), tool_timeout=20,
                                 max_output_chars=LIMIT)
        env.reset(**dict(load_tasks("builtin", task_ids=["max_subarray"])[0]))
        try:
            yield env
        finally:
            env.get_reward()


def _utf8(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _cut(text: str) -> int:
    return sum(int(n) for n in re.findall(r"\.\.\. \[(\d+) bytes cut\] \.\.\.", text))


def test_flooding_commands_leave_bounded_observations(episode):
    """Ten commands that each print 2 x 4 MiB of undecodable bytes: every answer is at most
    ``LIMIT`` bytes of output (old: 4,000 characters, 12,000 bytes of U+FFFD), shows both streams'
    heads and tails, says how much it cut, and the ten kept answers hold under 200 KiB of heap."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        answers = [episode.bash(FLOOD.format(mib=4)) for _ in range(10)]  # kept, as the conversation keeps them
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    for answer in answers:
        header, _, output = answer.partition("\n")
        assert header == "[exit code 0]"
        assert _utf8(output) <= LIMIT, _utf8(output)
        assert output.startswith("head\ufffd") and "\ufffdtail\nE\ufffd" in output and output.endswith("\ufffdZ")
        assert _cut(output) > 2 * 4 * MIB  # U+FFFD is 3 bytes of UTF-8: the cut counts the text's bytes
    assert kept < 200 * 1024, f"{kept / 1024:.0f} KiB kept for ten answers"


def test_building_an_answer_costs_no_copy_of_the_flood():
    """``_render`` of 2 x 16 MiB of decoded output allocates a few KiB; control: joining the two
    streams, as the old answer did first, allocates 64 MiB more."""
    flood = ExecResult(0, stdout="\ufffd" * (16 * MIB), stderr="\ufffd" * (16 * MIB))
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        answer = _render(flood, LIMIT)
        peak = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.reset_peak()
        joined = flood.stdout + "\n" + flood.stderr  # the control: the old first step
        control = tracemalloc.get_traced_memory()[1] - base
        del joined
    finally:
        tracemalloc.stop()
    assert _utf8(answer) <= LIMIT + len("[exit code 0]\n")
    assert peak < 2 * MIB, f"{peak / MIB:.1f} MiB to build the answer"
    assert control > 60 * MIB, f"control: only {control / MIB:.1f} MiB"


def test_reading_a_huge_file_decodes_only_what_is_shown(episode):
    """A 24 MiB file of undecodable bytes: ``read_file`` answers ``LIMIT`` bytes with both ends and
    the marker, and the host's peak is what the provider's read costs (the bytes, twice, in the
    local provider) plus little (old: their decoded 48 MiB on top). 
    Control: decoding the same bytes whole."""
    episode.bash("python3 -c \"open('big', 'wb').write(b'A' + b'\\xff' * (24 << 20) + b'B')\"")
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        answer = episode.read_file("big")
        peak = tracemalloc.get_traced_memory()[1] - base
        data = b"A" + b"\xff" * (24 * MIB) + b"B"
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        whole = data.decode(errors="replace")  # the control: the old decoding
        control = tracemalloc.get_traced_memory()[1] - before
        del whole, data
    finally:
        tracemalloc.stop()
    assert _utf8(answer) <= LIMIT and answer.startswith("A\ufffd") and answer.endswith("\ufffdB")
    assert _cut(answer) > 24 * MIB - LIMIT  # counted in the file's bytes
    assert peak < 2 * 24 * MIB + 8 * MIB, f"{peak / MIB:.1f} MiB to answer"
    assert control > 40 * MIB, f"control: only {control / MIB:.1f} MiB"


def test_small_output_is_shown_whole(episode):
    """Control: what fits is left alone, byte for byte."""
    assert episode.bash("printf 'h\\303\\251llo'; printf 'err' >&2") == "[exit code 0]\nhéllo\nerr"
    episode.write_file("small.txt", "x😀y")
    assert episode.read_file("small.txt") == "x😀y"


@pytest.mark.parametrize("limit", range(4090, 4102))
def test_a_surrogate_pair_is_never_split(limit):
    """Text decoded with ``surrogatepass`` holds a character beyond the BMP as two surrogates: a
    cut between them would leave two lone halves. Control: the plain cut at that byte count does
    split some of these limits' pairs."""
    from trl_sandbox.scoring.clip import _utf8_prefix, clip_text

    text = "\ud83d\ude00" * 50_000
    clipped = clip_text(text, limit)
    head, _, rest = clipped.partition("\n... [")
    cut, _, tail = rest.partition(" bytes cut] ...\n")
    assert len(head) % 2 == 0 and len(tail) % 2 == 0 and _utf8(clipped) <= limit
    assert int(cut) == _utf8(text) - _utf8(head) - _utf8(tail)
    split = [n for n in range(2040, 2052) if len(_utf8_prefix(text, n)) % 2]
    assert split  # the control: byte-exact prefixes alone end inside a pair


@pytest.mark.parametrize("data", [b"\xff" * 100_000, "é".encode() * 100_000, b"a" * 100_000,
                                  "😀".encode() * 30_000, b"\xed\xa0\x80" * 40_000])
def test_clip_bytes_cuts_between_sequences_and_counts_the_bytes_left_out(data):
    from trl_sandbox.scoring.clip import clip_bytes

    shown = clip_bytes(data, LIMIT)
    head, _, rest = shown.partition("\n... [")
    cut, _, tail = rest.partition(" bytes cut] ...\n")
    assert _utf8(shown) <= LIMIT and head and tail
    # Each side is a whole decoding of a slice of ``data`` that starts or ends a sequence.
    assert data.decode("utf-8", "replace").startswith(head) and data.decode("utf-8", "replace").endswith(tail)
    assert clip_bytes(data[:1000], LIMIT) == data[:1000].decode("utf-8", "replace")
    assert 0 < int(cut) < len(data)

"""What a program can find in its own memory: nothing of any stdin it did not read itself.

The judge sends a fresh nonce and (for hidden-test datasets) the tests on stdin. The fork
server must never hold those bytes in memory that a forked program inherits, or a program could
scan its own address space for them (ctypes or /proc/self/mem) and forge a verdict.
"""

from __future__ import annotations

import asyncio
import os

from trl_sandbox import SandboxSpec
from trl_sandbox.local import LocalProvider

SCAN = r"""
import sys
# The needles are never built whole in this process (that would put them in its memory):
# each comes as two halves, and a find is the first half directly followed by the second.
pairs = [(bytes.fromhex(sys.argv[i]), bytes.fromhex(sys.argv[i + 1])) for i in range(1, len(sys.argv), 2)]
found = []
with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
    for line in maps:
        addr, perms = line.split()[:2]
        if "r" not in perms or "[vvar" in line or "[vsyscall" in line:
            continue
        lo, hi = (int(x, 16) for x in addr.split("-"))
        try:
            mem.seek(lo)
            chunk = mem.read(hi - lo)
        except OSError:
            continue
        for index, (head, tail) in enumerate(pairs):
            at = chunk.find(head)
            while at >= 0:
                if chunk.startswith(tail, at + len(head)):
                    found.append(str(index))
                    break
                at = chunk.find(head, at + 1)
print(" ".join(sorted(set(found))) or "none")
"""


def test_a_program_cannot_find_stdin_it_never_read_in_its_memory():
    async def scenario():
        provider = LocalProvider()
        sandbox = await provider.create(SandboxSpec())
        try:
            earlier = b"EARLIER-SECRET-" + os.urandom(16).hex().encode()
            current = b"CURRENT-SECRET-" + os.urandom(16).hex().encode()
            # A previous execution of the same sandbox got a secret on stdin ...
            first = await sandbox.exec(["python3", "-c", "import sys; sys.stdin.buffer.read()"],
                                       stdin=earlier, timeout=10)
            assert first.exit_code == 0
            # ... and this one gets another, which it does not read: it scans its memory instead.
            halves = [h.hex() for secret in (earlier, current) for h in (secret[:20], secret[20:])]
            result = await sandbox.exec(["python3", "-c", SCAN, *halves], stdin=current, timeout=20)
            return result, earlier, current
        finally:
            await provider.aclose()

    result, earlier, current = asyncio.run(scenario())
    assert result.exit_code == 0, result.stderr
    # "0": the earlier execution's stdin was found; "1": this execution's unread stdin was found.
    assert result.stdout.split() == ["none"], f"found in memory: {result.stdout}"


PRINT_SECRET = r"""
import os
secret = ("OUTPUT-SECRET-" + os.urandom(16).hex()).encode()
os.write(1, secret + b"\n")
os.write(2, secret.replace(b"OUTPUT", b"ERRORS") + b"\n")
"""


def test_a_program_cannot_find_an_earlier_programs_output_in_its_memory():
    from trl_sandbox.judge.verdict import build_program, check_outcome, check_spec

    async def scenario():
        provider = LocalProvider()
        sandbox = await provider.create(SandboxSpec())
        try:
            # The secrets are made inside the sandbox: only the output carries them out.
            printed = await sandbox.exec(["python3", "-c", PRINT_SECRET], timeout=10)
            out = printed.stdout.strip().encode()
            err = printed.stderr.strip().encode()
            # A judged program: its verdict line (with its nonce) and its candidate's prints.
            program = build_program("import os\nos.write(2, b'CANDIDATE-' + os.urandom(16).hex().encode())\n"
                                    "def f(x):\n    return x\n", check_spec(["assert f(1) == 1"], bind=["f"]),
                                    limit_s=2.0)
            nonce = os.urandom(16)
            judged = await sandbox.exec(list(program.argv), stdin=nonce + program.stdin, timeout=program.timeout)
            assert check_outcome(judged, nonce, 1).status == "passed", judged
            printed_by_candidate = judged.stderr.strip().encode()
            # Control: what the fork server does hold is found: a -c source run twice, whose code
            # (with the string) its compile cache keeps.
            source = b"SOURCE-SECRET-" + os.urandom(16).hex().encode()
            for _ in range(2):
                await sandbox.exec(["python3", "-c", f"x = {source.decode()!r}"], timeout=10)
            await sandbox.reset()  # a new lease
            needles = (out, err, nonce.hex().encode(), printed_by_candidate, source)
            halves = [h.hex() for secret in needles for h in (secret[:16], secret[16:])]
            result = await sandbox.exec(["python3", "-c", SCAN, *halves], timeout=30)
            return result, printed_by_candidate
        finally:
            await provider.aclose()

    result, printed_by_candidate = asyncio.run(scenario())
    assert result.exit_code == 0, result.stderr
    assert printed_by_candidate.startswith(b"CANDIDATE-"), printed_by_candidate
    # 0-3: the outputs, the verdict's nonce, the candidate's prints; 4: the -c source (the control).
    assert result.stdout.split() == ["4"], f"found in memory: {result.stdout}"


def test_a_program_cannot_find_an_earlier_leases_files_in_its_memory():
    async def scenario():
        provider = LocalProvider()
        sandbox = await provider.create(SandboxSpec())
        try:
            # Files of some kilobytes: a copy of that size, once in the supervisor's memory, stays
            # there after it is freed (a copy of a few bytes is soon overwritten).
            written = b"WRITTEN-SECRET-" + os.urandom(16).hex().encode()
            await sandbox.write_file("solution.py", written * 500)
            # A file a program made, which the host then reads.
            await sandbox.exec(["python3", "-c", "import os\nopen('made.txt', 'wb').write(b'MADE-SECRET-' + "
                                "os.urandom(16).hex().encode() * 500)"], timeout=10)
            made = (await sandbox.read_file("made.txt"))[:44]
            assert await sandbox.read_file("solution.py") == written * 500
            # Control: a -c source run twice stays in the fork server's compile cache, and is found.
            source = b"SOURCE-SECRET-" + os.urandom(16).hex().encode()
            for _ in range(2):
                await sandbox.exec(["python3", "-c", f"x = {source.decode()!r}"], timeout=10)
            await sandbox.reset()
            halves = [h.hex() for secret in (written, made, source) for h in (secret[:16], secret[16:])]
            result = await sandbox.exec(["python3", "-c", SCAN, *halves], timeout=30)
            # The channel stays in step after a write the supervisor refuses (through a symlink a
            # program left, out of the work directory), its contents still on the channel.
            await sandbox.exec(["python3", "-c", "import os; os.symlink('/tmp/out', 'link')"], timeout=10)
            refused = None
            try:
                await sandbox.write_file("link", b"x" * 100_000)
            except OSError as exc:
                refused = exc
            assert refused is not None and "escapes the work directory" in str(refused), refused
            after = await sandbox.exec(["python3", "-c", "print('still in step')"], timeout=10)
            return result, made, after
        finally:
            await provider.aclose()

    result, made, after = asyncio.run(scenario())
    assert made.startswith(b"MADE-SECRET-") and after.stdout == "still in step\n", (made, after)
    assert result.exit_code == 0, result.stderr
    # 0: what the host wrote, 1: what it read back; 2: the -c source (the control).
    assert result.stdout.split() == ["2"], f"found in memory: {result.stdout}"

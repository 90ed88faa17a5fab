"""Issue 36's hostile programs about what surrounds a lease: the shell's own path around the
launcher (Daytona's stderr file), output without end, the file operations, the launcher's tag, the
settings, and a writer that outlives its program (each check next to its control; public through
``attacks``)."""

from __future__ import annotations

from trl_sandbox.plugins.testing.kit import ProviderFactory, closing, run, run_programs
from trl_sandbox.sandbox import ExecResult, ResourceLimits, SandboxSpec

# -- 1 and 5: the shell's own path around the launcher -------------------------------------------

_BREAK_PATH = r"""
import os, stat, sys, time
parent = os.path.dirname(os.getcwd())
os.rename(parent, parent + '.gone')
with open(parent, 'w') as fh:
    fh.write('not a directory')
fifos = 0
for _ in range(20):  # every launcher file in reach, now or while we run, becomes a FIFO
    for d in ('/tmp', '/var/tmp', '/dev/shm', parent + '.gone'):
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            path = os.path.join(d, name)
            if name.startswith('.trl') and not stat.S_ISFIFO(os.lstat(path).st_mode):
                try:
                    os.rename(path, path + '.x')
                    os.mkfifo(path)
                    fifos += 1
                except OSError:
                    pass
    time.sleep(0.02)
print('broke', file=sys.stderr)
print('left')
"""
_HONEST = "import sys; print(sys.stdin.read()[::-1]); print('to stderr', file=sys.stderr)"


def check_the_next_lease_survives_a_broken_path(make: ProviderFactory) -> list[ExecResult]:
    """A program moves its work directory's parent away and leaves a file in its place, and turns
    every launcher file it finds into a FIFO: its own exec still ends (no hang), and the next
    program on that sandbox, after the reset, gets exactly its own result (stdout, stderr, stdin).
    The positive control is that next program: before the fix it scored ``error`` there for the
    sandbox's whole life."""
    p = make()

    async def go() -> list[ExecResult]:
        sandbox = await p.create(SandboxSpec())
        out = [await sandbox.exec(["python3", "-c", _BREAK_PATH], timeout=5)]
        await sandbox.reset()
        out.append(await sandbox.exec(["python3", "-c", _HONEST], stdin="olleh", timeout=5))
        out.append(await sandbox.exec(["python3", "-c", _HONEST], stdin="olleh", timeout=5))
        return out

    attack, *honest = run(closing(p, go()))
    assert (attack.exit_code, attack.stdout, attack.stderr) == (0, "left\n", "broke\n"), attack
    for result in honest:
        assert (result.exit_code, result.stdout, result.stderr) == (0, "hello\n", "to stderr\n"), result
    return [attack, *honest]


# -- 8 and 9: output without end, output past the file-size limit -------------------------------

_FLOOD = r"""
import os, sys
n = int(sys.argv[1])
block = b'x' * (1 << 20)
for _ in range(n):
    os.write(1, block)
    os.write(2, block)
"""


def check_output_is_bounded_in_the_sandbox(make: ProviderFactory, *, mib: int = 48) -> list[ExecResult]:
    """A program writes ``mib`` MiB to each stream under a 1 MiB output cap and a 2 MiB file-size
    limit: it runs to its end (its stderr never counts against its own file-size limit), each
    stream comes back cut at the cap and marked truncated. Controls: 3 MiB of stderr under a 16
    MiB cap come back whole although the file-size limit is 2 MiB, and that limit holds for a file
    the program writes itself."""
    limits = ResourceLimits(output_bytes=1 << 20, file_size_mb=2)
    flood, = run(run_programs(make, ["python3", "-c", _FLOOD, str(mib)], spec=SandboxSpec(limits=limits), timeout=30))
    assert flood.exit_code == 0 and flood.truncated, (flood.exit_code, flood.truncated, flood.stderr[-200:])
    assert len(flood.stdout) == len(flood.stderr) == 1 << 20, (len(flood.stdout), len(flood.stderr))
    whole = ResourceLimits(file_size_mb=2)
    file_write = "open('big', 'wb').write(b'x' * (3 << 20))"
    loud, capped = run(run_programs(make, ["python3", "-c", "import sys; sys.stderr.write('e' * (3 << 20))"],
                            ["python3", "-c", file_write], spec=SandboxSpec(limits=whole)))
    assert loud.exit_code == 0 and loud.stderr == "e" * (3 << 20) and not loud.truncated, (
        loud.exit_code, len(loud.stderr), loud.stdout[-300:])
    assert capped.exit_code != 0, f"control: the file-size limit did not hold: {capped!r}"
    return [flood, loud, capped]


# -- 6: file operations --------------------------------------------------------------------------

_PLANT = r"""
import os
for target, name in (('/dev/shm', 'shm'), ('/tmp', 'tmp'), ('/etc/hostname', 'host'), ('/', 'root'),
                     ('/dev/shm/.trl-sandbox-lease/pid', 'pid')):
    os.symlink(target, name)
os.mkfifo('fifo')
os.mkdir('real')
os.symlink('../shm', 'real/up')
print('planted')
"""
_LOOK = ("import os; print(sorted(n for d in ('/dev/shm', '/tmp') for n in os.listdir(d) if n.startswith('planted')),"
         " open('sub/dir/f.txt').read())")


def check_file_operations_stay_in_the_work_dir(make: ProviderFactory, *, fifo: bool = True) -> dict[str, object]:
    """``write_file``/``read_file`` refuse a path outside the work directory (``ValueError``)
    and a symbolic link a program planted on the way (``PermissionError``): never the resident's
    directory, ``/tmp``, ``/dev/shm`` or ``/etc`` through them, and a FIFO in the work dir neither
    blocks nor is written (``fifo=False`` leaves that out: a provider that opens it hangs). Control:
    an honest file in a new subdirectory is written, read back and seen by a program."""
    p = make()

    async def go() -> dict[str, object]:
        sandbox = await p.create(SandboxSpec())
        out: dict[str, object] = {}
        for path in ("/etc/trl-planted", "../planted", "/dev/shm/planted", "sub/../../planted"):
            for op in ("write", "read"):
                try:
                    await (sandbox.write_file(path, b"x") if op == "write" else sandbox.read_file(path))
                    out[f"{op} {path}"] = "done"
                except ValueError:
                    out[f"{op} {path}"] = "refused"
        planted = await sandbox.exec(["python3", "-c", _PLANT], timeout=10)
        assert planted.stdout == "planted\n", planted
        for path in ("shm/planted", "tmp/planted", "pid", "root/tmp/planted", "real/up/planted", "fifo")[:6 if fifo else 5]:
            try:
                await sandbox.write_file(path, b"1\n")
                out[f"write {path}"] = "done"
            except Exception as exc:  # noqa: BLE001 - only a refusal (an OSError) passes below
                out[f"write {path}"] = type(exc).__name__
        for path in ("host", "pid", "root/etc/hostname", "fifo")[:4 if fifo else 3]:
            try:
                await sandbox.read_file(path)
                out[f"read {path}"] = "done"
            except Exception as exc:  # noqa: BLE001 - only a refusal (an OSError) passes below
                out[f"read {path}"] = type(exc).__name__
        await sandbox.write_file("sub/dir/f.txt", b"honest")
        out["honest"] = await sandbox.read_file("sub/dir/f.txt")
        out["look"] = (await sandbox.exec(["python3", "-c", _LOOK], timeout=10)).stdout
        return out

    out = run(closing(p, go()))
    honest, look = out.pop("honest"), out.pop("look")
    through = {k: v for k, v in out.items() if v not in ("refused", "PermissionError", "OSError")}
    assert not through, f"not refused: {through}"
    assert look == "[] honest\n" and honest == b"honest", f"control, or written through a link: {look!r} {honest!r}"
    return out


# -- 10: the launcher's tag ----------------------------------------------------------------------

_FORGE = r"""
import os, re, sys
found = set()
pattern = re.compile(rb"trl-sandbox-lease:([0-9a-f]{16})|'tag': '([0-9a-f]{16})'")
for pid in [p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()]:
    for what in ('cmdline', 'environ'):
        try:
            with open(f'/proc/{pid}/{what}', 'rb') as fh:
                found.update(a or b for a, b in pattern.findall(fh.read()))
        except OSError:
            pass
    try:
        with open(f'/proc/{pid}/maps') as maps, open(f'/proc/{pid}/mem', 'rb', 0) as mem:
            for line in maps:
                span, perms = line.split()[:2]
                start, end = (int(x, 16) for x in span.split('-'))
                if perms[0] == 'r' and end - start < (64 << 20):
                    try:
                        mem.seek(start)
                        found.update(a or b for a, b in pattern.findall(mem.read(end - start)))
                    except (OSError, ValueError, OverflowError):
                        pass
    except OSError:
        pass
for tag in found:
    print(f'[trl-sandbox-lease:{tag.decode()}:failed] forged by the program')
print('found', len(found))
sys.exit(125 if found else 1)
"""


def check_the_launchers_tag_stays_hidden(make: ProviderFactory) -> ExecResult:
    """A failing program looks for the launcher's tag wherever it may read (every process's
    command line, environment and memory) and prints the launcher's failure line with each tag it
    found: it must find none, and its result is its own (exit 1), never a lost sandbox. Control:
    the same program finds a tag that a process of its own carries in its command line, and the
    failure line it prints with it stays its own output (exit 125, not a lost sandbox)."""
    decoy = ("python3 -c 'import time; time.sleep(3)' trl-sandbox-lease:0123456789abcdef & sleep 0.3; "
             'exec python3 -c "$0"')
    result, control = run(run_programs(make, ["python3", "-c", _FORGE], ["sh", "-c", decoy, _FORGE], timeout=20))
    assert (result.exit_code, result.stdout) == (1, "found 0\n"), result
    assert control.exit_code == 125 and control.stdout == (
        "[trl-sandbox-lease:0123456789abcdef:failed] forged by the program\nfound 1\n"), f"control: {control!r}"
    return result


# -- 11: settings that cannot work together --------------------------------------------------------


def check_every_setting_keeps_its_sandbox(make: ProviderFactory, *, programs: int = 4) -> dict[str, int]:
    """A pool of one runs ``programs`` programs with a reset after each, with the settings ``make``
    gives (e.g. ``isolation=sweep`` with the resident launcher's default): every lease is cleaned in
    the same sandbox, none is replaced and none fails. Returns the pool's counts."""
    from trl_sandbox.plugins.testing.kit import FAST
    from trl_sandbox.pool.sandbox_pool import SandboxPool

    with SandboxPool.open(make(), size=1, spec=SandboxSpec(), pool_settings=FAST) as pool:
        seen = [pool.run(["python3", "-c", "import os; open('/dev/shm/mine', 'x'); print('ok')"], timeout=10).stdout
                for _ in range(programs)]
        counts = dict(pool.drain_stats().counts)
    assert seen == ["ok\n"] * programs, seen  # each lease found /dev/shm wiped
    assert counts.get("replaced", 0) == 0 and counts.get("infra_errors", 0) == 0, counts
    return counts


# -- the launcher's pipes (added for 8 and 9): a writer that outlives the program ----------------

_WRITER = r"""
import os, sys, time
if os.fork() == 0:
    os.setsid()
    end = time.monotonic() + 30
    while time.monotonic() < end:
        try:
            os.write(1, b'o' * 65536)
            os.write(2, b'e' * 65536)
        except OSError:
            time.sleep(0.01)
    os._exit(0)
time.sleep(0.2)
print('parent done')
"""


def check_a_writer_that_outlives_the_program(make: ProviderFactory) -> list[ExecResult]:
    """A program leaves a process that writes to the inherited stdout and stderr without end, and
    exits: its exec ends within its own limit and a few seconds (never the service's backstop, a
    lost sandbox), and the next program gets exactly its own output. Control: that next one."""
    attack, after = run(run_programs(make, ["python3", "-c", _WRITER], ["python3", "-c", "print('mine')"], timeout=5))
    assert attack.exit_code == 0 and not attack.timed_out, (attack.exit_code, attack.timed_out, len(attack.stdout))
    assert attack.duration_s < 8, f"the exec waited for the leftover writer: {attack.duration_s:.1f} s"
    assert (after.exit_code, after.stdout, after.stderr) == (0, "mine\n", ""), after
    return [attack, after]

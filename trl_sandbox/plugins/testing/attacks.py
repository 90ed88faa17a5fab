"""Hostile programs against a remote lease (issue 36), each next to its control: the daemon's
loopback, the lease init's signals, the kernel's writable interfaces, IPC objects and keys left for
the next lease, the shell's own path around the launcher, and output without end.

Each ``check_*`` takes a provider factory (as the other checks do) and fails with
``AssertionError``. ``without_defence`` takes one of the launcher's defences out (for a plugin's
positive controls: the same attack must then succeed, so the check is known to see it)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

from trl_sandbox.plugins.testing.kit import ProviderFactory, closing, run
from trl_sandbox.sandbox import ExecResult, ResourceLimits, SandboxSpec

# What ``without_defence`` takes out of the launcher's text (only where no resident serves the
# execs: a resident runs the text it was started with).
_DEFENCES = {
    "signals": ("    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)\n    default_signals()\n",
                "    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)\n"),
    "network": ('    private_namespaces(spec.get("network"))\n', '    private_namespaces(True)\n'),
    "proc": ("    seal_proc()\n", "    pass\n"),
    "keyrings": ("        fresh_keyrings()\n", "        pass\n"),
}


@contextlib.contextmanager
def without_defence(name: str) -> Iterator[None]:
    """The launcher without one defence (``signals``, ``network``, ``proc``, ``keyrings``), for
    execs sent with the launcher's text (``resident_launcher=False``)."""
    from trl_sandbox.remote import lease

    old, new = _DEFENCES[name]
    saved = dict(lease.SOURCES)
    for mode, text in saved.items():
        if mode != "probe":
            assert old in text or name in ("network", "proc", "signals") and mode == "sweep", (name, mode)
            lease.SOURCES[mode] = text.replace(old, new, 1)
    try:
        yield
    finally:
        lease.SOURCES.update(saved)


async def _one(make: ProviderFactory, *programs: list[str], spec: SandboxSpec | None = None,
               timeout: float = 10, reset: bool = True) -> list[ExecResult]:
    p = make()

    async def go() -> list[ExecResult]:
        sandbox = await p.create(spec or SandboxSpec())
        out = []
        for argv in programs:
            out.append(await sandbox.exec(argv, timeout=timeout))
            if reset:
                await sandbox.reset()
        return out

    return await closing(p, go())


# -- 2: the daemon's loopback --------------------------------------------------------------------

_REACH = r"""
import socket, sys
try:
    socket.create_connection(('127.0.0.1', int(sys.argv[1])), 2).close()
    print('reached')
except OSError as exc:
    print('refused', exc.errno)
server = socket.socket()
server.bind(('127.0.0.1', 0))
server.listen(1)
client = socket.create_connection(server.getsockname(), 2)
peer, _ = server.accept()
client.sendall(b'own loopback')
print(peer.recv(64).decode())
"""


def check_the_daemons_loopback_is_out_of_reach(make: ProviderFactory, port: int) -> dict[str, ExecResult]:
    """A program without network reaches nothing on the sandbox's loopback (``port``: where the
    service's daemon listens there; on the fakes, their API), yet has a loopback of its own that
    works. Control: with ``SandboxSpec(network=True)`` the same program reaches the daemon (the
    target is real)."""
    argv = ["python3", "-c", _REACH, str(port)]
    (closed,) = run(_one(make, argv))
    (opened,) = run(_one(make, argv, spec=SandboxSpec(network=True)))
    assert closed.exit_code == 0 and closed.stdout.startswith("refused") and closed.stdout.endswith(
        "own loopback\n"), closed
    assert opened.exit_code == 0 and opened.stdout == "reached\nown loopback\n", f"control: {opened!r}"
    return {"closed": closed, "opened": opened}


# -- 4: the lease init's signals -----------------------------------------------------------------

_SIGNAL_INIT = r"""
import os, signal, time
sent = []
for target in sorted({1, os.getppid()}):
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                signal.SIGALRM, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGXCPU, signal.SIGTSTP, signal.SIGCONT):
        try:
            os.kill(target, sig)
            sent.append(sig)
        except OSError:
            pass
time.sleep(0.5)
print('wrong answer', len(sent) > 0)
raise SystemExit(1)
"""


def check_the_lease_init_ignores_what_a_program_sends(make: ProviderFactory) -> list[ExecResult]:
    """A failing program sends every signal it may to PID 1 of its namespace and to its parent
    (``kill -INT 1`` from an agent's shell): its result stays its own failure, neither a lost
    sandbox (``SandboxGoneError``) nor a forged ``timeout`` (SIGALRM). Control: a program that
    really runs past its limit is a timeout."""
    attack, slow = run(_one(make, ["python3", "-c", _SIGNAL_INIT], ["sleep", "5"], timeout=2))
    assert (attack.exit_code, attack.stdout, attack.timed_out) == (1, "wrong answer True\n", False), attack
    assert slow.timed_out and slow.exit_code is None, f"control: {slow!r}"
    return [attack, slow]


# -- 3: the kernel's interfaces, the hostname ----------------------------------------------------

_KERNEL = r"""
import os, socket
out = {}
for path, data in (('/proc/sys/kernel/hostname', 'pwned-lease'), ('/proc/sys/kernel/core_pattern', None),
                   ('/proc/sys/kernel/domainname', 'pwned-lease'), ('/proc/sysrq-trigger', None)):
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            if data:
                os.write(fd, data.encode())
        finally:
            os.close(fd)
        out[path] = 'opened'
    except OSError as exc:
        out[path] = exc.errno
out['hostname'] = socket.gethostname()
print(__import__('json').dumps(out))
"""


def check_the_kernel_stays_out_of_reach(make: ProviderFactory) -> list[ExecResult]:
    """A program (uid 0 in its namespace, no capabilities) can open no sysctl or kernel trigger
    for writing (``/proc/sys`` read-only: ``core_pattern`` opened for writing is a host-wide
    handler), and a hostname it set does not reach the next lease. Control: the next lease
    reads its hostname (it has one)."""
    attack, after = run(_one(make, ["python3", "-c", _KERNEL], ["python3", "-c", _KERNEL]))
    first, second = json.loads(attack.stdout), json.loads(after.stdout)
    assert all(v != "opened" for k, v in first.items() if k != "hostname"), first
    assert second["hostname"] and second["hostname"] != "pwned-lease", second
    return [attack, after]


# -- 7: IPC objects and keys ---------------------------------------------------------------------

_IPC = r"""
import ctypes, ctypes.util, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
try:
    mq_open = libc.mq_open
except AttributeError:
    mq_open = ctypes.CDLL(ctypes.util.find_library('rt') or 'librt.so.1', use_errno=True).mq_open
mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
keyctl = {'x86_64': (248, 250), 'aarch64': (217, 219)}.get(os.uname().machine)
libc.syscall.restype = ctypes.c_long
make = sys.argv[1] == 'make'
out = {}
out['shm'] = libc.shmget(0x7e57a11, 4096, (0o1000 | 0o666) if make else 0) >= 0
out['mq'] = mq_open(b'/trl-left', (0o100 | 2) if make else 0, 0o600, None) >= 0
if keyctl:
    if make:
        out['key'] = libc.syscall(keyctl[0], b'user', b'trl-left', b'secret', 6, -4) >= 0
    else:
        out['key'] = libc.syscall(keyctl[1], 10, -4, b'user', b'trl-left', 0) >= 0
print(json.dumps(out))
"""


def check_ipc_objects_and_keys_die_with_the_lease(make: ProviderFactory) -> list[ExecResult]:
    """A program leaves SysV shared memory, a POSIX message queue and a key in its user keyring;
    the next lease finds none of them. Control: the attacker made each (the kernel allowed it)."""
    made, found = run(_one(make, ["python3", "-c", _IPC, "make"], ["python3", "-c", _IPC, "find"]))
    made_report, found_report = json.loads(made.stdout), json.loads(found.stdout)
    assert made_report["shm"] and made_report["mq"], f"control: {made_report}"
    assert found_report == {k: False for k in found_report}, found_report
    return [made, found]


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
    flood, = run(_one(make, ["python3", "-c", _FLOOD, str(mib)], spec=SandboxSpec(limits=limits), timeout=30))
    assert flood.exit_code == 0 and flood.truncated, (flood.exit_code, flood.truncated, flood.stderr[-200:])
    assert len(flood.stdout) == len(flood.stderr) == 1 << 20, (len(flood.stdout), len(flood.stderr))
    whole = ResourceLimits(file_size_mb=2)
    file_write = "open('big', 'wb').write(b'x' * (3 << 20))"
    loud, capped = run(_one(make, ["python3", "-c", "import sys; sys.stderr.write('e' * (3 << 20))"],
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


def check_file_operations_stay_in_the_work_dir(make: ProviderFactory) -> dict[str, object]:
    """``write_file``/``read_file`` refuse a path outside the work directory (``ValueError``)
    and a symbolic link a program planted on the way (``PermissionError``): never the resident's
    directory, ``/tmp``, ``/dev/shm`` or ``/etc`` through them, and a FIFO in the work dir neither
    blocks nor is written. Control: an honest file in a new subdirectory is written, read back
    and seen by a program."""
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
        for path in ("shm/planted", "tmp/planted", "pid", "root/tmp/planted", "real/up/planted", "fifo"):
            try:
                await sandbox.write_file(path, b"1\n")
                out[f"write {path}"] = "done"
            except Exception as exc:  # noqa: BLE001 - only a refusal (an OSError) passes below
                out[f"write {path}"] = type(exc).__name__
        for path in ("host", "pid", "root/etc/hostname", "fifo"):
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
    result, control = run(_one(make, ["python3", "-c", _FORGE], ["sh", "-c", decoy, _FORGE], timeout=20))
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

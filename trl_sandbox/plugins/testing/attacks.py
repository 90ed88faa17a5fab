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

from trl_sandbox.plugins.testing.kit import ProviderFactory, closing, run, run_programs
from trl_sandbox.sandbox import ExecResult, SandboxSpec

# What ``without_defence`` takes out of the launcher's text (only where no resident serves the
# execs: a resident runs the text it was started with).
_DEFENCES = {
    "signals": ("    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)\n    default_signals()\n",
                "    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)\n"),
    "network": ('    private_namespaces(spec.get("network"))\n', '    private_namespaces(True)\n'),
    "proc": ("    seal_proc()\n", "    pass\n"),
    "keyrings": ("        fresh_keyrings()\n", "        pass\n"),
    "ipc": ('                wipe_ipc(spec.get("spare_ipc") or {})\n', "                pass\n"),
    "user": ('        if not sweep_mode and spec.get("user") is not None:\n', "        if False:\n"),
    "caps": ("        shed_capabilities()\n", "        pass\n"),
    "sweep_private": ('        if sweep_mode and spec.get("private"):\n', "        if False:\n"),
    "sockets": ('    sockets = () if spec.get("network") else listening_sockets()\n', "    sockets = ()\n"),
}
_NS_ONLY = ("network", "proc", "signals", "user", "sockets")  # not in ``sweep``'s text


@contextlib.contextmanager
def without_defence(*names: str) -> Iterator[None]:
    """The launcher without the defences ``names`` (keys of ``_DEFENCES``), for execs sent with the
    launcher's text (``resident_launcher=False``)."""
    from trl_sandbox.remote import lease

    saved = dict(lease.SOURCES)
    for name in names:
        old, new = _DEFENCES[name]
        for mode, text in lease.SOURCES.items():
            if mode != "probe":
                assert old in text or name in _NS_ONLY and mode == "sweep", (name, mode)
                lease.SOURCES[mode] = text.replace(old, new, 1)
    try:
        yield
    finally:
        lease.SOURCES.update(saved)


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
    (closed,) = run(run_programs(make, argv))
    (opened,) = run(run_programs(make, argv, spec=SandboxSpec(network=True)))
    assert closed.exit_code == 0 and closed.stdout.startswith("refused") and closed.stdout.endswith(
        "own loopback\n"), closed
    assert opened.exit_code == 0 and opened.stdout == "reached\nown loopback\n", f"control: {opened!r}"
    return {"closed": closed, "opened": opened}


_DAEMON = r"""
import os, socket, sys
name, port = sys.argv[1].encode(), int(sys.argv[2])
ready_r, ready_w = os.pipe()
if os.fork() == 0:
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    servers = [socket.socket(socket.AF_UNIX), socket.socket(), socket.socket(socket.AF_UNIX)]
    servers[0].bind(b'\0' + name)
    servers[1].setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    servers[1].bind(('127.0.0.1', port))
    servers[2].bind(sys.argv[3])
    for server in servers:
        server.listen(8)
        server.settimeout(0.05)
    os.write(ready_w, b'1')
    import time
    end = time.monotonic() + 30
    while time.monotonic() < end:
        for server in servers:
            try:
                peer, _ = server.accept()
                peer.sendall(b'daemon')
                peer.close()
            except OSError:
                pass
    os._exit(0)
os.close(ready_w)  # a daemon that failed to start (a port taken) ends the read: no hang
print('ready' if os.read(ready_r, 1) else 'failed')
"""
_CALL = r"""
import socket, sys
out = []
for family, address in ((socket.AF_UNIX, b'\0' + sys.argv[1].encode()), (socket.AF_INET, ('127.0.0.1', int(sys.argv[2]))),
                        (socket.AF_UNIX, sys.argv[3])):
    s = socket.socket(family)
    s.settimeout(2)
    try:
        s.connect(address)
        out.append(s.recv(16).decode())
    except OSError as exc:
        out.append(type(exc).__name__)
print(' '.join(out))
"""


def check_a_daemon_in_the_sandbox_is_out_of_reach(make: ProviderFactory, outside) -> tuple[str, ExecResult]:
    """A daemon that the service runs inside the sandbox, outside every lease (as Daytona's
    toolbox daemon is), listening on an abstract Unix socket, on the sandbox's loopback and on a
    Unix socket in the file system (``/tmp``, which every lease sees): a program without network
    reaches none of them. Control: a process outside the leases reaches all three.
    ``outside(sandbox_id, argv)`` as for ``check_the_resident_launcher``; namespaces only (a sweep
    would kill the daemon)."""
    import secrets

    name, port = "trl-daemon-" + secrets.token_hex(4), 20000 + secrets.randbelow(20000)
    path = f"/tmp/{name}.sock"
    p = make()

    async def go() -> tuple[str, ExecResult]:
        sandbox = await p.create(SandboxSpec())
        assert outside(sandbox.id, ["python3", "-c", _DAEMON, name, str(port), path]).strip() == "ready"
        control = outside(sandbox.id, ["python3", "-c", _CALL, name, str(port), path])
        return control, await sandbox.exec(["python3", "-c", _CALL, name, str(port), path], timeout=10)

    control, result = run(closing(p, go()))
    assert control == "daemon daemon daemon\n", f"control: {control!r}"
    assert result.exit_code == 0 and "daemon" not in result.stdout, result
    return control, result


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
    attack, slow = run(run_programs(make, ["python3", "-c", _SIGNAL_INIT], ["sleep", "5"], timeout=2))
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
    """A program (without capabilities) can open no sysctl or kernel trigger
    for writing (``/proc/sys`` read-only: ``core_pattern`` opened for writing is a host-wide
    handler), and a hostname it set does not reach the next lease. Control: the next lease
    reads its hostname (it has one)."""
    attack, after = run(run_programs(make, ["python3", "-c", _KERNEL], ["python3", "-c", _KERNEL]))
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


def check_ipc_objects_and_keys_die_with_the_lease(make: ProviderFactory, *, queues: bool = True) -> list[ExecResult]:
    """A program leaves SysV shared memory, a POSIX message queue and a key in its user keyring;
    the next lease finds none of them. Control: the attacker made each (the kernel allowed it).
    ``queues=False``: the POSIX queue is not asked about (a ``sweep`` without IPC namespaces
    removes queues only where it may list them: ``/dev/mqueue`` mounted, or one it mounts)."""
    made, found = run(run_programs(make, ["python3", "-c", _IPC, "make"], ["python3", "-c", _IPC, "find"]))
    made_report, found_report = json.loads(made.stdout), json.loads(found.stdout)
    assert made_report["shm"] and made_report["mq"], f"control: {made_report}"
    if not queues:
        found_report.pop("mq")
    assert found_report == {k: False for k in found_report}, found_report
    return [made, found]


# -- 3: no privilege left to the program ---------------------------------------------------------

_PRIVILEGE = r"""
import ctypes, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def caps(pid):
    with open('/proc/%s/status' % pid) as fh:
        return [int(line.split()[1], 16) for line in fh if line.startswith('CapEff:')][0]
out = {'uid': os.getuid(), 'gid': os.getgid(), 'caps': caps('self'), 'parent_caps': caps(os.getppid())}
try:
    socket.sethostname('pwned-lease')
    out['sethostname'] = 'done'
except OSError as exc:
    out['sethostname'] = exc.errno
out['mount'] = 'done' if libc.mount(b'tmpfs', b'/tmp', b'tmpfs', 0, None) == 0 else ctypes.get_errno()
try:
    fd = os.open('/proc/sys/kernel/domainname', os.O_WRONLY)
    os.write(fd, b'pwned-lease')
    os.close(fd)
    out['sysctl'] = 'done'
except OSError as exc:
    out['sysctl'] = exc.errno
print(json.dumps(out))
"""


def check_the_program_holds_no_privilege(make: ProviderFactory, *, user: bool = True) -> dict:
    """A program's effective capabilities are none, and it can neither set the hostname, mount,
    nor write a sysctl; with ``user`` (namespaces, where the image allows a user namespace inside
    the lease's) its uid is not 0. Control: PID 1 as the program sees it (the lease's init in a
    namespace, the sandbox's own in ``sweep``) holds capabilities, so the reading is real."""
    (result,) = run(run_programs(make, ["python3", "-c", _PRIVILEGE]))
    assert result.exit_code == 0, result
    report = json.loads(result.stdout)
    assert report["parent_caps"] != 0, f"control: {report}"
    assert report["caps"] == 0, f"capabilities: {report}"
    assert all(report[k] != "done" for k in ("sethostname", "mount", "sysctl")), f"done: {report}"
    if user:
        assert report["uid"] != 0 and report["gid"] != 0, f"uid: {report}"
    return report


# The classes about paths, output, files, the tag and settings are in ``attacks_paths`` (in one module
# with these they would exceed the house's length); re-exported so that every check is ``attacks.check_*``.
from trl_sandbox.plugins.testing.attacks_paths import (  # noqa: E402, F401
    check_a_writer_that_outlives_the_program,
    check_every_setting_keeps_its_sandbox,
    check_file_operations_stay_in_the_work_dir,
    check_output_is_bounded_in_the_sandbox,
    check_the_launchers_tag_stays_hidden,
    check_the_next_lease_survives_a_broken_path,
)

_SIGNALLING_CANDIDATE = '''
import os, signal
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM, signal.SIGHUP, signal.SIGUSR1):
    for pid in (1, os.getppid()):
        try:
            os.kill(pid, sig)
        except OSError:
            pass
def double(x):
    return 3 * x
'''


def check_a_wrong_answer_that_signals_its_init_scores_failed(make: ProviderFactory) -> list[str]:
    """Through the public ``Scorer``: a wrong answer that first signals PID 1 of its namespace and
    its parent (SIGINT, SIGTERM, SIGALRM, ...) scores ``failed`` (or ``error``: it may end its own
    judge) with a reward, never ``infra`` (a ``None`` reward) nor ``timeout``; a right answer next to it scores ``passed``. Returns the
    statuses."""
    from trl_sandbox.plugins.testing.kit import FAST
    from trl_sandbox.pool.sandbox_pool import SandboxPool
    from trl_sandbox.scoring.scorer import Scorer

    row = {"func_name": "double", "tests": ["1", "2"], "reference": "lambda x: 2 * x", "extract": "raw",
           "timeout": 3.0}
    right = "def double(x):\n    return 2 * x\n"
    with SandboxPool.open(make(), size=1, spec=SandboxSpec(), pool_settings=FAST) as pool:
        outcomes = Scorer(pool, cache_size=0).score([_SIGNALLING_CANDIDATE, right], [row, row])
    statuses = [o.status for o in outcomes]
    # ``error``: it may kill its own judge (its parent, or the process it runs in): still its own result.
    assert statuses[0] in ("failed", "error") and statuses[1] == "passed", [(o.status, o.detail) for o in outcomes]
    assert all(o.reward is not None for o in outcomes), outcomes
    return statuses

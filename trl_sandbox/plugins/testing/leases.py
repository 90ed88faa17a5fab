"""The clean-lease checks, for remote providers whose sandboxes live across many programs: a
program's leftovers cannot reach the next lease, a program cannot undo its isolation, what it
leaves can neither break nor slow the next cleaning, and a reset costs no request of its own."""


from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from trl_sandbox.plugins.testing.kit import FAST, ProviderFactory, closing, run
from trl_sandbox.pool.sandbox_pool import SandboxPool
from trl_sandbox.sandbox import ExecResult, SandboxSpec

# -- clean leases on a long-lived remote sandbox -------------------------------------------------

# A process a hostile program leaves behind. Whatever started it, it ignores the polite signals and
# then, until it is killed, spins the CPU and goes after every later program it can see (one whose
# command line holds the victim's mark): reads its stdin (a judge's payload), kills it, and rewrites
# the victim's own file in the work directory.
_LEFTOVER = r"""
import os, signal, sys, time
for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    signal.signal(sig, signal.SIG_IGN)
work, mark = sys.argv[1], (sys.argv[2] + sys.argv[3]).encode()
end = time.monotonic() + 30
while time.monotonic() < end:
    for name in os.listdir('/proc'):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f'/proc/{name}/cmdline', 'rb') as fh:
                if mark not in fh.read():
                    continue
            loot = b''
            try:
                with open(f'/proc/{name}/fd/0', 'rb') as fh:
                    loot = fh.read(4096)
            except OSError:
                pass
            for where in (os.path.join(work, 'loot'), '/tmp/loot'):
                with open(where, 'wb') as fh:
                    fh.write(loot or b'seen')
            with open(os.path.join(work, 'mine.txt'), 'w') as fh:
                fh.write('changed by a leftover')
            os.kill(int(name), signal.SIGKILL)
        except OSError:
            pass
"""
# Marks in command lines, never written out whole where another process could match them by mistake.
_VICTIM_MARK = ("VICTIM", "-3f1c")
_LEFTOVER_MARK = ("LEFTOVER", "-9d2e")


def _attacker(style: str) -> list[str]:
    """A program that leaves ``_LEFTOVER`` running (``style``: plain background child, own session,
    double fork) and fills ``/tmp`` and ``/dev/shm``, then exits 0 at once."""
    code = f"""
import os, subprocess, sys
leftover = [sys.executable, '-c', {_LEFTOVER!r}, os.getcwd(), *{_VICTIM_MARK!r}, ''.join({_LEFTOVER_MARK!r})]
quiet = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
for place in ('/tmp/fill', '/dev/shm/fill'):
    with open(place, 'wb') as fh:
        fh.write(b'x' * (8 << 20))
style = {style!r}
if style == 'double-fork':
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            subprocess.Popen(leftover, **quiet)
        os._exit(0)
    os.wait()
else:
    subprocess.Popen(leftover, start_new_session=(style == 'setsid'), **quiet)
print('left', style)
"""
    return ["python3", "-c", code]


# The next program: it writes its own file, waits a little (a leftover polls without pausing), then
# reports what it sees: processes carrying the leftover's mark, its file, and what is left in /tmp.
_VICTIM = f"""
import json, os, sys, time
secret = sys.stdin.read()
with open('mine.txt', 'w') as fh:
    fh.write(secret)
time.sleep(0.4)
others = []
for name in os.listdir('/proc'):
    if name.isdigit() and int(name) != os.getpid():
        try:
            with open(f'/proc/{{name}}/cmdline', 'rb') as fh:
                if ''.join({_LEFTOVER_MARK!r}).encode() in fh.read():
                    others.append(int(name))
        except OSError:
            pass
scratch = sorted(n for d in ('/tmp', '/dev/shm') for n in os.listdir(d) if n in ('fill', 'loot'))
print(json.dumps({{"others": others, "file": open('mine.txt').read() == secret, "scratch": scratch,
                  "loot": os.path.exists('loot')}}))
"""
VICTIM_SECRET = "the judge's payload: expected values of the hidden tests\n"


def _victim() -> list[str]:
    return ["python3", "-c", _VICTIM, "".join(_VICTIM_MARK)]


LEFTOVER_STYLES = ("plain", "setsid", "double-fork")


def check_leftovers_cannot_reach_the_next_lease(
    make: ProviderFactory, *, styles: Sequence[str] = LEFTOVER_STYLES
) -> dict[str, ExecResult]:
    """For each way of leaving a process behind, one attacker and then one victim on a pool of a
    single sandbox (so the victim gets the attacker's sandbox, after the usual reset): the victim
    must run to the end with exactly its own result: no process of the earlier lease visible in its
    ``/proc``, its file unchanged, no ``/tmp`` or ``/dev/shm`` leftovers, nothing of its stdin taken.

    Returns the victims' results by style (for a positive control: against a provider whose leases
    are not clean, the same check must fail)."""
    p = make()
    victims: dict[str, ExecResult] = {}
    with SandboxPool.open(p, size=1, spec=SandboxSpec(), pool_settings=FAST) as pool:
        for style in styles:
            attack = pool.run(_attacker(style), timeout=10)
            assert attack.exit_code == 0 and attack.stdout == f"left {style}\n", attack
            victims[style] = pool.run(_victim(), stdin=VICTIM_SECRET, timeout=10)
    for style, result in victims.items():
        assert result.exit_code == 0 and not result.timed_out, f"{style}: the victim did not finish: {result!r}"
        report = json.loads(result.stdout)
        assert report == {"others": [], "file": True, "scratch": [], "loot": False}, f"{style}: {report}"
    return victims


def check_a_reset_rides_with_the_next_exec(
    make: ProviderFactory, exec_calls: Callable[[], int], *, programs: int = 6
) -> int:
    """A pool of one runs ``programs`` programs, each lease reset: the service sees one exec per
    program (the reset travels with the next exec), and each program finds the work dir and /tmp
    empty of what the one before left. Returns the exec calls counted."""
    p = make()
    write = ("import os; print(sorted(os.listdir('.')), sorted(n for n in os.listdir('/tmp') if n.startswith('x-')));"
             " open('left.txt', 'w').write('x'); open('/tmp/x-' + str(os.getpid()), 'w').write('x')")
    with SandboxPool.open(p, size=1, spec=SandboxSpec(), pool_settings=FAST) as pool:
        pool.run(["true"], timeout=10)  # the sandbox exists, prepared
        before = exec_calls()
        seen = [pool.run(["python3", "-c", write], timeout=10).stdout for _ in range(programs)]
        calls = exec_calls() - before
    assert calls == programs, f"{calls} exec requests for {programs} programs"
    assert seen == ["[] []\n"] * programs, seen
    return calls


_UNDO = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
caps = {l.split(':')[0]: int(l.split()[1], 16) for l in open('/proc/self/status') if l.startswith('Cap')}
umount = libc.umount2(b'/proc', 2)
print(sum(caps.values()), umount, ctypes.get_errno(), sorted(int(p) for p in os.listdir('/proc') if p.isdigit())[:1])
"""


def check_a_program_cannot_undo_its_isolation(make: ProviderFactory) -> ExecResult:
    """A program holds no capability at all (effective, permitted, bounding, ambient, inheritable)
    and cannot unmount the ``/proc`` the sweep and its namespace rely on (EPERM). Found by an
    attack: a program with CAP_SYS_ADMIN unmounted its sandbox's /proc, and every later sweep saw
    another PID namespace's processes."""
    p = make()

    async def go() -> ExecResult:
        sandbox = await p.create(SandboxSpec())
        return await sandbox.exec(["python3", "-c", _UNDO], timeout=10)

    result = run(closing(p, go()))
    total, umount, errno, _ = result.stdout.split(maxsplit=3)
    assert (int(total), int(umount), int(errno)) == (0, -1, 1), result
    return result


_LITTER = r"""
import os, sys, time
kind, budget = sys.argv[1], float(sys.argv[2])
os.chdir('/tmp')
if kind == 'deep':  # deeper than PATH_MAX and than Python's recursion limit
    for _ in range(3000):
        os.mkdir('d')
        os.chdir('d')
else:  # as many files as fit in the budget: emptying /tmp then takes about as long
    end, n = time.monotonic() + budget, 0
    os.mkdir('litter')
    while time.monotonic() < end:
        for _ in range(500):
            open(f'litter/{n}', 'w').close()
            n += 1
print(kind, 'done')
"""


def check_what_a_program_leaves_cannot_break_or_slow_the_next(make: ProviderFactory) -> dict[str, ExecResult]:
    """Found by attacks: a program leaves in /tmp (a) a directory tree 3000 levels deep, which a
    recursive cleaning in Python cannot remove (the neighbour's exec failed: its verdict became
    ``error``), or (b) so many files that emptying /tmp takes longer than the next program's whole
    time limit (the neighbour timed out). The next program must run to its own result, within its
    own limit; the cleaning is not its time. Returns the neighbours' results; for (b) its
    ``duration_s`` (the whole exec) exceeding its 1 s limit is the control that the cleaning was
    that slow."""
    p = make()
    out: dict[str, ExecResult] = {}
    neighbour = ["python3", "-c", "import time; time.sleep(0.2); print('mine')"]
    with SandboxPool.open(p, size=1, spec=SandboxSpec(), pool_settings=FAST) as pool:
        for kind, budget in (("deep", 0), ("files", 3.0)):
            litter = pool.run(["python3", "-c", _LITTER, kind, str(budget)], timeout=30)
            assert litter.stdout == f"{kind} done\n", litter
            out[kind] = pool.run(neighbour, timeout=1)
    for kind, result in out.items():
        assert (result.exit_code, result.stdout, result.timed_out) == (0, "mine\n", False), f"{kind}: {result!r}"
    assert out["files"].duration_s > 1.0, f"control: the cleaning was quick ({out['files'].duration_s:.2f} s)"
    return out


def leftover_attack(style: str = "setsid") -> tuple[list[str], list[str]]:
    """The attacker and victim argv of ``check_leftovers_cannot_reach_the_next_lease`` (the victim
    reads ``VICTIM_SECRET`` on stdin), for positive controls against a bare SDK."""
    return _attacker(style), _victim()


_ROB = '''
import os
got = []
for pid in [p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()]:
    for what in ('fd/0', 'environ', 'mem'):
        try:
            with open('/proc/%s/%s' % (pid, what), 'rb') as fh:
                fh.read(64)
            got.append('%s/%s' % (pid, what))
        except OSError:
            pass
raise RuntimeError('robbed:' + ','.join(got) + ':')
def double(x):
    return 2 * x
'''


def check_a_candidate_cannot_read_its_judge(make: ProviderFactory) -> str:
    """Through the public ``Scorer``: a candidate tries to read, through ``/proc``, the stdin (the
    judge's payload: its nonce and the tests), environment and memory of every other process it
    can see, its judge included. It must get none (a program holds no capability, so the judge's
    non-dumpable state holds). Returns the outcome's detail."""
    from trl_sandbox.scoring.scorer import Scorer

    row = {"func_name": "double", "tests": ["1", "2"], "reference": "lambda x: 2 * x", "extract": "raw",
           "timeout": 3.0}
    p = make()
    with SandboxPool.open(p, size=1, spec=SandboxSpec(), pool_settings=FAST) as pool:
        (outcome,) = Scorer(pool, cache_size=0).score([_ROB], [row])
    # A candidate that can open the judge's stdin may take the payload before the judge reads it
    # (a busy machine): the judge then finds its stdin short, which is the same reach.
    assert "stdin ended early" not in outcome.detail, f"the candidate read the judge's fd/0 first: {outcome}"
    assert outcome.status == "error" and "robbed:" in outcome.detail, outcome
    robbed = outcome.detail.split("robbed:", 1)[1].split(":", 1)[0]
    assert robbed == "", f"the candidate read {robbed}"
    return outcome.detail


def check_devices_stay_as_the_image_made_them(make: ProviderFactory) -> ExecResult:
    """Found by reading the launcher after the fix: ``/dev`` is a mount of its own, root owns it,
    and a program that replaced ``/dev/null`` with a file would feed the next program's stdin
    (commands without stdin read ``/dev/null``). A program may create nothing in ``/dev`` and
    replace nothing there; the next program reads an empty ``/dev/null``."""
    p = make()
    tamper = ("import os\nfor act in (lambda: os.mkdir('/dev/trl-left'), lambda: os.rename('/dev/null', '/dev/n0')):\n"
              "    try:\n        act(); print('done')\n    except OSError as e:\n        print(e.errno)\n")

    async def go() -> tuple[ExecResult, ExecResult]:
        sandbox = await p.create(SandboxSpec())
        first = await sandbox.exec(["python3", "-c", tamper], timeout=10)
        await sandbox.reset()
        second = await sandbox.exec(["sh", "-c", "ls -d /dev/trl-left 2>/dev/null; head -c 9 /dev/null; echo end"],
                                    timeout=10)
        return first, second

    first, second = run(closing(p, go()))
    assert first.stdout.split() == ["30", "30"], first  # EROFS, both
    assert second.stdout == "end\n", second
    return first


# -- the resident launcher ------------------------------------------------------------------------

_HIDDEN = r"""
import json, os, stat, sys
where = sys.argv[1]
try:
    listing = sorted(os.listdir(where))
except OSError as exc:
    listing = str(exc)
try:
    with open(os.path.join(where, 'q'), 'w') as fh:
        fh.write(str(os.getpid()) + '\n')
    forged = 'written'
except OSError as exc:
    forged = type(exc).__name__
fifos = []  # every FIFO in reach, wherever it is: each gets a forged request
for top in ('/', '/dev/shm', '/tmp', '/var/tmp', '/run'):
    for here, dirs, files in os.walk(top):
        if here in ('/proc', '/sys') or here.startswith(('/proc/', '/sys/')) or here.count('/') > 6:
            dirs[:] = []
            continue
        for name in files:
            path = os.path.join(here, name)
            try:
                if stat.S_ISFIFO(os.lstat(path).st_mode):
                    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                    os.write(fd, b'1\n')
                    os.close(fd)
                    fifos.append(path)
            except OSError:
                pass
print(json.dumps({"listing": listing, "forged": forged, "fifos": sorted(set(fifos)),
                  "pids": len([p for p in os.listdir('/proc') if p.isdigit()])}))
"""
_ANCESTRY = r"""
import os, sys, time
mark, end = sys.argv[1].encode(), time.monotonic() + 10
while time.monotonic() < end:
    chains = []
    for name in os.listdir('/proc'):
        try:
            words = open(f'/proc/{name}/cmdline', 'rb').read().split(b'\0')
            if name.isdigit() and len(words) > 2 and words[2].startswith(b'sleep 1 # ' + mark):  # the program
                chain, pid = [], int(name)
                while pid > 1:
                    pid = int(open(f'/proc/{pid}/stat', 'rb').read().rsplit(b')', 1)[1].split()[1])
                    chain.append(pid)
                chains.append(chain)
        except (OSError, ValueError, IndexError):
            pass
    if chains:
        print(' '.join(map(str, max(chains, key=len))))
        sys.exit(0)
    time.sleep(0.01)
print('not found')
"""


def check_the_resident_launcher(make: ProviderFactory, outside: Callable[[str, list[str]], str]) -> None:
    """Where the image allows PID namespaces, a resident launcher starts each exec's launcher as a
    fork (``trl_sandbox.remote.launcher_resident``): (1) an exec's program descends from it (no
    interpreter started per exec); (2) a program sees neither the resident's process nor its
    directory (a tmpfs of its own), and cannot write a request into it; (3) with the resident killed, an exec is the
    sandbox's failure (``SandboxGoneError``: a pool replaces the sandbox), never the program's
    result, and a pool on that provider still scores the program right.

    ``outside(sandbox_id, argv)`` runs ``argv`` in the sandbox outside every lease (as the vendor's
    daemon would, without the launcher) and returns its stdout: the fakes enter the container."""
    import asyncio

    from trl_sandbox.remote.launcher_resident import RESIDENT_DIR
    from trl_sandbox.sandbox import SandboxGoneError

    p = make()
    mark = "resident-check-" + "7e1a"

    async def go() -> None:
        sandbox = await p.create(SandboxSpec())
        resident = int(outside(sandbox.id, ["cat", f"{RESIDENT_DIR}/pid"]).strip())
        looking = asyncio.get_running_loop().run_in_executor(None, outside, sandbox.id, ["python3", "-c", _ANCESTRY, mark])
        result = await sandbox.exec(["sh", "-c", f"sleep 1 # {mark}"], timeout=10)
        chain = [int(pid) for pid in (await looking).split() if pid.isdigit()]
        assert result.exit_code == 0 and resident in chain, (resident, chain, result)
        hidden = await sandbox.exec(["python3", "-c", _HIDDEN, RESIDENT_DIR], timeout=10)
        report = json.loads(hidden.stdout)
        assert report["listing"] == [] and report["forged"] != "written", report
        assert not any(path.startswith(RESIDENT_DIR) for path in report["fifos"]), report
        assert report["pids"] <= 3, report  # init, this program (and its shell): not the resident
        # Positive control: the resident's FIFO is there, seen from outside every lease; on a file
        # system of its own (the daemon may mount one on the fakes), which no program can fill.
        assert outside(sandbox.id, ["sh", "-c", f"test -p {RESIDENT_DIR}/q && echo fifo"]).strip() == "fifo"
        assert outside(sandbox.id, ["grep", "-c", f" {RESIDENT_DIR} ", "/proc/self/mountinfo"]).strip() == "1"
        outside(sandbox.id, ["kill", "-9", str(resident)])  # as the kernel's OOM killer might
        try:
            gone = await sandbox.exec(["echo", "ran"], timeout=10)
        except SandboxGoneError:
            gone = None
        assert gone is None, f"an exec without its resident must fail as the sandbox's fault: {gone!r}"

    run(closing(p, go()))
    with SandboxPool.open(make(), size=1, spec=SandboxSpec(), pool_settings=FAST) as pool:
        pool.run(["true"], timeout=10)
        for member in list(pool._members):
            outside(member, ["sh", "-c", f"kill -9 $(cat {RESIDENT_DIR}/pid)"])
        echoed = pool.run(["python3", "-c", "import sys; print(sys.stdin.read()[::-1])"], stdin="olleh", timeout=10)
    assert echoed.stdout == "hello\n", echoed


def check_a_launcher_that_never_answers(make: ProviderFactory, outside: Callable[[str, list[str]], str]) -> None:
    """The launcher ends a program at its deadline and says so; past the service's backstop the
    launcher itself failed (here: its resident stopped from outside the lease). That is the
    sandbox's failure (``SandboxGoneError``: the pool reruns the program elsewhere), never a timeout
    scored -1. Positive control: a program that really runs past its deadline is a timeout, as
    ever. Set the provider module's ``CLEANING_MARGIN_S`` low first: the backstop is the deadline
    plus that margin."""
    from trl_sandbox.remote.launcher_resident import RESIDENT_DIR
    from trl_sandbox.sandbox import SandboxGoneError

    p = make()

    async def go() -> tuple[ExecResult, BaseException | None]:
        sandbox = await p.create(SandboxSpec())
        slow = await sandbox.exec(["sleep", "5"], timeout=1)
        outside(sandbox.id, ["sh", "-c", f"kill -STOP $(cat {RESIDENT_DIR}/pid)"])
        try:
            await sandbox.exec(["echo", "never"], timeout=1)
        except SandboxGoneError as exc:
            return slow, exc
        return slow, None

    slow, gone = run(closing(p, go()))
    assert slow.timed_out and slow.exit_code is None, slow
    assert gone is not None

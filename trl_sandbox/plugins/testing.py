"""Conformance checks any provider plugin can run against its own provider.

Every provider must behave the same where the pool, the scorer and the tasks rely on it: an exec
returns an ``ExecResult`` (also for a timeout or a missing program) and stdin arrives byte-exact,
``SandboxSpec.limits`` are enforced, files persist until ``reset()``, ``list`` finds sandboxes by
their tags and ``destroy`` is quiet for one already gone, an unreachable service is an
``InfraError``, and a pool on top retries infrastructure failures, replaces a sandbox that
vanished and scores a task end to end. Each ``check_*`` function here tests one of these and
fails with ``AssertionError``; a plugin's test suite calls them with a factory for its provider
(usually pointed at a fake of the service), and keeps its own tests for what only it does.

``make`` is a no-argument callable returning a new, configured provider; the checks close every
provider they make. Checks that need to see or disturb the service itself take small callables
(``live`` lists the ids of the sandboxes that exist on the service; ``vanish`` deletes one behind
the provider's back; ...), so that any fake or real service can be plugged in.

Remote providers whose sandboxes live across many programs also run the clean-lease checks: a
program's leftovers (any way of detaching, spinning, filling ``/tmp``, robbing and killing) cannot
reach the next lease (``check_leftovers_cannot_reach_the_next_lease``), a program holds no
capability to undo its isolation, what it leaves can neither break nor slow the next cleaning, and
a reset costs no request of its own (``check_a_reset_rides_with_the_next_exec``). They need a
service that behaves like the real one about leftovers (the fakes run each sandbox in a container
of its own: ``trl_sandbox.remote.fake_container``).

To get pytest's detailed assertion messages, call ``pytest.register_assert_rewrite("trl_sandbox.plugins.testing")``
before importing this module.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from trl_sandbox.pool.sandbox_pool import PoolSettings, SandboxPool
from trl_sandbox.sandbox import ExecResult, InfraError, Provider, Sandbox, SandboxSpec

T = TypeVar("T")
ProviderFactory = Callable[[], Provider]

# Short back-offs and deadlines for a pool against a local fake; no health checks during a test.
FAST = PoolSettings(backoff_initial_s=0.05, backoff_max_s=0.2, lease_timeout_s=20.0, create_timeout_s=20.0,
                    destroy_timeout_s=10.0, health_interval_s=3600.0)
# Every byte value, CR/LF, a NUL, shell syntax and quotes, invalid UTF-8: stdin must arrive byte-exact.
STDIN = bytes(range(256)) * 4 + b"\r\n\n$(touch /tmp/pwned)\x00EOF\n'\"`" + b"\xff" * 3
_BOTH = ("import sys\nfor i in range(3):\n    print(i, flush=True); print(f'e{i}', file=sys.stderr, flush=True)\n"
         "sys.stdout.write('tail é'); sys.stderr.write('bad3'); sys.exit(5)")
_DIGEST = ("import hashlib, sys; data = sys.stdin.buffer.read(); "
           "print(len(data), hashlib.sha256(data).hexdigest()); print('to stderr', file=sys.stderr); sys.exit(3)")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def closing(provider: Provider, coro: Awaitable[T]) -> T:
    """Await ``coro``, then close ``provider`` whatever happened."""
    try:
        return await coro
    finally:
        await provider.aclose()


def _digest_line(data: bytes) -> str:
    return f"{len(data)} {hashlib.sha256(data).hexdigest()}\n"


async def _raises(exc_type: type[BaseException], awaitable: Awaitable[Any]) -> BaseException:
    """The ``exc_type`` that ``awaitable`` raised; AssertionError if it returned (other errors propagate)."""
    try:
        await awaitable
    except exc_type as exc:
        return exc
    raise AssertionError(f"{exc_type.__name__} was not raised")


# -- one sandbox ----------------------------------------------------------------------------------


def check_exec(make: ProviderFactory) -> dict[str, ExecResult]:
    """Exit codes, byte-exact stdin (bytes, text, none, several MiB), argv without a shell, a missing program.

    With ``capabilities.separate_stderr`` the streams must be exactly the program's; without it
    stderr must be empty and both streams' text must be in stdout. Returns the results by name.
    """
    p = make()
    big = b"x" * (3 << 20)

    async def go() -> dict[str, ExecResult]:
        sandbox = await p.create(SandboxSpec())
        return {
            "with_stdin": await sandbox.exec(["python3", "-c", _DIGEST], stdin=STDIN, timeout=10),
            "as_text": await sandbox.exec(["python3", "-c", _DIGEST], stdin="héllo", timeout=10),
            "without": await sandbox.exec(["python3", "-c", _DIGEST], timeout=10),
            "large": await sandbox.exec(["python3", "-c", _DIGEST], stdin=big, timeout=20),
            "quoted": await sandbox.exec(["printf", "%s|", "a b", "$HOME", "it's", ";ls"], timeout=5),
            "missing": await sandbox.exec(["no-such-program-xyz"], timeout=5),
            "both": await sandbox.exec(["python3", "-c", _BOTH], timeout=10),
        }

    results = run(closing(p, go()))
    with_stdin, as_text, without, large = (results[k] for k in ("with_stdin", "as_text", "without", "large"))
    assert with_stdin.exit_code == 3 and not with_stdin.timed_out
    expected = [(with_stdin, STDIN), (as_text, "héllo".encode()), (without, b""), (large, big)]
    if p.capabilities.separate_stderr:
        for result, data in expected:
            assert result.stdout == _digest_line(data)  # without stdin the program reads EOF
        assert with_stdin.stderr == "to stderr\n"
        # Turns between the streams, no final newline, non-ASCII: each stream exactly its own.
        both = results["both"]
        assert (both.exit_code, both.stdout, both.stderr) == (5, "0\n1\n2\ntail é", "e0\ne1\ne2\nbad3")
    else:
        for result, data in expected:
            assert _digest_line(data).rstrip("\n") in result.stdout
        assert "to stderr" in with_stdin.stdout and with_stdin.stderr == ""  # merged streams
    assert results["quoted"].stdout == "a b|$HOME|it's|;ls|"  # no shell in between
    assert results["missing"].exit_code == 127 and not results["missing"].timed_out
    return results


def check_cwd_env_and_limits(make: ProviderFactory) -> Sandbox:
    """``env`` and a relative ``cwd`` reach the program; ``ResourceLimits`` defaults are in force.

    Returns the (closed) sandbox, for provider-specific checks of how it applied the limits.
    """
    p = make()

    async def go() -> tuple[Sandbox, ExecResult, ExecResult]:
        sandbox = await p.create(SandboxSpec())
        await sandbox.write_file("sub/keep.txt", b"x")
        env_cwd = await sandbox.exec(["sh", "-c", 'echo "$X"; pwd'], env={"X": "1 2"}, cwd="sub", timeout=5)
        limits = await sandbox.exec(["sh", "-c", "ulimit -n; ulimit -v"], timeout=5)
        return sandbox, env_cwd, limits

    sandbox, env_cwd, limits = run(closing(p, go()))
    work_dir = getattr(sandbox, "work_dir")  # noqa: B009 - not part of the Sandbox protocol
    assert env_cwd.stdout.splitlines() == ["1 2", f"{work_dir}/sub"]
    assert limits.stdout.split() == ["256", str(1024 * 1024)]  # ResourceLimits defaults
    return sandbox


def check_timeout_is_a_result(make: ProviderFactory) -> None:
    """A program past its time limit is a timed-out result, promptly, and the sandbox still works."""
    p = make()

    async def go() -> tuple[ExecResult, float, ExecResult]:
        sandbox = await p.create(SandboxSpec())
        t0 = time.monotonic()
        slow = await sandbox.exec(["sh", "-c", "echo started; sleep 30"], timeout=1, stdin=b"x")
        elapsed = time.monotonic() - t0
        after = await sandbox.exec(["echo", "still here"], timeout=5)
        return slow, elapsed, after

    slow, elapsed, after = run(closing(p, go()))
    assert slow.timed_out and slow.exit_code is None and not slow.ok
    assert elapsed < 5
    assert after.stdout == "still here\n"


def check_files_reset_and_alive(make: ProviderFactory) -> None:
    """Files round-trip byte-exact (relative and absolute paths, new parent directories), the
    program sees them, a missing one is ``FileNotFoundError``, ``reset()`` empties the work
    directory, and the sandbox is alive afterwards."""
    p = make()

    async def go() -> tuple[bytes, bytes, ExecResult, ExecResult, bool]:
        sandbox = await p.create(SandboxSpec())
        work_dir = getattr(sandbox, "work_dir")  # noqa: B009 - not part of the Sandbox protocol
        await sandbox.write_file("deep/dir/data.bin", STDIN)
        back = await sandbox.read_file("deep/dir/data.bin")
        absolute = await sandbox.read_file(f"{work_dir}/deep/dir/data.bin")
        seen = await sandbox.exec(["sha256sum", "deep/dir/data.bin"], timeout=5)
        await _raises(FileNotFoundError, sandbox.read_file("nope.txt"))
        await sandbox.reset()
        await _raises(FileNotFoundError, sandbox.read_file("deep/dir/data.bin"))
        listing = await sandbox.exec(["ls", "-A"], timeout=5)
        return back, absolute, seen, listing, await sandbox.alive()

    back, absolute, seen, listing, alive = run(closing(p, go()))
    assert back == STDIN and absolute == STDIN
    assert seen.stdout.split()[0] == hashlib.sha256(STDIN).hexdigest()
    assert listing.exit_code == 0 and listing.stdout == ""  # reset left an empty work dir
    assert alive


# -- the provider ---------------------------------------------------------------------------------


def check_list_by_tags_and_destroy(
    make: ProviderFactory,
    tags: Mapping[str, str],
    *,
    state: str,
    live: Callable[[], list[str]],
    list_calls: Callable[[], int] | None = None,
    unknown_id: str | None = None,
) -> int | None:
    """``list`` finds exactly the sandboxes with all of ``tags`` (in ``state``, with a creation time);
    ``destroy`` removes one, is quiet when it is already gone, and works from another provider
    instance (and, given ``unknown_id``, for an id that never existed).

    Returns how many calls ``list`` made to the service (by ``list_calls``), for checking paging.
    """
    p = make()
    mine, other = {**tags, "batch": "a"}, {**tags, "batch": "b"}

    async def go() -> tuple[list[Sandbox], Sandbox, list, int | None, list]:
        created = [await p.create(SandboxSpec(tags=mine)) for _ in range(3)]
        stranger = await p.create(SandboxSpec(tags=other))
        calls = list_calls() if list_calls else 0
        listed = await p.list(mine)
        pages = list_calls() - calls if list_calls else None
        await p.destroy(created[0].id)
        await p.destroy(created[0].id)  # already gone: quiet
        fresh = make()
        try:
            await fresh.destroy(created[1].id)  # an id this provider instance did not create
            if unknown_id is not None:
                await fresh.destroy(unknown_id)
        finally:
            await fresh.aclose()
        after = await p.list(mine)
        return created, stranger, listed, pages, after

    created, stranger, listed, pages, after = run(closing(p, go()))
    assert sorted(i.id for i in listed) == sorted(s.id for s in created)
    assert all(i.tags == mine and i.state == state and i.created_at for i in listed)
    assert [i.id for i in after] == [created[2].id]
    assert set(live()) == {created[2].id, stranger.id}
    return pages


def check_unreachable_service_is_an_infra_error(make: ProviderFactory, stop_service: Callable[[], None]) -> None:
    """An exec after the service went away (``stop_service``) raises exactly ``InfraError``."""
    p = make()

    async def go() -> BaseException:
        sandbox = await p.create(SandboxSpec())
        stop_service()
        return await _raises(InfraError, sandbox.exec(["true"], timeout=5))

    error = run(closing(p, go()))
    assert type(error) is InfraError


# -- a pool on top --------------------------------------------------------------------------------


def check_pool_honours_retry_after_and_retries_server_errors(
    make: ProviderFactory,
    tags: Mapping[str, str],
    *,
    rate_limit_exec: Callable[[float, str], None],
    fail_exec: Callable[[str], None],
    fail_create: Callable[[], None],
    create_calls: Callable[[], int],
    live: Callable[[], list[str]],
) -> None:
    """A pool of one waits out a rate limit's ``retry_after``, retries a server error, and keeps
    the sandbox through both (it still answers: a replacement would only cost a create); a failed
    create is retried.

    ``rate_limit_exec(retry_after, match)`` makes the service answer the next exec whose request
    contains ``match`` with a rate limit; ``fail_exec(match)`` the same with a server error;
    ``fail_create()`` fails the next create with a server error; ``create_calls()`` counts creates.
    """
    p = make()
    rate_limit_exec(0.6, "first")
    fail_exec("second")
    fail_create()
    with SandboxPool.open(p, size=1, spec=SandboxSpec(tags=tags), pool_settings=FAST) as pool:
        t0 = time.monotonic()
        limited = pool.run(["echo", "first"], timeout=5)
        waited = time.monotonic() - t0
        retried = pool.run(["echo", "second"], timeout=5)
        stats = pool.drain_stats()
    assert limited.stdout == "first\n" and waited >= 0.6
    assert retried.stdout == "second\n"
    assert stats.counts["rate_limited"] == 1 and stats.counts["infra_errors"] == 2  # the exec's 5xx, the create's
    assert stats.counts["kept"] == 2 and stats.counts["replaced"] == 0
    assert create_calls() == 2  # the failed one and the one that served both jobs
    assert live() == []


# Fault-matrix pool settings: short back-offs, and an outage budget no seed should come near.
MATRIX = replace(FAST, max_attempts=3, outage_s=60.0, lease_timeout_s=30.0)


def _matrix_program(i: int) -> list[str]:
    return ["python3", "-c", f"import sys; print({i} * {i}); print('e{i}', file=sys.stderr); sys.exit({i} % 3)"]


def _misscored(i: int, result: ExecResult, separate: bool) -> bool:
    if result.exit_code != i % 3 or result.timed_out:
        return True
    if separate:
        return result.stdout != f"{i * i}\n" or result.stderr != f"e{i}\n"
    return f"{i * i}\n" not in result.stdout or f"e{i}\n" not in result.stdout


def check_rides_out_faults(
    make: ProviderFactory,
    tags: Mapping[str, str],
    *,
    chaos: Callable[[int | None], None],
    live: Callable[[], list[str]],
    created_tags: Callable[[], list[Mapping[str, str]]],
    seeds: Sequence[int] = (1, 2, 3),
    programs: int = 41,
    size: int = 2,
    settings: PoolSettings = MATRIX,
) -> list[dict[str, Any]]:
    """The seeded fault matrix: for each seed, ``programs`` programs on a pool of ``size`` while the
    service fails creates and execs at random (``chaos(seed)`` turns its faults on, ``chaos(None)``
    off). Every seed must score at least 90% of the programs, none wrongly (an infrastructure
    failure may cost a result, never falsify one), tag every sandbox it created with the run's
    tags, and leave none alive. ``created_tags()`` lists the tags of every sandbox the service
    ever created. ``settings`` are the pool's (a positive control passes ``max_attempts=1``).
    Returns per-seed numbers for reporting.
    """
    report = []
    for seed in seeds:
        run_tags = {**tags, "trl-sandbox-run": f"{tags.get('trl-sandbox-run', 'matrix')}-s{seed}"}
        before = len(created_tags())
        p = make()
        separate = p.capabilities.separate_stderr
        chaos(seed)
        try:
            with SandboxPool.open(p, size=size, spec=SandboxSpec(tags=run_tags), pool_settings=settings) as pool:
                async def all_programs() -> list[Any]:
                    jobs = [pool.aexec(_matrix_program(i), timeout=10) for i in range(programs)]
                    return await asyncio.gather(*jobs, return_exceptions=True)

                results = pool.loop.run(all_programs())
                stats = pool.drain_stats()
        finally:
            chaos(None)
        scored = [i for i, r in enumerate(results) if isinstance(r, ExecResult)]
        others = [r for r in results if not isinstance(r, (ExecResult, InfraError))]
        wrong = [i for i in scored if _misscored(i, results[i], separate)]
        made = created_tags()[before:]
        row = {"seed": seed, "scored": len(scored), "programs": programs, "created": len(made),
               "replaced": stats.counts["replaced"], "kept": stats.counts["kept"],
               "create_failures": stats.counts["create_failures"]}
        report.append(row)
        assert others == [], f"seed {seed}: jobs failed with something other than InfraError: {others!r}"
        assert wrong == [], f"seed {seed}: misscored programs {wrong}: {[results[i] for i in wrong]}"
        assert len(scored) >= 0.9 * programs, f"seed {seed}: only {row}"
        untagged = [t for t in made if any(t.get(k) != v for k, v in run_tags.items())]
        assert made and untagged == [], f"seed {seed}: sandboxes created without the run's tags: {untagged}"
        assert live() == [], f"seed {seed}: sandboxes left alive: {live()}"
    return report


def check_a_sandbox_that_vanishes_is_replaced(
    make: ProviderFactory,
    tags: Mapping[str, str],
    *,
    vanish: Callable[[str], None],
    live: Callable[[], list[str]],
) -> None:
    """A pooled sandbox deleted behind the provider's back (``vanish``) is replaced; nothing is left."""
    p = make()
    with SandboxPool.open(p, size=1, spec=SandboxSpec(tags=tags), pool_settings=FAST) as pool:
        assert pool.run(["echo", "one"], timeout=5).stdout == "one\n"
        (first,) = live()
        vanish(first)
        assert pool.run(["echo", "two"], timeout=5).stdout == "two\n"
        assert pool.drain_stats().counts["replaced"] >= 1
        assert first not in live()
    assert live() == []


def check_scorer_end_to_end_on_the_sorting_task(
    make: ProviderFactory, tags: Mapping[str, str], *, live: Callable[[], list[str]]
) -> None:
    """The built-in sorting task scores a correct and a wrong body exactly; the pool leaves nothing."""
    from trl_sandbox.scoring.scorer import Scorer
    from trl_sandbox.tasks.builtin import SOLUTIONS
    from trl_sandbox.tasks.load import load_tasks

    p = make()
    row = load_tasks("builtin", task_ids=["sorting"])[0]
    completions = [SOLUTIONS["sorting"], "    return xs\n"]
    with SandboxPool.open(p, size=2, spec=SandboxSpec(tags=tags), pool_settings=FAST) as pool:
        outcomes = Scorer(pool, cache_size=0).score(completions, [row, row])
    assert [(o.status, o.passed, o.total, o.reward) for o in outcomes] == [
        ("passed", 5, 5, 1.0), ("failed", 1, 5, 0.2)]
    assert live() == []


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

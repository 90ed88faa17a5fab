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
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from trl_sandbox.plugins.testing.kit import (  # noqa: F401  (public from here)
    _BOTH,
    _DIGEST,
    FAST,
    STDIN,
    ProviderFactory,
    _digest_line,
    _raises,
    closing,
    run,
)
from trl_sandbox.plugins.testing.leases import (  # noqa: F401  (public from here)
    LEFTOVER_STYLES,
    VICTIM_SECRET,
    check_a_candidate_cannot_read_its_judge,
    check_a_launcher_that_never_answers,
    check_a_program_cannot_undo_its_isolation,
    check_a_reset_rides_with_the_next_exec,
    check_devices_stay_as_the_image_made_them,
    check_leftovers_cannot_reach_the_next_lease,
    check_the_resident_launcher,
    check_what_a_program_leaves_cannot_break_or_slow_the_next,
    leftover_attack,
)
from trl_sandbox.pool.sandbox_pool import PoolSettings, SandboxPool
from trl_sandbox.sandbox import ExecResult, InfraError, Sandbox, SandboxSpec

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


def check_io_programs_end_to_end(make: ProviderFactory, tags: Mapping[str, str], *, live: Callable[[], list[str]]) -> None:
    """Whole programs on stdin/stdout (the I/O judge inside the sandbox, the image's toolchain):
    a right Python program passes, a wrong one fails per test, and a C++ program is either judged
    or, where the image lacks g++, ``infra`` naming it (never the program's fault)."""
    from trl_sandbox.scoring.scorer import Scorer

    tests = [{"input": f"{i} {i + 4}\n", "output": f"{2 * i + 4}\n"} for i in range(3)]
    rows = [{"task_id": "sum", "tests": tests}] * 2 + [{"task_id": "sum-cpp", "tests": tests, "language": "cpp"}]
    completions = ["a, b = map(int, input().split())\nprint(a + b)", "a, b = map(int, input().split())\nprint(a + b + (a == 1))",
                   "#include <iostream>\nint main(){long a,b;std::cin>>a>>b;std::cout<<a+b<<std::endl;}\n"]
    with SandboxPool.open(make(), size=2, spec=SandboxSpec(tags=tags), pool_settings=FAST) as pool:
        outcomes = Scorer(pool, cache_size=0).score(completions, rows)
    assert [(o.status, o.passed) for o in outcomes[:2]] == [("passed", 3), ("failed", 2)], outcomes
    assert outcomes[2].status == "passed" or (outcomes[2].status == "infra" and "g++" in outcomes[2].detail), outcomes[2]
    assert live() == []

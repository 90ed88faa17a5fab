"""The e2b provider under a pool, with faults, and its clean leases, on the fake E2B."""

from __future__ import annotations

import time

import e2b_testing
import pytest
from e2b_testing import TAGS

from trl_sandbox import SandboxSpec
from trl_sandbox.plugins import testing
from trl_sandbox.plugins.testing import closing, run

fake, outside, provider = e2b_testing.fake, e2b_testing.outside, e2b_testing.provider  # the fixtures this module uses

# -- a pool on top ----------------------------------------------------------------------------------


def test_pool_honours_retry_after_and_retries_server_errors(fake, provider):
    testing.check_pool_honours_retry_after_and_retries_server_errors(
        lambda: provider(rate_limit_wait_s=0.6), TAGS,
        rate_limit_exec=lambda wait, match: fake.fail("exec", 429, match=match),
        fail_exec=lambda match: fake.fail("exec", 500, match=match),
        fail_create=lambda: fake.fail("create", 502),
        create_calls=lambda: fake.count("create"),
        live=fake.live,
    )


def test_a_sandbox_that_vanishes_is_replaced(fake, provider):
    testing.check_a_sandbox_that_vanishes_is_replaced(provider, TAGS, vanish=fake.vanish, live=fake.live)


def test_scorer_end_to_end_on_the_sorting_task(fake, provider):
    testing.check_scorer_end_to_end_on_the_sorting_task(provider, TAGS, live=fake.live)


def test_io_programs_end_to_end(fake, provider):
    testing.check_io_programs_end_to_end(provider, TAGS, live=fake.live)


@pytest.mark.parametrize("seeds", [(1, 2, 3), (4, 5, 6)])
def test_seeded_fault_matrix(fake, provider, seeds):
    """20% transient faults (503, 502, 429, dropped connections) on creates and execs, 5% vanishing
    sandboxes: every seed scores at least 90% of 41 programs, none wrongly, with every sandbox
    tagged and none left alive."""
    report = testing.check_rides_out_faults(
        lambda: provider(rate_limit_wait_s=0.05), TAGS, chaos=fake.chaos, live=fake.live,
        created_tags=lambda: fake.created_metadata, seeds=seeds)
    print(report)
    assert sum(row["create_failures"] + row["kept"] + row["replaced"] for row in report) > 0  # faults happened


def test_fault_matrix_positive_control_a_pool_that_gives_up_loses_programs(fake, provider):
    """The matrix's bar is not vacuous: with one attempt per job the same faults cost more than 10%."""
    from dataclasses import replace

    with pytest.raises(AssertionError, match="only"):
        testing.check_rides_out_faults(lambda: provider(rate_limit_wait_s=0.05), TAGS, chaos=fake.chaos,
                                       live=fake.live, created_tags=lambda: fake.created_metadata,
                                       seeds=(1, 2, 3), settings=replace(testing.MATRIX, max_attempts=1))


# -- the time limit ends the program's whole tree -----------------------------------------------------

# A program that leaves a grandchild in a session of its own (out of envd's process group), which
# writes a heartbeat file until killed, then blocks past its limit.
_TREE = (
    "import os, sys, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        while True:\n"
    "            open('/var/tmp/heartbeat', 'a').write('.')\n"
    "            time.sleep(0.05)\n"
    "    os._exit(0)\n"
    "time.sleep(60)\n"
)


def _survivors(outside, sandbox_id: str) -> str:
    """Whether the heartbeat still grows, looked at from outside every lease."""
    size = "import os; print(os.path.getsize('/var/tmp/heartbeat') if os.path.exists('/var/tmp/heartbeat') else 0)"
    first = outside(sandbox_id, ["python3", "-c", size]).strip()
    time.sleep(0.5)
    second = outside(sandbox_id, ["python3", "-c", size]).strip()
    return f"{first}->{second}"


def _timed_out_tree(provider, outside, **settings) -> tuple[bool, str, str]:
    p = provider(**settings)

    async def go():
        sandbox = await p.create(SandboxSpec())
        result = await sandbox.exec(["python3", "-c", _TREE], timeout=1)
        return sandbox.id, result

    sandbox_id, result = run(go())  # not closed yet: look inside first
    try:
        growth = _survivors(outside, sandbox_id)
        processes = outside(sandbox_id, ["python3", "-c", "import os; print(sorted(int(p) for p in os.listdir('/proc') "
                                         "if p.isdigit()))"])
    finally:
        run(p.aclose())
    return result.timed_out, growth, processes


def test_a_timed_out_program_leaves_no_process(fake, provider, outside):
    """The launcher's deadline kills the program's whole tree, the setsid'd grandchild included:
    nothing writes the heartbeat afterwards, and only the sandbox's own processes remain."""
    timed_out, growth, processes = _timed_out_tree(provider, outside)
    assert timed_out
    first, second = growth.split("->")
    assert first == second, f"a process of the timed-out program is still running ({growth})"


def test_positive_control_without_the_launcher_a_timed_out_program_leaves_its_grandchild(fake, provider, outside):
    """The fake is honest: with the SDK's timeout and envd's kill alone (the bare SDK's way) the
    grandchild in its own session survives the timeout and keeps writing."""
    timed_out, growth, _ = _timed_out_tree(provider, outside, clean_leases=False)
    assert timed_out
    first, second = growth.split("->")
    assert int(second) > int(first), growth


def test_a_launcher_that_never_answers_is_the_sandboxs_failure_not_the_programs_timeout(provider, outside,
                                                                                        monkeypatch):
    from trl_sandbox_e2b import sandbox as module

    monkeypatch.setattr(module, "CLEANING_MARGIN_S", 1)  # the backstop: deadline + 1 s
    testing.check_a_launcher_that_never_answers(provider, outside)


def test_the_resident_launcher_serves_hides_and_is_optional(provider, outside):
    testing.check_the_resident_launcher(provider, outside)


# -- clean leases ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("isolation", "resident"), [("auto", True), ("auto", False), ("sweep", True)])
def test_leftover_processes_cannot_reach_the_next_lease(provider, isolation, resident):
    testing.check_leftovers_cannot_reach_the_next_lease(lambda: provider(isolation=isolation, resident_launcher=resident))


def test_positive_control_leftovers_reach_the_next_lease_without_the_launcher(provider):
    with pytest.raises(AssertionError):
        testing.check_leftovers_cannot_reach_the_next_lease(lambda: provider(clean_leases=False), styles=["setsid"])


def test_a_reset_rides_with_the_next_exec(fake, provider):
    assert testing.check_a_reset_rides_with_the_next_exec(provider, lambda: fake.count("exec")) == 6


def test_positive_control_without_the_launcher_a_reset_costs_an_exec(fake, provider):
    with pytest.raises(AssertionError, match="1[1-3] exec requests for 6 programs"):
        testing.check_a_reset_rides_with_the_next_exec(lambda: provider(clean_leases=False), lambda: fake.count("exec"))


@pytest.mark.parametrize(("isolation", "resident"), [("auto", True), ("sweep", True)])
def test_a_program_cannot_undo_its_isolation(provider, isolation, resident):
    testing.check_a_program_cannot_undo_its_isolation(lambda: provider(isolation=isolation, resident_launcher=resident))


def test_positive_control_a_plain_exec_holds_the_sandbox_roots_capabilities(provider):
    with pytest.raises(AssertionError):
        testing.check_a_program_cannot_undo_its_isolation(lambda: provider(clean_leases=False))


def test_what_a_program_leaves_cannot_break_or_slow_the_next(provider):
    testing.check_what_a_program_leaves_cannot_break_or_slow_the_next(provider)


def test_a_candidate_cannot_read_its_judge(provider):
    testing.check_a_candidate_cannot_read_its_judge(provider)


def test_positive_control_without_the_launcher_a_candidate_reads_its_judge(provider):
    with pytest.raises(AssertionError, match="the candidate read .*fd/0"):
        testing.check_a_candidate_cannot_read_its_judge(lambda: provider(clean_leases=False))


def test_devices_stay_as_the_image_made_them(provider):
    testing.check_devices_stay_as_the_image_made_them(provider)


def test_a_judge_sized_stdin_rides_in_the_exec_without_an_upload(fake, provider):
    """Stdin up to 64 KiB travels in the command (no upload); larger stdin is uploaded first."""
    import hashlib

    p = provider()
    digest = "import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())"
    small, large = bytes(range(256)) * 40, b"y" * (100 << 10)

    async def go():
        sandbox = await p.create(SandboxSpec())
        counts = []
        for data in (small, large):
            before = (fake.count("exec"), fake.count("files"))
            result = await sandbox.exec(["python3", "-c", digest], stdin=data, timeout=10)
            counts.append((fake.count("exec") - before[0], fake.count("files") - before[1], result.stdout))
        return counts

    small_calls, large_calls = run(closing(p, go()))
    assert small_calls == (1, 0, hashlib.sha256(small).hexdigest() + "\n")
    assert large_calls == (1, 1, hashlib.sha256(large).hexdigest() + "\n")


# -- creates whose answer never came ------------------------------------------------------------------


def test_a_create_that_times_out_after_the_sandbox_exists_is_killed(fake, provider):
    """E2B made the sandbox but answered after ``create_timeout_s``: the provider asks again with
    the same idempotency key and kills what it gets back, so nothing waits for its lifetime."""
    from trl_sandbox import InfraError

    p = provider(create_timeout_s=1)
    fake.stall_next_creates(1, 3.0)
    with pytest.raises(InfraError, match="timed out"):
        run(closing(p, p.create(SandboxSpec(tags=TAGS))))  # closing waits for the recovery
    assert len(fake.created_metadata) == 1  # the same sandbox came back, no second one was made
    assert fake.live() == [] and len(fake.killed) == 1


def test_a_create_abandoned_by_the_pool_deadline_is_killed(fake, provider):
    from dataclasses import replace

    from trl_sandbox.pool.sandbox_pool import SandboxPool

    fake.stall_next_creates(1, 3.0)
    settings = replace(testing.FAST, create_timeout_s=1.5)
    with SandboxPool.open(provider(create_timeout_s=60), size=1, spec=SandboxSpec(tags=TAGS),
                          pool_settings=settings) as pool:
        assert pool.run(["echo", "ok"], timeout=5).stdout == "ok\n"
    assert fake.live() == []
    assert len(fake.created_metadata) == 2  # the abandoned one (recovered by its key, killed) and the one used


def test_positive_control_without_the_recovery_the_late_sandbox_stays(fake, provider, monkeypatch):
    from trl_sandbox_e2b.provider import E2BProvider

    from trl_sandbox import InfraError

    async def nothing(self, kwargs):
        return None

    monkeypatch.setattr(E2BProvider, "_recover", nothing)
    p = provider(create_timeout_s=1)
    fake.stall_next_creates(1, 3.0)
    with pytest.raises(InfraError, match="timed out"):
        run(closing(p, p.create(SandboxSpec(tags=TAGS))))
    assert len(fake.live()) == 1  # made before the client gave up, and nobody killed it

"""Clean leases on the modal provider: what a program leaves cannot reach the next one, the time
limit really ends a program with everything it started, and a launcher that fails is the
sandbox's fault. On the fake, every sandbox is a container of its own where leftovers live on."""

from __future__ import annotations

import asyncio

import pytest

from trl_sandbox import SandboxGoneError, SandboxSpec
from trl_sandbox.plugins import testing
from trl_sandbox.plugins.testing import closing, run

MARK = "trl-modal-leftover-5b1f"
# A program that starts a detached child (own session, ignoring SIGTERM) and then runs past its limit.
SPAWNER = ("import os, subprocess, time\n"
           f"subprocess.Popen(['sh', '-c', 'trap \"\" TERM; sleep 300; : {MARK}'], start_new_session=True)\n"
           "time.sleep(0.3)\n"
           "print('spawned', flush=True)\n"
           "time.sleep(300)\n")
# Counts the processes whose command line holds the mark (given in two halves: not in its own).
COUNT = ("import os, sys\n"
         "mark = (sys.argv[1] + sys.argv[2]).encode()\n"
         "n = 0\n"
         "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
         "    try:\n"
         "        n += mark in open(f'/proc/{pid}/cmdline', 'rb').read()\n"
         "    except OSError:\n"
         "        pass\n"
         "print(n)\n")


def _survivors(outside, sandbox_id: str) -> int:
    half = len(MARK) // 2
    return int(outside(sandbox_id, ["python3", "-c", COUNT, MARK[:half], MARK[half:]]).strip())


@pytest.mark.parametrize(("isolation", "resident"), [("auto", True), ("sweep", True)])
def test_a_timed_out_program_leaves_no_process_behind(provider, outside, isolation, resident):
    """The per-exec timeout is the launcher's: the program and its detached child both end."""
    p = provider(isolation=isolation, resident_launcher=resident)

    async def go():
        sandbox = await p.create(SandboxSpec())
        result = await sandbox.exec(["python3", "-c", SPAWNER], timeout=1.5)
        if isolation == "sweep":  # a sweep kills leftovers with the next exec
            await sandbox.exec(["true"], timeout=5)
        await asyncio.sleep(0.3)
        return result, _survivors(outside, sandbox.id)

    result, survivors = run(closing(p, go()))
    assert result.timed_out and result.exit_code is None
    assert survivors == 0


def test_positive_control_modals_own_exec_timeout_leaves_the_detached_child(provider, outside):
    """Without the launcher, Modal's exec timeout is all there is: the result is a timeout, but the
    child the program detached lives on in the sandbox (the fake's worker kills the exec's process
    group only, and Modal's client has no kill to send)."""
    p = provider(clean_leases=False)

    async def go():
        sandbox = await p.create(SandboxSpec())
        result = await sandbox.exec(["python3", "-c", SPAWNER], timeout=1.5)
        await asyncio.sleep(0.3)
        return result, _survivors(outside, sandbox.id)

    result, survivors = run(closing(p, go()))
    assert result.timed_out
    assert survivors == 1


def test_a_launcher_that_never_answers_is_the_sandboxs_failure_not_the_programs_timeout(provider, outside,
                                                                                        monkeypatch):
    from trl_sandbox_modal import sandbox as module

    monkeypatch.setattr(module, "CLEANING_MARGIN_S", 1)  # Modal's backstop: deadline + 1 s
    testing.check_a_launcher_that_never_answers(provider, outside)


def test_the_backstop_firing_is_never_scored_as_the_programs(provider, outside, monkeypatch):
    """The resident stopped, Modal's exec timeout fires: ``SandboxGoneError``, whichever of the
    worker's kill and the client's -1 comes first."""
    from trl_sandbox_modal import sandbox as module

    from trl_sandbox.remote.launcher_resident import RESIDENT_DIR

    monkeypatch.setattr(module, "CLEANING_MARGIN_S", 0)
    p = provider()

    async def go():
        sandbox = await p.create(SandboxSpec())
        outside(sandbox.id, ["sh", "-c", f"kill -STOP $(cat {RESIDENT_DIR}/pid)"])
        with pytest.raises(SandboxGoneError, match="did not end the program"):
            await sandbox.exec(["echo", "never"], timeout=1)

    run(closing(p, go()))


@pytest.mark.parametrize(("isolation", "resident"), [("auto", True), ("auto", False), ("sweep", True)])
def test_leftover_processes_cannot_reach_the_next_lease(provider, isolation, resident):
    testing.check_leftovers_cannot_reach_the_next_lease(lambda: provider(isolation=isolation, resident_launcher=resident))


def test_positive_control_leftovers_reach_the_next_lease_without_the_launcher(provider):
    with pytest.raises(AssertionError):
        testing.check_leftovers_cannot_reach_the_next_lease(lambda: provider(clean_leases=False), styles=["setsid"])


def test_a_reset_rides_with_the_next_exec(fake, provider):
    assert testing.check_a_reset_rides_with_the_next_exec(provider, lambda: fake.count("TaskExecStart")) == 6


def test_positive_control_without_the_launcher_a_reset_costs_an_exec(fake, provider):
    with pytest.raises(AssertionError, match="1[1-3] exec requests for 6 programs"):
        testing.check_a_reset_rides_with_the_next_exec(lambda: provider(clean_leases=False),
                                                       lambda: fake.count("TaskExecStart"))


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


def test_the_resident_launcher_serves_hides_and_is_optional(provider, outside):
    testing.check_the_resident_launcher(provider, outside)


def test_positive_control_the_fake_keeps_a_leftover_for_the_next_bare_sdk_exec(fake):
    """The fake is honest: with the bare SDK (two plain execs on one sandbox, as Modal's examples
    do) the leftover of the first command survives and gets the second."""
    import modal

    attacker, victim = testing.leftover_attack("setsid")

    async def go():
        app = await modal.App.lookup.aio("bare", create_if_missing=True)
        sb = await modal.Sandbox.create.aio("sleep", "infinity", app=app, image=modal.Image.debian_slim(), timeout=120)
        try:
            await sb.exec.aio("mkdir", "-p", "/tmp/w")
            first = await sb.exec.aio(*attacker, workdir="/tmp/w", timeout=10)
            first_rc = await first.wait.aio()
            await asyncio.sleep(0.3)
            second = await sb.exec.aio(*victim, workdir="/tmp/w", timeout=10)
            second.stdin.write(testing.VICTIM_SECRET.encode())
            second.stdin.write_eof()
            await second.stdin.drain.aio()
            return first_rc, await second.wait.aio()
        finally:
            await sb.terminate.aio()

    first, second = run(go())
    assert first == 0
    assert second != 0  # the leftover killed it

"""The daytona provider through the real ``daytona`` SDK, against a fake Daytona on loopback."""

from __future__ import annotations

import email.utils
import math
from datetime import datetime, timedelta, timezone

import pytest

pytest.register_assert_rewrite("trl_sandbox.plugins.testing")

from daytona_fake import API_KEY, FakeDaytona  # noqa: E402
from trl_sandbox_daytona.provider import retry_after  # noqa: E402

from trl_sandbox import (  # noqa: E402
    ConfigError,
    InfraError,
    QuotaError,
    RateLimitError,
    SandboxGoneError,
    SandboxSpec,
    load_tasks,
)
from trl_sandbox.plugins import make_provider, providers, testing  # noqa: E402
from trl_sandbox.plugins.testing import FAST, closing, run  # noqa: E402
from trl_sandbox.pool.sandbox_pool import PoolSettings, SandboxPool  # noqa: E402

TAGS = {"trl-sandbox": "1", "trl-sandbox-run": "daytona-test"}
CREDENTIAL_VARS = ("DAYTONA_API_KEY", "DAYTONA_JWT_TOKEN", "DAYTONA_ORGANIZATION_ID", "DAYTONA_API_URL")


@pytest.fixture
def fake():
    server = FakeDaytona().start()
    yield server
    server.stop()


@pytest.fixture
def provider(fake, tmp_path):
    made = []

    def build(**settings):
        settings = {"api_key": API_KEY, "api_url": fake.api_url, "work_dir": f"{tmp_path}/{{id}}", **settings}
        made.append(make_provider("daytona", settings))
        return made[-1]

    return build


# -- configuration --------------------------------------------------------------------------------


def test_registered_from_its_own_distribution():
    registration = providers()["daytona"]
    assert registration.distribution == "trl-sandbox-daytona"


def test_missing_credentials_are_a_config_error_naming_the_variable(monkeypatch, tmp_path):
    for name in CREDENTIAL_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # no .env here
    with pytest.raises(ConfigError, match="DAYTONA_API_KEY.*dashboard"):
        make_provider("daytona", {})
    # the SDK's own variables are honoured
    monkeypatch.setenv("DAYTONA_API_KEY", "from-env")
    assert make_provider("daytona", {}).name == "daytona"


def test_missing_credentials_fail_when_the_trainer_is_built(monkeypatch, tmp_path):
    from trl_sandbox import SandboxGRPOConfig, SandboxGRPOTrainer

    for name in CREDENTIAL_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    args = SandboxGRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none",
                             sandbox_provider="daytona")
    with pytest.raises(ConfigError, match="DAYTONA_API_KEY"):
        SandboxGRPOTrainer(model="never-loaded", args=args, train_dataset=load_tasks("builtin"))


def test_rejected_key_is_a_config_error(provider):
    p = provider(api_key="wrong")
    with pytest.raises(ConfigError, match="DAYTONA_API_KEY"):
        run(closing(p, p.create(SandboxSpec())))


def test_bad_settings_are_config_errors(provider):
    with pytest.raises(ConfigError, match="snapshot and image"):
        provider(snapshot="s", image="python:3.12")
    with pytest.raises(ConfigError, match="cpu"):
        provider(cpu="many")
    with pytest.raises(ConfigError, match="work_dir"):
        provider(work_dir="relative/dir")


# -- create ---------------------------------------------------------------------------------------


def test_create_carries_labels_env_lifetime_and_network_off(fake, provider):
    p = provider()
    spec = SandboxSpec(tags=TAGS, env={"GREETING": "hi there"}, lifetime_s=1000)

    async def go():
        sandbox = await p.create(spec)
        echoed = await sandbox.exec(["sh", "-c", 'printf %s "$GREETING"'], timeout=5)
        return sandbox, echoed

    sandbox, echoed = run(closing(p, go()))
    request = fake.sandboxes[sandbox.id].request
    assert {k: request["labels"][k] for k in TAGS} == TAGS
    assert request["env"] == {"GREETING": "hi there"} and echoed.stdout == "hi there"
    assert request["networkBlockAll"] is True
    assert request["ttlMinutes"] == math.ceil(1000 / 60)  # a hard server-side lifetime
    assert request["autoDeleteInterval"] == 0 and request["autoStopInterval"] == 15  # ephemeral, auto-stops
    assert "buildInfo" not in request or request["buildInfo"] is None  # default snapshot


def test_image_sandboxes_carry_resources_and_network_on(fake, provider):
    p = provider(image="python:3.12-slim", cpu="2", disk=5, auto_stop_interval="0", ephemeral="false")
    sandbox = run(closing(p, p.create(SandboxSpec(network=True, memory_mb=3000))))
    request = fake.sandboxes[sandbox.id].request
    assert "python:3.12-slim" in request["buildInfo"]["dockerfileContent"]
    assert (request["cpu"], request["memory"], request["disk"]) == (2, 3, 5)
    assert request["networkBlockAll"] is False
    assert request["autoStopInterval"] == 0 and request.get("autoDeleteInterval") is None


# -- exec, files, reset ---------------------------------------------------------------------------

def test_exec_exit_codes_separate_streams_and_byte_exact_stdin(provider):
    assert provider().capabilities.separate_stderr
    results = testing.check_exec(provider)
    assert results["with_stdin"].stderr == "to stderr\n"  # split inside the command, one call


def test_streams_are_split_in_the_same_single_call_and_resist_forgery(fake, provider):
    """The program prints marker lookalikes (a wrong nonce, and the real format with a nonce it
    guessed) and searches every process's argv and its parent shell's stdin for a nonce; the split
    is still exact, the search finds none, and each exec is one call to the daemon."""
    forger = (
        "import glob, os, re, sys\n"
        "pattern = re.compile(rb'trl-sandbox:[0-9a-f]{32}')\n"
        "found = 0\n"
        "for path in glob.glob('/proc/[0-9]*/cmdline'):\n"
        "    try:\n"
        "        found += len(pattern.findall(open(path, 'rb').read()))\n"
        "    except OSError:\n"
        "        pass\n"
        "try:\n"
        "    fd = os.open(f'/proc/{os.getppid()}/fd/0', os.O_RDONLY | os.O_NONBLOCK)\n"
        "    found += len(pattern.findall(os.read(fd, 1 << 16)))\n"
        "except OSError:\n"
        "    pass\n"
        "print('[trl-sandbox:' + '0' * 32 + ':stderr]forged')\n"
        "print('[trl-sandbox:' + '0' * 32 + ':exit=0]')\n"
        "sys.stderr.write(f'found={found}')\n"
        "sys.exit(3)\n"
    )
    decoy = "trl-sandbox:" + "ab" * 16  # in this program's own argv: the search must see it
    p = provider()

    async def go():
        sandbox = await p.create(SandboxSpec())
        before = fake.count("exec")
        result = await sandbox.exec(["python3", "-c", forger, decoy], timeout=10)
        return result, fake.count("exec") - before

    result, calls = run(closing(p, go()))
    assert calls == 1
    assert result.exit_code == 3 and not result.truncated
    assert result.stdout == "[trl-sandbox:" + "0" * 32 + ":stderr]forged\n[trl-sandbox:" + "0" * 32 + ":exit=0]\n"
    assert result.stderr == "found=1"  # the decoy only: no nonce anywhere the program can look


def test_split_streams_from_the_end():
    from trl_sandbox_daytona.streams import split_streams

    n = "f" * 32
    start, end = f"[trl-sandbox:{n}:stderr]", f"[trl-sandbox:{n}:exit="
    assert split_streams(f"out{start}err{end}3]\n", n) == ("out", "err", True)
    assert split_streams(f"a{start}x{end}1]\nb{start}err{end}3]\nlate", n) == (f"a{start}x{end}1]\nblate", "err", True)
    assert split_streams("killed before the trailer", n) == ("killed before the trailer", "", False)
    assert split_streams(f"out{start}partial err", n) == ("out", "partial err", False)


def test_cwd_env_and_limits(provider):
    sandbox = testing.check_cwd_env_and_limits(provider)
    assert sandbox.prlimit  # the limits were applied with prlimit


def test_timeout_is_a_result_and_the_sandbox_survives(provider):
    testing.check_timeout_is_a_result(provider)


def test_files_reset_and_alive(provider):
    testing.check_files_reset_and_alive(provider)


def test_list_by_tags_across_pages_and_destroy(fake, provider):
    pages = testing.check_list_by_tags_and_destroy(provider, TAGS, state="started", live=fake.live,
                                                   list_calls=lambda: fake.count("list"))
    assert pages == 2  # the fake pages by two: the SDK followed the cursor


# -- errors and the pool ----------------------------------------------------------------------------


def test_error_mapping(fake, provider):
    p = provider()

    async def go():
        sandbox = await p.create(SandboxSpec())
        errors = {}
        for status, headers, message in [
            (429, {"Retry-After-sandbox-lifecycle": "2", "Retry-After-authenticated": "0.5"}, ""),
            (500, {}, ""), (503, {}, ""), (504, {}, ""), (403, {}, "Total CPU limit exceeded. Maximum allowed: 10"),
        ]:
            fake.fail("exec", status, headers=headers, message=message)
            try:
                await sandbox.exec(["true"], timeout=5)
            except Exception as exc:
                errors[status] = exc
        fake.fail("create", 400, message="Total disk limit exceeded. Maximum allowed: 30GiB")
        try:
            await p.create(SandboxSpec())
        except Exception as exc:
            errors["create-quota"] = exc
        fake.fail("create", 400, message="Snapshot nope not found")
        try:
            await p.create(SandboxSpec())
        except Exception as exc:
            errors["create-bad"] = exc
        fake.vanish(sandbox.id)
        try:
            await sandbox.exec(["true"], timeout=5)
        except Exception as exc:
            errors["vanished"] = exc
        return errors, await sandbox.alive()

    errors, alive = run(closing(p, go()))
    assert isinstance(errors[429], RateLimitError) and errors[429].retry_after == 2.0  # the longest wait
    assert type(errors[500]) is InfraError and type(errors[503]) is InfraError
    assert type(errors[504]) is InfraError  # a gateway timeout is not the program's timeout
    assert isinstance(errors[403], QuotaError) and isinstance(errors["create-quota"], QuotaError)
    assert isinstance(errors["create-bad"], ConfigError)
    assert type(errors["vanished"]) is SandboxGoneError and "vanished" in str(errors["vanished"])
    assert alive is False


def test_retry_after_headers():
    soon = email.utils.format_datetime(datetime.now(timezone.utc) + timedelta(seconds=30), usegmt=True)
    assert 25 < retry_after({"Retry-After": soon}) <= 30  # an HTTP date
    assert retry_after({"retry-after-sandbox-create": "3", "X-RateLimit-Remaining": "0"}) == 3.0
    assert retry_after({"Content-Type": "application/json"}) is None


def test_an_unreachable_service_is_an_infra_error(fake, provider):
    testing.check_unreachable_service_is_an_infra_error(provider, fake.stop)


def test_pool_honours_retry_after_and_retries_server_errors(fake, provider):
    testing.check_pool_honours_retry_after_and_retries_server_errors(
        provider, TAGS,
        rate_limit_exec=lambda wait, match: fake.fail("exec", 429, headers={"Retry-After": f"{wait:g}"}, match=match),
        fail_exec=lambda match: fake.fail("exec", 500, match=match),
        fail_create=lambda: fake.fail("create", 502),
        create_calls=lambda: fake.count("create"),
        live=fake.live,
    )


def test_create_that_times_out_after_the_sandbox_exists_is_deleted(fake, provider):
    p = provider(create_timeout_s=1)
    fake.stick_next_creates(1)
    with SandboxPool.open(p, size=1, spec=SandboxSpec(tags=TAGS), pool_settings=FAST) as pool:
        result = pool.run(["echo", "ok"], timeout=5)
        stuck = [s.id for s in fake.sandboxes.values() if s.state == "starting"]
        assert not stuck  # deleted by the provider as soon as its create timed out
    assert result.stdout == "ok\n"
    assert len(fake.deleted) == 2 and fake.live() == []


def test_create_abandoned_by_the_pool_deadline_is_swept_by_tags(fake, provider):
    p = provider(create_timeout_s=60)
    fake.stick_next_creates(1)
    settings = PoolSettings(**{**FAST.__dict__, "create_timeout_s": 1.5})
    with SandboxPool.open(p, size=1, spec=SandboxSpec(tags=TAGS), pool_settings=settings) as pool:
        assert pool.run(["echo", "ok"], timeout=5).stdout == "ok\n"
        assert len(fake.live()) == 2  # the abandoned one still exists on the server
    assert fake.live() == []  # the final sweep by tags removed it


def test_a_sandbox_that_vanishes_is_replaced(fake, provider):
    testing.check_a_sandbox_that_vanishes_is_replaced(provider, TAGS, vanish=fake.vanish, live=fake.live)


def test_scorer_end_to_end_on_the_sorting_task(fake, provider):
    testing.check_scorer_end_to_end_on_the_sorting_task(provider, TAGS, live=fake.live)


def test_io_programs_end_to_end(fake, provider):
    testing.check_io_programs_end_to_end(provider, TAGS, live=fake.live)


@pytest.mark.parametrize("seeds", [(1, 2, 3), (4, 5, 6)])
def test_seeded_fault_matrix(fake, provider, seeds):
    """20% transient faults on creates and execs, 5% vanishing sandboxes: every seed scores at
    least 90% of 41 programs, none wrongly, with every sandbox tagged and none left alive."""
    report = testing.check_rides_out_faults(
        provider, TAGS, chaos=fake.chaos, live=fake.live, created_tags=lambda: fake.created_labels, seeds=seeds)
    print(report)
    assert sum(row["create_failures"] + row["kept"] + row["replaced"] for row in report) > 0  # faults happened


def test_fault_matrix_positive_control_a_pool_that_gives_up_loses_programs(fake, provider):
    """The matrix's bar is not vacuous: with one attempt per job (no retry, no keeping) the same
    faults cost more than 10% of the programs."""
    from dataclasses import replace

    with pytest.raises(AssertionError, match="only"):
        testing.check_rides_out_faults(provider, TAGS, chaos=fake.chaos, live=fake.live, created_tags=lambda: fake.created_labels,
                                       seeds=(1, 2, 3), settings=replace(testing.MATRIX, max_attempts=1))


def test_the_conformance_check_catches_merged_streams(provider, monkeypatch):
    """Positive control: with the split switched off (the daemon's combined output as stdout)
    the conformance suite fails for a provider that declares separate streams."""
    import trl_sandbox_daytona.provider as module

    monkeypatch.setattr(module, "split_streams", lambda output, nonce: (output, "", True))
    with pytest.raises(AssertionError):
        testing.check_exec(provider)


# -- clean leases: what a program leaves cannot reach the next one --------------------------------


@pytest.mark.parametrize(("isolation", "resident"), [("auto", True), ("auto", False), ("sweep", True)])
def test_leftover_processes_cannot_reach_the_next_lease(provider, isolation, resident):
    """A program leaves a process (background child, own session, double fork; ignoring SIGTERM)
    that spins, fills /tmp and /dev/shm, and waits to kill, rob and tamper with the next program;
    the next program on that sandbox runs to its own result and sees none of it. ``auto`` gets a
    PID namespace per program on the fake; ``sweep`` is what an image refusing namespaces gets."""
    testing.check_leftovers_cannot_reach_the_next_lease(lambda: provider(isolation=isolation, resident_launcher=resident))


def test_positive_control_leftovers_reach_the_next_lease_without_the_launcher(provider):
    """The fake is honest: with plain SDK execs (no launcher) and the old reset, the same leftover
    survives into the next lease and gets the victim (or at least is seen by it)."""
    with pytest.raises(AssertionError):
        testing.check_leftovers_cannot_reach_the_next_lease(lambda: provider(clean_leases=False),
                                                            styles=["setsid"])


def test_a_reset_rides_with_the_next_exec(fake, provider):
    assert testing.check_a_reset_rides_with_the_next_exec(provider, lambda: fake.count("exec")) == 6


def test_positive_control_without_the_launcher_a_reset_costs_an_exec(fake, provider):
    # 6 programs and a reset exec after each lease: 5 to 7 resets fall in the count, as the pool's
    # resets after checkin land before or after it is read.
    with pytest.raises(AssertionError, match="1[1-3] exec requests for 6 programs"):
        testing.check_a_reset_rides_with_the_next_exec(lambda: provider(clean_leases=False),
                                                       lambda: fake.count("exec"))


@pytest.mark.parametrize(("isolation", "resident"), [("auto", True), ("auto", False), ("sweep", True)])
def test_a_program_cannot_undo_its_isolation(provider, isolation, resident):
    testing.check_a_program_cannot_undo_its_isolation(lambda: provider(isolation=isolation, resident_launcher=resident))


def test_positive_control_a_plain_exec_holds_the_sandbox_roots_capabilities(provider):
    """On the fake, as in a container that runs commands as root: without the launcher a program
    holds capabilities, and can unmount its sandbox's /proc."""
    with pytest.raises(AssertionError):
        testing.check_a_program_cannot_undo_its_isolation(lambda: provider(clean_leases=False))


def test_what_a_program_leaves_cannot_break_or_slow_the_next(provider):
    testing.check_what_a_program_leaves_cannot_break_or_slow_the_next(provider)


def test_positive_control_a_recursive_cleaning_in_python_breaks_on_a_deep_tree(tmp_path):
    """The deep tree of the check above is a real attack: Python's own recursive removal (the
    launcher's fallback where the image has no ``rm``) fails on it."""
    import os
    import sys

    from trl_sandbox.remote import launcher_cleaning

    path = os.path.join(str(tmp_path), "t")
    os.mkdir(path)
    here = os.open(path, os.O_RDONLY)
    for _ in range(sys.getrecursionlimit() + 10):
        os.mkdir("d", dir_fd=here)
        there = os.open("d", os.O_RDONLY, dir_fd=here)
        os.close(here)
        here = there
    os.close(here)
    with pytest.raises((RecursionError, OSError)):
        launcher_cleaning.remove(path)
    assert launcher_cleaning.rm_rf([path])  # what the launcher uses


def test_positive_control_the_fake_keeps_a_leftover_for_the_next_bare_sdk_exec(fake):
    """The fake is honest: with the bare SDK (two plain ``process.exec`` calls on one sandbox, as
    the vendor's examples do) the leftover of the first command survives and gets the second."""
    import asyncio
    import shlex

    from daytona import AsyncDaytona, CreateSandboxFromSnapshotParams, DaytonaConfig

    attacker, victim = testing.leftover_attack("setsid")

    async def go():
        client = AsyncDaytona(DaytonaConfig(api_key=API_KEY, api_url=fake.api_url))
        try:
            sandbox = await client.create(CreateSandboxFromSnapshotParams(), timeout=30)
            first = await sandbox.process.exec(f"mkdir -p /tmp/w && cd /tmp/w && {shlex.join(attacker)}", timeout=10)
            await asyncio.sleep(0.3)  # the leftover is up
            second = await sandbox.process.exec(
                f"cd /tmp/w && printf %s {shlex.quote(testing.VICTIM_SECRET)} | {shlex.join(victim)}", timeout=10)
            return first, second
        finally:
            await client.close()

    first, second = run(go())
    assert first.exit_code == 0
    assert second.exit_code != 0  # the leftover killed it (SIGKILL: 137)


def test_a_judge_sized_stdin_rides_in_the_exec_without_an_upload(fake, provider):
    """Stdin up to 64 KiB travels in the command (no upload request, no file in the sandbox);
    larger stdin is uploaded first, as before."""
    p = provider()
    digest = "import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())"
    small, large = bytes(range(256)) * 40, b"y" * (100 << 10)

    async def go():
        sandbox = await p.create(SandboxSpec())
        counts = []
        for data in (small, large):
            before = (fake.count("exec"), fake.count("upload"))
            result = await sandbox.exec(["python3", "-c", digest], stdin=data, timeout=10)
            counts.append((fake.count("exec") - before[0], fake.count("upload") - before[1], result.stdout))
        return counts

    import hashlib

    (small_calls, large_calls) = run(closing(p, go()))
    assert small_calls == (1, 0, hashlib.sha256(small).hexdigest() + "\n")
    assert large_calls == (1, 1, hashlib.sha256(large).hexdigest() + "\n")


def test_a_candidate_cannot_read_its_judge(provider):
    testing.check_a_candidate_cannot_read_its_judge(provider)


def test_positive_control_without_the_launcher_a_candidate_reads_its_judge(provider):
    """On the fake, as in a container whose commands run as root: without the launcher the
    candidate holds CAP_SYS_PTRACE and reads its judge's stdin despite its non-dumpable state."""
    with pytest.raises(AssertionError, match="the candidate read .*fd/0"):
        testing.check_a_candidate_cannot_read_its_judge(lambda: provider(clean_leases=False))


def test_devices_stay_as_the_image_made_them(provider):
    testing.check_devices_stay_as_the_image_made_them(provider)


def test_positive_control_without_the_launcher_a_program_writes_in_dev(provider):
    with pytest.raises(AssertionError, match="done"):
        testing.check_devices_stay_as_the_image_made_them(lambda: provider(clean_leases=False))


@pytest.fixture
def outside(fake):
    """Runs argv in a fake sandbox outside every lease (as the service's daemon would) -> stdout."""
    return lambda sandbox_id, argv: fake.sandboxes[sandbox_id].container.run_outside(argv)


def test_the_resident_launcher_serves_hides_and_is_optional(provider, outside):
    testing.check_the_resident_launcher(provider, outside)


def test_a_launcher_that_never_answers_is_the_sandboxs_failure_not_the_programs_timeout(provider, outside,
                                                                                        monkeypatch):
    from trl_sandbox_daytona import provider as module

    monkeypatch.setattr(module, "CLEANING_MARGIN_S", 1)  # the backstop: deadline + 1 s
    testing.check_a_launcher_that_never_answers(provider, outside)

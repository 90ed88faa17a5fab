"""The coreweave provider through the real ``cwsandbox`` SDK, against a fake gRPC service on loopback."""

from __future__ import annotations

import os

# Sandboxes a test leaves running keep a connection to the fake, and gRPC logs a GOAWAY line for each
# when the fake stops. Read when gRPC is first imported.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import asyncio  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import grpc  # noqa: E402
import pytest  # noqa: E402

pytest.register_assert_rewrite("trl_sandbox.plugins.testing")

from coreweave_fake import API_KEY, FakeCoreWeave  # noqa: E402
from trl_sandbox_coreweave.provider import decode_tags  # noqa: E402

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

TAGS = {"trl-sandbox": "1", "trl-sandbox-run": "coreweave-test"}


@pytest.fixture
def fake():
    server = FakeCoreWeave().start()
    yield server
    server.stop()


@pytest.fixture
def provider(fake, tmp_path):
    def build(name="coreweave", **settings):
        settings = {"api_key": API_KEY, "base_url": fake.base_url, "work_dir": f"{tmp_path}/{{id}}", **settings}
        return make_provider(name, settings)

    return build


# -- configuration --------------------------------------------------------------------------------


def test_registered_under_both_names_from_its_own_distribution(provider):
    found = providers()
    assert found["coreweave"].distribution == found["aviato"].distribution == "trl-sandbox-coreweave"
    assert provider("aviato").name == "aviato" and provider().name == "coreweave"


def test_missing_credentials_are_a_config_error_naming_the_variable(monkeypatch):
    monkeypatch.delenv("CWSANDBOX_API_KEY", raising=False)
    monkeypatch.delenv("AVIATO_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="CWSANDBOX_API_KEY") as info:
        make_provider("coreweave", {})
    assert "rename" not in str(info.value)
    monkeypatch.setenv("AVIATO_API_KEY", "old")  # the pre-rename variable is not read by the SDK
    with pytest.raises(ConfigError, match="AVIATO_API_KEY is set, but it is no longer read"):
        make_provider("aviato", {})
    with pytest.raises(ConfigError, match="auth="):
        make_provider("coreweave", {"api_key": "k", "auth": "password"})
    monkeypatch.setenv("CWSANDBOX_API_KEY", "from-env")
    assert make_provider("coreweave", {}).name == "coreweave"


def test_missing_credentials_fail_when_the_trainer_is_built(monkeypatch, tmp_path):
    from trl_sandbox import SandboxGRPOConfig, SandboxGRPOTrainer

    monkeypatch.delenv("CWSANDBOX_API_KEY", raising=False)
    args = SandboxGRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none",
                             sandbox_provider="coreweave")
    with pytest.raises(ConfigError, match="CWSANDBOX_API_KEY"):
        SandboxGRPOTrainer(model="never-loaded", args=args, train_dataset=load_tasks("builtin"))


def test_rejected_key_is_a_config_error(provider):
    p = provider(api_key="wrong")
    with pytest.raises(ConfigError, match="CWSANDBOX_API_KEY"):
        run(closing(p, p.create(SandboxSpec())))


# -- create ---------------------------------------------------------------------------------------


def test_create_carries_tags_lifetime_image_resources_env_and_network_off(fake, provider):
    p = provider()
    spec = SandboxSpec(tags=TAGS, env={"GREETING": "hi there"}, lifetime_s=1234.5, cpus=2, memory_mb=3000)

    async def go():
        sandbox = await p.create(spec)
        echoed = await sandbox.exec(["sh", "-c", 'printf %s "$GREETING"'], timeout=5)
        return sandbox, echoed

    sandbox, echoed = run(closing(p, go()))
    sent = fake.sandboxes[sandbox.id].spec
    assert set(sent.tags) == {"trl-sandbox:1", "trl-sandbox-run:coreweave-test"}
    assert sent.max_lifetime_seconds == 1235  # a server-side lifetime
    container = sent.containers[0]
    assert container.image == "python:3.11"
    assert dict(container.environment_variables) == {"GREETING": "hi there"} and echoed.stdout == "hi there"
    limits = container.resource_requirements.limits
    assert (limits.cpu, limits.memory) == ("2000m", "3000Mi")
    assert sent.network.deny_egress and sent.network.deny_ingress


def test_image_resources_and_network_on_from_settings(fake, provider):
    p = provider(image="python:3.12-slim", cpu="500m", memory="1Gi", runtime_class="gvisor")
    sandbox = run(closing(p, p.create(SandboxSpec(network=True, image=None))))
    sent = fake.sandboxes[sandbox.id].spec
    container = sent.containers[0]
    assert container.image == "python:3.12-slim" and sent.runtime_class == "gvisor"
    assert (container.resource_requirements.requests.cpu, container.resource_requirements.requests.memory) == (
        "500m", "1Gi")
    assert not sent.HasField("network")  # network on: the service's default policy


# -- exec, files, reset ---------------------------------------------------------------------------


def test_exec_exit_codes_separate_streams_and_byte_exact_stdin(provider):
    results = testing.check_exec(provider)  # the large stdin goes in several frames
    assert results["with_stdin"].stderr == "to stderr\n"  # separate streams


def test_cwd_env_and_limits(provider):
    sandbox = testing.check_cwd_env_and_limits(provider)
    assert {"prlimit", "timeout"} <= sandbox.tools


def test_timeout_is_a_result_and_the_sandbox_survives(provider):
    testing.check_timeout_is_a_result(provider)


def test_a_command_that_outlives_its_cancelled_rpc_is_killed_in_the_sandbox(fake, provider):
    fake.kill_on_cancel = False  # a service that does not stop the command when the exec RPC ends
    p = provider(clean_leases=False)  # the launcher would end it too: this is about `timeout -s KILL`

    def still_there(box) -> bool:
        return subprocess.run(box.argv(["pgrep", "-f", "sleep 61.25"]), capture_output=True).returncode == 0

    async def go():
        sandbox = await p.create(SandboxSpec())
        box = fake.sandboxes[sandbox.id].box
        result = await sandbox.exec(["sh", "-c", "exec sleep 61.25"], timeout=1)
        seen = [await asyncio.to_thread(still_there, box)]  # right after the RPC's deadline: still there
        deadline = time.monotonic() + 10
        while seen[-1] and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # waiting for the in-sandbox `timeout -s KILL` is the thing under test
            seen.append(await asyncio.to_thread(still_there, box))
        return result, seen

    result, seen = run(closing(p, go()))
    assert result.timed_out
    assert seen[0] and not seen[-1]


def test_files_reset_and_alive(provider):
    testing.check_files_reset_and_alive(provider)


def test_list_by_tags_across_pages_and_destroy(fake, provider):
    pages = testing.check_list_by_tags_and_destroy(provider, TAGS, state="running", live=fake.live,
                                                   list_calls=lambda: fake.count("list"),
                                                   unknown_id="cw-no-such-sandbox")
    assert pages == 2  # the fake pages by two: the SDK followed the page token


# -- errors and the pool ----------------------------------------------------------------------------


def test_error_mapping(fake, provider):
    p = provider()
    cases = [
        ("limited", grpc.StatusCode.RESOURCE_EXHAUSTED, {"retry_delay": 1.5}, ""),
        ("quota", grpc.StatusCode.RESOURCE_EXHAUSTED, {}, "sandbox quota exceeded for the organization"),
        ("unavailable", grpc.StatusCode.UNAVAILABLE, {}, ""),
        ("internal", grpc.StatusCode.INTERNAL, {}, ""),
    ]

    async def go():
        sandbox = await p.create(SandboxSpec())
        errors = {}
        for name, code, extra, message in cases:
            fake.fail("exec", code, message=message, **extra)
            try:
                await sandbox.exec(["true"], timeout=5)
            except Exception as exc:
                errors[name] = exc
        fake.fail("create", grpc.StatusCode.RESOURCE_EXHAUSTED, message="CPU quota exceeded",
                  reason="CWSANDBOX_QUOTA_EXCEEDED")
        try:
            await p.create(SandboxSpec())
        except Exception as exc:
            errors["create-quota"] = exc
        fake.fail("create", grpc.StatusCode.INVALID_ARGUMENT, message="unknown runtime class")
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
    assert isinstance(errors["limited"], RateLimitError) and errors["limited"].retry_after == 1.5
    assert isinstance(errors["quota"], QuotaError) and isinstance(errors["create-quota"], QuotaError)
    assert type(errors["unavailable"]) is InfraError and type(errors["internal"]) is InfraError
    assert isinstance(errors["create-bad"], ConfigError)
    assert type(errors["vanished"]) is SandboxGoneError and "vanished" in str(errors["vanished"])
    assert alive is False


def test_an_unreachable_service_is_an_infra_error(fake, provider):
    testing.check_unreachable_service_is_an_infra_error(provider, fake.stop)


def test_pool_honours_retry_after_and_retries_server_errors(fake, provider):
    testing.check_pool_honours_retry_after_and_retries_server_errors(
        provider, TAGS,
        rate_limit_exec=lambda wait, match: fake.fail("exec", grpc.StatusCode.RESOURCE_EXHAUSTED, retry_delay=wait,
                                                      match=match),
        fail_exec=lambda match: fake.fail("exec", grpc.StatusCode.INTERNAL, match=match),
        fail_create=lambda: fake.fail("create", grpc.StatusCode.UNAVAILABLE),
        create_calls=lambda: fake.count("create"),
        live=fake.live,
    )


def test_create_that_never_starts_is_deleted(fake, provider):
    p = provider(start_timeout_s=1)
    fake.stick_next_creates(1)
    with SandboxPool.open(p, size=1, spec=SandboxSpec(tags=TAGS), pool_settings=FAST) as pool:
        assert pool.run(["echo", "ok"], timeout=5).stdout == "ok\n"
    stuck = next(iter(fake.sandboxes))
    assert len(fake.deleted) == 2 and fake.live() == []
    # deleted by the provider when its start timed out, before the pool's final sweep by tags
    assert fake.calls.index(("delete", stuck)) < fake.calls.index(("list", None))


def test_create_abandoned_by_the_pool_deadline_leaves_nothing_behind(fake, provider):
    p = provider(start_timeout_s=60)
    fake.stick_next_creates(1)
    settings = PoolSettings(**{**FAST.__dict__, "create_timeout_s": 1.5})
    with SandboxPool.open(p, size=1, spec=SandboxSpec(tags=TAGS), pool_settings=settings) as pool:
        assert pool.run(["echo", "ok"], timeout=5).stdout == "ok\n"
    assert len(fake.sandboxes) == 2 and fake.live() == []


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
        provider, TAGS, chaos=fake.chaos, live=fake.live, created_tags=lambda: [decode_tags(t) for t in fake.created_tags], seeds=seeds)
    print(report)
    assert sum(row["create_failures"] + row["kept"] + row["replaced"] for row in report) > 0  # faults happened


def test_fault_matrix_positive_control_a_pool_that_gives_up_loses_programs(fake, provider):
    """The matrix's bar is not vacuous: with one attempt per job (no retry, no keeping) the same
    faults cost more than 10% of the programs."""
    from dataclasses import replace

    with pytest.raises(AssertionError, match="only"):
        testing.check_rides_out_faults(provider, TAGS, chaos=fake.chaos, live=fake.live, created_tags=lambda: [decode_tags(t) for t in fake.created_tags],
                                       seeds=(1, 2, 3), settings=replace(testing.MATRIX, max_attempts=1))


def test_lifetime_is_capped_so_leftovers_end_within_minutes(fake, provider):
    async def lifetime(p, spec):
        await p.create(spec)
        return fake.sandboxes[list(fake.sandboxes)[-1]].spec.max_lifetime_seconds

    assert run(closing(provider(), lifetime(provider(), SandboxSpec()))) == 1800  # not the spec's 6 h
    assert run(closing(provider(), lifetime(provider(max_lifetime_s=600), SandboxSpec()))) == 600
    with pytest.raises(ConfigError, match="max_lifetime_s"):
        provider(max_lifetime_s=10)


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
    return lambda sandbox_id, argv: fake.sandboxes[sandbox_id].box.run_outside(argv)


def test_the_resident_launcher_serves_hides_and_is_optional(provider, outside):
    testing.check_the_resident_launcher(provider, outside)


def test_a_launcher_that_never_answers_is_the_sandboxs_failure_not_the_programs_timeout(provider, outside,
                                                                                        monkeypatch):
    from trl_sandbox_coreweave import provider as module

    monkeypatch.setattr(module, "CLEANING_MARGIN_S", 1)  # the backstop: deadline + 1 s
    testing.check_a_launcher_that_never_answers(provider, outside)

"""The modal provider through the real ``modal`` SDK, against the fake Modal on loopback."""

from __future__ import annotations

import math

import pytest
from modal_proto import api_pb2
from trl_sandbox_modal.fake import SDK_ATTEMPTS
from trl_sandbox_modal.provider import CREATED_TAG

from trl_sandbox import (
    ConfigError,
    InfraError,
    QuotaError,
    RateLimitError,
    SandboxGoneError,
    SandboxSpec,
    load_tasks,
)
from trl_sandbox.plugins import make_provider, providers, testing
from trl_sandbox.plugins.testing import closing, run

TAGS = {"trl-sandbox": "1", "trl-sandbox-run": "modal-test"}
CREDENTIAL_VARS = ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET")


# -- configuration --------------------------------------------------------------------------------


def test_registered_from_its_own_distribution():
    assert providers()["modal"].distribution == "trl-sandbox-modal"


def test_missing_credentials_are_a_config_error_naming_the_variables(monkeypatch, tmp_path):
    for name in CREDENTIAL_VARS:
        monkeypatch.delenv(name, raising=False)
    import modal.config

    monkeypatch.setattr(modal.config, "_user_config", {})  # no ~/.modal.toml profile either
    with pytest.raises(ConfigError, match="MODAL_TOKEN_ID and MODAL_TOKEN_SECRET"):
        make_provider("modal", {})
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-x")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-x")
    assert make_provider("modal", {}).name == "modal"  # the SDK's own variables are honoured


def test_missing_credentials_fail_when_the_trainer_is_built(monkeypatch, tmp_path):
    from trl_sandbox import SandboxGRPOConfig, SandboxGRPOTrainer

    for name in CREDENTIAL_VARS:
        monkeypatch.delenv(name, raising=False)
    import modal.config

    monkeypatch.setattr(modal.config, "_user_config", {})
    args = SandboxGRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none",
                             sandbox_provider="modal")
    with pytest.raises(ConfigError, match="MODAL_TOKEN_ID"):
        SandboxGRPOTrainer(model="never-loaded", args=args, train_dataset=load_tasks("builtin"))


def test_a_missing_sdk_is_a_one_line_config_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "modal.config", None)  # as if the modal package were not installed
    with pytest.raises(ConfigError, match="pip install trl-sandbox-modal") as caught:
        make_provider("modal", {"token_id": "ak-x", "token_secret": "as-x"})
    assert "\n" not in str(caught.value)


def test_rejected_token_is_a_config_error(provider):
    p = provider(token_id="ak-wrong", token_secret="as-wrong")
    with pytest.raises(ConfigError, match="token was rejected.*MODAL_TOKEN_ID"):
        run(closing(p, p.create(SandboxSpec())))


def test_an_image_that_cannot_be_built_is_a_one_line_config_error(provider):
    p = provider(image="no-such-image:latest")
    with pytest.raises(ConfigError, match="could not be built") as caught:
        run(closing(p, p.create(SandboxSpec())))
    assert "\n" not in str(caught.value)


def test_bad_settings_are_config_errors(provider):
    with pytest.raises(ConfigError, match="cpu"):
        provider(cpu="many")
    with pytest.raises(ConfigError, match="work_dir"):
        provider(work_dir="relative/dir")
    with pytest.raises(ConfigError, match="isolation"):
        provider(isolation="none")


# -- create ---------------------------------------------------------------------------------------


def test_create_carries_tags_env_lifetime_resources_and_network_off(fake, provider):
    p = provider()
    spec = SandboxSpec(tags=TAGS, env={"GREETING": "hi there"}, lifetime_s=1000.5, cpus=2, memory_mb=3000)

    async def go():
        sandbox = await p.create(spec)
        return sandbox, await sandbox.exec(["sh", "-c", 'printf %s "$GREETING"'], timeout=5)

    sandbox, echoed = run(closing(p, go()))
    made = fake.sandboxes[sandbox.id]
    assert {k: made.tags[k] for k in TAGS} == TAGS and CREATED_TAG in made.tags
    assert echoed.stdout == "hi there"
    definition = made.definition
    assert definition.timeout_secs == math.ceil(1000.5)  # a finite server-side lifetime
    assert definition.network_access.network_access_type == api_pb2.NetworkAccess.BLOCKED
    assert list(definition.entrypoint_args) == ["sleep", "infinity"]
    resources = definition.resources
    assert (resources.milli_cpu, resources.milli_cpu_max) == (1000, 1000)  # 2 vCPUs = 1 physical core
    assert (resources.memory_mb, resources.memory_mb_max) == (3000, 3000)


def test_network_on_when_asked(fake, provider):
    p = provider()
    sandbox = run(closing(p, p.create(SandboxSpec(network=True))))
    assert fake.sandboxes[sandbox.id].definition.network_access.network_access_type != api_pb2.NetworkAccess.BLOCKED


# -- exec, files, reset ---------------------------------------------------------------------------


def test_exec_exit_codes_separate_streams_and_byte_exact_stdin(provider):
    results = testing.check_exec(provider)
    assert results["with_stdin"].stderr == "to stderr\n"


def test_cwd_env_and_limits(provider):
    testing.check_cwd_env_and_limits(provider)


def test_timeout_is_a_result_and_the_sandbox_survives(provider):
    testing.check_timeout_is_a_result(provider)


def test_files_reset_and_alive(provider):
    testing.check_files_reset_and_alive(provider)


def test_list_by_tags_across_pages_and_destroy(fake, provider):
    pages = testing.check_list_by_tags_and_destroy(provider, TAGS, state="running", live=fake.live,
                                                   list_calls=lambda: fake.count("SandboxListV2"),
                                                   unknown_id="sb-fake-never")
    assert pages == 3  # the fake pages by two: the SDK followed the timestamps, then an empty page


# -- errors and the pool ----------------------------------------------------------------------------


def test_error_mapping(fake, provider):
    p = provider()

    async def go():
        sandbox = await p.create(SandboxSpec())
        errors = {}
        for name, rpc, status, kwargs in [
            ("throttle", "TaskExecStart", "RESOURCE_EXHAUSTED", {"retry_after": 2.5}),
            ("create-rate", "SandboxCreateV2", "RESOURCE_EXHAUSTED",
             {"message": "Sandbox creation rate limit (5/s) exceeded"}),
            ("quota", "SandboxCreateV2", "RESOURCE_EXHAUSTED",
             {"message": "You have reached the limit of 100 concurrent sandboxes"}),
            ("unavailable", "TaskExecStart", "UNAVAILABLE", {}),  # outlasting the SDK's own retries
            ("internal", "SandboxCreateV2", "INTERNAL", {}),
            ("invalid", "SandboxCreateV2", "INVALID_ARGUMENT", {"message": "cpu must be at most 64"}),
        ]:
            fake.fail(rpc, status, **kwargs)
            try:
                if rpc == "TaskExecStart":
                    await sandbox.exec(["true"], timeout=5)
                else:
                    await p.create(SandboxSpec())
            except Exception as exc:
                errors[name] = exc
        fake.vanish(sandbox.id)
        try:
            await sandbox.exec(["true"], timeout=5)
        except Exception as exc:
            errors["vanished"] = exc
        return errors, await sandbox.alive()

    errors, alive = run(closing(p, go()))
    assert isinstance(errors["throttle"], RateLimitError) and errors["throttle"].retry_after == 2.5
    assert isinstance(errors["create-rate"], RateLimitError)
    assert isinstance(errors["quota"], QuotaError)
    assert type(errors["unavailable"]) is InfraError and type(errors["internal"]) is InfraError
    assert isinstance(errors["invalid"], ConfigError)
    assert type(errors["vanished"]) is SandboxGoneError
    assert alive is False


def test_a_throttle_is_a_rate_limit_not_latency(fake, provider, monkeypatch):
    """With ``MODAL_MAX_THROTTLE_WAIT`` at the provider's 0, Modal's client raises on a throttle at
    once and the pool's limiter waits out the server's ``retry_after``; the control: with the
    variable unset, the very same throttles are slept through inside the SDK, invisible to the pool."""
    import time

    p = provider()

    async def go():
        sandbox = await p.create(SandboxSpec())
        fake.fail("TaskExecStart", "RESOURCE_EXHAUSTED", times=3, retry_after=0.4)
        t0 = time.monotonic()
        try:
            await sandbox.exec(["true"], timeout=5)
        except RateLimitError as exc:
            return exc, time.monotonic() - t0
        return None, time.monotonic() - t0

    error, _ = run(closing(p, go()))
    assert isinstance(error, RateLimitError) and error.retry_after == 0.4
    p = provider()
    monkeypatch.delenv("MODAL_MAX_THROTTLE_WAIT")  # the SDK's default: wait without limit
    error, waited = run(closing(p, go()))
    assert error is None and waited >= 1.2  # three throttles slept through: latency, no error


def test_an_unreachable_service_is_an_infra_error(fake, provider):
    testing.check_unreachable_service_is_an_infra_error(provider, fake.stop)


def test_pool_honours_retry_after_and_retries_server_errors(fake, provider):
    testing.check_pool_honours_retry_after_and_retries_server_errors(
        provider, TAGS,
        rate_limit_exec=lambda wait, match: fake.fail("TaskExecStart", "RESOURCE_EXHAUSTED", retry_after=wait,
                                                      match=match),
        fail_exec=lambda match: fake.fail("TaskExecStart", "UNAVAILABLE", match=match),
        fail_create=lambda: fake.fail("SandboxCreateV2", "UNAVAILABLE"),
        # the provider's creates: the failed one took the SDK's four requests, the good one one
        create_calls=lambda: fake.count("SandboxCreateV2") - (SDK_ATTEMPTS["control"] - 1),
        live=fake.live,
    )


def test_a_sandbox_that_vanishes_is_replaced(fake, provider):
    testing.check_a_sandbox_that_vanishes_is_replaced(provider, TAGS, vanish=fake.vanish, live=fake.live)


def test_scorer_end_to_end_on_the_sorting_task(fake, provider):
    testing.check_scorer_end_to_end_on_the_sorting_task(provider, TAGS, live=fake.live)


def test_io_programs_end_to_end(fake, provider):
    testing.check_io_programs_end_to_end(provider, TAGS, live=fake.live)


def test_create_abandoned_by_the_pool_deadline_is_swept_by_tags(fake, provider):
    """A create slower than the pool's deadline still makes its sandbox on the service (Modal
    cannot be told to stop); the pool's final sweep by tags removes it."""
    from dataclasses import replace

    from trl_sandbox.plugins.testing import FAST
    from trl_sandbox.pool.sandbox_pool import SandboxPool

    p = provider()
    fake.stall("SandboxCreateV2", 2.5)
    settings = replace(FAST, create_timeout_s=1.0)
    with SandboxPool.open(p, size=1, spec=SandboxSpec(tags=TAGS), pool_settings=settings) as pool:
        assert pool.run(["echo", "ok"], timeout=5).stdout == "ok\n"
    assert len(fake.created_tags) >= 2  # the abandoned create made one too
    assert fake.live() == []  # the final sweep by tags removed it

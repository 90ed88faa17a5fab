"""The e2b provider through the real ``e2b`` SDK, against the fake E2B on loopback."""

from __future__ import annotations

import e2b_testing
import pytest
from e2b_testing import TAGS

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

fake, provider = e2b_testing.fake, e2b_testing.provider  # the fixtures this module uses

CREDENTIAL_VARS = ("E2B_API_KEY", "E2B_ACCESS_TOKEN", "E2B_API_URL", "E2B_SANDBOX_URL", "E2B_DOMAIN")


# -- configuration --------------------------------------------------------------------------------


def test_registered_from_its_own_distribution():
    assert providers()["e2b"].distribution == "trl-sandbox-e2b"


def test_missing_key_is_a_one_line_config_error_naming_the_variable(monkeypatch):
    for name in CREDENTIAL_VARS:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="E2B_API_KEY.*e2b.dev") as caught:
        make_provider("e2b", {})
    assert "\n" not in str(caught.value)
    monkeypatch.setenv("E2B_API_KEY", "from-env")  # the SDK's own variable is honoured
    assert make_provider("e2b", {}).name == "e2b"


def test_missing_key_fails_when_the_trainer_is_built(monkeypatch, tmp_path):
    from trl_sandbox import SandboxGRPOConfig, SandboxGRPOTrainer

    for name in CREDENTIAL_VARS:
        monkeypatch.delenv(name, raising=False)
    args = SandboxGRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none",
                             sandbox_provider="e2b")
    with pytest.raises(ConfigError, match="E2B_API_KEY"):
        SandboxGRPOTrainer(model="never-loaded", args=args, train_dataset=load_tasks("builtin"))


def test_a_missing_sdk_is_a_config_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "e2b", None)  # as if not installed
    with pytest.raises(ConfigError, match="pip install trl-sandbox-e2b"):
        make_provider("e2b", {"api_key": "k"})


def test_rejected_key_is_a_config_error(fake, provider):
    p = provider()
    fake.fail("create", 401, message="Invalid API key")
    with pytest.raises(ConfigError, match="E2B_API_KEY"):
        run(closing(p, p.create(SandboxSpec())))


def test_unknown_template_is_a_one_line_config_error(provider):
    p = provider(template="no-such-template")
    with pytest.raises(ConfigError, match="no-such-template.*template") as caught:
        run(closing(p, p.create(SandboxSpec())))
    assert "\n" not in str(caught.value)


def test_bad_settings_are_config_errors(provider):
    with pytest.raises(ConfigError, match="work_dir"):
        provider(work_dir="relative/dir")
    with pytest.raises(ConfigError, match="isolation"):
        provider(isolation="none")
    with pytest.raises(ConfigError, match="retries"):
        provider(retries="many")


# -- create ---------------------------------------------------------------------------------------


def test_create_carries_metadata_env_lifetime_and_network_off(fake, provider):
    p = provider()
    spec = SandboxSpec(tags=TAGS, env={"GREETING": "hi there"}, lifetime_s=1000)

    async def go():
        sandbox = await p.create(spec)
        echoed = await sandbox.exec(["sh", "-c", 'printf %s "$GREETING"'], timeout=5)
        return sandbox, echoed

    sandbox, echoed = run(closing(p, go()))
    request = fake.create_requests[-1]
    assert {k: request["metadata"][k] for k in TAGS} == TAGS
    assert request["envVars"] == {"GREETING": "hi there"} and echoed.stdout == "hi there"
    assert request["allow_internet_access"] is False
    assert request["timeout"] == 1000  # a finite server-side lifetime, killed at its end
    assert fake.sandboxes[sandbox.id].template == "base"


def test_network_on_is_passed_on(fake, provider):
    p = provider()
    run(closing(p, p.create(SandboxSpec(network=True))))
    assert fake.create_requests[-1]["allow_internet_access"] is True


def test_the_lifetime_is_capped_by_the_plans_maximum(fake, provider):
    run(closing(provider(), provider().create(SandboxSpec())))  # 6 h asked, Hobby's 1 h given
    p = provider(max_lifetime_s="600")
    run(closing(p, p.create(SandboxSpec(lifetime_s=1000))))
    assert [r["timeout"] for r in fake.create_requests] == [3600, 600]
    assert p.lifetime_cap_s == 600  # the pool rotates members before it


def test_the_lifetime_ends_the_sandbox_and_everything_in_it(fake, provider):
    """Past its lifetime the service kills the sandbox: every route answers 502 "was not found",
    which is a vanished sandbox (``SandboxGoneError``), and ``alive`` says False."""
    p = provider()

    async def go():
        sandbox = await p.create(SandboxSpec(lifetime_s=600))
        fake.sandboxes[sandbox.id].end_at = 0  # its lifetime is over
        gone = await testing._raises(SandboxGoneError, sandbox.exec(["true"], timeout=5))
        return gone, await sandbox.alive()

    gone, alive = run(closing(p, go()))
    assert "gone" in str(gone) and alive is False and fake.live() == []


# -- exec, files, reset ---------------------------------------------------------------------------


def test_exec_exit_codes_separate_streams_and_byte_exact_stdin(fake, provider):
    testing.check_exec(provider)


def test_cwd_env_and_limits(provider):
    testing.check_cwd_env_and_limits(provider)


def test_timeout_is_a_result_and_the_sandbox_survives(provider):
    testing.check_timeout_is_a_result(provider)


def test_files_reset_and_alive(provider):
    testing.check_files_reset_and_alive(provider)


def test_list_by_tags_across_pages_and_destroy(fake, provider):
    fake.page_size = 2
    pages = testing.check_list_by_tags_and_destroy(provider, TAGS, state="running", live=fake.live,
                                                   list_calls=lambda: fake.count("list"))
    assert pages >= 2  # the fake pages by two: the SDK followed x-next-token


# -- errors ---------------------------------------------------------------------------------------


def test_error_mapping(fake, provider):
    p = provider()

    async def go():
        sandbox = await p.create(SandboxSpec())
        found = {}
        for status in (429, 500, 503, 504):
            fake.fail("exec", status)
            found[status] = await testing._raises(Exception, sandbox.exec(["true"], timeout=5))
        for status in (429, 503, 500):
            fake.fail("create", status)
            found[f"create-{status}"] = await testing._raises(Exception, p.create(SandboxSpec()))
        fake.fail("create", 400, message="Team quota exceeded: limit reached")
        found["create-400"] = await testing._raises(Exception, p.create(SandboxSpec()))
        fake.fail("exec", 0)  # the connection drops; the sandbox is still there
        found["drop"] = await testing._raises(Exception, sandbox.exec(["true"], timeout=5))
        fake.fail("exec", 0)  # and the SDK's health probe fails too: unreachable, not confirmed dead
        fake.fail("health", 0)
        found["unreachable"] = await testing._raises(Exception, sandbox.exec(["true"], timeout=5))
        found["after"] = await sandbox.exec(["echo", "fine"], timeout=5)  # it was alive all along
        fake.vanish(sandbox.id)
        found["vanished"] = await testing._raises(Exception, sandbox.exec(["true"], timeout=5))
        found["vanished-write"] = await testing._raises(Exception, sandbox.write_file("a", b"x"))
        return found, await sandbox.alive()

    found, alive = run(closing(p, go()))
    assert isinstance(found[429], RateLimitError) and found[429].retry_after == 1.0
    assert isinstance(found["create-429"], RateLimitError)
    assert found["after"].stdout == "fine\n"
    for key in (500, 503, 504, "create-503", "create-500", "drop", "unreachable"):
        assert type(found[key]) is InfraError, (key, found[key])
    assert isinstance(found["create-400"], QuotaError)
    assert type(found["vanished"]) is SandboxGoneError and type(found["vanished-write"]) is SandboxGoneError
    assert alive is False


def test_an_unreachable_service_is_an_infra_error(fake, provider):
    testing.check_unreachable_service_is_an_infra_error(provider, fake.stop)


def test_the_sdk_retries_only_when_asked(fake, provider):
    """The SDK retries 5xx on the control plane by itself; by default it does not, so the pool's
    budget counts every attempt; ``retries=2`` lets it ride out a 502 inside one create."""
    fake.fail("create", 502)
    with pytest.raises(InfraError):
        run(closing(provider(), provider().create(SandboxSpec())))
    fake.fail("create", 502)
    p = provider(retries=2)
    run(closing(p, p.create(SandboxSpec())))
    assert fake.count("create") == 3


def test_the_plans_concurrency_limit_is_a_rate_limit(fake, provider):
    """Past the plan's running sandboxes (Hobby: 20) E2B answers 429: the pool waits, never scores it."""
    fake.max_sandboxes = 1
    p = provider()

    async def go():
        first = await p.create(SandboxSpec())
        refused = await testing._raises(RateLimitError, p.create(SandboxSpec()))
        await p.destroy(first.id)
        second = await p.create(SandboxSpec())  # the slot is free again
        return refused, second

    refused, second = run(closing(p, go()))
    assert "maximum number of concurrent" in str(refused) and second.id in fake.live()

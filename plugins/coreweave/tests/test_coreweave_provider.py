"""The coreweave provider through the real ``cwsandbox`` SDK, against a fake gRPC service on loopback."""

from __future__ import annotations

import os

# Sandboxes a test leaves running keep a connection to the fake, and gRPC logs a GOAWAY line for each
# when the fake stops. Read when gRPC is first imported.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import asyncio  # noqa: E402
import hashlib  # noqa: E402
import time  # noqa: E402

import grpc  # noqa: E402
import pytest  # noqa: E402
from coreweave_fake import API_KEY, FakeCoreWeave  # noqa: E402

from trl_sandbox import (  # noqa: E402
    ConfigError,
    InfraError,
    QuotaError,
    RateLimitError,
    SandboxSpec,
    load_tasks,
)
from trl_sandbox.builtin_tasks import SOLUTIONS  # noqa: E402
from trl_sandbox.plugins import make_provider, providers  # noqa: E402
from trl_sandbox.pool import PoolSettings, SandboxPool  # noqa: E402
from trl_sandbox.scoring import Scorer  # noqa: E402

FAST = PoolSettings(backoff_initial_s=0.05, backoff_max_s=0.2, lease_timeout_s=20.0, create_timeout_s=20.0,
                    destroy_timeout_s=10.0, health_interval_s=3600.0)
TAGS = {"trl-sandbox": "1", "trl-sandbox-run": "coreweave-test"}
STDIN = bytes(range(256)) * 4 + b"\r\n\n$(touch /tmp/pwned)\x00EOF\n'\"`" + b"\xff" * 3


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


def run(coro):
    return asyncio.run(coro)


async def closing(provider, coro):
    try:
        return await coro
    finally:
        await provider.aclose()


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
    p = provider()
    digest = ("import hashlib, sys; data = sys.stdin.buffer.read(); "
              "print(len(data), hashlib.sha256(data).hexdigest()); print('to stderr', file=sys.stderr); sys.exit(3)")

    async def go():
        sandbox = await p.create(SandboxSpec())
        with_stdin = await sandbox.exec(["python3", "-c", digest], stdin=STDIN, timeout=10)
        as_text = await sandbox.exec(["python3", "-c", digest], stdin="héllo", timeout=10)
        without = await sandbox.exec(["python3", "-c", digest], timeout=10)
        big = b"x" * (3 << 20)
        large = await sandbox.exec(["python3", "-c", digest], stdin=big, timeout=20)
        quoted = await sandbox.exec(["printf", "%s|", "a b", "$HOME", "it's", ";ls"], timeout=5)
        missing = await sandbox.exec(["no-such-program-xyz"], timeout=5)
        return with_stdin, as_text, without, (big, large), quoted, missing

    with_stdin, as_text, without, (big, large), quoted, missing = run(closing(p, go()))
    assert with_stdin.exit_code == 3 and not with_stdin.timed_out
    assert with_stdin.stdout == f"{len(STDIN)} {hashlib.sha256(STDIN).hexdigest()}\n"
    assert with_stdin.stderr == "to stderr\n"  # separate streams
    assert as_text.stdout == f"{len('héllo'.encode())} {hashlib.sha256('héllo'.encode()).hexdigest()}\n"
    assert without.stdout == f"0 {hashlib.sha256(b'').hexdigest()}\n"  # no stdin: the program reads EOF
    assert large.stdout == f"{len(big)} {hashlib.sha256(big).hexdigest()}\n"  # several stdin frames
    assert quoted.stdout == "a b|$HOME|it's|;ls|"  # no shell in between
    assert missing.exit_code == 127 and not missing.timed_out


def test_cwd_env_and_limits(provider):
    p = provider()

    async def go():
        sandbox = await p.create(SandboxSpec())
        await sandbox.write_file("sub/keep.txt", b"x")
        env_cwd = await sandbox.exec(["sh", "-c", 'echo "$X"; pwd'], env={"X": "1 2"}, cwd="sub", timeout=5)
        limits = await sandbox.exec(["sh", "-c", "ulimit -n; ulimit -v"], timeout=5)
        return sandbox, env_cwd, limits

    sandbox, env_cwd, limits = run(closing(p, go()))
    assert env_cwd.stdout.splitlines() == ["1 2", f"{sandbox.work_dir}/sub"]
    assert {"prlimit", "timeout"} <= sandbox.tools
    assert limits.stdout.split() == ["256", str(1024 * 1024)]  # ResourceLimits defaults


def test_timeout_is_a_result_and_the_sandbox_survives(provider):
    p = provider()

    async def go():
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


def test_a_command_that_outlives_its_cancelled_rpc_is_killed_in_the_sandbox(fake, provider, tmp_path):
    fake.kill_on_cancel = False  # a service that does not stop the command when the exec RPC ends
    p = provider()
    pidfile = tmp_path / "pid"

    async def go():
        sandbox = await p.create(SandboxSpec())
        return await sandbox.exec(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 60"], timeout=1)

    assert run(closing(p, go())).timed_out
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)  # waiting for the in-sandbox `timeout -s KILL` is the thing under test
    assert not os.path.exists(f"/proc/{pid}")
    assert time.monotonic() < deadline


def test_files_reset_and_alive(provider):
    p = provider()

    async def go():
        sandbox = await p.create(SandboxSpec())
        await sandbox.write_file("deep/dir/data.bin", STDIN)
        back = await sandbox.read_file("deep/dir/data.bin")
        absolute = await sandbox.read_file(f"{sandbox.work_dir}/deep/dir/data.bin")
        seen = await sandbox.exec(["sha256sum", "deep/dir/data.bin"], timeout=5)
        with pytest.raises(FileNotFoundError):
            await sandbox.read_file("nope.txt")
        await sandbox.reset()
        with pytest.raises(FileNotFoundError):
            await sandbox.read_file("deep/dir/data.bin")
        listing = await sandbox.exec(["ls", "-A"], timeout=5)
        return back, absolute, seen, listing, await sandbox.alive()

    back, absolute, seen, listing, alive = run(closing(p, go()))
    assert back == STDIN and absolute == STDIN
    assert seen.stdout.split()[0] == hashlib.sha256(STDIN).hexdigest()
    assert listing.exit_code == 0 and listing.stdout == ""  # reset left an empty work dir
    assert alive


def test_list_by_tags_across_pages_and_destroy(fake, provider):
    p = provider()
    mine, other = {**TAGS, "batch": "a"}, {**TAGS, "batch": "b"}

    async def go():
        created = [await p.create(SandboxSpec(tags=mine)) for _ in range(3)]
        stranger = await p.create(SandboxSpec(tags=other))
        calls = fake.count("list")
        listed = await p.list(mine)
        pages = fake.count("list") - calls
        await p.destroy(created[0].id)
        await p.destroy(created[0].id)  # already gone: quiet
        fresh = provider()
        await fresh.destroy(created[1].id)  # an id this process did not create
        await fresh.destroy("cw-no-such-sandbox")
        await fresh.aclose()
        after = await p.list(mine)
        return created, stranger, listed, pages, after

    created, stranger, listed, pages, after = run(closing(p, go()))
    assert sorted(i.id for i in listed) == sorted(s.id for s in created)
    assert pages == 2  # the fake pages by two: the SDK followed the page token
    assert all(i.tags == mine and i.state == "running" and i.created_at for i in listed)
    assert [i.id for i in after] == [created[2].id]
    assert set(fake.live()) == {created[2].id, stranger.id}


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
    assert type(errors["vanished"]) is InfraError and "vanished" in str(errors["vanished"])
    assert alive is False


def test_an_unreachable_service_is_an_infra_error(fake, provider):
    p = provider()

    async def go():
        sandbox = await p.create(SandboxSpec())
        fake.stop()
        with pytest.raises(InfraError) as info:
            await sandbox.exec(["true"], timeout=5)
        return info.value

    error = run(closing(p, go()))
    assert type(error) is InfraError


def test_pool_honours_retry_after_and_retries_server_errors(fake, provider):
    p = provider()
    fake.fail("exec", grpc.StatusCode.RESOURCE_EXHAUSTED, retry_delay=0.6, match="first")
    fake.fail("exec", grpc.StatusCode.INTERNAL, match="second")
    with SandboxPool.open(p, size=1, spec=SandboxSpec(tags=TAGS), pool_settings=FAST) as pool:
        fake.fail("create", grpc.StatusCode.UNAVAILABLE)  # the replacement of the rate-limited sandbox
        t0 = time.monotonic()
        limited = pool.run(["echo", "first"], timeout=5)
        waited = time.monotonic() - t0
        retried = pool.run(["echo", "second"], timeout=5)
        stats = pool.drain_stats()
    assert limited.stdout == "first\n" and waited >= 0.6
    assert retried.stdout == "second\n"
    assert stats.counts["rate_limited"] == 1 and stats.counts["infra_errors"] == 2
    assert fake.count("create") == 4  # the first, the UNAVAILABLE one, and the two replacements
    assert fake.live() == []


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
    p = provider()
    with SandboxPool.open(p, size=1, spec=SandboxSpec(tags=TAGS), pool_settings=FAST) as pool:
        assert pool.run(["echo", "one"], timeout=5).stdout == "one\n"
        (first,) = fake.live()
        fake.vanish(first)
        assert pool.run(["echo", "two"], timeout=5).stdout == "two\n"
        assert pool.drain_stats().counts["replaced"] >= 1
        assert first not in fake.live()
    assert fake.live() == []


def test_scorer_end_to_end_on_the_sorting_task(fake, provider):
    p = provider()
    row = load_tasks("builtin", task_ids=["sorting"])[0]
    completions = [SOLUTIONS["sorting"], "    return xs\n"]
    with SandboxPool.open(p, size=2, spec=SandboxSpec(tags=TAGS), pool_settings=FAST) as pool:
        outcomes = Scorer(pool, cache_size=0).score(completions, [row, row])
    assert [(o.status, o.passed, o.total, o.reward) for o in outcomes] == [
        ("passed", 5, 5, 1.0), ("failed", 1, 5, 0.2)]
    assert fake.live() == []

"""The daytona provider through the real ``daytona`` SDK, against a fake Daytona on loopback."""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import math
import time
from datetime import datetime, timedelta, timezone

import pytest
from daytona_fake import API_KEY, FakeDaytona
from trl_sandbox_daytona.provider import retry_after

from trl_sandbox import (
    ConfigError,
    InfraError,
    QuotaError,
    RateLimitError,
    SandboxSpec,
    load_tasks,
)
from trl_sandbox.builtin_tasks import SOLUTIONS
from trl_sandbox.plugins import make_provider, providers
from trl_sandbox.pool import PoolSettings, SandboxPool
from trl_sandbox.scoring import Scorer

FAST = PoolSettings(backoff_initial_s=0.05, backoff_max_s=0.2, lease_timeout_s=20.0, create_timeout_s=20.0,
                    destroy_timeout_s=10.0, health_interval_s=3600.0)
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


def run(coro):
    return asyncio.run(coro)


async def closing(provider, coro):
    try:
        return await coro
    finally:
        await provider.aclose()


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

STDIN = bytes(range(256)) * 4 + b"\r\n\n$(touch /tmp/pwned)\x00EOF\n'\"`" + b"\xff" * 3


def test_exec_exit_codes_merged_output_and_byte_exact_stdin(provider):
    p = provider()
    digest = ("import hashlib, sys; data = sys.stdin.buffer.read(); "
              "print(len(data), hashlib.sha256(data).hexdigest()); print('to stderr', file=sys.stderr); sys.exit(3)")

    async def go():
        sandbox = await p.create(SandboxSpec())
        with_stdin = await sandbox.exec(["python3", "-c", digest], stdin=STDIN, timeout=10)
        as_text = await sandbox.exec(["python3", "-c", digest], stdin="héllo", timeout=10)
        without = await sandbox.exec(["python3", "-c", digest], timeout=10)
        quoted = await sandbox.exec(["printf", "%s|", "a b", "$HOME", "it's", ";ls"], timeout=5)
        missing = await sandbox.exec(["no-such-program-xyz"], timeout=5)
        return with_stdin, as_text, without, quoted, missing

    with_stdin, as_text, without, quoted, missing = run(closing(p, go()))
    assert with_stdin.exit_code == 3 and not with_stdin.timed_out
    assert f"{len(STDIN)} {hashlib.sha256(STDIN).hexdigest()}" in with_stdin.stdout
    assert "to stderr" in with_stdin.stdout and with_stdin.stderr == ""  # Daytona merges the streams
    assert f"{len('héllo'.encode())} {hashlib.sha256('héllo'.encode()).hexdigest()}" in as_text.stdout
    assert f"0 {hashlib.sha256(b'').hexdigest()}" in without.stdout  # no stdin: the program reads EOF
    assert quoted.stdout == "a b|$HOME|it's|;ls|"
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
    assert sandbox.prlimit and limits.stdout.split() == ["256", str(1024 * 1024)]  # ResourceLimits defaults


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
        fresh = make_provider("daytona", {"api_key": API_KEY, "api_url": fake.api_url})
        await fresh.destroy(created[1].id)  # an id this process did not create
        await fresh.aclose()
        after = await p.list(mine)
        return created, stranger, listed, pages, after

    created, stranger, listed, pages, after = run(closing(p, go()))
    assert sorted(i.id for i in listed) == sorted(s.id for s in created)
    assert pages == 2  # the fake pages by two: the SDK followed the cursor
    assert all(i.tags == mine and i.state == "started" and i.created_at for i in listed)
    assert [i.id for i in after] == [created[2].id]
    assert set(fake.live()) == {created[2].id, stranger.id}


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
    assert type(errors["vanished"]) is InfraError and "vanished" in str(errors["vanished"])
    assert alive is False


def test_retry_after_headers():
    soon = email.utils.format_datetime(datetime.now(timezone.utc) + timedelta(seconds=30), usegmt=True)
    assert 25 < retry_after({"Retry-After": soon}) <= 30  # an HTTP date
    assert retry_after({"retry-after-sandbox-create": "3", "X-RateLimit-Remaining": "0"}) == 3.0
    assert retry_after({"Content-Type": "application/json"}) is None


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
    fake.fail("exec", 429, headers={"Retry-After": "0.6"}, match="first")
    fake.fail("exec", 500, match="second")
    with SandboxPool.open(p, size=1, spec=SandboxSpec(tags=TAGS), pool_settings=FAST) as pool:
        fake.fail("create", 502)  # the replacement of the rate-limited sandbox
        t0 = time.monotonic()
        limited = pool.run(["echo", "first"], timeout=5)
        waited = time.monotonic() - t0
        retried = pool.run(["echo", "second"], timeout=5)
        stats = pool.drain_stats()
    assert limited.stdout == "first\n" and waited >= 0.6
    assert retried.stdout == "second\n"
    assert stats.counts["rate_limited"] == 1 and stats.counts["infra_errors"] == 2
    assert fake.count("create") == 4  # the first, the 502, and the two replacements
    assert fake.live() == []


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

"""Conformance checks for prepared environments on a remote provider (snapshots + lease copies).

A plugin's tests call these with a pool of its provider (against its fake service) and a
``SnapshotService`` view of the fake's state (snapshots made, live ones, faults to inject):

* ``check_one_build_for_many_leases``: several concurrent programs of one key, one snapshot;
* ``check_isolation_between_leases``: writes, deletes, chmod and a detached writer of one lease
  never reach the next (each with its positive control), and the pristine tree is neither
  visible nor writable to a program;
* ``check_failed_setup_is_infra``: a failing setup makes its rows ``InfraError`` (reward None),
  builds no snapshot, and leaves other rows alone;
* ``check_snapshot_fault``: a snapshot that is a ghost, stuck pending or 404s on boot is built
  again, and the programs then get their correct verdicts.

``SnapshotEnvironmentChecks`` runs them all as test methods of a plugin's test class.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from trl_sandbox.environments.spec import parse
from trl_sandbox.sandbox import InfraError

ENV = {
    "files": {"data/in.txt": "5\n", "keep.txt": "prepared\n"},
    "setup": ["python3 -c \"open('derived.txt', 'w').write(str(int(open('data/in.txt').read()) * 8))\"",
              "mkdir -p bin && printf '#!/bin/sh\\necho tool\\n' > bin/tool && chmod 755 bin/tool"],
}
HOSTILE = r"""
set -e
echo changed >> keep.txt; rm derived.txt; chmod 000 data; echo new > planted.txt
(sleep 0.5; echo late > keep.txt; echo late > planted.txt) > /dev/null 2>&1 &
cat keep.txt; ls
"""
LOOK = "cat keep.txt; cat derived.txt; echo; cat data/in.txt; ./bin/tool; test ! -e planted.txt && echo clean"
CLEAN = "prepared\n40\n5\ntool\nclean\n"
PRISTINE = "/var/tmp/.trl-sandbox-env"


@dataclass
class SnapshotService:
    """What the fake says about snapshots."""

    made: Callable[[], int]  # snapshot calls that succeeded (ghosts included)
    live: Callable[[], int]  # snapshots that exist now
    fault: Callable[[str], None]  # spoil the next snapshot: "ghost", "pending", "boot404"
    drop_all: Callable[[], None]  # every snapshot vanishes behind the provider's back


def sh(pool: Any, script: str, environment: Any = ENV, timeout: float = 10.0):
    return pool.run(["/bin/sh", "-c", script], timeout=timeout,
                    environment=parse(environment) if environment is not None else None)


def _many(pool: Any, n: int, script: str, environment: Any = ENV) -> list:
    async def all_of():
        spec = parse(environment)
        return await asyncio.gather(*[pool.aexec(["/bin/sh", "-c", script], timeout=10.0, environment=spec)
                                      for _ in range(n)])
    return pool.loop.run(all_of())


def check_one_build_for_many_leases(pool: Any, service: SnapshotService, n: int = 4) -> None:
    before = service.made()
    results = _many(pool, n, LOOK)
    assert [r.stdout for r in results] == [CLEAN] * n, results
    assert service.made() - before == 1, "one snapshot for every lease of one key"
    # Positive control: without the environment, none of it is there.
    bare = sh(pool, "ls; test -e derived.txt || echo absent", environment=None)
    assert bare.stdout.strip().endswith("absent"), bare
    # A second spec that differs in one byte is a second build.
    other = {**ENV, "files": {**ENV["files"], "data/in.txt": "6\n"}}
    assert sh(pool, "cat derived.txt", environment=other).stdout == "48"
    assert service.made() - before == 2


def check_isolation_between_leases(pool: Any, copy: str | None = None) -> None:
    """``pool`` has one sandbox: every lease after the first reuses it. ``copy``: how the lease's
    copy must be made, "overlay" or "copy" (an overlay is a mount at the working directory)."""
    if copy is not None:
        mounts = sh(pool, "grep -c ' - overlay ' /proc/self/mountinfo || true").stdout.strip()
        assert (mounts != "0") == (copy == "overlay"), (copy, mounts)
    first = sh(pool, HOSTILE)
    assert first.exit_code == 0, first
    assert "changed" in first.stdout and "planted.txt" in first.stdout and "derived.txt" not in first.stdout
    for _ in range(2):
        again = sh(pool, "sleep 0.7; " + LOOK)
        assert again.stdout == CLEAN, again
    # The pristine tree is neither in sight nor writable; the lease's copy is (positive control).
    peek = sh(pool, f"ls -A {PRISTINE}; echo x > {PRISTINE}/tree/keep.txt && echo wrote; "
                    "echo mine > keep.txt && cat keep.txt")
    assert "wrote" not in peek.stdout and "tree" not in peek.stdout, peek
    assert peek.stdout.strip().endswith("mine"), peek
    assert sh(pool, LOOK).stdout == CLEAN


def check_failed_setup_is_infra(pool: Any, service: SnapshotService) -> None:
    before = service.made()
    broken = {"files": {"a.txt": "x"}, "setup": ["echo the-setup-said-this; exit 3"]}
    for _ in range(2):
        try:
            sh(pool, "echo never", environment=broken)
        except InfraError as exc:
            assert "the-setup-said-this" in str(exc), exc
        else:
            raise AssertionError("a failed setup must be an infrastructure error")
    assert service.made() == before, "no snapshot of a failed setup"
    assert sh(pool, LOOK).stdout == CLEAN  # other rows go on (positive control)


def check_snapshot_fault(pool: Any, service: SnapshotService, kind: str, salt: str) -> None:
    """A fresh key (``salt``) whose first snapshot is spoiled: built again, then correct."""
    env = {**ENV, "files": {**ENV["files"], "salt.txt": salt}}
    made, live = service.made(), service.live()
    service.fault(kind)
    results = _many(pool, 3, LOOK, env)
    assert [r.stdout for r in results] == [CLEAN] * 3, results
    assert service.made() - made == 2, "the spoiled snapshot, then a good one"
    assert service.live() - live == 1, "the spoiled one was deleted (or never existed)"


def check_vanished_snapshot_is_rebuilt(make_pool: Callable[[], Any], service: SnapshotService) -> None:
    """A key whose snapshot vanished after it was built (another process, a later run) is built
    again by the next process that uses it, never failed."""
    env = {**ENV, "files": {**ENV["files"], "salt.txt": "vanish"}}
    with make_pool() as pool:
        assert sh(pool, LOOK, environment=env).stdout == CLEAN
    made = service.made()
    service.drop_all()
    with make_pool() as pool:
        assert sh(pool, LOOK, environment=env).stdout == CLEAN
    assert service.made() - made == 1


def check_missing_snapshot_on_create(provider: Any, service: SnapshotService) -> None:
    """A create from a snapshot that vanished after it was checked is an ``InfraError`` (the pool
    retries or scores ``None``) and sends the key back to the cold path: the next prepare builds."""
    from trl_sandbox.sandbox import SandboxSpec

    env = parse({**ENV, "files": {**ENV["files"], "salt.txt": "gone-on-create"}})

    async def go():
        prepared = await provider.prepare_environment(env)
        sandbox = await provider.create(SandboxSpec(image=prepared.image))  # positive control: it boots
        await provider.destroy(sandbox.id)
        made = service.made()
        service.drop_all()
        try:
            await provider.create(SandboxSpec(image=prepared.image))
        except InfraError:
            pass
        else:
            raise AssertionError("a create from a missing snapshot must be an InfraError")
        again = await provider.prepare_environment(env)
        assert again.image != prepared.image and service.made() - made == 1
        sandbox = await provider.create(SandboxSpec(image=again.image))
        await sandbox.use_environment(again)
        result = await sandbox.exec(["/bin/sh", "-c", LOOK], timeout=10)
        await provider.destroy(sandbox.id)
        await provider.aclose()
        return result

    assert asyncio.run(go()).stdout == CLEAN


class SnapshotEnvironmentChecks:
    """The checks above as test methods, for a plugin's test module to subclass. Its fixtures:
    ``make_pool(size=2, **settings)`` (a pool of the provider against its fake, with an environment
    cache of its own), ``make_provider()`` (the same provider, unpooled) and ``service`` (a
    ``SnapshotService`` view of the fake)."""

    @pytest.mark.parametrize("isolation", ["auto", "sweep"])
    def test_isolation_between_leases_of_one_sandbox(self, make_pool, isolation):
        # auto: the launcher mounts an overlay (it holds CAP_SYS_ADMIN in the fake's container);
        # sweep: it copies the tree.
        with make_pool(size=1, isolation=isolation) as pool:
            check_isolation_between_leases(pool, copy="overlay" if isolation == "auto" else "copy")

    def test_a_failed_setup_is_infra_for_its_rows_only(self, make_pool, service):
        with make_pool() as pool:
            check_failed_setup_is_infra(pool, service)

    @pytest.mark.parametrize("kind", ["ghost", "pending", "boot404"])
    def test_a_spoiled_snapshot_is_built_again(self, make_pool, service, kind):
        with make_pool() as pool:
            check_snapshot_fault(pool, service, kind, salt=kind)

    def test_a_snapshot_that_vanished_is_built_again(self, make_pool, service):
        check_vanished_snapshot_is_rebuilt(make_pool, service)

    def test_a_create_from_a_missing_snapshot_is_infra_and_rebuilds(self, make_provider, service):
        check_missing_snapshot_on_create(make_provider(), service)

"""Helpers for the local provider's tests: a provider on its own event-loop thread, with
synchronous wrappers, and a view of the host's processes to prove that nothing escapes.

Everything runs real bubblewrap sandboxes; nothing is mocked.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from trl_sandbox.local import LocalProvider, LocalSandbox
from trl_sandbox.pool.loop import LoopThread
from trl_sandbox.sandbox import ExecResult, ResourceLimits, SandboxSpec


class Box:
    """A ``LocalSandbox`` driven synchronously from the test thread."""

    def __init__(self, host: Host, sandbox: LocalSandbox) -> None:
        self.host = host
        self.sandbox = sandbox

    @property
    def id(self) -> str:
        return self.sandbox.id

    def exec(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | str | None = None,
        timeout: float = 10.0,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        return self.host.run(self.sandbox.exec(argv, stdin=stdin, timeout=timeout, cwd=cwd, env=env))

    def py(self, source: str, **kwargs) -> ExecResult:
        return self.exec(["python3", "-c", source], **kwargs)

    def write(self, path: str, data: bytes | str) -> None:
        self.host.run(self.sandbox.write_file(path, data.encode() if isinstance(data, str) else data))

    def read(self, path: str) -> bytes:
        return self.host.run(self.sandbox.read_file(path))

    def reset(self) -> None:
        self.host.run(self.sandbox.reset())

    def alive(self) -> bool:
        return self.host.run(self.sandbox.alive())

    def destroy(self) -> None:
        self.host.run(self.host.provider.destroy(self.sandbox.id))

    # -- the host's view ---------------------------------------------------------------------

    @property
    def bwrap_pid(self) -> int:
        return self.sandbox.pid

    def supervisor_pid(self) -> int:
        children = children_of(self.bwrap_pid)
        assert len(children) == 1, f"bwrap should have exactly one child, has {children}"
        return children[0]

    def namespace_members(self) -> list[int]:
        """Host pids of every process in this sandbox's pid namespace."""
        ns = os.readlink(f"/proc/{self.supervisor_pid()}/ns/pid")
        members = []
        for pid in host_pids():
            try:
                if os.readlink(f"/proc/{pid}/ns/pid") == ns:
                    members.append(pid)
            except OSError:
                pass
        return members

    def assert_only_supervisor(self) -> None:
        """Nothing but the supervisor is left in the sandbox (checked from the host)."""
        assert self.namespace_members() == [self.supervisor_pid()]


class Host:
    """A ``LocalProvider`` with its own loop thread (the way the pool drives one)."""

    def __init__(self, **settings) -> None:
        self.loop = LoopThread("local-provider-tests")
        try:
            self.provider = LocalProvider(**settings)
        except BaseException:
            self.loop.stop()
            raise

    def run(self, coro, timeout: float = 60.0):
        return self.loop.run(coro, timeout)

    def create(self, **spec) -> Box:
        limits = spec.pop("limits", None)
        if isinstance(limits, Mapping):
            limits = ResourceLimits(**limits)
        if limits is not None:
            spec["limits"] = limits
        return Box(self, self.run(self.provider.create(SandboxSpec(**spec))))

    def close(self) -> None:
        try:
            self.run(self.provider.aclose())
        finally:
            self.loop.stop()


@contextmanager
def local_host(**settings) -> Iterator[Host]:
    """A provider for one test module; on exit, every sandbox is gone from the host."""
    before = descendants(os.getpid())
    host = Host(**settings)
    try:
        yield host
    finally:
        host.close()
        left = wait_for(lambda: not (descendants(os.getpid()) - before), timeout=10)
        assert left, f"processes left on the host: {describe(descendants(os.getpid()) - before)}"


# -- the host's process table -------------------------------------------------------------------


def host_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def children_of(pid: int) -> list[int]:
    return sorted(p for p in host_pids() if parent_of(p) == pid)


def descendants(pid: int) -> set[int]:
    parents = {p: parent_of(p) for p in host_pids()}
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    # Threads are not processes, but short-lived helper processes of the test runner may be:
    # only count the ones that are still there.
    return {p for p in found if os.path.exists(f"/proc/{p}")}


def describe(pids: set[int]) -> list[str]:
    out = []
    for pid in sorted(pids):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            out.append(f"{pid}: {cmdline[:120]}")
        except OSError:
            pass
    return out


def host_uid_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Uid:"):
                return int(line.split()[1])
    raise AssertionError(f"no Uid line for {pid}")


def wait_for(predicate, timeout: float = 5.0, interval: float = 0.02) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)

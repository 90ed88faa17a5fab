"""Per-sandbox control groups for the local provider: a fair, bounded share of the machine.

Rlimits bound one process; they do not stop a program that starts sixty spinning processes from
slowing every other sandbox until their programs time out (GRPO would pay it for that: the group
mean drops), nor memory a program pins outside its address space (tmpfs, SysV/POSIX shm, memfd).
A control group per sandbox does both: equal CPU weight for every sandbox, a process cap, and a
memory limit charged with every page the sandbox's processes allocate, whatever the kind.

Layout: ``<base>/trl-sandbox-<host pid>-<uuid>/<sandbox id>`` in every hierarchy used, where
``<base>`` is the group the provider's own process is in (so a limit someone put on the trainer
still covers its sandboxes). The per-run directory lets a later run recognise the groups of a run
that died (its pid is gone) and remove them. Its CPU weight follows the number of live sandboxes
(one default weight each), so that against the host's other processes the sandboxes together weigh
what they would as plain processes (one busy process each), while inside it every sandbox has the
same weight however many processes it runs. A shared parent of fixed weight would instead squeeze
every sandbox of every run into the share of one process.

What the kernel may offer, in the order ``cgroups="auto"`` tries them:

* cgroup v2 with ``cpu``, ``memory`` and ``pids`` available in ``<base>`` and enableable for its
  children. The no-internal-processes rule forbids enabling controllers below a non-root group that
  holds processes, so this works when the provider runs in the root group or a delegated subtree
  whose controllers are already enabled; anywhere else v2 is reported as unavailable, with why.
* cgroup v1 with the ``cpu`` and ``pids`` controllers writable (root), plus ``memory`` and
  ``cpuacct`` when mounted.
* none: the sandboxes run without groups; the provider logs it once and its metrics say so.

Every process of a sandbox is in its group before it runs anything: bwrap is spawned with a
``preexec_fn`` that writes ``0`` (itself) into pre-opened ``cgroup.procs`` files, after the fork
and before the exec, so bwrap, the supervisor and every program start inside.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import time
import uuid
from collections.abc import Callable

from trl_sandbox.local.cgroup_detect import (
    V2_CONTROLLERS,
    Unavailable,
    detect_v1,
    detect_v2,
    read_text,
    write_text,
)
from trl_sandbox.sandbox import ConfigError

log = logging.getLogger(__name__)

PREFIX = "trl-sandbox-"  # run directories: trl-sandbox-<pid>-<uuid>
MODES = ("auto", "off", "v1", "v2")
PID_HEADROOM = 16  # bwrap, the supervisor and its helpers, on top of the programs' own cap


_warned = False


def _warn_once(reason: str) -> None:
    """Say once per process that sandboxes run unbounded; the metrics say it every step."""
    global _warned
    if not _warned:
        _warned = True
        log.warning("local sandboxes run without cgroups (no fair CPU share, no memory bound per sandbox): %s",
                    reason)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SandboxGroup:
    """The directories of one sandbox's group (one per hierarchy) and the handles to fill and read it."""

    def __init__(self, owner: Cgroups, name: str, dirs: list[str]) -> None:
        self.owner = owner
        self.name = name
        self.dirs = dirs
        self._fds: list[int] = []
        memory = owner.bases.get("memory")
        name = "memory.events" if owner.version == 2 else "memory.oom_control"
        self._oom_file = next((os.path.join(d, name) for d in dirs if memory and d.startswith(memory + "/")), None)
        self._oom_seen = 0

    def preexec(self) -> Callable[[], None]:
        """A ``preexec_fn`` that puts the forked child into this group before it execs bwrap.

        The ``cgroup.procs`` files are opened here, by the (root) parent: after the fork the child
        may already have dropped to an unprivileged uid, and the kernel checks the opener's rights
        (plus, in v1, that the writer's euid owns the task moved: it moves itself).
        """
        self.close_fds()
        self._fds = [os.open(os.path.join(d, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC) for d in self.dirs]
        fds = list(self._fds)

        def join() -> None:
            for fd in fds:
                os.write(fd, b"0")

        return join

    def close_fds(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def new_oom_kills(self) -> bool:
        """Whether the kernel's OOM killer struck inside this group since the last call."""
        if self._oom_file is None:
            return False
        try:
            fd = os.open(self._oom_file, os.O_RDONLY | os.O_CLOEXEC)  # after every exec: kept cheap
            try:
                text = os.read(fd, 4096).decode("ascii", "replace")
            finally:
                os.close(fd)
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    seen, self._oom_seen = self._oom_seen, int(value)
                    return self._oom_seen > seen
        except (OSError, ValueError):
            pass
        return False

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.dirs:
            try:
                found.update(int(p) for p in read_text(os.path.join(d, "cgroup.procs")).split())
            except OSError:
                pass
        return found

    def cpu_seconds(self) -> float | None:
        return self.owner._cpu_of(self.dirs)

    def meter_files(self) -> list[str]:
        """The group's counters of CPU time and memory that the sandbox reads from inside
        (``judge/meter.py``): programs' CPU and memory are counted where nothing can hide them."""
        owner, found = self.owner, []
        for controller, name in (("cpu", "cpu.stat") if owner.version == 2 else ("cpuacct", "cpuacct.usage"),
                                 ("memory", "memory.stat"), ("memory", "memory.kmem.usage_in_bytes")):
            base = owner.bases.get(controller)
            path = next((os.path.join(d, name) for d in self.dirs if base and d.startswith(base + "/")), None)
            if path is not None and os.path.exists(path):
                found.append(path)
        return found

    async def remove(self, timeout: float = 5.0) -> None:
        """Kill whatever is left in the group, then remove its directories (retrying while busy)."""
        self.close_fds()
        await self.owner._remove_dirs(self.dirs, timeout)
        self.owner._live.discard(self.name)
        try:
            self.owner._weigh(len(self.owner._live))
        except OSError:
            pass


class Cgroups:
    """Detects what the kernel offers and makes one group per sandbox under a per-run parent."""

    def __init__(self, setting: str = "auto") -> None:
        setting = str(setting).lower()
        if setting not in MODES:
            raise ConfigError(f"local provider setting cgroups={setting!r} must be one of {', '.join(MODES)}")
        self.version = 0
        self.bases: dict[str, str] = {}  # controller -> base directory
        self.reason = "cgroups='off'"
        if setting != "off":
            tried = ("v2", "v1") if setting == "auto" else (setting,)
            reasons = []
            for kind in tried:
                try:
                    if kind == "v2":
                        base = detect_v2()
                        self.bases = {c: base for c in V2_CONTROLLERS}
                        self.version = 2
                    else:
                        self.bases = detect_v1()
                        self.version = 1
                    break
                except (Unavailable, OSError) as exc:
                    reasons.append(f"{kind}: {exc}")
            if not self.version:
                self.reason = "; ".join(reasons)
                if setting != "auto":
                    raise ConfigError(
                        f"local provider setting cgroups={setting!r}, but {self.reason}. Use cgroups='auto' "
                        "(the best available) or cgroups='off'"
                    )
        if not self.version and setting == "auto":
            _warn_once(self.reason)
        self.run = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.run_dirs: list[str] = []
        self._live: set[str] = set()
        if self.version:
            self.reap_stale()
            try:
                # A trial run: creating groups must work now, or the setting is refused now. The
                # run's groups are made again with the first sandbox, so a provider that never
                # creates one (``trl-sandbox ls``, a trainer that never trains) leaves nothing.
                self._make_run_dirs()
                self._remove_run_dirs()
            except OSError as exc:
                self.reason = f"creating {self.run} failed: {exc}"
                if setting != "auto":
                    raise ConfigError(f"local provider setting cgroups={setting!r}, but {self.reason}") from None
                self.version, self.bases, self.run_dirs = 0, {}, []
                _warn_once(self.reason)

    # -- what the provider asks --------------------------------------------------------------------

    @property
    def mode(self) -> str:
        return f"cgroup-v{self.version}" if self.version else "none"

    @property
    def memory(self) -> bool:
        return "memory" in self.bases

    def _dirs(self) -> list[str]:
        return sorted(set(self.bases.values()))

    def _make_run_dirs(self) -> None:
        try:
            for base in self._dirs():
                run = os.path.join(base, self.run)
                os.mkdir(run)
                self.run_dirs.append(run)
                if self.version == 2:
                    _enable_v2(run)
            self._weigh(0)
        except OSError:
            for run in self.run_dirs:
                _rmdir_quiet(run)
            self.run_dirs = []
            raise

    def _weigh(self, sandboxes: int) -> None:
        """The run's CPU weight: one default weight per live sandbox (at least one)."""
        cpu = os.path.join(self.bases.get("cpu", ""), self.run)
        if "cpu" not in self.bases or not os.path.isdir(cpu):
            return
        n = max(1, sandboxes)
        if self.version == 2:
            write_text(cpu + "/cpu.weight", str(min(10000, 100 * n)))
        else:
            write_text(cpu + "/cpu.shares", str(min(262144, 1024 * n)))

    def _remove_run_dirs(self) -> None:
        for run in self.run_dirs:
            os.rmdir(run)
        self.run_dirs = []

    def create(self, sandbox_id: str, *, memory_bytes: int, max_pids: int) -> SandboxGroup:
        """A group for one sandbox: equal CPU weight, ``pids.max``, and the memory limit."""
        if not self.run_dirs:
            self._make_run_dirs()
        dirs = []
        try:
            for run in self.run_dirs:
                path = os.path.join(run, sandbox_id)
                os.mkdir(path)
                dirs.append(path)
            for controller, base in self.bases.items():
                path = os.path.join(base, self.run, sandbox_id)
                if controller == "cpu":
                    write_text(path + ("/cpu.weight" if self.version == 2 else "/cpu.shares"),
                           "100" if self.version == 2 else "1024")
                elif controller == "pids":
                    write_text(path + "/pids.max", str(max_pids))
                elif controller == "memory" and self.version == 2:
                    write_text(path + "/memory.max", str(memory_bytes))
                    if os.path.exists(path + "/memory.swap.max"):
                        write_text(path + "/memory.swap.max", "0")
                elif controller == "memory":
                    write_text(path + "/memory.limit_in_bytes", str(memory_bytes))
                    if os.path.exists(path + "/memory.memsw.limit_in_bytes"):
                        write_text(path + "/memory.memsw.limit_in_bytes", str(memory_bytes))
            self._live.add(sandbox_id)
            self._weigh(len(self._live))
        except OSError:
            for path in dirs:
                _rmdir_quiet(path)
            raise
        return SandboxGroup(self, sandbox_id, dirs)

    def cpu_seconds(self) -> float | None:
        """CPU seconds used by every sandbox of this run so far, removed ones included (its groups
        are made with the first sandbox and removed by ``close``: the count restarts from 0 then)."""
        return self._cpu_of(self.run_dirs) if self.run_dirs else 0.0

    def _cpu_of(self, dirs: list[str]) -> float | None:
        if self.version == 2:
            cpu = next((d for d in dirs if d.startswith(self.bases["cpu"] + "/")), None)
            if cpu is None:
                return None
            for line in read_text(cpu + "/cpu.stat").splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
            return None
        base = self.bases.get("cpuacct")
        acct = next((d for d in dirs if base and d.startswith(base + "/")), None)
        return int(read_text(acct + "/cpuacct.usage")) / 1e9 if acct else None

    async def close(self, timeout: float = 5.0) -> None:
        """Remove the run's groups (the sandboxes' groups first)."""
        dirs = [os.path.join(run, name) for run in self.run_dirs for name in _children(run)]
        await self._remove_dirs(dirs + self.run_dirs, timeout)
        self.run_dirs = []

    # -- removal ---------------------------------------------------------------------------------

    async def _remove_dirs(self, dirs: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for path in dirs:
            while True:
                _kill_members(path, self.version)
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        log.warning("cannot remove cgroup %s: %s", path, exc)
                        break
                await asyncio.sleep(0.02)

    def reap_stale(self) -> list[str]:
        """Remove the groups of runs whose process is gone (a run killed with SIGKILL leaves them)."""
        removed = []
        for base in self._dirs():
            for run in _children(base):
                pid = run[len(PREFIX):].split("-", 1)[0]
                if not run.startswith(PREFIX) or not pid.isdigit() or _alive(int(pid)):
                    continue
                path = os.path.join(base, run)
                for child in _children(path):
                    _kill_members(os.path.join(path, child), self.version)
                _kill_members(path, self.version)
                # SIGKILL is delivered asynchronously: retry briefly while the groups are busy.
                deadline = time.monotonic() + 2.0
                while True:
                    for child in _children(path):
                        _rmdir_quiet(os.path.join(path, child))
                    if _rmdir_quiet(path) or time.monotonic() > deadline:
                        break
                    time.sleep(0.02)
                if not os.path.exists(path):
                    removed.append(path)
                else:
                    log.warning("cannot remove the cgroup %s of an earlier run: it is still busy", path)
        if removed:
            log.info("removed %d cgroup(s) of earlier runs: %s", len(removed), ", ".join(removed))
        return removed


def _enable_v2(path: str) -> None:
    enabled = set(read_text(path + "/cgroup.subtree_control").split())
    todo = [c for c in V2_CONTROLLERS if c not in enabled]
    if todo:
        write_text(path + "/cgroup.subtree_control", " ".join("+" + c for c in todo))


def _children(path: str) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(path) if e.is_dir())
    except OSError:
        return []


def _kill_members(path: str, version: int) -> None:
    """SIGKILL every process still in the group (v2 has ``cgroup.kill`` for exactly this)."""
    if version == 2 and os.path.exists(path + "/cgroup.kill"):
        try:
            write_text(path + "/cgroup.kill", "1")
        except OSError:
            pass
        return
    try:
        pids = [int(p) for p in read_text(path + "/cgroup.procs").split()]
    except OSError:
        return
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _rmdir_quiet(path: str) -> bool:
    try:
        os.rmdir(path)
        return True
    except OSError:
        return False

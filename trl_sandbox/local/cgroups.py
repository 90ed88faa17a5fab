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

from ..sandbox import ConfigError

log = logging.getLogger(__name__)

PREFIX = "trl-sandbox-"  # run directories: trl-sandbox-<pid>-<uuid>
MODES = ("auto", "off", "v1", "v2")
PID_HEADROOM = 16  # bwrap, the supervisor and its helpers, on top of the programs' own cap
V1_CONTROLLERS = ("cpu", "cpuacct", "memory", "pids")
V2_CONTROLLERS = ("cpu", "memory", "pids")


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _mounts() -> list[tuple[str, str, str, str]]:
    """(mount point, root inside the hierarchy, fs type, super options) of every cgroup mount."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
                out.append((fields[4].replace("\\040", " "), fields[3], tail[0], tail[2]))
    return out


def _own_groups() -> dict[str, str]:
    """Hierarchy key (``"0"`` for v2, else the comma-joined controllers) -> this process's group."""
    out = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            num, controllers, path = line.rstrip("\n").split(":", 2)
            out["0" if num == "0" and not controllers else controllers] = path
    return out


def _join(mount: str, root: str, path: str) -> str | None:
    """The directory of group ``path`` under a mount of the hierarchy at ``root``; None if outside it."""
    if root != "/" and not (path == root or path.startswith(root.rstrip("/") + "/")):
        return None
    rel = path[len(root):] if root != "/" else path
    full = os.path.normpath(mount + "/" + rel.lstrip("/"))
    return full if os.path.isdir(full) else None


class Unavailable(Exception):
    """This kind of cgroup cannot be used here; the message says why and what would change it."""


def _detect_v1() -> dict[str, str]:
    """Controller -> base directory for the v1 controllers we can write to."""
    own = _own_groups()
    found: dict[str, str] = {}
    for mount, root, fstype, opts in _mounts():
        if fstype != "cgroup":
            continue
        names = set(opts.split(","))
        for controller in V1_CONTROLLERS:
            if controller in names and controller not in found:
                key = next((k for k in own if controller in k.split(",")), None)
                base = _join(mount, root, own[key]) if key else None
                if base:
                    found[controller] = base
    missing = [c for c in ("cpu", "pids") if c not in found]
    if missing:
        raise Unavailable(f"the cgroup v1 controller(s) {', '.join(missing)} are not mounted")
    for controller, base in found.items():
        if not os.access(base, os.W_OK):
            raise Unavailable(f"{base} (cgroup v1 {controller}) is not writable: run the trainer as root")
    return found


def _detect_v2() -> str:
    own = _own_groups().get("0")
    mount = next(((m, r) for m, r, fstype, _ in _mounts() if fstype == "cgroup2"), None)
    if own is None or mount is None:
        raise Unavailable("cgroup v2 is not mounted")
    base = _join(mount[0], mount[1], own)
    if base is None:
        raise Unavailable(f"this process's cgroup v2 group {own!r} is not visible under {mount[0]}")
    available = set(_read(os.path.join(base, "cgroup.controllers")).split())
    missing = [c for c in V2_CONTROLLERS if c not in available]
    if missing:
        raise Unavailable(
            f"cgroup v2 group {base} does not offer the controller(s) {', '.join(missing)} "
            "(bound to cgroup v1, or not delegated to this group)"
        )
    if not os.access(base, os.W_OK):
        raise Unavailable(f"cgroup v2 group {base} is not writable (it is not delegated to this user)")
    enabled = set(_read(os.path.join(base, "cgroup.subtree_control")).split())
    todo = [c for c in V2_CONTROLLERS if c not in enabled]
    if todo:
        try:
            _write(os.path.join(base, "cgroup.subtree_control"), " ".join("+" + c for c in todo))
        except OSError as exc:
            raise Unavailable(
                f"cannot enable {', '.join(todo)} for the children of cgroup v2 group {base} ({exc.strerror}): "
                "a non-root group that holds processes cannot delegate controllers; start the trainer in a "
                "leaf of a delegated subtree whose parent has them enabled, e.g. under `systemd-run "
                "--scope -p Delegate=yes`, after moving the process into a child group"
            ) from None
    return base


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

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.dirs:
            try:
                found.update(int(p) for p in _read(os.path.join(d, "cgroup.procs")).split())
            except OSError:
                pass
        return found

    def cpu_seconds(self) -> float | None:
        return self.owner._cpu_of(self.dirs)

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
                        base = _detect_v2()
                        self.bases = {c: base for c in V2_CONTROLLERS}
                        self.version = 2
                    else:
                        self.bases = _detect_v1()
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
        self.run = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.run_dirs: list[str] = []
        self._live: set[str] = set()
        if self.version:
            self.reap_stale()
            try:
                self._make_run_dirs()
            except OSError as exc:
                self.reason = f"creating {self.run} failed: {exc}"
                if setting != "auto":
                    raise ConfigError(f"local provider setting cgroups={setting!r}, but {self.reason}") from None
                self.version, self.bases, self.run_dirs = 0, {}, []

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
        for base in self._dirs():
            run = os.path.join(base, self.run)
            os.mkdir(run)
            self.run_dirs.append(run)
            if self.version == 2:
                _enable_v2(run)
        self._weigh(0)

    def _weigh(self, sandboxes: int) -> None:
        """The run's CPU weight: one default weight per live sandbox (at least one)."""
        cpu = os.path.join(self.bases.get("cpu", ""), self.run)
        if "cpu" not in self.bases or not os.path.isdir(cpu):
            return
        n = max(1, sandboxes)
        if self.version == 2:
            _write(cpu + "/cpu.weight", str(min(10000, 100 * n)))
        else:
            _write(cpu + "/cpu.shares", str(min(262144, 1024 * n)))

    def create(self, sandbox_id: str, *, memory_bytes: int, max_pids: int) -> SandboxGroup:
        """A group for one sandbox: equal CPU weight, ``pids.max``, and the memory limit."""
        dirs = []
        try:
            for run in self.run_dirs:
                path = os.path.join(run, sandbox_id)
                os.mkdir(path)
                dirs.append(path)
            for controller, base in self.bases.items():
                path = os.path.join(base, self.run, sandbox_id)
                if controller == "cpu":
                    _write(path + ("/cpu.weight" if self.version == 2 else "/cpu.shares"),
                           "100" if self.version == 2 else "1024")
                elif controller == "pids":
                    _write(path + "/pids.max", str(max_pids))
                elif controller == "memory" and self.version == 2:
                    _write(path + "/memory.max", str(memory_bytes))
                    if os.path.exists(path + "/memory.swap.max"):
                        _write(path + "/memory.swap.max", "0")
                elif controller == "memory":
                    _write(path + "/memory.limit_in_bytes", str(memory_bytes))
                    if os.path.exists(path + "/memory.memsw.limit_in_bytes"):
                        _write(path + "/memory.memsw.limit_in_bytes", str(memory_bytes))
            self._live.add(sandbox_id)
            self._weigh(len(self._live))
        except OSError:
            for path in dirs:
                _rmdir_quiet(path)
            raise
        return SandboxGroup(self, sandbox_id, dirs)

    def cpu_seconds(self) -> float | None:
        """CPU seconds used by every sandbox of this run so far, removed ones included."""
        return self._cpu_of(self.run_dirs)

    def _cpu_of(self, dirs: list[str]) -> float | None:
        if self.version == 2:
            cpu = next((d for d in dirs if d.startswith(self.bases["cpu"] + "/")), None)
            if cpu is None:
                return None
            for line in _read(cpu + "/cpu.stat").splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
            return None
        base = self.bases.get("cpuacct")
        acct = next((d for d in dirs if base and d.startswith(base + "/")), None)
        return int(_read(acct + "/cpuacct.usage")) / 1e9 if acct else None

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
    enabled = set(_read(path + "/cgroup.subtree_control").split())
    todo = [c for c in V2_CONTROLLERS if c not in enabled]
    if todo:
        _write(path + "/cgroup.subtree_control", " ".join("+" + c for c in todo))


def _children(path: str) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(path) if e.is_dir())
    except OSError:
        return []


def _kill_members(path: str, version: int) -> None:
    """SIGKILL every process still in the group (v2 has ``cgroup.kill`` for exactly this)."""
    if version == 2 and os.path.exists(path + "/cgroup.kill"):
        try:
            _write(path + "/cgroup.kill", "1")
        except OSError:
            pass
        return
    try:
        pids = [int(p) for p in _read(path + "/cgroup.procs").split()]
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

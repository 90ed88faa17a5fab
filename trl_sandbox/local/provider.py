"""The built-in local provider: bubblewrap containers with a warm Python fork server.

One ``LocalSandbox`` (``container.py``) is one long-lived ``bwrap`` process (``command.py``)
started from the pool's event loop, with new user, pid, network, ipc, uts, cgroup and mount
namespaces, a read-only system, private size-capped tmpfs mounts on the work directory
(``/work``, the default cwd and the base of relative paths), ``/tmp`` and ``/dev/shm``, an
environment cleared of the host's variables (only ``PATH``, ``HOME``, ``LANG`` and
``SandboxSpec.env``) and an unprivileged uid inside. When the host runs as root, bwrap itself
runs as an unprivileged host uid (65534 by default), so sandboxed code never maps to host root.

Inside, the supervisor (``supervisor/``) runs as PID 1 and serves requests over the container's
stdin/stdout. What other code can rely on:

* ``exit_code``: the exit status (0-255), or minus the signal number when the program died of a
  signal (``-9`` for SIGKILL, ``-11`` for a segfault), as ``subprocess`` reports it. A timeout
  is ``timed_out=True`` with ``exit_code=-9``: the exec's process tree used ``timeout`` CPU
  seconds, or (a program that sleeps or blocks) the wall-clock backstop passed; dying of the
  CPU-seconds rlimit (SIGXCPU) also sets ``timed_out``. A command that cannot be started gives 127 (not found) or 126, as a shell
  does. ``None`` only when the sandbox itself died during the execution.
* ``oom_killed``: the program died of an uncaught ``MemoryError`` (the address-space limit is
  ``ResourceLimits.memory_mb``); for non-Python programs, stderr ending in ``MemoryError``.
* Fast Python: argv whose first item is ``python``, ``python3``, ``pythonX.Y`` or the sandbox
  interpreter's path, followed by any of the flags ``-I -s -S -u -B -E -q`` and then ``-c SRC``,
  ``SCRIPT`` or ``-`` (program on stdin), runs in a fork of the pre-imported supervisor with a
  fresh ``__main__``; code objects are cached by source. Anything else (``-m``, ``-O``, ``-X``,
  an exec ``env`` with ``PYTHON*`` variables, ...) runs the real interpreter.
* A clean kernel per program: every exec runs in its own IPC namespace (SysV objects and POSIX
  message queues die with it; a judged candidate may make neither, in any memory mode, and shares
  the sandbox's empty namespace), with no capabilities and a seccomp filter (no keyrings, ptrace,
  namespaces, mounts, kernel modules, bpf, ...: ``supervisor/kernel.py``). After every exec,
  every process it left behind is killed (``kill(-1)`` from PID 1 reaches double-forked and
  ``setsid`` processes); files persist until ``reset()``, which mounts a fresh tmpfs on
  ``/work``, ``/tmp`` and ``/dev/shm`` (contents and metadata as new).
* Files: ``write_file``/``read_file`` take paths relative to ``/work`` (absolute ones must be
  inside it). A path that escapes it, is not valid UTF-8, or is longer than 4096 bytes or 64 levels
  raises ``ValueError``; one that escapes through a symlink a program left behind raises
  ``PermissionError``; a missing file ``FileNotFoundError``; any other failure the supervisor reports
  an ``OSError``. Only a sandbox that broke raises ``InfraError``.
* If the sandbox dies during an exec, that exec returns ``exit_code=None`` with an explanation in
  stderr, and every later call raises ``InfraError``. If the host itself stopped it (``destroy``,
  lifetime expiry), the exec raises ``InfraError``. Sandboxed code cannot kill the supervisor
  (it is the namespace's init), so in practice that takes the host or the kernel's OOM killer.
* Where a forked interpreter differs from a fresh one: the string hash seed is the supervisor's
  (the same in every exec of a sandbox), ``sys.flags`` are the supervisor's, and modules in
  ``preload`` are already imported (in their pristine state: each exec starts from a fresh fork).

Memory, per sandbox, in ``memory_mode="deny"`` (the default): the seccomp filter refuses SysV
shared memory, message queues and semaphores, POSIX message queues and ``memfd_create``, the
calls that pin memory outside every address space. What a sandbox can hold is then at most
``work_size_mb + tmp_size_mb + shm_size_mb`` of tmpfs (336 MiB by default; their inodes are
capped too) plus ``memory_mb`` of address space per process times ``max_processes`` processes
(RLIMIT_AS, RLIMIT_NPROC; 1 GiB x 64 with the default ``ResourceLimits``), plus the supervisor
itself (about 20 MB RSS) and kernel buffers of the program's pipes and sockets (bounded by
``open_files`` per process, charged only by a memory cgroup). ``memory_mode="cgroup"`` allows the
refused calls (each exec then gets an IPC namespace of its own, and POSIX queues are capped at
800 KiB by RLIMIT_MSGQUEUE; a resident judge's candidates are still refused SysV objects and POSIX
queues), for a setup where a memory cgroup charges them; ``"auto"`` (the
default) picks ``"cgroup"`` exactly when the sandbox has a memory cgroup of its own.

* Cgroups (``cgroups.py``; provider setting ``cgroups="auto"|"v1"|"v2"|"off"``): where the kernel
  lets us (root with the v1 controllers, or a delegated v2 subtree), every sandbox has its own group
  from before bwrap execs: the same CPU weight as every other sandbox however many processes it
  starts, ``pids.max`` = ``ResourceLimits.max_processes`` + 16, and a memory limit of
  ``SandboxSpec.memory_mb`` (swap included) over everything the sandbox holds: the supervisor, its
  programs, and what they pin outside their address space (tmpfs files, SysV/POSIX shm, memfd). A
  program that hits it is killed by the kernel's OOM killer inside the group (``exit_code=-9``); if
  the pages it pinned are mapped by no process, the victim may be the supervisor, and the sandbox
  dies (the program's exec returns ``exit_code=None``; the pool replaces the sandbox). The supervisor
  is told ``memory_mode="cgroup"`` then, else ``"deny"``. ``SandboxSpec.cpus`` is not enforced: the
  groups share CPU by weight, not by quota. Without cgroups, only the per-process rlimits of
  ``ResourceLimits`` and the tmpfs caps apply. The OOM killer's order is set and read back: programs
  and candidates ``oom_score_adj=1000`` (picked first), the resident judge and its forker 500, the
  supervisor its start-up score (the lowest), so a sandbox's own code dies before what judges it.
* What it sees (``mounts.py``): the interpreter's standard library, not the host's site-packages
  (each site directory is an empty read-only tmpfs; ``packages=[...]`` binds named top-level
  packages back), and a /proc whose host-wide files (boot arguments, kernel symbols, keys, ...) are
  covered.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterable, Mapping, Sequence

from trl_sandbox.environments.builds import Prepared
from trl_sandbox.environments.spec import EnvironmentSpec
from trl_sandbox.judge.verdict import JUDGE_SOURCE
from trl_sandbox.local import mounts, toolchain_cache
from trl_sandbox.local.cgroups import PID_HEADROOM, Cgroups, SandboxGroup
from trl_sandbox.local.command import INSTALL_HINT, SCRATCH, SUPERVISOR_PATH, Command
from trl_sandbox.local.container import LocalSandbox
from trl_sandbox.local.environments import DEFAULT_MOUNT_POINTS, LocalEnvironments
from trl_sandbox.local.usage import _Usage
from trl_sandbox.plugins.settings import flag, number
from trl_sandbox.sandbox import Capabilities, ConfigError, InfraError, SandboxInfo, SandboxSpec

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_PRELOAD", "LocalProvider", "LocalSandbox"]

# What the fork server imports before the first program: the modules programs (and the harness
# around them) import most. Each costs memory once per sandbox, not time per program. Left out on
# purpose: ``threading`` (its fork hook would run in every child, ~0.4 ms per exec; a program that
# imports it pays ~1 ms once) and what imports it (``queue``, ``subprocess``, ``asyncio``, ...).
DEFAULT_PRELOAD = (
    "abc", "array", "base64", "binascii", "bisect", "cmath", "collections", "collections.abc",
    "contextlib", "copy", "ctypes", "dataclasses", "datetime", "decimal", "enum", "fractions",
    "functools", "hashlib", "heapq", "io", "itertools", "json", "math", "numbers", "operator", "os",
    "pickle", "random", "re", "signal", "statistics", "string", "struct", "sys", "textwrap", "time",
    "traceback", "types", "typing", "unicodedata", "warnings", "weakref",
)
MEMORY_MODES = ("auto", "deny", "cgroup")


class LocalProvider:
    """Sandboxes on this machine, isolated with bubblewrap.

    Settings (``sandbox_provider_settings``): ``python`` (the interpreter inside the sandbox; it
    must be visible there, i.e. under ``/usr`` or an ``extra_ro_binds`` entry), ``bwrap``,
    ``extra_ro_binds`` (host paths, or ``(host, inside)`` pairs, mounted read-only),
    ``work_size_mb`` / ``tmp_size_mb`` / ``shm_size_mb`` (tmpfs caps), ``preload`` (modules the fork
    server imports up front), ``sandbox_uid``, ``host_uid`` (the host uid bwrap drops to when run
    as root; ``None`` keeps root), ``max_concurrency``, ``start_timeout_s``, ``exec_grace_s``
    (how long past an exec's timeout the host waits before declaring the sandbox hung),
    ``compile_cache_mb`` (source size of the programs whose compiled code a sandbox keeps; code
    takes about 3.5 times its source in memory), ``memory_mode`` (``"deny"``: programs cannot
    pin memory outside their address space; ``"cgroup"``: they can, because a memory cgroup
    charges it; ``"auto"``: ``"cgroup"`` where the sandbox has a memory cgroup, else ``"deny"``),
    ``cgroups`` (``auto``, ``v1``, ``v2`` or ``off``; a mode the kernel refuses is a
    ``ConfigError``), ``packages`` (top-level modules of the sandbox interpreter's site
    directories to make visible, e.g. ``["numpy"]`` or ``"numpy,sympy"``), ``time_budget``
    (``"cpu"``: an exec's timeout is CPU seconds of its whole process tree, so waiting for a core
    never times a program out; ``"wall"``: wall-clock seconds) and, in CPU mode, the wall-clock
    backstop for programs that sleep or block: ``wall_factor`` x timeout + ``wall_margin_s``;
    ``resident_judge`` (``True``: one judge process per sandbox judges program after program, and
    each judged program costs one process, its candidate's, forked ahead of it by a small forker;
    ``False``: a judge process per program); ``cpp_pch`` (``True``: C++ programs that include
    ``<bits/stdc++.h>`` compile against a header precompiled once per machine, bound read-only;
    see ``trl_sandbox.local.toolchain_cache``).
    """

    name = "local"
    work_dir = "/work"
    grades_agent_tasks = True  # its supervisor reads a lease's changes and brings the hidden tests

    def __init__(
        self,
        python: str = "/usr/bin/python3",
        bwrap: str = "bwrap",
        extra_ro_binds: Iterable[str | Sequence[str]] = (),
        *,
        work_size_mb: int = 256,
        tmp_size_mb: int = 64,
        shm_size_mb: int = 16,
        preload: Iterable[str] = DEFAULT_PRELOAD,
        sandbox_uid: int = 1000,
        host_uid: int | None = 65534,
        max_concurrency: int | None = None,
        start_timeout_s: float = 30.0,
        exec_grace_s: float = 5.0,
        compile_cache_mb: float = 1,
        memory_mode: str = "auto",
        cgroups: str = "auto",
        packages: Iterable[str] = (),
        time_budget: str = "cpu",
        wall_factor: float = 4.0,
        wall_margin_s: float = 2.0,
        resident_judge: bool = True,
        cpp_pch: bool = True,
        environment_cache: str | None = None,
        environment_cache_mb: float = 20_000,
        mount_points: Iterable[str] = DEFAULT_MOUNT_POINTS,
    ) -> None:
        found = shutil.which(bwrap)
        if not found:
            raise ConfigError(f"the local sandbox needs bubblewrap, but {bwrap!r} was not found; {INSTALL_HINT}")
        if not os.path.isabs(python):
            raise ConfigError(f"provider setting python={python!r} must be an absolute path inside the sandbox")
        if not os.access(python, os.X_OK):
            raise ConfigError(
                f"the sandbox interpreter {python!r} does not exist or is not executable; install it "
                "(`apt-get install python3`) or set the provider setting python=/path/to/python3"
            )
        self._python = python
        binds: list[tuple[str, str]] = []
        for entry in extra_ro_binds:
            src, dest = (entry, entry) if isinstance(entry, str) else tuple(entry)
            binds.append(mounts.check_bind(src, dest, SCRATCH))
        pch = toolchain_cache.pch_dir() if flag("local", "cpp_pch", cpp_pch) else None
        if pch is not None:
            binds.append((str(pch), toolchain_cache.PCH_INSIDE))
        visible = ["/usr"] + [dest for _, dest in binds]
        if not any(python == v or python.startswith(v.rstrip("/") + "/") for v in visible):
            raise ConfigError(
                f"the sandbox interpreter {python!r} is not inside the sandbox: only /usr and extra_ro_binds "
                f"are mounted; add its installation prefix to extra_ro_binds"
            )
        sites = mounts.site_dirs(python, binds)
        if isinstance(packages, str):
            packages = [p.strip() for p in packages.split(",") if p.strip()]  # --setting packages=numpy,sympy
        package_binds = mounts.package_entries(packages, sites)
        sizes = {
            "work": number("local", "work_size_mb", work_size_mb, int, required=True, positive=True),
            "tmp": number("local", "tmp_size_mb", tmp_size_mb, int, required=True, positive=True),
            "shm": number("local", "shm_size_mb", shm_size_mb, int, required=True, positive=True),
        }
        if memory_mode not in MEMORY_MODES:
            raise ConfigError(
                f"provider setting memory_mode={memory_mode!r} must be 'auto' (the default), 'deny' (programs "
                "cannot pin memory outside their address space) or 'cgroup' (only where a memory cgroup charges it)"
            )
        self._memory_mode = memory_mode
        if time_budget not in ("cpu", "wall"):
            raise ConfigError(
                f"provider setting time_budget={time_budget!r} must be 'cpu' (a timeout is CPU time of the "
                "program's processes; the wall clock is a backstop) or 'wall' (a timeout is wall-clock time)"
            )
        self.time_budget = time_budget
        self.wall_factor = number("local", "wall_factor", wall_factor, required=True, positive=True)
        if self.wall_factor < 1:
            raise ConfigError(f"provider setting wall_factor={wall_factor!r} must be at least 1 (the backstop "
                              "comes after the CPU budget)")
        self.wall_margin_s = number("local", "wall_margin_s", wall_margin_s, required=True)
        if self.wall_margin_s < 0:
            raise ConfigError(f"provider setting wall_margin_s={wall_margin_s!r} must be 0 or more")
        self.wall_timeouts = 0  # execs ended by the wall-clock backstop (slept or blocked), not by CPU
        self._preload = tuple(preload)
        self.resident_judge = flag("local", "resident_judge", resident_judge)
        # Trusted programs every sandbox runs ahead (the judge: see supervisor/main.warm_up). An exec
        # names one by its token, so its source does not travel with every exec.
        self.warm_tokens: dict[str, str] = {JUDGE_SOURCE: "\0trl-sandbox-warm-0"}
        uid = number("local", "sandbox_uid", sandbox_uid, int, required=True)
        drop: dict = {}
        host_uid = number("local", "host_uid", host_uid, int)
        if os.geteuid() == 0 and host_uid is not None:
            drop = {"user": host_uid, "group": host_uid, "extra_groups": []}
        self._start_timeout = number("local", "start_timeout_s", start_timeout_s, required=True, positive=True)
        self._grace = number("local", "exec_grace_s", exec_grace_s, required=True, positive=True)
        self._cache_bytes = int(number("local", "compile_cache_mb", compile_cache_mb, required=True) * (1 << 20))
        # Extra supervisor configuration; {"exit_watch": "sigchld"} forces the Python 3.8 code path.
        self._supervisor_options: dict = {}
        self._command = Command(found, binds, sizes, uid, drop, self.work_dir, sites, package_binds)
        self.work_size_mb = sizes["work"]
        if isinstance(mount_points, str):
            mount_points = [p.strip() for p in mount_points.split(",") if p.strip()]
        self.environments = LocalEnvironments(
            self._command, self.work_dir, environment_cache,
            number("local", "environment_cache_mb", environment_cache_mb, required=True, positive=True),
            tuple(mounts.check_mount_point(p) for p in mount_points), self._command.spawn_kwargs(),
            host_uid if drop else None)
        self.python_version = self._command.probe(python)
        cpus = os.cpu_count() or 1
        self.capabilities = Capabilities(
            network_isolation=True,
            files=True,
            persistent_state=True,
            separate_stderr=True,
            max_concurrency=number("local", "max_concurrency", max_concurrency, int, positive=True) or max(4, 4 * cpus),
            fast_python=True,
        )
        self._sandboxes: dict[str, LocalSandbox] = {}
        self._closed = False
        self._cgroups = Cgroups(cgroups)  # after the probe: a broken setup leaves no groups behind
        self._usage = _Usage(self)

    @property
    def isolation_mode(self) -> str:
        """``cgroup-v2``, ``cgroup-v1`` or ``none``: what bounds each sandbox's share of the machine."""
        return self._cgroups.mode

    def usage(self) -> dict[str, float | str]:
        """Per-step metrics: the isolation mode, the CPU seconds sandboxes used and the programs the
        wall-clock backstop ended since the last call (a CPU-budget timeout is an ordinary timeout)."""
        return self._usage.read()

    async def prepare_environment(self, spec: EnvironmentSpec) -> Prepared:
        """Build ``spec`` once per machine (or find it built); leases then ``use_environment``."""
        return await self.environments.prepare(spec)

    def wall_bound(self, timeout: float) -> float:
        """The wall-clock seconds an exec with ``timeout`` may take (its backstop, in CPU mode)."""
        return self.wall_factor * timeout + self.wall_margin_s if self.time_budget == "cpu" else timeout

    # -- Provider API --------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> LocalSandbox:
        if spec.network:
            raise ConfigError(
                "the local provider has no network access (SandboxSpec.network=True); use a remote provider "
                "for programs that need the network"
            )
        if self._closed:
            raise InfraError("the local provider is closed")
        root, python = self.environments.sandbox_root(spec.image, self._python)  # rootfs: a prepared image
        sandbox_id = "local-" + uuid.uuid4().hex[:12]
        command = self._command
        group = self._group(sandbox_id, spec)
        try:
            args, fds = command.args(command.env(spec.env, root), [python, "-s", SUPERVISOR_PATH],
                                     meter=group.meter_files() if group is not None else (), root=root)
        except BaseException:
            if group is not None:
                await asyncio.shield(group.remove())
            raise
        try:
            proc = await asyncio.create_subprocess_exec(
                *args,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=fds,
                limit=1 << 20,
                **command.spawn_kwargs(group),
            )
        except BaseException as exc:
            if group is not None:
                await asyncio.shield(group.remove())
            if isinstance(exc, (OSError, subprocess.SubprocessError)):
                raise InfraError(f"cannot start bubblewrap: {exc}") from exc
            raise
        finally:
            for fd in fds:
                os.close(fd)
            if group is not None:
                group.close_fds()
        sandbox = LocalSandbox(self, sandbox_id, spec, proc)
        sandbox.group = group
        self._sandboxes[sandbox_id] = sandbox
        memory_mode = self._memory_mode
        if memory_mode == "auto":
            # "cgroup": the sandbox's memory cgroup bounds what shm/memfd can pin; "deny": nothing
            # does, so the supervisor refuses those calls.
            memory_mode = "cgroup" if group is not None and self._cgroups.memory else "deny"
        limits = spec.limits
        config = {
            "work_dir": self.work_dir,
            "scratch": command.scratch(),
            "memory_mode": memory_mode,
            "time_budget": self.time_budget,
            "wall_factor": self.wall_factor,
            "wall_margin_s": self.wall_margin_s,
            "limits": {
                "cpu_seconds": limits.cpu_seconds,
                "memory_mb": limits.memory_mb,
                "max_processes": limits.max_processes,
                "file_size_mb": limits.file_size_mb,
                "open_files": limits.open_files,
            },
            "output_bytes": limits.output_bytes,
            "python_names": [python],
            "preload": list(self._preload),
            "warm": [[token, source] for source, token in self.warm_tokens.items()],
            "cache_bytes": self._cache_bytes,
            "resident_judge": self.resident_judge,
            **self._supervisor_options,
        }
        try:
            await sandbox._start(config, self._start_timeout)
        except BaseException:
            self._sandboxes.pop(sandbox_id, None)
            await asyncio.shield(self._retire(sandbox, "its start failed"))
            raise
        return sandbox

    def _group(self, sandbox_id: str, spec: SandboxSpec) -> SandboxGroup | None:
        """The sandbox's cgroup: ``SandboxSpec.memory_mb`` for everything it holds, a process cap."""
        if not self._cgroups.version:
            return None
        try:
            return self._cgroups.create(
                sandbox_id,
                memory_bytes=int(spec.memory_mb) << 20,
                max_pids=int(spec.limits.max_processes) + PID_HEADROOM,
            )
        except OSError as exc:
            raise InfraError(f"cannot create the cgroup of sandbox {sandbox_id}: {exc}") from exc

    async def _retire(self, sandbox: LocalSandbox, reason: str) -> None:
        """Stop a sandbox, then remove its cgroup (once its processes are gone)."""
        try:
            self._usage.retire(sandbox)
        except Exception as exc:  # a metric must never keep a sandbox alive
            log.warning("reading the CPU use of sandbox %s failed: %r", sandbox.id, exc)
        try:
            await sandbox._stop(reason)
        finally:
            if sandbox.group is not None:
                await sandbox.group.remove()

    async def list(self, tags: Mapping[str, str]) -> list[SandboxInfo]:
        return [
            SandboxInfo(id=s.id, tags=dict(s.tags), state="running" if s._usable() else "dead", created_at=s.created_at)
            for s in self._sandboxes.values()
            if all(s.tags.get(k) == v for k, v in tags.items())
        ]

    async def destroy(self, sandbox_id: str) -> None:
        sandbox = self._sandboxes.pop(sandbox_id, None)
        if sandbox is not None:
            await self._retire(sandbox, "destroyed")

    async def aclose(self) -> None:
        self._closed = True
        sandboxes = list(self._sandboxes.values())
        self._sandboxes.clear()
        await asyncio.gather(*(self._retire(s, "the provider was closed") for s in sandboxes), return_exceptions=True)
        await self._cgroups.close()

    def __repr__(self) -> str:
        bwrap = self._command.bwrap
        return f"LocalProvider(python={self._python!r}, bwrap={bwrap!r}, sandboxes={len(self._sandboxes)})"

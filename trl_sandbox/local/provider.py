"""The built-in local provider: bubblewrap containers with a warm Python fork server.

One ``LocalSandbox`` is one long-lived ``bwrap`` process started from the pool's event loop:
new user, pid, network, ipc, uts and cgroup namespaces; ``/usr`` (and the ``/bin``, ``/lib*``
links) read-only; from ``/etc`` only what programs need to start, plus a synthetic
``passwd``/``group``/``hosts``; a read-only root; private size-capped tmpfs mounts on the work
directory (``/work``, the default cwd and the base of relative paths), ``/tmp`` and ``/dev/shm``;
an environment cleared of the host's variables (only ``PATH``, ``HOME``, ``LANG`` and
``SandboxSpec.env``); an unprivileged uid inside. When the host runs as root, bwrap itself runs
as an unprivileged host uid (65534 by default), so sandboxed code never maps to host root.

Inside, ``supervisor.py`` runs as PID 1 and serves requests over the container's stdin/stdout
(protocol in its docstring). What other code can rely on:

* ``exit_code``: the exit status (0-255), or minus the signal number when the program died of a
  signal (``-9`` for SIGKILL, ``-11`` for a segfault), as ``subprocess`` reports it. A timeout
  is ``timed_out=True`` with ``exit_code=-9``; dying of the CPU-seconds rlimit (SIGXCPU) also
  sets ``timed_out``. A command that cannot be started gives 127 (not found) or 126, as a shell
  does. ``None`` only when the sandbox itself died during the execution.
* ``oom_killed``: the program died of an uncaught ``MemoryError`` (the address-space limit is
  ``ResourceLimits.memory_mb``); for non-Python programs, stderr ending in ``MemoryError``.
* Fast Python: argv whose first item is ``python``, ``python3``, ``pythonX.Y`` or the sandbox
  interpreter's path, followed by any of the flags ``-I -s -S -u -B -E -q`` and then ``-c SRC``,
  ``SCRIPT`` or ``-`` (program on stdin), runs in a fork of the pre-imported supervisor with a
  fresh ``__main__``; code objects are cached by source. Anything else (``-m``, ``-O``, ``-X``,
  an exec ``env`` with ``PYTHON*`` variables, ...) runs the real interpreter.
* After every exec, every process it left behind is killed (``kill(-1)`` from PID 1 reaches
  double-forked and ``setsid`` processes), and SysV IPC objects are removed; files persist until
  ``reset()``, which also empties ``/work``, ``/tmp`` and ``/dev/shm``.
* Files: ``write_file``/``read_file`` take paths relative to ``/work`` (absolute ones must be
  inside it). A path that escapes it raises ``ValueError``; one that escapes through a symlink a
  program left behind raises ``PermissionError``; a missing file ``FileNotFoundError``.
* If the sandbox dies during an exec, that exec returns ``exit_code=None`` with an explanation in
  stderr, and every later call raises ``InfraError``. If the host itself stopped it (``destroy``,
  lifetime expiry), the exec raises ``InfraError``. Sandboxed code cannot kill the supervisor
  (it is the namespace's init), so in practice that takes the host or the kernel's OOM killer.
* Where a forked interpreter differs from a fresh one: the string hash seed is the supervisor's
  (the same in every exec of a sandbox), ``sys.flags`` are the supervisor's, and modules in
  ``preload`` are already imported (in their pristine state: each exec starts from a fresh fork).
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
  ``ResourceLimits`` and the tmpfs caps apply. Every sandbox process has ``oom_score_adj=1000``, so
  the host's OOM killer picks sandboxed code first.
* What it sees (``mounts.py``): the interpreter's standard library, not the host's site-packages
  (each site directory is an empty read-only tmpfs; ``packages=[...]`` binds named top-level
  packages back), and a /proc whose host-wide files (boot arguments, kernel symbols, keys, ...) are
  covered.
"""

from __future__ import annotations

import asyncio
import logging
import marshal
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ..sandbox import (
    Capabilities,
    ConfigError,
    ExecResult,
    InfraError,
    SandboxInfo,
    SandboxSpec,
    exec_arguments,
)
from ..settings import number
from . import mounts
from . import supervisor as _proto
from .cgroups import PID_HEADROOM, Cgroups, SandboxGroup
from .usage import _Usage

log = logging.getLogger(__name__)

SUPERVISOR_SOURCE = Path(__file__).with_name("supervisor.py")
SUPERVISOR_PATH = "/.trl-sandbox/supervisor.py"

HEADER = _proto.HEADER
LENGTH = _proto.LENGTH
MARSHAL_VERSION = 4  # readable by every Python the supervisor supports (3.8+)

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

# The writable tmpfs mounts of a sandbox: emptied by reset(), never the target of a bind.
SCRATCH = ("/work", "/tmp", "/dev/shm", "/proc", "/dev")

# Host files that programs need to start and that reveal nothing about the host.
ETC_FILES = (
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
    "/etc/localtime", "/etc/nsswitch.conf",
)

INSTALL_HINT = (
    "install bubblewrap: `apt-get install bubblewrap` (Debian/Ubuntu), `dnf install bubblewrap` "
    "(Fedora), or pass the path of `bwrap` as the provider setting bwrap=..."
)
USERNS_HINT = (
    "bubblewrap could not create a user namespace. Enable unprivileged user namespaces: "
    "`sysctl -w kernel.unprivileged_userns_clone=1` (older Debian), "
    "`sysctl -w user.max_user_namespaces=15000`, on Ubuntu 23.10+ "
    "`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (or an AppArmor profile for bwrap); "
    "inside a container, run it with `--security-opt seccomp=unconfined --security-opt apparmor=unconfined` "
    "or `--privileged`."
)


class _Died(Exception):
    """Internal: the supervisor went away (or stopped answering) during a request."""

    def __init__(self, reason: str, *, by_host: bool = False, hung: bool = False):
        super().__init__(reason)
        self.by_host = by_host
        self.hung = hung


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name)  # close-on-exec: only bwrap gets it, through pass_fds
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class LocalProvider:
    """Sandboxes on this machine, isolated with bubblewrap.

    Settings (``sandbox_provider_settings``): ``python`` (the interpreter inside the sandbox; it
    must be visible there, i.e. under ``/usr`` or an ``extra_ro_binds`` entry), ``bwrap``,
    ``extra_ro_binds`` (host paths, or ``(host, inside)`` pairs, mounted read-only),
    ``work_size_mb`` / ``tmp_size_mb`` / ``shm_size_mb`` (tmpfs caps), ``preload`` (modules the fork
    server imports up front), ``sandbox_uid``, ``host_uid`` (the host uid bwrap drops to when run
    as root; ``None`` keeps root), ``max_concurrency``, ``start_timeout_s``, ``exec_grace_s``
    (how long past an exec's timeout the host waits before declaring the sandbox hung) and
    ``compile_cache_mb`` (source size of the programs whose compiled code a sandbox keeps; code
    takes about 3.5 times its source in memory), ``cgroups`` (``auto``, ``v1``, ``v2`` or ``off``; a
    mode the kernel refuses is a ``ConfigError``) and ``packages`` (top-level modules of the sandbox
    interpreter's site directories to make visible, e.g. ``["numpy"]`` or ``"numpy,sympy"``).
    """

    name = "local"
    work_dir = "/work"

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
        cgroups: str = "auto",
        packages: Iterable[str] = (),
    ) -> None:
        found = shutil.which(bwrap)
        if not found:
            raise ConfigError(f"the local sandbox needs bubblewrap, but {bwrap!r} was not found; {INSTALL_HINT}")
        self._bwrap = found
        if not os.path.isabs(python):
            raise ConfigError(f"provider setting python={python!r} must be an absolute path inside the sandbox")
        if not os.access(python, os.X_OK):
            raise ConfigError(
                f"the sandbox interpreter {python!r} does not exist or is not executable; install it "
                "(`apt-get install python3`) or set the provider setting python=/path/to/python3"
            )
        self._python = python
        self._binds: list[tuple[str, str]] = []
        for entry in extra_ro_binds:
            src, dest = (entry, entry) if isinstance(entry, str) else tuple(entry)
            self._binds.append(mounts.check_bind(src, dest, SCRATCH))
        visible = ["/usr"] + [dest for _, dest in self._binds]
        if not any(python == v or python.startswith(v.rstrip("/") + "/") for v in visible):
            raise ConfigError(
                f"the sandbox interpreter {python!r} is not inside the sandbox: only /usr and extra_ro_binds "
                f"are mounted; add its installation prefix to extra_ro_binds"
            )
        self._sites = mounts.site_dirs(python, self._binds)
        if isinstance(packages, str):
            packages = [p.strip() for p in packages.split(",") if p.strip()]  # --setting packages=numpy,sympy
        self._packages = mounts.package_entries(packages, self._sites)
        self._sizes = {
            "work": number("local", "work_size_mb", work_size_mb, int, required=True, positive=True),
            "tmp": number("local", "tmp_size_mb", tmp_size_mb, int, required=True, positive=True),
            "shm": number("local", "shm_size_mb", shm_size_mb, int, required=True, positive=True),
        }
        self._preload = tuple(preload)
        self._sandbox_uid = number("local", "sandbox_uid", sandbox_uid, int, required=True)
        self._drop: dict = {}
        host_uid = number("local", "host_uid", host_uid, int)
        if os.geteuid() == 0 and host_uid is not None:
            self._drop = {"user": host_uid, "group": host_uid, "extra_groups": []}
        self._start_timeout = number("local", "start_timeout_s", start_timeout_s, required=True, positive=True)
        self._grace = number("local", "exec_grace_s", exec_grace_s, required=True, positive=True)
        self._cache_bytes = int(number("local", "compile_cache_mb", compile_cache_mb, required=True) * (1 << 20))
        # Extra supervisor configuration; {"exit_watch": "sigchld"} forces the Python 3.8 code path.
        self._supervisor_options: dict = {}
        self._supervisor = SUPERVISOR_SOURCE.read_bytes()
        self._version = self._bwrap_version()
        self._disable_userns = self._version >= (0, 8)
        self._sized_tmpfs = self._version >= (0, 7)
        self._tmpfs_perms = self._version >= (0, 8)
        if not self._sized_tmpfs:
            warnings.warn(
                f"bubblewrap {'.'.join(map(str, self._version))} cannot cap tmpfs sizes (0.7+ can); "
                "only RLIMIT_FSIZE bounds what a program writes",
                stacklevel=2,
            )
        self.python_version = self._probe()
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

    # -- construction helpers ----------------------------------------------------------------

    def _bwrap_version(self) -> tuple[int, ...]:
        try:
            out = subprocess.run([self._bwrap, "--version"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            raise ConfigError(f"cannot run {self._bwrap!r}: {exc}; {INSTALL_HINT}") from exc
        m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out)
        return tuple(int(x) for x in m.groups() if x is not None) if m else (0, 0)

    def _args(self, env: Mapping[str, str], command: Sequence[str]) -> tuple[list[str], list[int]]:
        """The bwrap command line, and the memfds it reads (to pass, then close)."""
        uid = self._sandbox_uid
        data = {
            SUPERVISOR_PATH: self._supervisor,
            "/etc/passwd": (
                f"root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{uid}:{uid}:sandbox:{self.work_dir}:/bin/sh\n"
                "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ).encode(),
            "/etc/group": f"root:x:0:\nsandbox:x:{uid}:\nnogroup:x:65534:\n".encode(),
            "/etc/hosts": b"127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
        }
        args = [self._bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--as-pid-1"]
        if self._disable_userns:
            args.append("--disable-userns")
        args.append("--clearenv")
        for key, value in env.items():
            args += ["--setenv", key, value]
        args += ["--ro-bind", "/usr", "/usr"]
        for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(d):
                args += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                args += ["--ro-bind", d, d]
        for path in ETC_FILES:
            if os.path.exists(path):
                args += ["--ro-bind", path, path]
        for src, dest in self._binds:
            args += ["--ro-bind", src, dest]
        args += mounts.mask_args(self._sites, self._packages, sized=self._sized_tmpfs, perms=self._tmpfs_perms)
        args += ["--proc", "/proc", *mounts.proc_args(), "--dev", "/dev"]
        for dest, size, perms in (
            (self.work_dir, self._sizes["work"], "0755"),
            ("/tmp", self._sizes["tmp"], "1777"),
            ("/dev/shm", self._sizes["shm"], "1777"),
        ):
            if self._sized_tmpfs:
                args += ["--size", str(size << 20)]
            if self._tmpfs_perms:
                args += ["--perms", perms]
            args += ["--tmpfs", dest]
        fds = []
        try:
            for dest, blob in data.items():
                fd = _memfd(os.path.basename(dest), blob)
                fds.append(fd)
                args += ["--ro-bind-data", str(fd), dest]
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        args += [
            "--remount-ro", "/dev", "--remount-ro", "/",
            "--uid", str(uid), "--gid", str(uid), "--hostname", "sandbox", "--chdir", self.work_dir,
            "--", *command,
        ]
        return args, fds

    def _env(self, spec_env: Mapping[str, str]) -> dict[str, str]:
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": self.work_dir, "LANG": "C.UTF-8"}
        for key, value in spec_env.items():
            if not isinstance(key, str) or not key or "=" in key or "\0" in key or "\0" in str(value):
                raise ConfigError(f"SandboxSpec.env: invalid variable {key!r}")
            env[key] = str(value)
        return env

    def _spawn_kwargs(self, group: SandboxGroup | None = None) -> dict:
        extra = {"preexec_fn": group.preexec()} if group is not None else {}
        return {"cwd": "/", "env": {}, "start_new_session": True, **self._drop, **extra}

    @property
    def isolation_mode(self) -> str:
        """``cgroup-v2``, ``cgroup-v1`` or ``none``: what bounds each sandbox's share of the machine."""
        return self._cgroups.mode

    def usage(self) -> dict[str, float | str]:
        """Per-step metrics: the isolation mode and the CPU seconds sandboxes used since the last call."""
        return self._usage.read()

    def _probe(self) -> str:
        """Start one container now, so that a broken setup is a ConfigError at construction."""
        command = [self._python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"]
        attempts = [True, False] if self._disable_userns else [False]
        result = None
        for disable in attempts:
            self._disable_userns = disable
            args, fds = self._args(self._env({}), command)
            try:
                result = subprocess.run(args, pass_fds=fds, capture_output=True, text=True, timeout=60,
                                        **self._spawn_kwargs())
            except (OSError, subprocess.SubprocessError) as exc:
                raise ConfigError(f"cannot run bubblewrap ({self._bwrap}): {exc}; {INSTALL_HINT}") from exc
            finally:
                for fd in fds:
                    os.close(fd)
            if result.returncode == 0:
                break
        assert result is not None
        err = result.stderr.strip()
        if result.returncode != 0:
            lowered = err.lower()
            if any(s in lowered for s in ("namespace", "uid map", "operation not permitted", "permission denied")) \
                    and "execvp" not in lowered:
                raise ConfigError(f"the local sandbox cannot start: {err or 'bwrap failed'}. {USERNS_HINT}")
            raise ConfigError(f"the local sandbox cannot start (bwrap exit {result.returncode}): {err}")
        version = result.stdout.strip()
        try:
            major, minor = (int(x) for x in version.split(".")[:2])
        except ValueError as exc:
            raise ConfigError(f"the sandbox interpreter {self._python!r} printed {version!r} for its version") from exc
        if (major, minor) < (3, 8):
            raise ConfigError(f"the sandbox interpreter {self._python!r} is Python {version}; 3.8 or newer is needed")
        return version

    # -- Provider API --------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> LocalSandbox:
        if spec.network:
            raise ConfigError(
                "the local provider has no network access (SandboxSpec.network=True); use a remote provider "
                "for programs that need the network"
            )
        if self._closed:
            raise InfraError("the local provider is closed")
        if spec.image:
            warnings.warn(
                f"the local provider runs the host's {self._python}; SandboxSpec.image={spec.image!r} is ignored",
                stacklevel=2,
            )
        sandbox_id = "local-" + uuid.uuid4().hex[:12]
        args, fds = self._args(self._env(spec.env), [self._python, "-s", SUPERVISOR_PATH])
        group = None
        try:
            group = self._group(sandbox_id, spec)
            proc = await asyncio.create_subprocess_exec(
                *args,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=fds,
                limit=1 << 20,
                **self._spawn_kwargs(group),
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
        limits = spec.limits
        config = {
            "work_dir": self.work_dir,
            "limits": {
                "cpu_seconds": limits.cpu_seconds,
                "memory_mb": limits.memory_mb,
                "max_processes": limits.max_processes,
                "file_size_mb": limits.file_size_mb,
                "open_files": limits.open_files,
            },
            "output_bytes": limits.output_bytes,
            "python_names": [self._python],
            "preload": list(self._preload),
            "cache_bytes": self._cache_bytes,
            # "cgroup": the sandbox's memory cgroup bounds what shm/memfd can pin; "deny": nothing
            # does, so the supervisor refuses those calls.
            "memory_mode": "cgroup" if group is not None and self._cgroups.memory else "deny",
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
        return f"LocalProvider(python={self._python!r}, bwrap={self._bwrap!r}, sandboxes={len(self._sandboxes)})"


class LocalSandbox:
    """One bubblewrap container with its supervisor. Use through ``LocalProvider.create``."""

    def __init__(self, provider: LocalProvider, sandbox_id: str, spec: SandboxSpec, proc) -> None:
        self.id = sandbox_id
        self.spec = spec
        self.tags = dict(spec.tags)
        self.created_at = time.time()
        self.python_version = ""
        self._provider = provider
        self._proc = proc
        self.group: SandboxGroup | None = None
        self._reader: asyncio.StreamReader = proc.stdout
        self._writer: asyncio.StreamWriter = proc.stdin
        self._lock = asyncio.Lock()
        self._dead: str | None = None
        self._dead_by_host = False
        self._hang = False
        self._grace = provider._grace
        self._max_output = spec.limits.output_bytes
        self._lifetime = asyncio.get_running_loop().call_later(spec.lifetime_s, self._expire)
        self._kill_sent = False
        # Signal bwrap through a pidfd: Popen.kill() first polls the child with waitpid, which can
        # reap it under asyncio's child watcher (a spurious "Unknown child process" warning),
        # and a bare pid could be reused once the process is reaped.
        try:
            self._pidfd: int | None = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            self._pidfd = None

    @property
    def pid(self) -> int:
        """The host pid of the outer bwrap process."""
        return self._proc.pid

    # -- state ---------------------------------------------------------------------------------

    def _usable(self) -> bool:
        return self._dead is None and self._proc.returncode is None

    def _mark_dead(self, reason: str, *, by_host: bool = False) -> None:
        if self._dead is None:
            self._dead = reason
            self._dead_by_host = by_host
            log.debug("sandbox %s is dead: %s", self.id, reason)
        if self._proc.returncode is None and not self._kill_sent:
            self._kill_sent = True
            try:
                if self._pidfd is not None:
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
                else:
                    self._proc.kill()
            except ProcessLookupError:
                pass

    def _expire(self) -> None:
        self._mark_dead(f"its lifetime of {self.spec.lifetime_s:g} s expired", by_host=True)

    def _check(self) -> None:
        if self._dead is not None:
            raise InfraError(f"sandbox {self.id} is dead: {self._dead}")
        if self._proc.returncode is not None:
            self._mark_dead(f"bwrap exited with status {self._proc.returncode}")
            raise InfraError(f"sandbox {self.id} is dead: {self._dead}")

    async def _stop(self, reason: str) -> None:
        self._lifetime.cancel()
        self._mark_dead(reason, by_host=True)
        try:
            self._writer.close()
        except Exception:
            pass
        try:
            await asyncio.wait_for(self._proc.wait(), 10)
            # Let both pipes see end of file while the loop runs, so that no transport is left
            # to be closed by the garbage collector after the loop has stopped.
            await asyncio.wait_for(asyncio.gather(self._reader.read(), self._proc.stderr.read()), 5)
        except asyncio.TimeoutError:
            log.warning("sandbox %s (pid %s) did not exit after SIGKILL", self.id, self._proc.pid)
        except RuntimeError:
            pass  # an exec in flight is reading stdout; it sees the end of file itself
        transport = getattr(self._proc, "_transport", None)
        if transport is not None:
            transport.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    # -- transport -----------------------------------------------------------------------------

    async def _call(
        self, request: tuple, deadline: float | None, raw: bytes = b""
    ) -> tuple[int, int, int, float, bytes, bytes]:
        """Send one request (plus a raw frame, for an exec's stdin) and read its answer:
        (kind, flags, code, duration, part1, part2)."""
        payload = marshal.dumps(request, MARSHAL_VERSION)
        watchdog = None
        try:
            self._writer.write(LENGTH.pack(len(payload)) + payload + raw)
            if len(payload) + len(raw) > 1 << 16:
                await self._writer.drain()
            if deadline is not None:
                watchdog = asyncio.get_running_loop().call_later(deadline, self._hung, deadline)
            head = await self._reader.readexactly(HEADER.size)
            kind, flags, code, duration, n1, n2 = HEADER.unpack(head)
            if kind == _proto.K_RESULT and (n1 > self._max_output or n2 > self._max_output):
                self._mark_dead("the supervisor sent more output than the cap")
                raise _Died(self._dead or "protocol error")
            body = await self._reader.readexactly(n1 + n2) if n1 + n2 else b""
        except asyncio.CancelledError:
            # The answer is still on its way: the channel cannot be reused.
            self._mark_dead("a request was cancelled before its answer arrived")
            raise
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            if self._dead is None:
                self._mark_dead(await self._death_reason())
            raise _Died(self._dead or "the sandbox died", by_host=self._dead_by_host, hung=self._hang) from exc
        finally:
            if watchdog is not None:
                watchdog.cancel()
        if n2:
            return kind, flags, code, duration, body[:n1], body[n1:]
        return kind, flags, code, duration, body, b""

    def _hung(self, deadline: float) -> None:
        self._hang = True
        self._mark_dead(f"no answer from the supervisor within {deadline:.1f} s")

    async def _death_reason(self) -> str:
        """Why the channel closed: bwrap's exit status and whatever it (or Python) said on stderr."""
        detail = b""
        try:
            detail = await asyncio.wait_for(self._proc.stderr.read(4096), 1.0)
            await asyncio.wait_for(self._proc.wait(), 1.0)
        except (asyncio.TimeoutError, OSError):
            pass
        rc = self._proc.returncode
        reason = "the supervisor exited" if rc is None else f"bwrap exited with status {rc}"
        text = detail.decode("utf-8", "replace").strip()[-500:]
        return f"{reason}: {text}" if text else reason

    async def _start(self, config: dict, timeout: float) -> None:
        try:
            kind, _, _, _, version, _ = await asyncio.wait_for(self._call((_proto.OP_CONFIG, config), None), timeout)
        except _Died as exc:
            raise InfraError(f"sandbox {self.id} failed to start: {exc}") from None
        except asyncio.TimeoutError as exc:
            raise InfraError(f"sandbox {self.id} did not start within {timeout:g} s") from exc
        if kind != _proto.K_OK:
            raise InfraError(f"sandbox {self.id} failed to start: unexpected answer {kind!r}")
        self.python_version = version.decode(errors="replace")

    async def _simple(self, request: tuple, timeout: float = 60.0) -> tuple[int, int, bytes]:
        async with self._lock:
            self._check()
            try:
                kind, _, code, _, part1, _ = await self._call(request, timeout)
            except _Died as exc:
                raise InfraError(f"sandbox {self.id} died: {exc}") from None
        if kind == _proto.K_ERROR:
            message = part1.decode("utf-8", "replace")
            if code:
                raise OSError(code, message)
            raise InfraError(f"sandbox {self.id}: {message}")
        return kind, code, part1

    # -- Sandbox API ---------------------------------------------------------------------------

    async def exec(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | str | None = None,
        timeout: float,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        argv, stdin = exec_arguments(argv, stdin, timeout, allow_empty=True)  # the supervisor answers 127
        if env:
            env = {str(k): str(v) for k, v in env.items()}
        stdin = stdin or b""
        request = (_proto.OP_EXEC, argv, len(stdin), float(timeout), cwd, env or None)
        async with self._lock:
            self._check()
            started = time.monotonic()
            try:
                kind, flags, code, duration, out, err = await self._call(request, timeout + self._grace, stdin)
            except _Died as exc:
                if exc.by_host:
                    raise InfraError(f"sandbox {self.id} was stopped during an exec: {exc}") from None
                oom = self.group is not None and self.group.new_oom_kills()
                return ExecResult(
                    exit_code=None,
                    stderr=f"trl-sandbox: the sandbox died during this execution ({exc})"
                    + ("; its memory cgroup ran out of memory" if oom else "") + "\n",
                    timed_out=exc.hung,
                    oom_killed=oom,
                    duration_s=time.monotonic() - started,
                )
        if kind != _proto.K_RESULT:
            self._mark_dead(f"protocol error: answer {kind!r} to an exec")
            raise InfraError(f"sandbox {self.id}: {self._dead}")
        return ExecResult(
            exit_code=code,
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            timed_out=bool(flags & _proto.F_TIMED_OUT),
            # Killed by the kernel because the sandbox's memory cgroup was full: the same verdict
            # as a MemoryError. One small read per exec keeps the baseline current.
            oom_killed=bool(flags & _proto.F_OOM) or (self.group is not None and self.group.new_oom_kills()
                                                      and code == -signal.SIGKILL),
            truncated=bool(flags & _proto.F_TRUNCATED),
            duration_s=duration,
        )

    def _path(self, path: str) -> str:
        work = self._provider.work_dir
        full = os.path.normpath(os.path.join(work, path))
        if "\0" in path or not (full == work or full.startswith(work + "/")):
            raise ValueError(f"path {path!r} is outside the sandbox work directory {work}")
        return full

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        if isinstance(data, str):
            data = data.encode()
        await self._simple((_proto.OP_WRITE, self._path(path), bytes(data), int(mode)))

    async def read_file(self, path: str) -> bytes:
        _, _, data = await self._simple((_proto.OP_READ, self._path(path)))
        return data

    async def reset(self) -> None:
        await self._simple((_proto.OP_RESET,))

    async def alive(self) -> bool:
        if not self._usable():
            return False
        if self._lock.locked():
            return True  # busy with an exec, which has its own watchdog
        try:
            await self._simple((_proto.OP_PING,), timeout=10.0)
        except (InfraError, OSError):
            return False
        return True

    def __repr__(self) -> str:
        state = "running" if self._usable() else f"dead ({self._dead})"
        return f"<LocalSandbox {self.id} pid={self._proc.pid} {state}>"


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
* A clean kernel per program: every exec runs in its own IPC namespace (SysV objects and POSIX
  message queues die with it), with no capabilities and a seccomp filter (no keyrings, ptrace,
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
800 KiB by RLIMIT_MSGQUEUE), for a setup where a memory cgroup charges them.
``SandboxSpec.cpus`` and ``SandboxSpec.memory_mb`` are not enforced (no cgroups). Every sandbox
process has ``oom_score_adj=1000``, so the host's OOM killer picks sandboxed code first.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
import warnings
from collections.abc import Iterable, Mapping, Sequence

from ..sandbox import Capabilities, ConfigError, InfraError, SandboxInfo, SandboxSpec
from ..settings import number
from .command import INSTALL_HINT, SCRATCH, SUPERVISOR_PATH, Command
from .container import LocalSandbox

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
MEMORY_MODES = ("deny", "cgroup")


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
    takes about 3.5 times its source in memory) and ``memory_mode`` (``"deny"``: programs cannot
    pin memory outside their address space; ``"cgroup"``: they can, because a memory cgroup
    charges it).
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
        memory_mode: str = "deny",
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
            if not os.path.exists(src):
                raise ConfigError(f"extra_ro_binds: {src!r} does not exist")
            dest = os.path.normpath(dest)
            if not os.path.isabs(dest) or any(dest == d or dest.startswith(d + "/") for d in SCRATCH):
                raise ConfigError(f"extra_ro_binds: {dest!r} must be an absolute path outside {', '.join(SCRATCH)}")
            binds.append((os.path.abspath(src), dest))
        visible = ["/usr"] + [dest for _, dest in binds]
        if not any(python == v or python.startswith(v.rstrip("/") + "/") for v in visible):
            raise ConfigError(
                f"the sandbox interpreter {python!r} is not inside the sandbox: only /usr and extra_ro_binds "
                f"are mounted; add its installation prefix to extra_ro_binds"
            )
        sizes = {
            "work": number("local", "work_size_mb", work_size_mb, int, required=True),
            "tmp": number("local", "tmp_size_mb", tmp_size_mb, int, required=True),
            "shm": number("local", "shm_size_mb", shm_size_mb, int, required=True),
        }
        if memory_mode not in MEMORY_MODES:
            raise ConfigError(
                f"provider setting memory_mode={memory_mode!r} must be 'deny' (programs cannot pin memory "
                "outside their address space) or 'cgroup' (only where a memory cgroup charges it)"
            )
        self._memory_mode = memory_mode
        self._preload = tuple(preload)
        uid = number("local", "sandbox_uid", sandbox_uid, int, required=True)
        drop: dict = {}
        host_uid = number("local", "host_uid", host_uid, int)
        if os.geteuid() == 0 and host_uid is not None:
            drop = {"user": host_uid, "group": host_uid, "extra_groups": []}
        self._start_timeout = number("local", "start_timeout_s", start_timeout_s, required=True)
        self._grace = number("local", "exec_grace_s", exec_grace_s, required=True)
        self._cache_bytes = int(number("local", "compile_cache_mb", compile_cache_mb, required=True) * (1 << 20))
        # Extra supervisor configuration; {"exit_watch": "sigchld"} forces the Python 3.8 code path.
        self._supervisor_options: dict = {}
        self._command = Command(found, binds, sizes, uid, drop, self.work_dir)
        self.python_version = self._command.probe(python)
        cpus = os.cpu_count() or 1
        self.capabilities = Capabilities(
            network_isolation=True,
            files=True,
            persistent_state=True,
            separate_stderr=True,
            max_concurrency=number("local", "max_concurrency", max_concurrency, int) or max(4, 4 * cpus),
            fast_python=True,
        )
        self._sandboxes: dict[str, LocalSandbox] = {}
        self._closed = False

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
        command = self._command
        args, fds = command.args(command.env(spec.env), [self._python, "-s", SUPERVISOR_PATH])
        try:
            proc = await asyncio.create_subprocess_exec(
                *args,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=fds,
                limit=1 << 20,
                **command.spawn_kwargs(),
            )
        except OSError as exc:
            raise InfraError(f"cannot start bubblewrap: {exc}") from exc
        finally:
            for fd in fds:
                os.close(fd)
        sandbox = LocalSandbox(self, sandbox_id, spec, proc)
        self._sandboxes[sandbox_id] = sandbox
        limits = spec.limits
        config = {
            "work_dir": self.work_dir,
            "scratch": command.scratch(),
            "memory_mode": self._memory_mode,
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
            **self._supervisor_options,
        }
        try:
            await sandbox._start(config, self._start_timeout)
        except BaseException:
            self._sandboxes.pop(sandbox_id, None)
            await asyncio.shield(sandbox._stop("its start failed"))
            raise
        return sandbox

    async def list(self, tags: Mapping[str, str]) -> list[SandboxInfo]:
        return [
            SandboxInfo(id=s.id, tags=dict(s.tags), state="running" if s._usable() else "dead", created_at=s.created_at)
            for s in self._sandboxes.values()
            if all(s.tags.get(k) == v for k, v in tags.items())
        ]

    async def destroy(self, sandbox_id: str) -> None:
        sandbox = self._sandboxes.pop(sandbox_id, None)
        if sandbox is not None:
            await sandbox._stop("destroyed")

    async def aclose(self) -> None:
        self._closed = True
        sandboxes = list(self._sandboxes.values())
        self._sandboxes.clear()
        await asyncio.gather(*(s._stop("the provider was closed") for s in sandboxes), return_exceptions=True)

    def __repr__(self) -> str:
        bwrap = self._command.bwrap
        return f"LocalProvider(python={self._python!r}, bwrap={bwrap!r}, sandboxes={len(self._sandboxes)})"

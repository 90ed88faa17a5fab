"""The contracts everything else builds on: what a sandbox provider must supply and the errors it
may raise, and what a task hands over to be run (``Program``) and gets back (``Outcome``).

Everything here is plain data or a ``Protocol`` so that a provider or task plugin depends on this
module only; it imports nothing of the package. All provider I/O is async; the pool drives it from its own event-loop thread.

The error taxonomy matters more than anything else in this file: the pool retries ``InfraError``
and ``RateLimitError``, never retries ``ConfigError``/``QuotaError``, and a reward is ``None``
(dropped from the GRPO baseline) only when infrastructure failed. Whatever the model's code does,
``Sandbox.exec`` returns an ``ExecResult``: a crash, a timeout or a memory blow-up is a *result*.
"""

from __future__ import annotations

import functools
import hashlib
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable

# -- errors -------------------------------------------------------------------------------------


class SandboxError(Exception):
    """Base class of every error a provider or the pool raises."""


class InfraError(SandboxError):
    """Retryable infrastructure failure: transport error, 5xx, sandbox vanished or unresponsive.

    A plain ``InfraError`` says nothing about the sandbox's health: a 503 or a dropped connection
    usually comes from the service, not the sandbox, so the pool probes ``alive()`` and retries on
    the same sandbox when it still answers (a replacement costs a create, which is what a
    struggling service can least afford). Raise ``SandboxGoneError`` when the sandbox itself is gone.
    """


class SandboxGoneError(InfraError):
    """The sandbox no longer exists (HTTP 404, gRPC NOT_FOUND on its id): the pool replaces it."""


class SandboxOutageError(InfraError):
    """No sandbox could be created for longer than the outage budget (``sandbox_outage_s``).

    Training stops with this error rather than running on ``None`` rewards; ``evaluate``/``exec``
    report the items it affects as infrastructure errors.
    """


class RateLimitError(InfraError):
    """The provider asked us to slow down (HTTP 429, gRPC RESOURCE_EXHAUSTED)."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class QuotaError(SandboxError):
    """A hard account limit (sandbox count, disk, vCPU). Retrying does not help; shrink the pool."""


class ConfigError(SandboxError):
    """Bad or missing configuration. Raised when the trainer is built, with a message saying what to set."""


# -- specs and results --------------------------------------------------------------------------


@dataclass(frozen=True)
class ResourceLimits:
    """Per-execution limits. Providers enforce what they can and say so in ``Capabilities``."""

    cpu_seconds: float = 10.0
    memory_mb: int = 1024
    max_processes: int = 64
    file_size_mb: int = 64
    open_files: int = 256
    output_bytes: int = 16 * 1024 * 1024  # per stream

    def __post_init__(self) -> None:
        # A zero or negative budget would make every program a timeout (or unbounded, for rlimits
        # that read 0 as "none"): say which field to change, at construction.
        for name, minimum in (("cpu_seconds", 0), ("memory_mb", 0), ("max_processes", 0), ("file_size_mb", 0),
                              ("open_files", 0), ("output_bytes", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > minimum:
                raise ConfigError(f"ResourceLimits.{name}={value!r}: it must be a positive number")


@dataclass(frozen=True)
class SandboxSpec:
    """What to create. Network is off and the lifetime is finite by default: a leaked sandbox dies."""

    image: str | None = None
    cpus: float = 1.0
    memory_mb: int = 2048
    network: bool = False
    tags: Mapping[str, str] = field(default_factory=dict)
    lifetime_s: float = 6 * 3600.0
    env: Mapping[str, str] = field(default_factory=dict)
    limits: ResourceLimits = field(default_factory=ResourceLimits)

    def __post_init__(self) -> None:
        if not self.lifetime_s or self.lifetime_s <= 0:
            raise ConfigError("SandboxSpec.lifetime_s must be a positive number of seconds (it is always finite)")
        for name in ("cpus", "memory_mb"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"SandboxSpec.{name}={value!r}: it must be a positive number")


@dataclass(frozen=True)
class ExecResult:
    """The result of one execution. A timeout is ``timed_out=True``, never an exception."""

    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    oom_killed: bool = False
    truncated: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.oom_killed


@dataclass(frozen=True)
class SandboxInfo:
    """What ``Provider.list`` reports about a sandbox, possibly one created by another process."""

    id: str
    tags: Mapping[str, str]
    state: str = "unknown"
    created_at: float | None = None


@dataclass(frozen=True)
class Capabilities:
    """What a provider guarantees; the pool and tasks adapt to it."""

    network_isolation: bool = True
    files: bool = True
    persistent_state: bool = True
    separate_stderr: bool = True
    max_concurrency: int | None = None
    # True when python argv is served by a pre-imported interpreter (no interpreter start-up per exec).
    fast_python: bool = False


def exec_arguments(
    argv: Sequence[str], stdin: bytes | str | None, timeout: float, *, allow_empty: bool = False
) -> tuple[list[str], bytes | None]:
    """``Sandbox.exec``'s inputs checked and normalised the same way for every provider.

    A caller's mistake (a string instead of a list, a missing timeout) is a ``TypeError`` or
    ``ValueError`` before anything reaches the provider; stdin text becomes UTF-8 bytes.
    """
    if isinstance(argv, (str, bytes)) or (not argv and not allow_empty):
        raise TypeError("argv must be a non-empty sequence of strings, e.g. ['python3', '-c', source]")
    if not timeout or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if isinstance(stdin, str):
        stdin = stdin.encode()
    return [str(a) for a in argv], stdin


# Bounds on a file operation's path, checked on the host before it reaches the sandbox (whose
# directory creation must not depend on an interpreter's recursion limit).
MAX_PATH_BYTES, MAX_PATH_DEPTH = 4096, 64


def sandbox_path(work: str, path: str, *, root_ok: bool = True) -> str:
    """``path`` (relative to the work directory ``work``, or absolute inside it) normalised, for
    ``Sandbox.write_file``/``read_file`` on every provider: a ``ValueError`` when it leaves ``work``
    (``root_ok``: ``work`` itself is allowed), holds a NUL, is not UTF-8 or is absurdly long."""
    if not isinstance(path, str):
        raise TypeError(f"a sandbox path must be a str, not {type(path).__name__}")
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"path {path!r} is not valid UTF-8 (a lone surrogate?)") from None
    if len(encoded) > MAX_PATH_BYTES or path.count("/") > MAX_PATH_DEPTH:
        raise ValueError(f"path is longer than {MAX_PATH_BYTES} bytes or {MAX_PATH_DEPTH} levels")
    work = posixpath.normpath(work)
    full = posixpath.normpath(posixpath.join(work, path))
    if "\0" in path or not ((root_ok and full == work) or full.startswith(work + "/")):
        raise ValueError(f"path {path!r} is outside the sandbox work directory {work}")
    return full


# -- protocols ----------------------------------------------------------------------------------


@runtime_checkable
class Sandbox(Protocol):
    """One isolated machine-like environment. Relative paths and the default cwd are its work dir."""

    id: str

    async def exec(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | str | None = None,
        timeout: float,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult: ...

    async def write_file(self, path: str, data: bytes) -> None: ...

    async def read_file(self, path: str) -> bytes: ...

    async def reset(self) -> None:
        """Return to a clean state for the next lease, or raise to have the pool replace the sandbox."""
        ...

    async def alive(self) -> bool: ...


@runtime_checkable
class Provider(Protocol):
    """A source of sandboxes. Constructed synchronously by ``factory(**settings)``.

    The constructor must validate configuration (API keys, binaries) and raise ``ConfigError``:
    the trainer builds the provider in ``__init__`` so that mistakes surface before training.
    Network clients should be created lazily inside the async methods (they run on the pool's loop).
    """

    name: str
    capabilities: Capabilities

    async def create(self, spec: SandboxSpec) -> Sandbox: ...

    async def list(self, tags: Mapping[str, str]) -> list[SandboxInfo]: ...

    async def destroy(self, sandbox_id: str) -> None: ...

    async def aclose(self) -> None: ...


# -- the task contract: a program to run, the verdict on it --------------------------------------

Status = Literal["passed", "failed", "error", "timeout", "banned", "no_code", "infra"]
STATUSES: tuple[Status, ...] = ("passed", "failed", "error", "timeout", "banned", "no_code", "infra")

# The dataset column naming the task set that scores a row.
TASK_COLUMN = "sandbox_task"


@dataclass(frozen=True)
class Program:
    """What to run in a sandbox for one completion.

    ``nonce_on_stdin``: the runner prepends 16 fresh random bytes to ``stdin`` for every execution
    and hands the same bytes to ``Task.score``; a judge inside the sandbox signs its verdict with
    them so that the candidate's own output can never pass for a verdict. The nonce is not part of
    ``key()``, so identical programs are still deduplicated and cached.
    """

    argv: tuple[str, ...]
    stdin: bytes = b""
    files: tuple[tuple[str, bytes], ...] = ()
    timeout: float = 1.0
    nonce_on_stdin: bool = False
    # The row's prepared environment (``environments.spec.EnvironmentSpec``): the program runs in
    # its own copy of it. ``None``: the sandbox's empty working directory.
    environment: Any = None

    def key(self, salt: str = "") -> str:
        """A hash of everything that determines the result (for dedup within a batch and caching)."""
        h = hashlib.sha256()
        for part in (salt, repr(self.timeout), repr(self.nonce_on_stdin)):
            h.update(part.encode("utf-8", "surrogatepass"))  # model text may hold lone surrogates
            h.update(b"\0")
        h.update(_argv_digest(tuple(self.argv)))
        h.update(self.stdin)
        for path, data in self.files:
            h.update(path.encode("utf-8", "surrogatepass") + b"\0")
            h.update(hashlib.sha256(data).digest())
        if self.environment is not None:
            fingerprint = getattr(self.environment, "fingerprint", None) or repr(self.environment)
            h.update(b"environment\0" + fingerprint.encode("utf-8", "surrogatepass"))
        return h.hexdigest()


@functools.lru_cache(maxsize=64)
def _argv_digest(argv: tuple[str, ...]) -> bytes:
    """The argv's part of a program's key, kept for the argvs seen last: a judged program's argv
    is the judge's whole source, the same for every completion."""
    return hashlib.sha256(repr(argv).encode("utf-8", "surrogatepass")).digest()


@dataclass(frozen=True)
class Outcome:
    """The verdict on one completion. ``reward`` is filled in by the reward scheme."""

    status: Status
    passed: int = 0
    total: int = 0
    reward: float | None = None
    detail: str = ""
    tests: tuple[bool, ...] = field(default=(), repr=False)

    def with_reward(self, reward: float | None) -> Outcome:
        return replace(self, reward=reward)


@runtime_checkable
class Task(Protocol):
    """A task set. ``build``/``score`` receive one dataset row (a mapping of its columns).

    Optional: ``quick_score = True`` where ``score`` only reads a verdict (work linear in the
    result's size, no I/O, no decoding of the program's values, as ``judge.check_outcome``): the
    scorer then scores small results on the pool's loop instead of handing them to its thread.
    """

    name: str
    description: str

    def rows(self, **options: Any) -> list[dict[str, Any]]:
        """Dataset rows: at least ``prompt`` and ``task_id``; ``sandbox_task`` is added by ``load_tasks``."""
        ...

    def build(self, completion: str, row: Mapping[str, Any]) -> Program | Outcome:
        """A program to run, or a final ``Outcome`` (``no_code``/``banned``) without running anything."""
        ...

    def score(self, result: ExecResult, row: Mapping[str, Any], *, nonce: bytes | None) -> Outcome:
        """The outcome of ``result``; ``reward`` may be left ``None`` for the scheme to fill in."""
        ...

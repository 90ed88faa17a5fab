"""The ``ray`` provider: local bubblewrap sandboxes on the nodes of a Ray cluster.

Ray places, supervises and reaps; we bring the sandbox. Each sandbox is one Ray actor
(``actor.SandboxActor``) that holds one local sandbox on the node Ray chose for it by its
resources, so a team's own CPU nodes carry the reward instead of the training nodes' cores. One
actor per sandbox, not one per node: Ray's scheduler then places and accounts every sandbox by
itself, and a crashed actor costs one sandbox, not a node's worth (``plugins/ray/README.md``
gives the measured cost of the extra processes).

The pool contract holds whole: every exec, file operation and reset travels to the actor and
back; a timeout is an ``ExecResult``; an actor or node that died is ``SandboxGoneError`` (the pool
replaces the sandbox, Ray puts the new one on a live node, the job is retried); any other Ray
failure is ``InfraError``. Actors are never detached: they are owned by the process that made
them, so when it dies, even by SIGKILL, Ray ends them and their sandboxes with them.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from trl_sandbox.environments.builds import Prepared
from trl_sandbox.environments.spec import EnvironmentSpec
from trl_sandbox.plugins.settings import flag, number
from trl_sandbox.sandbox import (
    Capabilities,
    ConfigError,
    ExecResult,
    InfraError,
    SandboxGoneError,
    SandboxInfo,
    SandboxSpec,
    exec_arguments,
)

from . import cluster
from .actor import ERRORS, MAX_INTERNED, SandboxActor
from .environments import RayEnvironments

log = logging.getLogger(__name__)

STRATEGIES = ("SPREAD", "DEFAULT")
# Arguments of this many characters that recur cross once per sandbox, then as their digest.
INTERN_MIN, INTERN_MAX = 4096, 256 * 1024
_ACTOR_CLASS: Any = None  # ray.remote(SandboxActor), made once per process


def _mapping(name: str, value: Any, kind: type) -> dict[str, Any]:
    """A mapping setting from code ({"sandbox": 1}) or the command line ("sandbox=1,cpu_node=1")."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        pairs = [p.partition("=") for p in value.split(",") if p.strip()]
        if any(not sep or not k.strip() for k, sep, _ in pairs):
            raise ConfigError(f"ray provider setting {name}={value!r} must be KEY=VALUE pairs separated by commas")
        value = {k.strip(): v.strip() for k, _, v in pairs}
    if not isinstance(value, Mapping):
        raise ConfigError(f"ray provider setting {name}={value!r} must be a mapping or KEY=VALUE,... text")
    if kind is float:
        return {str(k): number("ray", f"{name}.{k}", v, float, 0) for k, v in value.items()}
    return {str(k): str(v) for k, v in value.items()}


def _local_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings passed to the local provider on each node, checked by name here: a typo must
    fail at construction on the driver, which may have no bubblewrap of its own."""
    from trl_sandbox.local.provider import LocalProvider

    known = set(inspect.signature(LocalProvider.__init__).parameters) - {"self"}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ConfigError(
            f"ray provider: unknown setting(s) {', '.join(unknown)}; the ray provider takes address, namespace, "
            "cpus_per_sandbox, resources, label_selector, strategy, connect_timeout_s, start_timeout_s, "
            f"call_margin_s and probe, and passes the local provider's settings on: {', '.join(sorted(known))}")
    return dict(settings)


class RaySandbox:
    """A sandbox on a node of the cluster, reached through its actor."""

    work_dir = "/work"

    def __init__(self, provider: RayProvider, sandbox_id: str, handle: Any, info: Mapping[str, Any],
                 tags: Mapping[str, str]) -> None:
        self.id = sandbox_id
        self.tags = dict(tags)
        self.node_id: str = info["node_id"]
        self.host: str = info["host"]
        self.created_at = time.time()
        self._provider = provider
        self._handle = handle
        self._info = dict(info)
        self._busy = 0
        self._reset_due = False
        self._held: set[str] = set()  # digests of the large arguments the actor keeps
        self.environment_mode = ""  # how the node gave the last prepared environment: overlay or copy

    def wall_bound(self, timeout: float) -> float:
        """The node's own bound (its CPU-time backstop), plus the round trip through Ray."""
        info = self._info
        bound = info["wall_factor"] * timeout + info["wall_margin_s"] if info["time_budget"] == "cpu" else timeout
        return bound + self._provider.call_margin_s

    async def _ask(self, method: str, *args: Any, **kwargs: Any) -> Any:

        reset = False
        if method in ("exec", "write_file", "read_file", "use_environment"):
            reset, self._reset_due = self._reset_due, False
            args = (reset, *args)
        self._busy += 1
        try:
            answer = await self._call(method, args, kwargs)
        except BaseException:
            # The call may not have reached the actor: a reset it carried is still due (one more
            # is harmless; a job is retried whole, its files written again after it).
            self._reset_due = self._reset_due or reset
            raise
        finally:
            self._busy -= 1
        if answer[0] == "ok":
            return answer[1]
        if answer[0] == "resend":  # answered before anything ran there, the reset included
            self._reset_due = self._reset_due or reset
            return answer
        raise ERRORS.get(answer[1], InfraError)(answer[2])

    async def _call(self, method: str, args: tuple, kwargs: dict) -> Any:
        import ray

        try:
            return await getattr(self._handle, method).remote(*args, **kwargs)
        except ray.exceptions.RayActorError as exc:
            raise SandboxGoneError(f"sandbox {self.id} on node {self.host} ({self.node_id[:12]}) is gone: "
                                   f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
        except ray.exceptions.RayError as exc:
            raise InfraError(f"sandbox {self.id}: Ray failed: {type(exc).__name__}: {exc}") from None

    async def exec(self, argv: Sequence[str], *, stdin: bytes | str | None = None, timeout: float,
                   cwd: str | None = None, env: Mapping[str, str] | None = None) -> ExecResult:
        argv, stdin = exec_arguments(argv, stdin, timeout, allow_empty=True)
        env = {str(k): str(v) for k, v in env.items()} if env else None
        sent, interned, keep = self._intern(argv)
        result = await self._ask("exec", sent, stdin, float(timeout), cwd, env, interned or None, tuple(keep))
        if isinstance(result, tuple):  # ("resend",): the actor does not hold what we thought
            self._held.clear()
            result = await self._ask("exec", argv, stdin, float(timeout), cwd, env)
        self._held.update(digest for _, digest in keep)
        return result

    def _intern(self, argv: list[str]) -> tuple[list[str], dict[int, str], list[tuple[int, str]]]:
        """Large arguments (the judge's source, 48 KB with every judged program) cross once per
        sandbox; later execs send their digest (0.3 ms less of the actor's CPU per exec)."""
        interned: dict[int, str] = {}
        keep: list[tuple[int, str]] = []
        for position, arg in enumerate(argv):
            if not INTERN_MIN <= len(arg) <= INTERN_MAX:
                continue
            digest, recurring = self._provider.digest(arg)
            if digest in self._held:
                interned[position] = digest
            elif recurring and len(self._held) + len(keep) < MAX_INTERNED:
                keep.append((position, digest))
        if not interned:
            return argv, interned, keep
        return ["" if i in interned else a for i, a in enumerate(argv)], interned, keep

    async def use_environment(self, prepared: Prepared) -> None:
        """This lease's private copy of a prepared environment, mounted by the node's local sandbox
        (``environments.RayEnvironments.lease``); dropped by the next reset."""
        await self._provider.environments.lease(self, prepared)

    async def write_file(self, path: str, data: bytes) -> None:
        await self._ask("write_file", path, bytes(data))

    async def read_file(self, path: str) -> bytes:
        return await self._ask("read_file", path)

    async def reset(self) -> None:
        self._reset_due = False
        await self._ask("reset")

    def defer_reset(self) -> bool:
        """The reset rides with the next call (as in the local sandbox): no round trip of its own."""
        if self._busy:
            return False
        self._reset_due = True
        return True

    async def alive(self) -> bool:
        try:
            return bool(await asyncio.wait_for(self._ask("alive"), 10.0))
        except (asyncio.TimeoutError, SandboxGoneError):
            return False

    def __repr__(self) -> str:
        return f"<RaySandbox {self.id} on {self.host} ({self.node_id[:12]})>"


class RayProvider:
    """Sandboxes on a Ray cluster's nodes, each a local bubblewrap sandbox in an actor.

    Settings (``sandbox_provider_settings`` / ``--setting``): ``address`` (``auto``: the cluster
    this machine joined with ``ray start``, or ``RAY_ADDRESS``; ``HOST:PORT``; ``ray://HOST:10001``
    for Ray Client; ``local``: start a one-machine Ray in this process, for trying it out),
    ``namespace`` (where the sandbox actors are named; ``ls``/``reap`` look there),
    ``cpus_per_sandbox`` (Ray CPUs each sandbox reserves, default 1), ``resources`` (custom Ray
    resources each sandbox reserves, e.g. ``sandbox=1`` where only CPU nodes offer ``sandbox``: the
    way to keep sandboxes off the GPU nodes), ``label_selector`` (node labels a sandbox's node must
    carry, e.g. ``role=cpu``), ``strategy`` (``SPREAD``, the default, spreads sandboxes over the
    nodes; ``DEFAULT`` packs them), ``connect_timeout_s``, ``start_timeout_s`` (how long a new
    sandbox may wait for a node and start), ``call_margin_s`` (wall-clock seconds allowed for the
    round trip through Ray on top of an exec's own bound), ``probe`` (start one sandbox at
    construction, so that a node without bubblewrap fails here). Every other setting is the local
    provider's (limits, ``packages``, ``python``, ``cgroups``, ...) and applies on every node.
    """

    name = "ray"

    def __init__(self, address: str = "auto", namespace: str = "trl-sandbox", *, cpus_per_sandbox: float = 1.0,
                 resources: Any = None, label_selector: Any = None, strategy: str = "SPREAD",
                 connect_timeout_s: float = 60.0, start_timeout_s: float = 120.0, call_margin_s: float = 5.0,
                 probe: Any = True, **local_settings: Any) -> None:
        try:
            import ray  # noqa: F401
        except ImportError as exc:  # pragma: no cover - ray is this plugin's dependency
            raise ConfigError(f"the ray provider needs Ray: pip install trl-sandbox-ray ({exc})") from None
        if not isinstance(address, str) or not address:
            raise ConfigError(f"ray provider setting address={address!r} must be auto, local, HOST:PORT or ray://HOST:PORT")
        if not isinstance(namespace, str) or not namespace:
            raise ConfigError(f"ray provider setting namespace={namespace!r} must be a non-empty name")
        self.address, self.namespace = address, namespace
        self.cpus_per_sandbox = number("ray", "cpus_per_sandbox", cpus_per_sandbox, float, 0, required=True)
        self.resources = _mapping("resources", resources, float)
        self.label_selector = _mapping("label_selector", label_selector, str)
        self.strategy = str(strategy).upper()
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"ray provider setting strategy={strategy!r} must be SPREAD or DEFAULT")
        self.connect_timeout_s = number("ray", "connect_timeout_s", connect_timeout_s, required=True, positive=True)
        self.start_timeout_s = number("ray", "start_timeout_s", start_timeout_s, required=True, positive=True)
        self.call_margin_s = number("ray", "call_margin_s", call_margin_s, required=True, minimum=0)
        self._local = _local_settings(local_settings)
        self.environments = RayEnvironments(self, self._local)
        self._digests: dict[str, list] = {}  # large argument -> [digest, times seen]
        self._sandboxes: dict[str, RaySandbox] = {}
        self._pending: dict[str, Any] = {}
        self._closed = False
        cluster.connect(address, namespace, self.connect_timeout_s)
        try:
            self.capacity = self._check_capacity()
            self.capabilities = Capabilities(network_isolation=True, files=True, persistent_state=True,
                                             separate_stderr=True, max_concurrency=self.capacity, fast_python=True)
            self.node_info: dict[str, Any] = {}
            if flag("ray", "probe", probe):
                self.node_info = self._probe()
        except BaseException:
            cluster.disconnect()
            raise

    def digest(self, arg: str) -> tuple[str, bool]:
        """A large argument's digest, and whether it recurs (was seen before). Only recurring ones
        are kept by actors, so one-off programs never fill their room; a string's hash is cached
        on the object, so finding the judge's source again costs a dictionary lookup."""
        entry = self._digests.get(arg)
        if entry is None:
            if len(self._digests) >= 64:  # forget the arguments seen once
                self._digests = {k: v for k, v in self._digests.items() if v[1] > 1}
            entry = [hashlib.blake2b(arg.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest(), 0]
            if len(self._digests) < 64:
                self._digests[arg] = entry
        entry[1] += 1
        return entry[0], entry[1] > 1

    # -- placement -------------------------------------------------------------------------------

    def _need(self) -> dict[str, float]:
        return {"CPU": self.cpus_per_sandbox, **self.resources}

    def _shape(self) -> str:
        need = ", ".join(f"{k}={v:g}" for k, v in self._need().items())
        labels = ", ".join(f"{k}={v}" for k, v in self.label_selector.items())
        return need + (f" on nodes labelled {labels}" if labels else "")

    def _check_capacity(self) -> int:
        total, nodes = cluster.capacity(self._need(), self.label_selector)
        if total < 1:
            raise ConfigError(
                f"ray provider: no node of the cluster at {self.address!r} can host a sandbox ({self._shape()}); its "
                f"nodes: {'; '.join(nodes) or 'none alive'}. Lower cpus_per_sandbox, or start nodes that offer the "
                "resources (`ray start --address=HEAD:6379 --resources='{\"sandbox\": 16}'`)")
        return total

    def _options(self, name: str) -> dict[str, Any]:
        options: dict[str, Any] = {"name": name, "namespace": self.namespace, "num_cpus": self.cpus_per_sandbox,
                                   "max_restarts": 0, "max_task_retries": 0, "max_concurrency": 8}
        if self.resources:
            options["resources"] = dict(self.resources)
        if self.label_selector:
            options["label_selector"] = dict(self.label_selector)
        if self.strategy == "SPREAD":
            options["scheduling_strategy"] = "SPREAD"
        return options

    def _actor(self, spec: SandboxSpec) -> tuple[str, Any]:
        import ray

        global _ACTOR_CLASS
        if _ACTOR_CLASS is None:
            _ACTOR_CLASS = ray.remote(SandboxActor)
        sandbox_id = "ray-" + uuid.uuid4().hex[:12]
        handle = _ACTOR_CLASS.options(**self._options(cluster.actor_name(sandbox_id, spec.tags))).remote(self._local, spec)
        return sandbox_id, handle

    def _probe(self) -> dict[str, Any]:
        """Start one sandbox now, so that a node without bubblewrap or the interpreter, or settings
        the local provider refuses there, fail the trainer's construction with the node's words."""
        import ray

        _, handle = self._actor(SandboxSpec(tags={"trl-sandbox-probe": "1"}))
        try:
            answer = ray.get(handle.start.remote(), timeout=self.start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise ConfigError(
                f"ray provider: no node started a sandbox ({self._shape()}) within start_timeout_s="
                f"{self.start_timeout_s:g}; the cluster's capacity for it is {self.capacity}, all of it may be in use"
            ) from None
        except ray.exceptions.RayError as exc:
            raise ConfigError(f"ray provider: the probe sandbox failed on its node: {exc}") from None
        finally:
            try:
                ray.get(handle.close.remote(), timeout=10)
            except Exception:
                pass
            ray.kill(handle, no_restart=True)
        if answer[0] != "ok":
            raise ConfigError(f"ray provider: a node cannot host the local sandbox: {answer[2]}")
        return answer[1]

    def usage(self) -> dict[str, float | str]:
        """``sandbox/isolation_mode`` of the sandboxes on the nodes (the weakest, when nodes differ),
        for the trainer's metrics. CPU seconds are not reported: they are spent on other machines,
        where they do not compete with training."""
        modes = {s._info.get("isolation_mode", "none") for s in self._sandboxes.values()}
        if not modes:
            return {}
        return {"sandbox/isolation_mode": "none" if "none" in modes else sorted(modes)[0]}

    # -- Provider API ----------------------------------------------------------------------------

    async def prepare_environment(self, spec: EnvironmentSpec) -> Prepared:
        """Build ``spec`` once on every node that holds a sandbox of this provider (the local
        provider's builds there); leases then ``use_environment``. ``SetupFailed`` when it fails."""
        return await self.environments.prepare(spec)

    async def create(self, spec: SandboxSpec) -> RaySandbox:
        if spec.network:
            raise ConfigError("the ray provider runs the local sandbox, which has no network (SandboxSpec.network=True)")
        if self._closed:
            raise InfraError("the ray provider is closed")
        sandbox_id, handle = self._actor(spec)
        self._pending[sandbox_id] = handle
        try:
            answer = await asyncio.wait_for(_awaited(handle.start.remote()), self.start_timeout_s)
        except asyncio.TimeoutError:
            await self._end(handle)
            raise InfraError(f"no node of the Ray cluster started sandbox {sandbox_id} ({self._shape()}) within "
                             f"{self.start_timeout_s:g} s; the cluster holds {self.capacity} such sandboxes: make the "
                             "pool smaller or add nodes") from None
        except BaseException as exc:
            await asyncio.shield(self._end(handle))
            if isinstance(exc, Exception):
                raise InfraError(f"sandbox {sandbox_id} did not start on its node: {type(exc).__name__}: {exc}") from None
            raise
        finally:
            self._pending.pop(sandbox_id, None)
        if answer[0] != "ok":
            await self._end(handle)
            # A node that cannot host one (no bwrap there) is the cluster's fault, not the run's:
            # retried, and Ray may place the next one elsewhere.
            raise InfraError(f"sandbox {sandbox_id} did not start on its node: {answer[1]}: {answer[2]}")
        sandbox = RaySandbox(self, sandbox_id, handle, answer[1], spec.tags)
        if self._closed:
            await self._end(handle)
            raise InfraError("the ray provider was closed while a sandbox started")
        self._sandboxes[sandbox_id] = sandbox
        return sandbox

    async def _end(self, handle: Any, graceful: bool = True) -> None:
        """Stop the sandbox in its actor (its cgroup goes too), then end the actor."""
        import ray

        if graceful:
            try:
                await asyncio.wait_for(_awaited(handle.close.remote()), 10.0)
            except BaseException:
                pass
        try:
            ray.kill(handle, no_restart=True)
        except Exception as exc:  # already gone
            log.debug("ray.kill: %r", exc)

    async def list(self, tags: Mapping[str, str]) -> list[SandboxInfo]:
        import ray

        named = await asyncio.to_thread(ray.util.list_named_actors, all_namespaces=True)
        found = []
        for entry in named:
            parsed = cluster.parse_name(entry.get("name", "")) if entry.get("namespace") == self.namespace else None
            if parsed is None:
                continue
            sandbox_id, sandbox_tags = parsed
            if all(sandbox_tags.get(k) == v for k, v in tags.items()):
                own = self._sandboxes.get(sandbox_id)
                found.append(SandboxInfo(id=sandbox_id, tags=sandbox_tags, state="running",
                                         created_at=own.created_at if own else None))
        return found

    async def destroy(self, sandbox_id: str) -> None:
        import ray

        sandbox = self._sandboxes.pop(sandbox_id, None)
        if sandbox is not None:
            await self._end(sandbox._handle)
            return
        for info in await self.list({}):  # another process's sandbox (``trl-sandbox reap``)
            if info.id == sandbox_id:
                try:
                    handle = ray.get_actor(cluster.actor_name(sandbox_id, info.tags), namespace=self.namespace)
                except ValueError:
                    return
                await self._end(handle)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        handles = [s._handle for s in self._sandboxes.values()] + list(self._pending.values())
        self._sandboxes.clear()
        await asyncio.gather(*(self._end(h) for h in handles), return_exceptions=True)
        cluster.disconnect()

    def __repr__(self) -> str:
        return f"RayProvider(address={self.address!r}, namespace={self.namespace!r}, sandboxes={len(self._sandboxes)})"


async def _awaited(ref: Any) -> Any:
    return await ref

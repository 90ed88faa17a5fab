"""The local provider's prepared environments: each built once in a one-off bubblewrap container,
then given to every lease as an overlay (``supervisor/layers.py``). A root filesystem ``base``
is the build's root and then the root of the sandboxes that lease it (``local/rootfs.py``).

A build writes the environment's files into a fresh tree, binds it writable at the environment's
working directory in a container like a sandbox (read-only system, the sandbox's uid, no network
unless ``setup_network``) and runs the setup commands there in order, each in its own shell. The
tree then enters the cache (``environments/cache.py``) and is never written again: leases see it
through their own overlay, read-only underneath. The files are owned by the uid that runs the
sandboxes, so that a lease's copy-up keeps them its own (a file of an unmapped uid cannot be
copied up: EOVERFLOW).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from trl_sandbox.environments import bases
from trl_sandbox.environments.builds import OUTPUT_KEPT, Builds, Prepared, SetupFailed
from trl_sandbox.environments.cache import EnvironmentCache
from trl_sandbox.environments.spec import EnvironmentSpec
from trl_sandbox.local import rootfs
from trl_sandbox.sandbox import ConfigError

if TYPE_CHECKING:
    from trl_sandbox.local.command import Command

# Where a lease's copy may be mounted besides the work directory: the working directories the
# published task layouts use. A sandbox makes these (empty) mount points when it starts.
DEFAULT_MOUNT_POINTS = ("/app", "/testbed", "/workspace", "/repo", "/code")
# Runs each setup command in its own shell, in order; the first failure ends the build.
SETUP_LOOP = 'for c in "$@"; do /bin/sh -c "$c" || { s=$?; echo "setup: exit $s: $c" >&2; exit $s; }; done'


def _tail(data: bytes) -> str:
    text = data.decode("utf-8", "replace")
    return text if len(text) <= OUTPUT_KEPT else "..." + text[-OUTPUT_KEPT:]


def _read_tail(f) -> bytes:
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - 4 * OUTPUT_KEPT))
    return f.read()


def _chown_tree(tree: Path, uid: int) -> None:
    for root, dirs, files in os.walk(tree):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, uid)
    os.lchown(tree, uid, uid)


def _check_reachable(root: Path, uid: int) -> None:
    """bubblewrap runs as ``uid`` (the provider's ``host_uid``) and binds the cache: every directory
    above it must let that uid through."""
    path = root.resolve()
    for directory in [path, *path.parents]:
        st = directory.stat()
        if not (st.st_mode & 0o001 or (st.st_uid == uid and st.st_mode & 0o100)):
            raise ConfigError(
                f"environment_cache={str(root)!r}: the sandboxes run as uid {uid}, which cannot enter {directory}; "
                "choose a cache directory every user can reach (the default as root is "
                "/var/cache/trl-sandbox/environments), or `chmod o+x` that directory")


class LocalEnvironments:
    """Build and lease prepared environments for one ``LocalProvider``."""

    def __init__(self, command: Command, work_dir: str, cache_dir: str | None, cache_mb: float,
                 mount_points: tuple[str, ...], spawn_kwargs: dict, owner: int | None) -> None:
        self.command = command
        self.work_dir = work_dir
        self.mount_points = tuple(mount_points)
        self._spawn = spawn_kwargs
        self._owner = owner
        self.cache = EnvironmentCache(cache_dir, cache_mb, owner=owner)
        if owner is not None:
            _check_reachable(self.cache.root, owner)
        self.builds = Builds(self.cache, "local", self._build, digest=_digest, active=lambda: set(self.active))
        self.active: dict[str, str] = {}  # sandbox id -> the key its lease uses now
        command.env_root = str(self.cache.root)
        command.mount_points = self.mount_points

    def check(self, spec: EnvironmentSpec) -> None:
        """What this provider cannot give, as a ``ConfigError`` that says what to change."""
        if spec.workdir is not None and spec.workdir != self.work_dir and spec.workdir not in self.mount_points:
            raise ConfigError(
                f"environment.workdir={spec.workdir!r} is not a mount point of the local sandbox; use "
                f"{self.work_dir} or one of {', '.join(self.mount_points)}, or add it to the local provider "
                "setting mount_points")

    async def prepare(self, spec: EnvironmentSpec) -> Prepared:
        self.check(spec)
        return await self.builds.prepare(spec)

    def sandbox_root(self, image: str | None, python: str) -> tuple[str | None, str]:
        """(root, interpreter) of a sandbox made for ``SandboxSpec.image``: a prepared root
        filesystem (``rootfs:``, only from this cache), or the host's system and ``python``."""
        if rootfs.is_image(image):
            return rootfs.sandbox_root(self.cache.root, str(image))
        if image:
            warnings.warn(f"the local provider runs the host's {python}; SandboxSpec.image={image!r} is ignored",
                          stacklevel=3)
        return None, python

    def _build(self, spec: EnvironmentSpec, key: str, staging: Path) -> dict:
        workdir = spec.workdir or self.work_dir
        root: Path | None = None
        if spec.base != "host":
            base = bases.resolve(spec.base)
            if spec.key(self.builds.kind, base.digest) != key:
                raise ConfigError(f"environment.base {spec.base!r} changed while its build began; try again")
            unpacked = rootfs.unpacked(self.cache.root, base, self._owner)
            root = rootfs.stage(unpacked, staging, workdir, self._owner)
        tree = staging / "tree"
        rootfs.write_files(tree, spec.files, self._owner)
        if root is None and self._owner is not None and os.geteuid() == 0:
            _chown_tree(tree, self._owner)
        output = b""
        if spec.setup:
            args = self.command.build_args(workdir, str(tree), spec.setup_network,
                                           ["/bin/sh", "-c", SETUP_LOOP, "setup", *spec.setup],
                                           root=None if root is None else str(root))
            # The output goes to a file, of which only the tail is read: a setup may print gigabytes.
            with tempfile.TemporaryFile() as out:
                try:
                    done = subprocess.run(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                          timeout=spec.setup_timeout, **self._spawn)
                except subprocess.TimeoutExpired:
                    raise SetupFailed(f"setup timed out after {spec.setup_timeout:g} s; output: "
                                      f"{_tail(_read_tail(out))}") from None
                except OSError as exc:
                    raise SetupFailed(f"setup could not start: {exc}") from exc
                output = _read_tail(out)
            if done.returncode != 0:
                raise SetupFailed(f"setup failed (exit {done.returncode}); output: {_tail(output)}")
        meta = {"spec": spec.describe(), "output": _tail(output)}
        if root is not None:
            meta.update(self._probe(spec, root), image=rootfs.PREFIX + str(self.cache.root / key / rootfs.ROOT))
        return meta

    def _probe(self, spec: EnvironmentSpec, root: Path) -> dict:
        """Start a sandbox on the built root now: an image that cannot run one is a ``ConfigError``
        at its first lease, never a sandbox that dies later."""
        python = rootfs.find_python(root)
        if python is None:
            raise ConfigError(f"environment.base {spec.base!r}: the image has no python3 on "
                              f"{rootfs.IMAGE_PATH}; the local sandbox's supervisor runs on the image's Python "
                              "(3.8 or newer): use an image that has it, or install it in the setup")
        try:
            version = self.command.probe(python, root=str(root))
        except ConfigError as exc:
            raise ConfigError(f"environment.base {spec.base!r}: a sandbox cannot start on this image with its "
                              f"{python} (Python 3.8 or newer is needed): {exc}") from exc
        return {"python": python, "python_version": version}


def _digest(base: str) -> str:
    """What the key hashes of a base: ``host``, or the root filesystem's digest (``bases``)."""
    return "host" if base == "host" else bases.resolve(base).digest

"""Built environments on disk: one directory per content key, a file lock per key, a disk budget.

Layout under the cache root::

    <key>/tree/        the prepared working directory (read-only to every lease)
    <key>/root/        with a root filesystem base: the build's root (``local/rootfs.py``)
    bases/             root filesystem bases, unpacked once per digest (kept; not in the budget)
    <key>/meta.json    what built it, how long it took, its size; its mtime is the last use
    <key>.lock         taken (``flock``) while the key is built, so that the processes of one
                       machine (``accelerate launch`` ranks) build each key once
    .build-*/          builds under way; renamed to ``<key>`` when complete, so a reader never
                       sees half a tree

Eviction removes the least recently used keys past the budget, never one this process leases
from (``in_use``), and first renames it away so that no later lease finds half of it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("trl_sandbox.environments")

META = "meta.json"
TREE = "tree"


def default_root() -> Path:
    """``$TRL_SANDBOX_ENV_CACHE``, else ``$XDG_CACHE_HOME/trl-sandbox/environments``; as root,
    ``/var/cache/trl-sandbox/environments`` (the sandbox's unprivileged uid must reach it)."""
    env = os.environ.get("TRL_SANDBOX_ENV_CACHE")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/cache/trl-sandbox/environments")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "trl-sandbox" / "environments"


def remove_tree(path: Path) -> None:
    """``rm -rf`` that also gets through directories a build left without write or search
    permission (mode 000, as overlayfs leaves its work directory)."""

    def fix(func, target, _exc):
        parent = os.path.dirname(target)
        for p in (parent, target):
            try:
                if not os.path.islink(p):
                    os.chmod(p, stat.S_IRWXU)
            except OSError:
                pass
        func(target)

    if path.exists() or path.is_symlink():
        try:
            os.chmod(path, stat.S_IRWXU)
        except OSError:
            pass
        shutil.rmtree(path, onerror=fix)


def tree_size(path: Path) -> tuple[int, int]:
    """(bytes, files) of a tree, not following symlinks."""
    total = files = 0
    for root, dirs, names in os.walk(path):
        for name in names + dirs:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            total += st.st_blocks * 512
            files += 1
    return total, files


class EnvironmentCache:
    """The built environments of one machine (see the module docstring)."""

    def __init__(self, root: str | os.PathLike | None = None, budget_mb: float = 20_000,
                 owner: int | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()
        self.budget_bytes = int(budget_mb * (1 << 20))
        self.owner = owner
        self.in_use: set[str] = set()
        self.root.mkdir(parents=True, exist_ok=True)
        if owner is not None and os.geteuid() == 0:
            os.chown(self.root, owner, owner)
        os.chmod(self.root, 0o755)

    def tree(self, key: str) -> Path:
        return self.root / key / TREE

    def ready(self, key: str) -> dict | None:
        """The key's metadata if it is built, and marks it used (for eviction)."""
        meta = self.root / key / META
        try:
            data = json.loads(meta.read_text())
            os.utime(meta)
        except (OSError, ValueError):
            return None
        return data if self.tree(key).is_dir() else None

    @contextlib.contextmanager
    def locked(self, key: str) -> Iterator[None]:
        """Hold the key's build lock (blocking: call it from a worker thread)."""
        fd = os.open(self.root / f"{key}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def staging(self) -> Path:
        """A fresh directory to build in: ``commit`` moves it into place."""
        path = self.root / f".build-{uuid.uuid4().hex[:12]}"
        path.mkdir(mode=0o755)
        (path / TREE).mkdir(mode=0o755)
        if self.owner is not None and os.geteuid() == 0:
            os.chown(path, self.owner, self.owner)
            os.chown(path / TREE, self.owner, self.owner)
        return path

    def commit(self, staging: Path, key: str, meta: dict) -> None:
        size, files = tree_size(staging)  # the tree, and a root filesystem beside it if the build has one
        meta = {**meta, "bytes": size, "files": files, "built_at": time.time()}
        (staging / META).write_text(json.dumps(meta, indent=1))
        target = self.root / key
        if target.exists():  # a build from an older run that was evicted halfway: replace it
            self.discard(key)
        os.rename(staging, target)
        self.evict(keep=key)

    def discard(self, key: str) -> None:
        target = self.root / key
        if target.exists():
            trash = self.root / f".trash-{uuid.uuid4().hex[:12]}"
            os.rename(target, trash)
            remove_tree(trash)

    def entries(self) -> list[tuple[float, int, str]]:
        """(last use, bytes, key) of every built key."""
        out = []
        for meta in self.root.glob(f"*/{META}"):
            key = meta.parent.name
            if key.startswith("."):
                continue
            try:
                used = meta.stat().st_mtime
                size = int(json.loads(meta.read_text()).get("bytes", 0))
            except (OSError, ValueError):
                continue
            out.append((used, size, key))
        return sorted(out)

    def evict(self, keep: str = "") -> list[str]:
        """Remove the least recently used keys until the cache fits its budget. Returns them."""
        entries = self.entries()
        total = sum(size for _, size, _ in entries)
        removed = []
        for _, size, key in entries:
            if total <= self.budget_bytes:
                break
            if key == keep or key in self.in_use:
                continue
            log.info("prepared environment %s evicted (cache over its %d MB budget)", key[:12],
                     self.budget_bytes >> 20)
            self.discard(key)
            total -= size
            removed.append(key)
        for stale in self.root.glob(".build-*"):  # a build whose process died: older than a day
            with contextlib.suppress(OSError):
                if time.time() - stale.stat().st_mtime > 86400:
                    remove_tree(stale)
        return removed

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

Eviction removes the least recently used keys past the budget, never one that a process leases
from (it holds the key's lock shared: ``hold``), and first renames it away so that no later lease
finds half of it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import stat
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("trl_sandbox.environments")

META = "meta.json"
LOCK_POLL_S = 0.05  # how often a process waiting for another's build looks again
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
    permission (mode 000, as overlayfs leaves its work directory) and trees of any depth (a setup
    may nest thousands of directories: Python's own walkers recurse per level). Never follows a
    symlink out of the tree, never crosses into another file system."""
    if not (path.exists() or path.is_symlink()):
        return
    if not path.is_symlink():
        subprocess.run(["chmod", "-R", "u+rwx", "--", str(path)], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
    subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=False)


def tree_size(path: Path) -> tuple[int, int]:
    """(bytes, entries) of a tree, not following symlinks; iterative, so any depth is fine."""
    total = files = 0
    stack = [str(path)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += st.st_blocks * 512
            files += 1
            if stat.S_ISDIR(st.st_mode):
                stack.append(entry.path)
    return total, files


class EnvironmentCache:
    """The built environments of one machine (see the module docstring)."""

    def __init__(self, root: str | os.PathLike | None = None, budget_mb: float = 20_000,
                 owner: int | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()
        self.budget_bytes = int(budget_mb * (1 << 20))
        self.owner = owner
        self._held: dict[str, int] = {}  # key -> fd holding its lock shared: leased from here
        self._held_lock = threading.Lock()
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

    def _lock_fd(self, key: str) -> int:
        return os.open(self.root / f"{key}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def hold(self, key: str) -> bool:
        """Take the key's lock shared for as long as this process leases from its tree, so that no
        process evicts it meanwhile (an eviction takes the lock exclusive, without waiting). False
        when the tree is gone (evicted before we held it): build it again."""
        with self._held_lock:
            if key in self._held:
                return self.tree(key).is_dir()
        fd = self._lock_fd(key)
        fcntl.flock(fd, fcntl.LOCK_SH)  # never under _held_lock: a build of this process may need it
        if not self.tree(key).is_dir():
            os.close(fd)
            return False
        with self._held_lock:
            if key in self._held:  # another thread of ours took it meanwhile
                os.close(fd)
            else:
                self._held[key] = fd
        return True

    def release(self, key: str) -> None:
        """No lease of this process uses ``key`` any more: it may be evicted."""
        with self._held_lock:
            fd = self._held.pop(key, None)
        if fd is not None:
            os.close(fd)

    @property
    def held(self) -> set[str]:
        with self._held_lock:
            return set(self._held)

    @contextlib.contextmanager
    def locked(self, key: str) -> Iterator[bool]:
        """Hold the key's build lock, or learn that the key got built meanwhile (blocking: call it
        from a worker thread). Yields True with the lock held, False when the tree is ready: the
        process that built it keeps its lock shared while it leases (``hold``), so waiting for the
        exclusive lock would wait for that lease to end."""
        self.release(key)  # our own shared hold would block our exclusive lock forever
        fd = self._lock_fd(key)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    if (self.root / key / META).is_file() and self.tree(key).is_dir():
                        yield False
                        return
                    time.sleep(LOCK_POLL_S)
                    continue
                yield True
                return
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
        held = self.held
        for _, size, key in entries:
            if total <= self.budget_bytes:
                break
            if key == keep or key in held:
                continue
            fd = self._lock_fd(key)
            try:
                try:  # a process that leases from it holds it shared: leave it
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue
                log.info("prepared environment %s evicted (cache over its %d MB budget)", key[:12],
                         self.budget_bytes >> 20)
                self.discard(key)
            finally:
                os.close(fd)
            total -= size
            removed.append(key)
        for stale in [*self.root.glob(".build-*"), *self.root.glob(".trash-*")]:
            try:  # a build whose process died: older than a day
                if time.time() - stale.stat().st_mtime > 86400:
                    remove_tree(stale)
            except Exception as exc:  # noqa: BLE001 - never the build's failure
                log.warning("could not remove %s: %s", stale, exc)
        return removed

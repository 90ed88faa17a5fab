"""Prepared environments on a root filesystem ``base`` (an OCI image layout, a directory, a
tarball): the base unpacked once per digest, a writable copy of it per build, and the sandbox's
view of the result.

Layout under the environment cache::

    bases/<digest>/rootfs   the base, unpacked once (``environments.bases.unpack``, whiteouts
                            honoured), owned by the uid that runs the sandboxes; never written again
    bases/<digest>.lock     taken (``flock``) while it is unpacked: one unpack per machine
    <key>/root/             the build's copy of it, after the setup: the sandbox's system
    <key>/tree/             the working directory: the image's own content there, the row's files,
                            what the setup wrote there (the lower of every lease's overlay)

A build copies the unpacked base (``cp -a --reflink=auto``: a clone where the file system can,
never hard links, which an in-place write of the setup would carry back into the base), moves the
image's working directory out into ``tree`` and runs the setup with the copy as its root, writable
everywhere (``pip install`` into ``/usr/local`` works). A sandbox made from it
(``SandboxSpec(image="rootfs:<cache>/<key>/root")``) binds every top-level entry of the copy
read-only in place of the host's ``/usr``, ``/bin``, ``/lib*`` and ``/etc``; its scratch places,
``/proc``, ``/dev``, ``/run`` and the synthetic ``/etc/passwd``, ``group`` and ``hosts`` are the
sandbox's own, as on the host. Its supervisor, the fork server and the judges run on the image's
``python3`` (3.8 or newer, first on ``IMAGE_PATH``), so a program's ``python3`` is the image's
with what the setup installed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import stat
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path

from trl_sandbox.environments import bases
from trl_sandbox.sandbox import ConfigError

PREFIX = "rootfs:"
ROOT = "root"
# A program's PATH in an image (Docker's default): the interpreter is looked up along it too.
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Top-level entries of an image that a sandbox replaces with its own.
OWN = ("proc", "dev", "sys", "tmp", "run", ".trl-sandbox")
# Files the sandbox binds its synthetic versions over: they must exist in the image's /etc.
SYNTHETIC = ("passwd", "group", "hosts")
_KEY = re.compile(r"[0-9a-f]{64}")


def is_image(image: str | None) -> bool:
    return bool(image) and str(image).startswith(PREFIX)


def system_args(root: str, covered: Iterable[str]) -> list[str]:
    """bwrap arguments that show ``root``'s top-level entries read-only, but for the sandbox's
    own places (``OWN`` and the top directories of ``covered``)."""
    skip = set(OWN) | {p.strip("/").split("/")[0] for p in covered}
    args: list[str] = []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.name in skip:
            continue
        inside = "/" + entry.name
        if entry.is_symlink():
            args += ["--symlink", os.readlink(entry.path), inside]
        elif entry.is_dir(follow_symlinks=False) or entry.is_file(follow_symlinks=False):
            args += ["--ro-bind", entry.path, inside]
    return args


def find_python(root: Path) -> str | None:
    """The image's ``python3``: the first on ``IMAGE_PATH`` (as a shell in it would find it)."""
    for directory in IMAGE_PATH.split(":"):
        path = f"{directory}/python3"
        if os.path.lexists(str(root) + path):
            return path
    return None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def unpacked(cache_root: Path, base: bases.Base, owner: int | None) -> Path:
    """``base`` unpacked under the cache, once per digest and machine (threads and processes wait
    on the digest's file lock; ``unpack`` renames a complete tree into place)."""
    name = base.digest.replace(":", "-")
    directory = cache_root / "bases"
    directory.mkdir(mode=0o755, exist_ok=True)
    target = directory / name / "rootfs"
    if target.is_dir():
        return target
    with _locked(directory / f"{name}.lock"):
        if not target.is_dir():
            (directory / name).mkdir(mode=0o755, exist_ok=True)
            bases.unpack(base, target, uid=owner)
            os.chmod(target, 0o755)
    return target


def _chown(path: str, owner: int | None, dir_fd: int | None = None) -> None:
    if owner is not None and os.geteuid() == 0:
        os.chown(path, owner, owner, dir_fd=dir_fd, follow_symlinks=False)


def _open_dir(name: str, dir_fd: int | None, what: str) -> int:
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:  # a link (ELOOP) or a file (ENOTDIR) where a directory must be
        raise ConfigError(f"{what}: {name!r} is not a directory of the image ({exc.strerror})") from exc


def write_files(tree: Path, files: Iterable[tuple[str, str]], owner: int | None) -> None:
    """Write an environment's ``files`` into ``tree`` without following any link the image has
    there (we may be root: a link must never carry a write out of the tree). A file replaces
    what the image had at its path."""
    top = _open_dir(str(tree), None, "environment.files")
    try:
        for rel, text in files:
            *parents, name = rel.split("/")
            fd = os.dup(top)
            try:
                for part in parents:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=fd)
                        _chown(part, owner, fd)
                    inner = _open_dir(part, fd, f"environment.files[{rel!r}]")
                    os.close(fd)
                    fd = inner
                try:
                    os.unlink(name, dir_fd=fd)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    raise ConfigError(f"environment.files[{rel!r}]: the image has a directory there") from exc
                out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                              dir_fd=fd)
                try:
                    os.write(out, text.encode("utf-8"))
                    if owner is not None and os.geteuid() == 0:
                        os.fchown(out, owner, owner)
                finally:
                    os.close(out)
            finally:
                os.close(fd)
    finally:
        os.close(top)


def stage(rootfs: Path, staging: Path, workdir: str, owner: int | None) -> Path:
    """Copy the unpacked base to ``staging/root``, move its working directory out to
    ``staging/tree`` (an empty mount point stays) and give ``/etc`` the files the sandbox binds
    over. Returns the copy."""
    root = staging / ROOT
    done = subprocess.run(["cp", "-a", "--reflink=auto", "--", str(rootfs), str(root)],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"copying the base {rootfs} for a build failed: {done.stderr.strip()[-2000:]}")
    top = _open_dir(str(root), None, "environment.base")
    try:
        name = workdir.strip("/")
        st = _lstat(name, top)
        tree = staging / "tree"
        if st is not None and stat.S_ISDIR(st.st_mode):
            os.rmdir(tree)  # the empty one the cache made: the image's working directory takes its place
            os.rename(root / name, tree)
        elif st is not None:
            os.unlink(name, dir_fd=top)
        os.mkdir(name, 0o755, dir_fd=top)
        _chown(name, owner, top)
        st = _lstat("etc", top)
        if st is None:
            os.mkdir("etc", 0o755, dir_fd=top)
            _chown("etc", owner, top)
        etc = _open_dir("etc", top, "environment.base /etc")
        try:
            for file in SYNTHETIC:
                st = _lstat(file, etc)
                if st is not None and stat.S_ISLNK(st.st_mode):  # may point anywhere: a file of our own
                    os.unlink(file, dir_fd=etc)
                    st = None
                if st is None:
                    os.close(os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=etc))
                    _chown(file, owner, etc)
        finally:
            os.close(etc)
    finally:
        os.close(top)
    return root


def _lstat(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def sandbox_root(cache_root: Path, image: str) -> tuple[str, str]:
    """``rootfs:PATH`` as (the root to bind, its interpreter). Only a prepared environment's root
    in this provider's cache qualifies: never an arbitrary host directory."""
    path = Path(os.path.realpath(image[len(PREFIX):]))
    cache = Path(os.path.realpath(cache_root))
    key = path.parent.name
    if path.name != ROOT or path.parent.parent != cache or not _KEY.fullmatch(key) or not path.is_dir():
        raise ConfigError(f"SandboxSpec.image={image!r}: a local sandbox's root filesystem must be a prepared "
                          f"environment's root in the provider's environment cache ({cache}/<key>/root); "
                          "give the row an environment with that base instead")
    try:
        python = json.loads((path.parent / "meta.json").read_text())["python"]
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"SandboxSpec.image={image!r}: the prepared environment's metadata names no "
                          "interpreter; prepare it again") from exc
    return str(path), python

"""An environment's ``base``: the root filesystem its setup starts from, resolved and unpacked.

``resolve`` turns the row's ``base`` string into a ``Base`` whose ``digest`` is what the content
key hashes (``EnvironmentSpec.key``): rows whose bases have the same digest share a build, and a
changed base is a new build. ``unpack`` materialises the root filesystem in a fresh directory,
which the local provider then uses as the read-only lower layer of its per-lease overlays.

The forms a ``base`` takes:

* ``host`` (default): the sandbox as it is today; nothing to unpack, digest ``"host"``.
* ``oci:PATH[:TAG]``: an OCI image layout (``skopeo copy docker://IMAGE oci:PATH:TAG`` makes one,
  offline tests make one with ``umoci`` or by hand); digest = the image manifest's digest, which
  covers every layer's digest. Unpacked here in Python (see ``layers``): no daemon, no umoci needed.
* a directory holding a root filesystem; digest = a SHA-256 over a walk of the tree (relative
  path, type, mode, size, mtime_ns, link target of every entry). The walk stats and never reads
  file contents, so resolving a multi-GB tree costs milliseconds; the price is that an edit
  which keeps a file's size and restores its mtime (``touch -r``) goes unnoticed. Anything a
  normal edit, ``cp`` or ``git checkout`` does changes an mtime, hence the key.
* a tarball (``.tar``, ``.tar.gz``/``.tgz``, also bz2/xz, zstd with ``zstandard``); digest = the
  SHA-256 of the file (remembered per path, size and mtime, so rows sharing it hash it once).
  Unpacked with the same checks as an image layer, but read literally: a plain tarball is not a
  layer, so a ``.wh.`` name in it is a file like any other.

Every unpacked tree is owned by this process, or by ``uid`` when given and we are root (the
uid that will read it through the overlay: copy-up of a file owned by an unmapped uid fails with
EOVERFLOW), carries no set-user/group-id bits, and has no device nodes or FIFOs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tarfile
import threading
from dataclasses import dataclass
from pathlib import Path

from trl_sandbox.environments import layers, oci
from trl_sandbox.sandbox import ConfigError

KINDS = ("host", "rootfs", "tarball", "oci")
_HINT = ("give 'host', a directory holding a root filesystem, a .tar/.tar.gz of one, or an OCI image layout "
         "as 'oci:PATH[:TAG]'")
_tarball_digests: dict[tuple[str, int, int, int], str] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class Base:
    """A resolved base. ``location`` is absolute ("" for host); ``tag`` only for OCI layouts."""

    kind: str
    location: str
    tag: str
    digest: str


HOST = Base("host", "", "", "host")


def resolve(base: str) -> Base:
    """The row's ``base`` string, checked and digested; ConfigError saying what to write if not
    usable (so a bad base fails when the trainer is built, not in the middle of a step). A
    relative path is taken from the current directory; ``~`` is expanded."""
    if not isinstance(base, str) or not base.strip() or "\0" in base:
        raise ConfigError(f"environment.base {base!r} is not usable; {_HINT}")
    base = base.strip()
    if base == "host":
        return HOST
    if base.startswith("oci:"):
        raw, tag = oci.split_ref(base[4:])
        if not raw:
            raise ConfigError(f"environment.base {base!r} names no layout; write oci:PATH[:TAG]")
        layout = Path(os.path.abspath(os.path.expanduser(raw)))
        return Base("oci", str(layout), tag, oci.resolve_manifest(layout, tag))
    path = Path(os.path.abspath(os.path.expanduser(base)))
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ConfigError(f"environment.base {base!r}: {path} does not exist; {_HINT}") from None
    except OSError as exc:
        raise ConfigError(f"environment.base {base!r}: {path} cannot be read ({exc.strerror})") from exc
    if stat.S_ISDIR(st.st_mode):
        if (path / "index.json").is_file() and (path / "oci-layout").is_file():
            raise ConfigError(f"environment.base {base!r} is an OCI image layout; write 'oci:{base}' to unpack "
                              "its image (a directory is otherwise copied as the root filesystem itself)")
        return Base("rootfs", str(path), "", tree_digest(path))
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"environment.base {base!r}: {path} is neither a directory nor a file; {_HINT}")
    compression = layers.sniff_compression(path)
    if compression == "zstd" and not layers.have_zstd():
        raise ConfigError(f"environment.base {base!r} is zstd-compressed; pip install zstandard, or give a "
                          ".tar or .tar.gz")
    if compression == "" and not tarfile.is_tarfile(path):
        raise ConfigError(f"environment.base {base!r}: {path} is not a tar archive; {_HINT}")
    return Base("tarball", str(path), "", file_digest(path))


def file_digest(path: Path) -> str:
    """``sha256:`` of a file's bytes, remembered per (path, size, mtime, inode)."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns, st.st_ino)
    with _lock:
        known = _tarball_digests.get(key)
    if known:
        return known
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
    digest = "sha256:" + sha.hexdigest()
    with _lock:
        _tarball_digests[key] = digest
    return digest


def tree_digest(root: Path) -> str:
    """``tree-sha256:`` over a walk of ``root`` without reading contents (see the module doc).

    One record per entry, in name order, depth first: relative path, type letter, permission
    bits, size (regular files), mtime_ns and link target, each field NUL-terminated (a name
    cannot hold a NUL, so records cannot be confused). The root's own name does not count: the
    same tree in another place has the same digest.
    """
    sha = hashlib.sha256()

    def entry(path: bytes, rel: bytes, st: os.stat_result) -> None:
        mode = st.st_mode
        kind = ("d" if stat.S_ISDIR(mode) else "f" if stat.S_ISREG(mode) else "l" if stat.S_ISLNK(mode)
                else "c" if stat.S_ISCHR(mode) else "b" if stat.S_ISBLK(mode) else "p" if stat.S_ISFIFO(mode)
                else "s")
        target = os.readlink(path) if kind == "l" else b""
        size = st.st_size if kind == "f" else 0
        for field in (rel, kind.encode(), b"%o" % stat.S_IMODE(mode), b"%d" % size, b"%d" % st.st_mtime_ns, target):
            sha.update(field + b"\0")

    def walk(path: bytes, rel: bytes) -> None:
        try:
            names = sorted(os.listdir(path))
        except OSError as exc:
            raise ConfigError(f"environment.base {root}: {os.fsdecode(path)} cannot be listed ({exc.strerror}); "
                              "the base must be readable by this process") from exc
        for name in names:
            child, child_rel = os.path.join(path, name), (rel + b"/" + name if rel else name)
            try:
                st = os.lstat(child)
            except OSError as exc:
                raise ConfigError(f"environment.base {root}: {os.fsdecode(child)} changed while it was hashed "
                                  f"({exc.strerror}); a base must not change while it is in use") from exc
            entry(child, child_rel, st)
            if stat.S_ISDIR(st.st_mode):
                walk(child, child_rel)

    top = os.fsencode(root)
    entry(top, b".", os.lstat(top))
    walk(top, b"")
    return "tree-sha256:" + sha.hexdigest()


def unpack(base: Base, dest: Path, *, uid: int | None = None) -> None:
    """Materialises ``base``'s root filesystem as the new directory ``dest``.

    Built in a temporary sibling and renamed into place, so ``dest`` exists only complete (a
    crash leaves a ``.NAME.partial-*`` sibling for the cache to sweep, never a half tree under
    the key's name). ``dest`` must not exist (FileExistsError): the caller keys and locks.
    The source is checked against ``base.digest`` on the way, so a base that changed since it was
    resolved raises ConfigError instead of building under a stale key.
    """
    if base.kind == "host":
        raise ConfigError("environment.base 'host' has no root filesystem to unpack: the sandbox uses the host's")
    if base.kind not in KINDS:
        raise ConfigError(f"unknown base kind {base.kind!r}; expected one of {', '.join(KINDS)}")
    dest = Path(dest)
    if os.path.lexists(dest):
        raise FileExistsError(f"{dest} exists already; unpack makes a new directory")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.partial-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        if base.kind == "rootfs":
            _copy_tree(base, tmp, uid)
        else:
            os.mkdir(tmp, 0o700)
            writer = layers.LayerWriter(tmp, uid)
            if base.kind == "tarball":
                writer.apply(Path(base.location), layers.sniff_compression(Path(base.location)), base.digest,
                             whiteouts=False, what=f"environment.base {base.location}")
            else:
                layout = Path(base.location)
                for index, (path, digest, compression, size) in enumerate(oci.layer_blobs(layout, base.digest)):
                    writer.apply(path, compression, digest, size, what=f"OCI layout {layout} layer {index} ({digest})")
            writer.finish()
        os.rename(tmp, dest)
    except BaseException:
        remove_tree(tmp)
        raise


def _copy_tree(base: Base, tmp: Path, uid: int | None) -> None:
    """A directory base: ``cp -a`` semantic (links kept as links, modes and times kept), minus
    special files and set-id bits, owned as the module doc says."""
    source = Path(base.location)

    def copy_file(src: str, dst: str) -> None:
        if stat.S_ISREG(os.lstat(src).st_mode):  # FIFOs and devices are skipped (a FIFO would block)
            shutil.copy2(src, dst, follow_symlinks=False)

    try:
        shutil.copytree(source, tmp, symlinks=True, copy_function=copy_file)
    except shutil.Error as exc:
        raise ConfigError(f"environment.base {source}: copying it failed for {len(exc.args[0])} entries, e.g. "
                          f"{exc.args[0][0]}; the base must be readable by this process") from exc
    chown = uid if uid is not None and os.geteuid() == 0 else None
    for path, dirs, files in os.walk(tmp):
        for name in (*dirs, *files):
            _sanitize(os.path.join(path, name), chown)
    _sanitize(str(tmp), chown)
    if tree_digest(source) != base.digest:
        raise ConfigError(f"environment.base {source} changed since it was resolved (or while it was copied); "
                          "resolve it again so that its key matches what is built")


def _sanitize(path: str, chown: int | None) -> None:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        if chown is not None:
            os.lchown(path, chown, chown)
        return
    if chown is not None:
        os.lchown(path, chown, chown)
    if st.st_mode & (stat.S_ISUID | stat.S_ISGID):
        os.chmod(path, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))


def remove_tree(path: Path) -> None:
    """Removes a tree this module made, whatever modes the image gave its directories (a rootless
    process cannot empty a directory of mode 0555 or list one of mode 0000 until it opens it up)."""
    if not os.path.lexists(path):
        return
    try:
        shutil.rmtree(path)
        return
    except OSError:
        pass

    def open_up(p: str) -> None:
        st = os.lstat(p)
        if stat.S_ISDIR(st.st_mode):
            os.chmod(p, stat.S_IMODE(st.st_mode) | stat.S_IRWXU)
            for name in os.listdir(p):
                open_up(os.path.join(p, name))

    open_up(str(path))
    shutil.rmtree(path)

"""Applying tar layers to a directory, safely: an OCI image's layers in order, or one rootfs tarball.

The result is what an overlay stack of the layers looks like merged: a later entry replaces an
earlier one (a file over a directory, a directory over a link), ``.wh.NAME`` deletes NAME from
the layers below, ``.wh..wh..opq`` empties its directory of what the layers below put there.

Nothing in an archive can write outside the root. Every parent directory is opened one
component at a time with ``O_NOFOLLOW`` relative to the previous one, so a symbolic link that
an earlier member planted (``etc -> /etc``, ``x -> ../..``) stops the unpack instead of carrying
a later member through it; ``..`` components are refused and leading ``/`` dropped (kept inside,
as GNU tar does); a member that exists is unlinked before it is written, never opened. Links are
kept as links: they only mean something inside the sandbox, whose root this tree becomes.
Python's ``tarfile`` only parses the stream here; its extraction (and ``data_filter``, absent
before 3.10.12/3.11.4) is not used, so every supported Python behaves the same.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import os
import shutil
import stat
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from trl_sandbox.sandbox import ConfigError

_DROP_BITS = stat.S_ISUID | stat.S_ISGID  # a rootfs is never a way to get a set-id program
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


def _broken_archive() -> tuple[type[BaseException], ...]:
    """The errors a damaged archive raises while it is read (not those of our own writes)."""
    errors: tuple[type[BaseException], ...] = (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile)
    try:
        import zstandard
    except ImportError:
        return errors
    return (*errors, zstandard.ZstdError)


def have_zstd() -> bool:
    try:
        import zstandard  # noqa: F401
    except ImportError:
        return False
    return True


class _Hashing:
    """A read-only stream that hashes what passes through (a layer is checked while it is read)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw, self.sha, self.size = raw, hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.sha.update(data)
        self.size += len(data)
        return data

    def drain(self) -> str:
        while self.read(1 << 20):
            pass
        return "sha256:" + self.sha.hexdigest()


def _members(stream: Any, compression: str) -> Iterator[tuple[tarfile.TarFile, tarfile.TarInfo]]:
    """The members of a (compressed) tar stream, read once, front to back."""
    if compression == "zstd":
        import zstandard

        stream = zstandard.ZstdDecompressor().stream_reader(stream)
        mode = "r|"
    else:
        mode = {"": "r|", "gzip": "r|gz"}.get(compression, "r|*")
    with tarfile.open(fileobj=stream, mode=mode) as archive:  # type: ignore[call-overload]
        for member in archive:
            yield archive, member


def sniff_compression(path: Path) -> str:
    """A tarball's compression from its first bytes: "", "gzip", "zstd" or "auto" (bz2/xz)."""
    with open(path, "rb") as f:
        head = f.read(6)
    if head.startswith(b"\x1f\x8b"):
        return "gzip"
    if head.startswith(b"\x28\xb5\x2f\xfd"):
        return "zstd"
    if head.startswith(b"BZh") or head.startswith(b"\xfd7zXZ\x00"):
        return "auto"
    return ""


class LayerWriter:
    """Applies tar layers, in order, to a fresh directory ``root``.

    Files are written owned by this process, or by ``uid`` (and group ``uid``, as the local
    sandbox maps them) when given and running as root: a prepared tree read through an overlay
    by an unmapped uid fails at copy-up (EOVERFLOW). Directories stay writable to us until
    ``finish``, which gives them their recorded modes and times deepest first: a read-only
    directory of the image must still take the files of a later layer.
    """

    def __init__(self, root: Path, uid: int | None = None) -> None:
        self.root = root
        self.chown = uid if uid is not None and os.geteuid() == 0 else None
        self.dirs: dict[str, tuple[int, int]] = {"": (0o755, 0)}  # rel path -> (mode, mtime_ns)
        self.fresh: set[str] = set()  # paths the current layer made (whiteouts spare them)

    def apply(self, path: Path, compression: str, digest: str = "", size: int = -1, *, whiteouts: bool = True,
              what: str = "") -> None:
        """One layer (or a plain rootfs tarball with ``whiteouts=False``). With ``digest`` the bytes
        read must hash to it, else ConfigError: a corrupt or changed blob never becomes a base."""
        what = what or str(path)
        self.fresh = set()
        with open(path, "rb") as raw:
            stream = _Hashing(raw)
            try:
                for archive, member in _members(stream, compression):
                    self._member(archive, member, whiteouts, what)
            except _broken_archive() as exc:
                raise ConfigError(f"{what}: not a readable tar archive ({type(exc).__name__}: {exc})") from exc
            got = stream.drain()
        if digest and (got != digest or (size >= 0 and stream.size != size)):
            raise ConfigError(f"{what}: its bytes hash to {got}, not {digest}: the file is corrupt or changed "
                              "since it was resolved; copy it again")

    # -- one member -------------------------------------------------------------------------

    def _member(self, archive: tarfile.TarFile, m: tarfile.TarInfo, whiteouts: bool, what: str) -> None:
        rel = _clean(m.name, what)
        if not rel:  # the root itself: only its metadata
            if m.isdir():
                self.dirs[""] = (stat.S_IMODE(m.mode) & ~_DROP_BITS, int(m.mtime * 1e9))
            return
        parent, _, name = rel.rpartition("/")
        if whiteouts and name.startswith(WHITEOUT):
            hidden = name[len(WHITEOUT):]
            if name != OPAQUE and hidden in ("", ".", ".."):
                raise ConfigError(f"{what}: whiteout {m.name!r} names no entry; refusing the image")
            fd = self._open_dir(parent, what, rel)
            try:
                if name == OPAQUE:
                    for entry in os.listdir(fd):
                        if _join(parent, entry) not in self.fresh:
                            self._remove(fd, entry, _join(parent, entry))
                elif _join(parent, hidden) not in self.fresh:
                    self._remove(fd, hidden, _join(parent, hidden))
            finally:
                os.close(fd)
            return
        if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
            return  # device nodes, FIFOs: a sandbox gets its own /dev
        fd = self._open_dir(parent, what, rel)
        try:
            existing = _lstat(fd, name)
            if existing is not None and not (m.isdir() and stat.S_ISDIR(existing.st_mode)):
                self._remove(fd, name, rel)  # a later layer's entry replaces, never writes through
            if m.isdir():
                if existing is None or not stat.S_ISDIR(existing.st_mode):
                    os.mkdir(name, 0o700, dir_fd=fd)
                self.dirs[rel] = (stat.S_IMODE(m.mode) & ~_DROP_BITS, int(m.mtime * 1e9))
            elif m.issym():
                os.symlink(m.linkname, name, dir_fd=fd)
                os.utime(name, ns=(int(m.mtime * 1e9),) * 2, dir_fd=fd, follow_symlinks=False)
            elif m.islnk():
                target = _clean(m.linkname, what)
                tparent, _, tname = target.rpartition("/")
                tfd = self._open_dir(tparent, what, rel, create=False)
                try:
                    os.link(tname, name, src_dir_fd=tfd, dst_dir_fd=fd, follow_symlinks=False)
                except (FileNotFoundError, PermissionError, IsADirectoryError) as exc:
                    raise ConfigError(f"{what}: hard link {m.name!r} -> {m.linkname!r}: no such file in the "
                                      f"image ({exc.strerror})") from exc
                finally:
                    os.close(tfd)
            else:
                self._write(archive, m, fd, name)
            if self.chown is not None:
                os.chown(name, self.chown, self.chown, dir_fd=fd, follow_symlinks=False)
            self.fresh.add(rel)
        finally:
            os.close(fd)

    def _write(self, archive: tarfile.TarFile, m: tarfile.TarInfo, dir_fd: int, name: str) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        out = os.open(name, flags, 0o600, dir_fd=dir_fd)
        try:
            source = archive.extractfile(m)
            if source is not None:
                with open(out, "wb", closefd=False) as sink:
                    shutil.copyfileobj(source, sink, 1 << 20)
            os.fchmod(out, stat.S_IMODE(m.mode) & ~_DROP_BITS)
            os.utime(out, ns=(int(m.mtime * 1e9),) * 2)
        finally:
            os.close(out)

    # -- paths ------------------------------------------------------------------------------

    def _open_dir(self, rel: str, what: str, member: str, create: bool = True) -> int:
        """A descriptor of directory ``rel`` under the root, opened component by component without
        following links; missing directories are made (mode 0755, as Docker does)."""
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(self.root, flags)
        done = ""
        for part in rel.split("/") if rel else ():
            done = _join(done, part)
            try:
                try:
                    nxt = os.open(part, flags, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise ConfigError(f"{what}: {member!r} refers to {done!r}, which the image does not "
                                          "have") from None
                    os.mkdir(part, 0o700, dir_fd=fd)
                    self.dirs.setdefault(done, (0o755, 0))
                    if self.chown is not None:
                        os.chown(part, self.chown, self.chown, dir_fd=fd, follow_symlinks=False)
                    nxt = os.open(part, flags, dir_fd=fd)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise ConfigError(f"{what}: member {member!r} goes through {done!r}, which is not a "
                                      "directory (a symbolic link is never followed while unpacking); refusing "
                                      "the image") from exc
                raise
            except ConfigError:
                os.close(fd)
                raise
            os.close(fd)
            fd = nxt
        return fd

    def _remove(self, dir_fd: int, name: str, rel: str) -> None:
        st = _lstat(dir_fd, name)
        if st is None:
            return
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(os.path.join(self.root, rel))  # its parents were just opened without links
            gone = rel + "/"
            for key in [k for k in self.dirs if k == rel or k.startswith(gone)]:
                del self.dirs[key]
        else:
            os.unlink(name, dir_fd=dir_fd)

    def finish(self) -> None:
        """Gives directories their modes and times, deepest first (a mode takes write away)."""
        for rel in sorted(self.dirs, key=lambda r: (-r.count("/") - bool(r), r)):
            mode, mtime_ns = self.dirs[rel]
            fd = self._open_dir(rel, str(self.root), rel, create=False)
            try:
                os.fchmod(fd, mode)
                if self.chown is not None:
                    os.fchown(fd, self.chown, self.chown)
                if mtime_ns:
                    os.utime(fd, ns=(mtime_ns, mtime_ns))
            finally:
                os.close(fd)


def _clean(name: str, what: str) -> str:
    """A member name relative to the root: leading ``/`` and ``./`` dropped (contained, as GNU tar
    does); any ``..`` component refused."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ConfigError(f"{what}: member {name!r} has a '..' component (it would land outside the root); "
                          "refusing the image")
    return "/".join(parts)


def _join(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None

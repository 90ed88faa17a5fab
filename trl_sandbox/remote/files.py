"""File operations on a remote sandbox (the agent's ``write_file``/``read_file``, ``SandboxPool.run(
files=...)``) that a program cannot redirect.

A vendor's daemon writes and reads files as itself (root on the services' default images) with
absolute paths, and follows every symbolic link on the way: a program that left ``work/x ->
/dev/shm/.trl-sandbox-lease`` would have the next ``write_file("x/pid", ...)`` land in the resident
launcher's directory, or a read return ``$HOME``'s files. So, as the local provider does:

* ``confine(work, path)``: a path must stay inside the work directory once normalised
  (``ValueError`` otherwise), before anything is sent;
* the operation itself runs in the sandbox as ``FILE_OP`` (standard library only), which walks
  the path from ``/`` one component at a time without following any link (``O_NOFOLLOW`` on every
  ``openat``) and opens the last one the same way, as a regular file only (a FIFO a program put
  there cannot block it). A link anywhere on the way is ``PermissionError``, a missing file
  ``FileNotFoundError``. A write's data is uploaded first to a fresh name the program cannot guess
  (``staging_path``) and copied from there.
"""

from __future__ import annotations

import base64
import errno
import posixpath
import uuid

from trl_sandbox.sandbox import sandbox_path

FILE_OP = r"""
import base64, os, stat, sys
op, work, rel = sys.argv[1], sys.argv[2], sys.argv[3]
FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC


def walk(fd, parts):
    for name in parts:
        try:
            step = os.open(name, os.O_RDONLY | os.O_DIRECTORY | FLAGS, dir_fd=fd)
        except FileNotFoundError:
            if op != 'write':
                raise
            os.mkdir(name, 0o755, dir_fd=fd)
            step = os.open(name, os.O_RDONLY | os.O_DIRECTORY | FLAGS, dir_fd=fd)
        os.close(fd)
        fd = step
    return fd


def regular(fd):
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise OSError(21 if stat.S_ISDIR(info.st_mode) else 22, 'not a regular file')
    if info.st_nlink > 1:  # a hard link a program made to a file elsewhere (where the image allows it)
        raise OSError(31, 'a file with other links')
    os.set_blocking(fd, True)
    return fd


try:
    parts = [p for p in rel.split('/') if p]
    where = walk(os.open('/', os.O_RDONLY | os.O_DIRECTORY | FLAGS), [p for p in work.split('/') if p] + parts[:-1])
    if op == 'write':
        src = os.open(sys.argv[4], os.O_RDONLY | FLAGS)
        try:
            out = regular(os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | FLAGS, 0o644, dir_fd=where))
            os.ftruncate(out, 0)
            while True:
                chunk = os.read(src, 1 << 20)
                if not chunk:
                    break
                while chunk:
                    chunk = chunk[os.write(out, chunk):]
        finally:
            os.unlink(sys.argv[4])
        print('OK')
    else:
        fd = regular(os.open(parts[-1], os.O_RDONLY | os.O_NONBLOCK | FLAGS, dir_fd=where))
        chunks = []
        while True:
            chunks.append(os.read(fd, 1 << 20))
            if not chunks[-1]:
                break
        print('OK', base64.b64encode(b''.join(chunks)).decode())
except OSError as exc:
    print('ERR', exc.errno, exc.strerror)
"""


def confine(work: str, path: str) -> tuple[str, str]:
    """``(full, relative)``: ``path`` (relative to ``work``, or absolute inside it) normalised;
    ``ValueError`` when it leaves ``work`` or cannot be a path (``sandbox.sandbox_path``)."""
    full = sandbox_path(work, path, root_ok=False)
    return full, full[len(posixpath.normpath(work)) + 1:]


def staging_path() -> str:
    """Where a write's data is uploaded first: a fresh name in /tmp (no lease can replace /tmp
    itself, and none can guess the name)."""
    return f"/tmp/.trl-sandbox-upload-{uuid.uuid4().hex}"


def argv(op: str, work: str, relative: str, staged: str | None = None) -> list[str]:
    """The command that performs ``op`` (``write``/``read``) in the sandbox, outside every lease."""
    return ["python3", "-I", "-S", "-c", FILE_OP, op, posixpath.normpath(work), relative,
            *([staged] if staged else [])]


def answer(output: str, path: str) -> bytes:
    """The data read (or ``b""`` for a write) from ``FILE_OP``'s output; its failure as the
    ``OSError`` it was (a link on the way: ``PermissionError``)."""
    lines = [line for line in output.splitlines() if line.startswith(("OK", "ERR "))]
    if not lines:
        raise OSError(errno.EIO, f"file operation failed: {output[-300:]!r}", path)
    words = lines[-1].split(" ", 2)
    if words[0] == "OK":
        return base64.b64decode(words[1]) if len(words) > 1 else b""
    code = int(words[1]) if words[1].isdigit() else errno.EIO
    if code in (errno.ELOOP, errno.ENOTDIR):
        raise PermissionError(errno.EACCES, "a symbolic link (or a file) on the way: refused", path)
    raise OSError(code, words[2] if len(words) > 2 else "", path)

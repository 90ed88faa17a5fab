"""An agent's changes to its copy of a prepared environment, and carrying them into a fresh copy.

Agent tasks are graded out of the agent's reach: when its episode ends, ``do_changes`` kills
every process of the sandbox and reads what the episode changed from the overlay's writable
layer (``layers.UPPER``, opened before the layer was covered): files with their contents and
modes, directories (opaque ones replace what the prepared tree had there), symlinks as links,
deletions (overlayfs whiteouts). Nothing is followed and nothing of the agent runs while it is
read. The host filters the list (protected paths, links that leave the tree, files the rules
refuse) and sends it to a fresh lease of the same environment, where ``do_apply`` writes it into
the new copy; ``do_tests`` brings the hidden tests in read-only at ``/tests`` with an empty
``/logs/verifier``; ``do_verdict`` reads the verifier's own reports once it has run.
"""

import errno
import marshal
import os
import stat

from . import kernel, layers, resident
from . import state as S
from .protocol import K_DATA, K_OK, reply

TESTS = "/tests"
LOGS = "/logs"
VERIFIER = "/logs/verifier"
REPORTS = ("reward.txt", "reward.json", "junit.xml")
REPORT_CAP = 4 << 20
MS_REMOUNT = 32
O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class TooLarge(Exception):
    pass


MAX_DEPTH = 256  # deeper trees of changes are the agent's doing: a verdict, never the grader's failure


def _entry(dir_fd, entry, path, out, budget):
    """Append (path, kind, mode, payload) for one entry of the layer; an fd if it is a directory."""
    st = entry.stat(follow_symlinks=False)
    mode = stat.S_IMODE(st.st_mode)
    budget[1] -= 1
    if budget[1] < 0:
        raise TooLarge(f"the episode changed more than {budget[2]} entries")
    if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
        out.append((path, "w", 0, b""))
    elif stat.S_ISDIR(st.st_mode):
        fd = os.open(entry.name, O_DIR, dir_fd=dir_fd)
        try:
            opaque = os.getxattr(fd, "user.overlay.opaque") == b"y"
        except OSError:
            opaque = False
        out.append((path, "o" if opaque else "d", mode, b""))
        return fd
    elif stat.S_ISLNK(st.st_mode):
        out.append((path, "l", 0, os.readlink(entry.name, dir_fd=dir_fd).encode("utf-8", "surrogateescape")))
    elif stat.S_ISREG(st.st_mode):
        budget[0] -= st.st_size
        if budget[0] < 0:
            raise TooLarge(f"the episode's changed files hold more than {budget[3]} bytes")
        fd = os.open(entry.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
        with open(fd, "rb") as f:
            out.append((path, "f", mode, f.read(st.st_size + 1)[: st.st_size]))
    # FIFOs, sockets and devices are not carried
    return None


def _walk(top_fd, out, budget):
    """Every entry of the layer below ``top_fd``, parents before children, without recursion (an
    episode may nest directories thousands deep)."""
    stack = [(top_fd, "", iter(sorted(os.scandir(top_fd), key=lambda e: e.name)), False)]
    try:
        while stack:
            dir_fd, prefix, entries, owned = stack[-1]
            entry = next(entries, None)
            if entry is None:
                stack.pop()
                if owned:
                    os.close(dir_fd)
                continue
            fd = _entry(dir_fd, entry, prefix + entry.name, out, budget)
            if fd is not None:
                if len(stack) > MAX_DEPTH:
                    os.close(fd)
                    raise TooLarge(f"the episode's directories nest deeper than {MAX_DEPTH}")
                stack.append((fd, prefix + entry.name + "/", iter(sorted(os.scandir(fd), key=lambda e: e.name)), True))
    finally:
        for dir_fd, _, _, owned in stack:
            if owned:
                os.close(dir_fd)


def do_changes(request):
    """``(CHANGES, max_bytes, max_entries)``: the episode's changes, marshalled; every process of
    the sandbox is ended first. Past the bounds: an error starting ``too large:``."""
    _, max_bytes, max_entries = request
    resident.sweep()
    if layers.UPPER[0] is None:
        raise OSError(errno.ENOTSUP, "this lease has no overlay of a prepared environment to read changes from")
    out = []
    try:
        _walk(layers.UPPER[0], out, [int(max_bytes), int(max_entries), int(max_entries), int(max_bytes)])
    except TooLarge as exc:
        raise OSError(errno.EFBIG, f"too large: {exc}") from None
    reply(K_DATA, part1=marshal.dumps(out, 4))


def _clear(path):
    """Remove ``path`` and everything below it, without recursion and without following links."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    pending, empty = [path], []
    while pending:
        here = pending.pop()
        empty.append(here)
        for entry in os.scandir(here):
            if entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)
            else:
                os.unlink(entry.path)
    for here in reversed(empty):
        os.rmdir(here)


def _inside(path):
    """``path`` (relative) under the work directory, with no symlink on the way (nothing of the
    agent runs here, and the host refused links that leave the tree; this is the second check)."""
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise PermissionError(errno.EACCES, "not a path inside the work directory", path)
    here = S.WORK
    for part in parts[:-1]:
        here = os.path.join(here, part)
        st = os.lstat(here)
        if not stat.S_ISDIR(st.st_mode):
            raise PermissionError(errno.EACCES, "a parent is not a directory", path)
    return os.path.join(S.WORK, path)


def do_apply(request):
    """``(APPLY, changes)`` in a fresh lease: write the (filtered) changes into its copy."""
    _, changes = request
    for path, kind, mode, payload in changes:
        full = _inside(path)
        if kind in ("w", "o", "f", "l") or (kind == "d" and not os.path.isdir(full)) or os.path.islink(full):
            _clear(full)
        if kind == "d" or kind == "o":
            if not os.path.isdir(full):
                os.mkdir(full, 0o700)
            os.chmod(full, mode)
        elif kind == "f":
            fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with open(fd, "wb") as f:
                f.write(payload)
            os.chmod(full, mode)
        elif kind == "l":
            os.symlink(payload.decode("utf-8", "surrogateescape"), full)
    reply(K_OK)


def _fresh(path, mode):
    layers._mount("tmpfs", path, "tmpfs", layers.MS_NOSUID | layers.MS_NODEV,
                  f"size=64m,nr_inodes=16384,mode={mode:o},uid={os.getuid()},gid={os.getgid()}")


def do_tests(request):
    """``(TESTS, {relative path: bytes})``: the hidden tests, read-only at /tests, and an empty
    /logs/verifier for the verifier's reports."""
    _, files = request
    _fresh(TESTS, 0o755)
    for path, data in files.items():
        full = os.path.normpath(os.path.join(TESTS, path))
        if not full.startswith(TESTS + "/"):
            raise PermissionError(errno.EACCES, "a test's path leaves /tests", path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(data)
        os.chmod(full, 0o755 if data.startswith(b"#!") or path.endswith(".sh") else 0o644)
    lib = kernel.libc()
    kernel.check(lib.mount(None, TESTS.encode(), None, MS_REMOUNT | layers.MS_RDONLY | layers.MS_NOSUID
                           | layers.MS_NODEV, None), "remount /tests read-only")
    _fresh(LOGS, 0o755)
    os.mkdir(VERIFIER, 0o755)
    reply(K_OK)


def do_verdict(request):
    """``(VERDICT,)``: the verifier's reports under /logs/verifier (regular files, bounded; ``None``
    for anything else of a report's name), read after every process of the sandbox has ended."""
    resident.sweep()
    found = {}
    for name in REPORTS:
        try:
            fd = os.open(os.path.join(VERIFIER, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        except OSError:  # a symlink of that name (ELOOP), or one we may not read: there, but no report
            found[name] = None
            continue
        try:  # a directory, FIFO or device of that name (the agent's code made it) is no report
            found[name] = os.read(fd, REPORT_CAP) if stat.S_ISREG(os.fstat(fd).st_mode) else None
        finally:
            os.close(fd)
    reply(K_DATA, part1=marshal.dumps(found, 4))

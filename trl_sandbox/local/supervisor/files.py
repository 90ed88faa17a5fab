"""The host's file operations (confined to the work directory) and ``reset()``.

A reset gives back the scratch places as new: instead of emptying them (which leaves their
metadata: a default ACL, xattrs, a mode a program set on the directory itself, the tmpfs's inode
counter), each one gets a fresh size-capped tmpfs on top, in the supervisor's own mount
namespace (``kernel``).
"""

import errno
import gc
import os
import stat

from . import kernel, layers, resident
from . import state as S
from .protocol import K_DATA, K_OK, receive_raw, reply, reply_files


def open_regular(path, flags, mode=0o644):
    """Open a regular file without blocking: a FIFO or device a program left must not hang us."""
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path):
    with open(open_regular(path, os.O_RDONLY), "rb") as f:
        return f.read()


def confined(path):
    """``path`` under the work directory, also once symlinks are resolved.

    Programs may leave symlinks in the work directory (to ``/proc/1/mem``, say); the host's
    file operations must not follow them out. No program runs while the host reads or writes
    files (leftovers are killed after every exec), so the check cannot be raced.
    """
    work = S.WORK
    full = os.path.normpath(os.path.join(work, path))
    for candidate in (full, os.path.realpath(full)):
        if "\0" in path or not (candidate == work or candidate.startswith(work + "/")):
            raise PermissionError(errno.EACCES, "path escapes the work directory", path)
    return full


def do_write(request):
    """The contents follow the request as a raw frame, moved into the file by the kernel: like an
    exec's stdin, they never sit in this process's memory, which every later program inherits."""
    _, path, size, mode = request
    try:
        full = confined(path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        fd = open_regular(full, os.O_WRONLY | os.O_CREAT, mode)
    except BaseException:
        receive_raw(size, S.DEVNULL)  # the channel must stay in step
        raise
    try:
        os.ftruncate(fd, 0)
        receive_raw(size, fd)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    reply(K_OK)


# The largest file the host reads in one call: a program may fill /work with one huge file.
READ_CAP = 64 << 20


def do_read(request):
    """The contents go from the file to the host by the kernel where it can (see ``do_write``); no
    program runs while the host reads, so the size does not change on the way."""
    fd = open_regular(confined(request[1]), os.O_RDONLY)
    with open(fd, "rb") as f:
        size = os.fstat(fd).st_size
        if size > READ_CAP:
            raise OSError(errno.EFBIG, f"file of {size} bytes is larger than the {READ_CAP} bytes a read returns")
        if S.SPLICE:
            reply_files(K_DATA, 0, 0, 0.0, (fd, size), (fd, 0))
            return
        data = f.read(READ_CAP + 1)
    if len(data) > READ_CAP:
        raise OSError(errno.EFBIG, f"file grew past the {READ_CAP} bytes a read returns")
    reply(K_DATA, part1=data)


# (path, size in MiB, mode) of every scratch place, from the configuration.
SCRATCH = []


def fresh_scratch():
    """A fresh tmpfs on every scratch place, then the work directory is our cwd again.

    Always, even where nothing seems to have happened: a program can leave traces that no check
    of the old mount sees cheaply (the tmpfs's inode counter moves with every unnamed O_TMPFILE
    file), and a new mount costs about a millisecond, mostly waiting, per reset.
    """
    for path, size_mb, mode in SCRATCH:
        kernel.fresh_tmpfs(path, size_mb, mode)
    os.chdir(S.WORK)


def do_reset(request):
    # Every exec ends with nothing of it left (a sweep, or the resident judge's check), so the
    # judge is all there can be; it holds nothing of the scratch places and stays.
    if resident.PID is None or resident.leftovers():
        resident.sweep()
    layers.drop()
    fresh_scratch()
    gc.collect()
    gc.freeze()
    reply(K_OK)

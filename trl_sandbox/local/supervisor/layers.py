"""A lease's private copy of a prepared environment: an overlay over the read-only prepared tree.

The host binds its cache of prepared trees read-only at ``ENV_ROOT``. ``do_environment`` mounts,
for one lease: a size-capped tmpfs at ``LAYER`` (the lease's writable layer: what the lease
writes is charged to the sandbox's memory like any tmpfs page, and bounded by the work
directory's size), then an overlay at the working directory whose lower is the prepared tree and
whose upper lives in that tmpfs. It then covers ``ENV_ROOT`` and ``LAYER`` with empty read-only
mounts: a program sees its own copy and nothing of other environments, nor its layer's bare
directories. Resetting the lease is dropping the layer (``drop``): nothing is copied back or
wiped. Where the kernel refuses an overlay in a user namespace (before Linux 5.11), the tree is
copied into a fresh tmpfs instead (slower; the same isolation).
"""

import os
import shutil
import stat

from . import kernel, resident
from . import state as S
from .protocol import ENV_LAYER as LAYER
from .protocol import ENV_ROOT, K_OK, reply

MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4
HEX = frozenset("0123456789abcdef")

# The lease's mounts, in the order they were made: (path, what) for ``drop``.
MOUNTS = []
IDLE_COVER = [False]  # ENV_ROOT is covered between leases too: no lease reads another's tree
BASE_WORK = [None]  # the configured work directory, while a lease works elsewhere
UPPER = [None]  # an fd of the overlay's writable layer, read by changes.do_changes (agent grading)
MODE = ["none"]  # "overlay" or "copy": how the last lease got its copy (the host reads it)


def _mount(source, target, fstype, flags, options):
    lib = kernel.libc()
    kernel.check(lib.mount(source.encode(), target.encode(), fstype.encode(), flags,
                           options.encode() if options else None), f"mount {fstype} on {target}")
    MOUNTS.append(target)


def _special(directory, names):
    """What a copy leaves out: FIFOs, sockets and devices (``copytree`` cannot copy them)."""
    skip = []
    for name in names:
        try:
            mode = os.lstat(os.path.join(directory, name)).st_mode
        except OSError:
            continue
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
            skip.append(name)
    return skip


def _cover(path):
    _mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,nr_inodes=16,mode=0")


def do_environment(request):
    """``(ENV, key, workdir, size_mb)``: give this lease its copy of the prepared tree ``key`` at
    ``workdir`` (``None``: the configured work directory)."""
    _, key, workdir, size_mb = request
    if not isinstance(key, str) or len(key) != 64 or not set(key) <= HEX:
        raise ValueError("an environment key is 64 hex digits")
    drop()
    target = workdir or S.WORK
    if not os.path.isdir(target):
        raise FileNotFoundError(f"{target} is not a mount point of this sandbox")
    uncover()
    lower = f"{ENV_ROOT}/{key}/tree"
    if not os.path.isdir(lower):
        raise FileNotFoundError(f"prepared environment {key[:12]} is not in the sandbox's cache")
    if target != S.WORK:
        # A resident judge keeps the work directory it started with: the next one starts here.
        resident.sweep()
        BASE_WORK[0] = S.WORK
    if target in kernel.MOUNTED:  # the lease's empty scratch tmpfs: the copy takes its place
        kernel.check(kernel.libc().umount2(target.encode(), kernel.MNT_DETACH), f"umount2({target})")
        kernel.MOUNTED.discard(target)
    inodes = max(1024, int(size_mb) * 256)
    _mount("tmpfs", LAYER, "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={int(size_mb)}m,nr_inodes={inodes},mode=700,uid={os.getuid()},gid={os.getgid()}")
    os.mkdir(LAYER + "/upper", 0o755)
    os.mkdir(LAYER + "/work", 0o700)
    try:
        _mount("overlay", target, "overlay", MS_NOSUID | MS_NODEV,
               f"lowerdir={lower},upperdir={LAYER}/upper,workdir={LAYER}/work,userxattr")
        MODE[0] = "overlay"
        UPPER[0] = os.open(LAYER + "/upper", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV,
               f"size={int(size_mb)}m,nr_inodes={inodes},mode=755,uid={os.getuid()},gid={os.getgid()}")
        shutil.copytree(lower, target, symlinks=True, dirs_exist_ok=True, ignore=_special)
        MODE[0] = f"copy (the kernel refused an overlay: {exc})"
    _cover(LAYER)
    _cover(ENV_ROOT)
    S.WORK = target
    os.chdir(target)
    reply(K_OK, part1=MODE[0].encode())


def drop():
    """Unmount the lease's copy (every process of the lease is gone by now) and give the
    configured work directory back. ``files.fresh_scratch`` then mounts a fresh tmpfs there."""
    if UPPER[0] is not None:
        os.close(UPPER[0])
        UPPER[0] = None
    if MOUNTS:
        os.chdir("/")
        lib = kernel.libc()
        while MOUNTS:
            path = MOUNTS.pop()
            kernel.check(lib.umount2(path.encode(), kernel.MNT_DETACH), f"umount2({path})")
        if BASE_WORK[0] is not None:
            resident.sweep()
            S.WORK, BASE_WORK[0] = BASE_WORK[0], None
    cover_idle()


def cover_idle():
    """Cover the cache between leases (at start, and after every drop)."""
    if not IDLE_COVER[0] and os.path.isdir(ENV_ROOT):
        _cover(ENV_ROOT)
        MOUNTS.pop()  # not the lease's: ``uncover`` takes it off
        IDLE_COVER[0] = True


def uncover():
    if IDLE_COVER[0]:
        kernel.check(kernel.libc().umount2(ENV_ROOT.encode(), kernel.MNT_DETACH), f"umount2({ENV_ROOT})")
        IDLE_COVER[0] = False

"""The lease launcher's prepared environments (``launcher.py`` says when each step runs).

A sandbox made from an environment's snapshot holds the pristine tree at ``ENV_ROOT/tree``
(``trl_sandbox.remote.environment`` builds it). Each lease gets a private copy at its working
directory, made by the launcher before the program and dropped by the next reset:

* ``ns`` mode (the launcher holds CAP_SYS_ADMIN in the sandbox's mount namespace): a size-capped
  tmpfs at ``ENV_ROOT/layer`` and a kernel overlay at the working directory, the pristine tree
  read-only underneath, the layer on top. It lives in the sandbox's own mount namespace, so
  every exec and file operation of the lease sees it; each program's namespace covers
  ``ENV_ROOT`` with an empty read-only tmpfs (``hide_dirs``). Dropping it is two unmounts.
* elsewhere (``userns``, ``sweep``, or a kernel that refuses the overlay): a copy (``cp -a``),
  owned by the program's user; dropping it empties the directory.

``freeze`` (the build's last step) copies a working directory to ``ENV_ROOT/tree``, owned by the
launcher's user, and records the key: a copy is made only from a tree whose key matches.

Standard library only, Python 3.8+. Sent as one source with the launcher's other parts.
"""

import os

if "_mount" not in globals():  # on the host; sent to a sandbox, the isolation's text came before
    from trl_sandbox.remote.launcher_cleaning import remove
    from trl_sandbox.remote.launcher_isolation import LIBC, MS_NOSUID, _check, _mount

ENV_ROOT = "/var/tmp/.trl-sandbox-env"
MNT_DETACH = 2


def _spawn(argv):
    for where in ("/bin", "/usr/bin"):
        path = os.path.join(where, argv[0])
        if os.access(path, os.X_OK):
            return os.waitpid(os.posix_spawn(path, argv, os.environ), 0)[1] == 0
    return False


def _empty(directory):
    """The contents of ``directory`` removed (never following a link), the directory kept."""
    if os.path.islink(directory):
        os.unlink(directory)
    if not os.path.isdir(directory):
        return
    paths = [os.path.join(directory, name) for name in os.listdir(directory)]
    if paths and not _spawn(["rm", "-rf", "--", *paths]):
        for path in paths:
            remove(path)


def _own(top, uid):
    for root, dirs, names in os.walk(top):
        for name in dirs + names:
            os.lchown(os.path.join(root, name), uid, uid)
    os.lchown(top, uid, uid)


def drop_environment(spec):
    """On a reset: unmount each lease copy's overlay and layer, then empty its directory."""
    for work in spec.get("drop") or ():
        for target in (work, ENV_ROOT + "/layer"):
            if os.path.ismount(target):
                _check(LIBC.umount2(target.encode(), MNT_DETACH), "umount2 " + target)
        _empty(work)


def apply_environment(spec):
    """This lease's private copy of the pristine tree at ``env["work"]``; returns how it was made."""
    env = spec["env"]
    tree, work = ENV_ROOT + "/tree", env["work"]
    try:
        with open(ENV_ROOT + "/key") as fh:
            found = fh.read().strip()
    except OSError:
        found = ""
    if found != env["key"] or not os.path.isdir(tree):
        raise OSError(2, "this sandbox holds no prepared environment " + env["key"][:12]
                      + " (its snapshot is empty or of another key)")
    os.makedirs(work, exist_ok=True)
    _empty(work)
    if spec.get("mode") == "ns" and not env.get("copy"):
        layer = ENV_ROOT + "/layer"
        try:
            os.makedirs(layer, exist_ok=True)
            _mount("tmpfs", layer, "tmpfs", MS_NOSUID, "size={}m,mode=0755".format(int(env.get("mb") or 1024)))
            os.mkdir(layer + "/upper", 0o755)
            os.mkdir(layer + "/work", 0o700)
            options = f"lowerdir={tree},upperdir={layer}/upper,workdir={layer}/work"
            try:
                _mount("overlay", work, "overlay", MS_NOSUID, options + ",userxattr")
            except OSError:
                _mount("overlay", work, "overlay", MS_NOSUID, options)
            return "overlay"
        except OSError:
            if os.path.ismount(layer):
                LIBC.umount2(layer.encode(), MNT_DETACH)
    if not _spawn(["cp", "-a", "--", tree + "/.", work]):
        raise OSError(5, "copying the prepared environment failed")
    uid = spec.get("uid")
    if uid is not None and os.geteuid() == 0:
        _own(work, uid)
    return "copy"


def freeze(spec):
    """The build's end: the working directory becomes the pristine tree of ``key``."""
    what = spec["freeze"]
    tree = ENV_ROOT + "/tree"
    if os.path.lexists(ENV_ROOT):
        _empty(ENV_ROOT)
    os.makedirs(ENV_ROOT, mode=0o755, exist_ok=True)
    os.chmod(ENV_ROOT, 0o755)
    os.mkdir(tree, 0o755)
    if not _spawn(["cp", "-a", "--", what["from"].rstrip("/") + "/.", tree]):
        raise OSError(5, "copying the working directory into the pristine tree failed")
    _own(tree, os.getuid())
    os.chmod(tree, 0o755)
    with open(ENV_ROOT + "/key", "w") as fh:
        fh.write(what["key"] + "\n")

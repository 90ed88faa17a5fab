"""What control groups the kernel offers this process: cgroup v2 with delegation, or v1 controllers.

Used by ``cgroups.py`` once, when a local provider is built. Each ``detect_*`` returns the base
directories (the groups this process is in) or raises ``Unavailable`` with why and what to change.
"""

from __future__ import annotations

import os

V1_CONTROLLERS = ("cpu", "cpuacct", "memory", "pids")
V2_CONTROLLERS = ("cpu", "memory", "pids")


def write_text(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def read_text(path: str) -> str:
    with open(path) as f:
        return f.read()


def _mounts() -> list[tuple[str, str, str, str]]:
    """(mount point, root inside the hierarchy, fs type, super options) of every cgroup mount."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
                out.append((fields[4].replace("\\040", " "), fields[3], tail[0], tail[2]))
    return out


def _own_groups() -> dict[str, str]:
    """Hierarchy key (``"0"`` for v2, else the comma-joined controllers) -> this process's group."""
    out = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            num, controllers, path = line.rstrip("\n").split(":", 2)
            out["0" if num == "0" and not controllers else controllers] = path
    return out


def _join(mount: str, root: str, path: str) -> str | None:
    """The directory of group ``path`` under a mount of the hierarchy at ``root``; None if outside it."""
    if root != "/" and not (path == root or path.startswith(root.rstrip("/") + "/")):
        return None
    rel = path[len(root):] if root != "/" else path
    full = os.path.normpath(mount + "/" + rel.lstrip("/"))
    return full if os.path.isdir(full) else None


class Unavailable(Exception):
    """This kind of cgroup cannot be used here; the message says why and what would change it."""


def detect_v1() -> dict[str, str]:
    """Controller -> base directory for the v1 controllers we can write to."""
    own = _own_groups()
    found: dict[str, str] = {}
    for mount, root, fstype, opts in _mounts():
        if fstype != "cgroup":
            continue
        names = set(opts.split(","))
        for controller in V1_CONTROLLERS:
            if controller in names and controller not in found:
                key = next((k for k in own if controller in k.split(",")), None)
                base = _join(mount, root, own[key]) if key else None
                if base:
                    found[controller] = base
    missing = [c for c in ("cpu", "pids") if c not in found]
    if missing:
        raise Unavailable(f"the cgroup v1 controller(s) {', '.join(missing)} are not mounted")
    for controller, base in found.items():
        if not os.access(base, os.W_OK):
            raise Unavailable(f"{base} (cgroup v1 {controller}) is not writable: run the trainer as root")
    return found


def detect_v2() -> str:
    own = _own_groups().get("0")
    mount = next(((m, r) for m, r, fstype, _ in _mounts() if fstype == "cgroup2"), None)
    if own is None or mount is None:
        raise Unavailable("cgroup v2 is not mounted")
    base = _join(mount[0], mount[1], own)
    if base is None:
        raise Unavailable(f"this process's cgroup v2 group {own!r} is not visible under {mount[0]}")
    available = set(read_text(os.path.join(base, "cgroup.controllers")).split())
    missing = [c for c in V2_CONTROLLERS if c not in available]
    if missing:
        raise Unavailable(
            f"cgroup v2 group {base} does not offer the controller(s) {', '.join(missing)} "
            "(bound to cgroup v1, or not delegated to this group)"
        )
    if not os.access(base, os.W_OK):
        raise Unavailable(f"cgroup v2 group {base} is not writable (it is not delegated to this user)")
    enabled = set(read_text(os.path.join(base, "cgroup.subtree_control")).split())
    todo = [c for c in V2_CONTROLLERS if c not in enabled]
    if todo:
        try:
            write_text(os.path.join(base, "cgroup.subtree_control"), " ".join("+" + c for c in todo))
        except OSError as exc:
            raise Unavailable(
                f"cannot enable {', '.join(todo)} for the children of cgroup v2 group {base} ({exc.strerror}): "
                "a non-root group that holds processes cannot delegate controllers; start the trainer in a "
                "leaf of a delegated subtree whose parent has them enabled, e.g. under `systemd-run "
                "--scope -p Delegate=yes`, after moving the process into a child group"
            ) from None
    return base

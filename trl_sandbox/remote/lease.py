"""Clean leases on remote sandboxes (Daytona, CoreWeave) without an extra round trip.

A remote sandbox is a container or VM that lives across many programs. Without care, a process a
program leaves behind survives into the next program's run (another completion of its group, or
the next turn of an episode) and can change its files, fill ``/tmp``, slow it into a timeout, kill
its judge or read its source. So every remote program runs through ``remote/launcher.py``: forked
by the sandbox's resident launcher (``remote/launcher_resident.py``; the exec is then ``sh -c
CLIENT``), or sent with the exec itself (``python3 -I -S -c SOURCE SPEC ARGV...``) where the image
allows no namespaces. A reset that is due travels with the next exec, exactly as the local
sandbox's does, and the program runs in a PID namespace of its own that ends with it (see the
launcher's docstring for what holds in which mode).

``Lease`` is the per-sandbox state a provider keeps: what the probe at creation found
(``isolation``: ``ns``/``userns`` or ``sweep`` where the image refuses namespaces), whether a reset
is due, the processes every sweep spares, and the resident's directory. ``probe_argv`` is the argv
of that probe (it also starts the resident);
``Lease.from_probe`` reads its answer (None: no ``python3`` in the image; the provider then keeps
its old behaviour and says so in a warning).
"""

from __future__ import annotations

import json
import logging
import secrets
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trl_sandbox.judge.sent_source import bare_source
from trl_sandbox.remote.launcher_isolation import PROGRAM_UID
from trl_sandbox.remote.launcher_resident import MARK, RESIDENT_DIR
from trl_sandbox.sandbox import ResourceLimits

log = logging.getLogger("trl_sandbox.remote.lease")



# Functions an exec in one mode never calls: left out of what is sent (the interpreter compiles
# the source on every exec, about 0.3 ms per KB on a slow machine).
_RESIDENT = {"start_resident", "serve", "handle", "follow", "_zombie"}
_UNUSED = {
    "probe": set(),  # the whole launcher: the resident it leaves running serves every later exec
    "ns": {"probe", "works", "private_sweep", "dumps", "baseline", "sweep", "ancestors", "pids", "start_time", "ipc_baseline", "wipe_ipc",
           *_RESIDENT},
    "sweep": {"probe", "works", "dumps", "baseline", "enter_namespaces", "seal_filesystem", "init",
              "own_user", "listening_sockets", "hide_sockets", *_RESIDENT},
}


# The parts first, the entry last: each part's text uses the names the ones before it defined
# (and imports them only on the host).
_TEXT = "\n".join(Path(__file__).with_name(name).read_text(encoding="utf-8")
                  for name in ("launcher_cleaning.py", "launcher_resident.py", "launcher_isolation.py",
                               "launcher_environment.py", "launcher.py", "launcher_main.py"))
SOURCES = {mode: bare_source(_TEXT, _UNUSED[mode]) for mode in _UNUSED}
LAUNCHER_SOURCE = SOURCES["probe"]  # the whole launcher (the probe runs it once per sandbox)
# -I: no current directory, user site or PYTHON* variables on the launcher's path; -S: no site
# module either (nothing of the image's site-packages runs before the launcher's own code).
LAUNCHER_ARGV = ("python3", "-I", "-S", "-c", LAUNCHER_SOURCE)
FAILED_EXIT = 125
#: Added to the service's own time limit for an exec: the launcher's cleaning runs before the
#: program's clock starts (the launcher enforces the program's limit itself), so a program that
#: left a million files cannot slow its neighbour into a timeout.
CLEANING_MARGIN_S = 10
#: The user a program runs as in ``sweep`` mode when the launcher may switch to it (nobody).
SWEEP_UID = 65534


# An exec with the resident launcher (``launcher_resident``): ``sh -c CLIENT MARK SPEC ARGV...``.
# A FIFO for the answer, our pid to the resident, then leave as the program left. Whatever fails
# before the resident took the exec is the launcher's failure (the program never ran): the provider
# replaces the sandbox (``SandboxGoneError``) and the program runs on another, with a resident of
# its own. The launcher's text does not travel with every exec (13 KB a request).
# The resident takes the standard streams from descriptors 5, 6 and 7: the shell moves 0 and 1
# for a moment around ``read`` and ``echo``.
CLIENT = """d=@DIR@; f="$d/c.$$"
if [ -p "$d/q" ] && read -r r < "$d/pid" && kill -0 "$r" 2>/dev/null && mkfifo -m 600 "$f" 2>/dev/null; then
  exec 4<>"$f" 3<>"$d/q" 5<&0 6>&1 7>&2
  echo $$ >&3
  exec 3>&-
  read -r s <&4
  exec 4<&-
  case "$s" in
    S*) kill -"${s#S}" $$; exit $((128 + ${s#S})) ;;
    [0-9]*) exit "$s" ;;
  esac
  rm -f "$f"
fi
echo "[trl-sandbox-lease:@TAG@:failed] the resident launcher is gone"
exit 125
"""


def probe_argv(serve: bool = True) -> list[str]:
    """The probe's argv; ``serve``: leave the resident launcher running where namespaces work."""
    return [*LAUNCHER_ARGV, repr({"probe": True, **({"serve": RESIDENT_DIR} if serve else {})})]


def rlimits(limits: ResourceLimits) -> dict[str, int]:
    """``SandboxSpec.limits`` as the launcher applies them (what ``prlimit`` applied before)."""
    return {"cpu": max(1, -(-int(limits.cpu_seconds * 1000) // 1000)), "as": int(limits.memory_mb) << 20,
            "fsize": int(limits.file_size_mb) << 20, "nofile": int(limits.open_files)}


class LeaseFailed(Exception):
    """The launcher could not clean the sandbox or isolate the program (the program never ran)."""


@dataclass
class Lease:
    isolation: str  # "ns", "userns" or "sweep"
    read_only_root: bool = False
    switch_user: bool = False
    spare: list[list[int]] = field(default_factory=list)
    #: The SysV IPC objects the sandbox had when it was made (by kind: ids), spared by a sweep's reset.
    spare_ipc: dict[str, list[int]] = field(default_factory=dict)
    reset_due: bool = False
    #: The resident launcher's directory (None: every exec starts a launcher of its own).
    resident: str | None = None
    #: ``ns``/``userns``: each program enters a user namespace of its own as ``PROGRAM_UID`` (the
    #: image allows nested user namespaces); else it stays uid 0 of the lease's, without capabilities.
    user_ns: bool = False
    #: ``sweep``: each program gets its own network, IPC and UTS namespaces (the launcher may make
    #: them without a user namespace: root with CAP_SYS_ADMIN); else it shares the sandbox's.
    private: bool = False
    #: Prepared environments (``trl_sandbox.remote.environment``): the copy the next exec makes
    #: (``env``), the build's ``freeze`` due, the directories a reset drops copies from, and
    #: whether the sandbox holds a pristine tree (kept by every wipe, hidden from programs).
    env: dict[str, Any] | None = None
    freeze: dict[str, str] | None = None
    env_dirs: list[str] = field(default_factory=list)
    env_root: str | None = None

    @classmethod
    def from_probe(cls, stdout: str, sandbox_id: str, provider: str) -> Lease | None:
        answer = None
        for line in reversed(stdout.splitlines()):
            if line.startswith("{") and '"isolation"' in line:
                try:
                    answer = json.loads(line)
                except ValueError:
                    continue
                break
        if answer is None:
            log.warning("%s sandbox %s: the image has no usable python3, so programs run without the lease "
                        "launcher: processes they leave are not killed and a reset empties the work directory only "
                        "(one more exec per lease)", provider, sandbox_id)
            return None
        lease = cls(isolation=str(answer.get("isolation") or "sweep"),
                    read_only_root=bool(answer.get("read_only_root")),
                    switch_user=bool(answer.get("switch_user")),
                    spare=[list(map(int, p)) for p in answer.get("spare") or []],
                    spare_ipc={str(k): [int(i) for i in v] for k, v in (answer.get("ipc") or {}).items()},
                    resident=str(answer["resident"]) if answer.get("resident") else None,
                    user_ns=bool(answer.get("user_ns")), private=bool(answer.get("private")))
        if lease.isolation != "sweep" and not lease.user_ns:
            log.warning("%s sandbox %s: the image refuses a user namespace inside the lease's, so programs run as "
                        "uid 0 of their namespace (without capabilities)", provider, sandbox_id)
        if lease.isolation == "sweep":
            log.warning("%s sandbox %s: the image refuses PID namespaces; every program is followed (and preceded) "
                        "by a sweep that kills every process not present when the sandbox was made%s", provider,
                        sandbox_id, " and programs run as nobody" if lease.switch_user else
                        "; programs run as the daemon's own user, so a program that the daemon killed on timeout "
                        "leaves processes that live until the next exec's sweep")
        return lease

    @classmethod
    def adopt(cls, stdout: str, sandbox_id: str, provider: str, *, sweep: bool = False,
              env_root: str | None = None) -> Lease | None:
        """``from_probe``, as the provider's settings and the sandbox's origin want it: ``sweep``
        isolation forced (the ``isolation=sweep`` setting), and the pristine tree of a prepared
        environment's sandbox (``env_root``) kept by every wipe and hidden from programs."""
        lease = cls.from_probe(stdout, sandbox_id, provider)
        if lease is not None and sweep:
            lease.isolation = "sweep"
        if lease is not None and env_root:
            lease.env_root = env_root
        return lease

    def argv(self, argv: Sequence[str], *, work: str, cwd: str | None, limits: ResourceLimits | None,
             timeout: float | None = None, stdin_b64: bool = False,
             keep: Sequence[str] = (), network: bool = False, cap: int | None = None) -> tuple[list[str], str]:
        """The launcher's argv for one program, and the tag of its own lines. Carries the due reset.
        Without ``network`` (``SandboxSpec.network``) the program gets a network namespace of its
        own, with only loopback. ``cap``: the bytes of each stream the launcher passes on (the
        rest is read and dropped in the sandbox; one byte more shows the cut)."""
        tag = secrets.token_hex(8)
        spec: dict[str, Any] = {"mode": "sweep" if self.isolation == "sweep" else "ns", "work": work,
                                "cwd": cwd or work, "reset": self.reset_due, "tag": tag}
        if timeout is not None:
            spec["timeout"] = float(timeout)
        if limits is not None:
            spec["limits"] = rlimits(limits)
        if stdin_b64:
            spec["stdin"] = "b64"
        if network:
            spec["network"] = True
        if cap is not None:
            spec["cap"] = int(cap)
        if self.env_root:
            keep = [*keep, self.env_root]
            spec["hide"] = [self.env_root]
        if self.reset_due and self.env_dirs:
            spec["drop"] = list(self.env_dirs)
        if self.freeze:
            spec["freeze"], self.freeze = self.freeze, None
        if self.env:
            spec["env"], self.env = self.env, None
        if keep:
            spec["keep"] = list(keep)
        if self.isolation == "sweep":
            spec["spare"] = self.spare
            spec["spare_ipc"] = self.spare_ipc
            if self.switch_user:
                spec["uid"] = SWEEP_UID
            if self.private:
                spec["private"] = True
        elif self.user_ns:
            spec["user"] = PROGRAM_UID
        if self.resident and spec["mode"] == "ns":
            spec["hide"] = [*spec.get("hide", ()), self.resident]  # out of the program's sight; never wiped
            spec["keep"] = [*keep, self.resident]
            client = CLIENT.replace("@DIR@", shlex.quote(self.resident)).replace("@TAG@", tag)
            return ["/bin/sh", "-c", client, MARK.decode(), repr(spec), *argv], tag
        head = ("python3", "-I", "-S", "-c", SOURCES[spec["mode"]])
        return [*head, repr(spec), *argv], tag  # a Python literal: no json import there


def failure(stdout: str, tag: str) -> str | None:
    """The launcher's own failure reason in ``stdout`` (None when it did not fail). The tag is
    fresh per exec and never visible to the program, so the line cannot be forged."""
    marker = f"[trl-sandbox-lease:{tag}:failed] "
    i = stdout.rfind(marker)
    if i < 0:
        return None
    return stdout[i + len(marker):].split("\n", 1)[0] or "unknown"


def timed_out(stdout: str, tag: str) -> bool:
    """Whether the launcher ended the program at its wall-clock limit."""
    return stdout.endswith(f"[trl-sandbox-lease:{tag}:timeout]\n")

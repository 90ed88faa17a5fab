"""Run metadata -> sandbox tags, and the built-in ``trl_sandbox_run_tags`` plugin.

Tags are how a sandbox is traced back to the run that made it (W&B run, Slurm job, host, rank)
and how leftovers of a killed run are found and reaped. Providers may turn them into labels
(CoreWeave tags become Kubernetes labels), so keys and values are normalised to a label-safe
alphabet here, once, for every provider.
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trl_sandbox.plugins.hookspecs import hookimpl

RUN_TAG = "trl-sandbox-run"
HOST_TAG = "trl-sandbox-host"
PID_TAG = "trl-sandbox-pid"
MANAGED_TAG = "trl-sandbox"
MADE_BY_TAG = "trl-sandbox-made-by"  # trainer, reward, exec, evaluate, self-check, pool

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def clean(value: Any, limit: int = 63) -> str:
    """A label-safe version of ``value`` (Kubernetes label rules: 63 chars, alnum at both ends)."""
    text = _UNSAFE.sub("-", str(value)).strip("-._")
    return text[:limit].rstrip("-._") or "none"


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass
class RunInfo:
    """What a ``trl_sandbox_run_tags`` implementation gets to look at."""

    run_id: str = field(default_factory=new_run_id)
    model_name: str | None = None
    rank: int = 0
    world_size: int = 1
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    args: Any = None  # the SandboxGRPOConfig when a trainer is running


def collect_tags(run: RunInfo, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The tags for every sandbox of this run: identity tags, plugin tags, then user tags."""
    from trl_sandbox.plugins import run_tags

    tags: dict[str, str] = {}
    tags.update(run_tags(run))
    tags.update(extra or {})
    # Identity tags last: reaping depends on them, so no plugin may override them.
    tags.update({MANAGED_TAG: "1", RUN_TAG: run.run_id, HOST_TAG: run.host, PID_TAG: str(run.pid)})
    return {clean(k): clean(v) for k, v in tags.items()}


def process_tags(made_by: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Tags for a pool that no trainer tagged (``trl-sandbox exec``/``evaluate``, a standalone
    ``SandboxReward``, a self-check, a user's own pool).

    Without them a killed process's sandboxes could not be told from anyone else's: start-up
    reaping, ``reap --dead-owners`` and the closing sweep all find sandboxes by these tags. The
    run id is ``TRL_SANDBOX_RUN_ID`` when set (so ranks of one launch share it), else fresh; the
    rank is ``RANK`` as ``accelerate``/``torchrun`` set it.
    """
    try:
        rank = int(os.environ.get("RANK", "0"))
    except ValueError:
        rank = 0
    run = RunInfo(run_id=os.environ.get("TRL_SANDBOX_RUN_ID") or new_run_id(), rank=rank)
    return collect_tags(run, {**(extra or {}), MADE_BY_TAG: made_by})


@hookimpl
def trl_sandbox_run_tags(run: RunInfo) -> dict[str, str]:
    """The default tags: W&B run, Slurm job, model, rank (the built-in plugin ``default_tags``)."""
    tags = {"rank": str(run.rank)}
    if run.model_name:
        tags["model"] = run.model_name.rstrip("/").split("/")[-1]
    if os.environ.get("WANDB_RUN_ID"):
        tags["wandb-run"] = os.environ["WANDB_RUN_ID"]
    if os.environ.get("SLURM_JOB_ID"):
        tags["slurm-job"] = os.environ["SLURM_JOB_ID"]
    return tags


def owner_is_dead(tags: Mapping[str, str], host: str | None = None) -> bool:
    """True when ``tags`` name a process on this host that no longer exists (its sandboxes are stale)."""
    host = clean(host or socket.gethostname())
    if clean(tags.get(HOST_TAG, "")) != host:
        return False
    try:
        pid = int(tags.get(PID_TAG, ""))
    except ValueError:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False

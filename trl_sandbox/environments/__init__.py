"""Prepared environments: a row's ``environment`` (files, setup commands, a base) built once per
content key and machine, and a private copy-on-write copy of it for every program and episode.

``spec`` parses a row's environment and computes its content key; ``cache`` keeps built trees
on disk with a file lock per key and a disk budget; ``builds`` makes each key once (single-flight
across threads and processes) and turns a failed setup into ``SetupFailed`` (``infra``). Each
provider builds and leases in its own way (the local one: ``trl_sandbox.local.environments``).
"""

from trl_sandbox.environments.builds import Prepared, SetupFailed
from trl_sandbox.environments.spec import ENVIRONMENT_COLUMN, EnvironmentSpec, parse

__all__ = ["ENVIRONMENT_COLUMN", "EnvironmentSpec", "Prepared", "SetupFailed", "parse"]

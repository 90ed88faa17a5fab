"""Reaching the Ray cluster, naming sandbox actors, and checking that a node can host one.

Connecting is bounded: ``ray.init`` toward an address where no cluster answers retries for
minutes, so the address is first tried with a plain TCP connection and the connection itself runs
under a deadline. Either failure is a ``ConfigError`` at trainer construction, with what to do.

Sandboxes are named actors whose name carries the sandbox id and the run's tags, so that
``list`` (and ``trl-sandbox ls`` / ``reap`` from another process) finds them from the cluster's
actor directory alone, without calling a single actor, and without the dashboard that Ray's state
API needs. The names are in the provider's namespace; non-detached named actors lose their name
when they die, so the directory lists exactly the live ones.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode

from trl_sandbox.sandbox import ConfigError

NAME_PREFIX = "trl-sandbox:"

_lock = threading.Lock()
_users = 0  # providers of this process using a connection one of them opened
_opened_here = False
_held = threading.Event()  # set when the connection this module opened has ended


def actor_name(sandbox_id: str, tags: Mapping[str, str]) -> str:
    return f"{NAME_PREFIX}{sandbox_id}:{urlencode(sorted((str(k), str(v)) for k, v in tags.items()))}"


def parse_name(name: str) -> tuple[str, dict[str, str]] | None:
    """``(sandbox id, tags)`` of a sandbox actor's name, or None for any other actor."""
    if not name.startswith(NAME_PREFIX):
        return None
    sandbox_id, _, query = name[len(NAME_PREFIX):].partition(":")
    return sandbox_id, dict(parse_qsl(query, keep_blank_values=True))


def _bootstrap(address: str) -> str | None:
    """The ``host:port`` that ``ray.init(address)`` would dial, or None where Ray would start a
    cluster of its own (``local``) or finds none (``auto`` with no cluster on this machine)."""
    if address.startswith("ray://"):
        return address[len("ray://"):]
    from ray._private import services

    try:
        return services.canonicalize_bootstrap_address(address)
    except (ConnectionError, ValueError) as exc:
        raise ConfigError(_unreachable(address, str(exc))) from None


def _unreachable(address: str, why: str) -> str:
    return (f"ray provider: no Ray cluster answers at address={address!r} ({why}); start one with "
            "`ray start --head` on the head node (and `ray start --address=HEAD:6379` on the others), or set "
            "address=HOST:PORT (or ray://HOST:10001 for Ray Client)")


def connect(address: str, namespace: str, timeout_s: float) -> None:
    """Connect this process to the cluster at ``address`` unless it already is (a user's own
    ``ray.init`` is kept as it is). Raises ``ConfigError`` when nothing answers within ``timeout_s``."""
    global _users, _opened_here
    import ray

    with _lock:
        if ray.is_initialized():
            _users += 1
            return
        if address != "local":
            target = _bootstrap(address)
            if target is None:
                raise ConfigError(_unreachable(address, "no running cluster was found on this machine"))
            host, _, port = target.rpartition(":")
            try:
                socket.create_connection((host.strip("[]"), int(port)), timeout=min(timeout_s, 10.0)).close()
            except (OSError, ValueError) as exc:
                raise ConfigError(_unreachable(address, f"{target}: {exc}")) from None
        failure: list[BaseException] = []
        done = threading.Event()

        def init() -> None:
            try:
                ray.init(address=address, namespace=namespace,  # "local": always a new one-machine Ray
                         ignore_reinit_error=True, log_to_driver=False, logging_level="WARNING")
            except BaseException as exc:
                failure.append(exc)
            done.set()
            # Ray ties the processes it starts for ``local`` (its GCS, its raylet) to the thread that
            # started them (they die with it): this thread lives until the connection ends.
            _held.wait()

        # In a thread also so that Ray installs no SIGTERM handler of its own (it would replace one
        # the user's program installed for its own teardown); its warning about that is dropped.
        quiet = _DropMessage("SIGTERM handler is not set")
        worker_log = logging.getLogger("ray._private.worker")
        worker_log.addFilter(quiet)
        thread = threading.Thread(target=init, name="trl-sandbox-ray-connect", daemon=True)
        _held.clear()
        thread.start()
        done.wait(timeout_s)
        worker_log.removeFilter(quiet)
        if not done.is_set() or failure:
            _held.set()
            why = f"{type(failure[0]).__name__}: {failure[0]}" if failure else f"no answer within {timeout_s:.0f} s"
            raise ConfigError(_unreachable(address, why))
        _users += 1
        _opened_here = True


class _DropMessage(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def disconnect() -> None:
    """Leave the cluster when the last provider of a connection this module opened is closed."""
    global _users, _opened_here
    import ray

    with _lock:
        _users = max(0, _users - 1)
        if _users == 0 and _opened_here:
            _opened_here = False
            ray.shutdown()
            _held.set()


def _fits(node: Mapping[str, Any], need: Mapping[str, float], labels: Mapping[str, str]) -> bool:
    have = node.get("Resources") or {}
    node_labels = node.get("Labels") or {}
    return (all(have.get(k, 0) >= v for k, v in need.items() if v > 0)
            and all(node_labels.get(k) == v for k, v in labels.items()))


def capacity(need: Mapping[str, float], labels: Mapping[str, str]) -> tuple[int, list[str]]:
    """How many sandboxes of shape ``need`` the live nodes matching ``labels`` hold in all (by
    their total resources), and one line per live node for an error message."""
    import ray

    total = 0
    lines = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        have = node.get("Resources") or {}
        lines.append(f"{node.get('NodeManagerAddress', '?')}: "
                     + ", ".join(f"{k}={v:g}" for k, v in sorted(have.items()) if not k.startswith("node:")))
        if _fits(node, need, labels):
            total += int(min(have.get(k, 0) / v for k, v in need.items() if v > 0)) if any(
                v > 0 for v in need.values()) else 1 << 20
    return total, lines

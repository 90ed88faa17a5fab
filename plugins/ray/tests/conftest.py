"""A Ray cluster on this machine for the ray provider's tests: a head without CPUs and two
worker nodes, each with its own resources, all on loopback.

``ray.cluster_utils.Cluster`` runs real raylets and a real GCS; the nodes share this machine's
cores, so the tests reason about placement (which node hosted what) and behaviour, never speed.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

# Ray would advertise the machine's outward address (found by routing toward 8.8.8.8); here only
# loopback is reachable, and this is how Ray itself keeps a one-machine cluster on it.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

NODE_CPUS = 4
NODE_SANDBOXES = 8  # the custom resource "sandbox" each worker node offers


def bwrap_pids() -> list[int]:
    out = subprocess.run(["pgrep", "-x", "bwrap"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def wait_until(predicate, timeout: float = 30.0, step: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)


@pytest.fixture(scope="session")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "node_ip_address": "127.0.0.1"})
    nodes = [c.add_node(num_cpus=NODE_CPUS, resources={"sandbox": NODE_SANDBOXES}, node_ip_address="127.0.0.1")
             for _ in range(2)]
    c.wait_for_nodes()
    c.worker_nodes_at_start = nodes
    yield c
    if ray.is_initialized():
        ray.shutdown()
    c.shutdown()


def actor_table() -> list[dict]:
    """Every sandbox actor the cluster ever had (the GCS's own record, dead ones included)."""
    from ray._private.state import state

    return [a for a in state.actor_table(None).values() if (a.get("Name") or "").startswith("trl-sandbox:ray-")]

"""A Ray cluster of several nodes on this machine, for the tests of the actor-learner on a cluster (issue 35).

`ray.cluster_utils.Cluster` starts real raylets (a head and worker nodes, each with its own CPUs and a custom
resource naming it), so placement across nodes and the loss of a node are real. Every node's servers listen on
127.0.0.1 only (`sparqrl.runners.actors._loopback_node` while each node starts, and the node IP given), and a run
that joins it gets `LOOPBACK_ENV`, so its driver listens there too. The cluster does not touch Ray's record of the
machine's current cluster (/tmp/ray/ray_current_cluster), which other Ray users of the machine may rely on.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Iterator

import pytest

LOOPBACK = "127.0.0.1"
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
"""For a process that joins the cluster: Ray's local-only switch off, so the cluster's 127.0.0.1 address stays
127.0.0.1 (otherwise Ray turns it into the machine's address, where nothing listens) and the driver's own servers
bind to loopback."""
# The nodes' health checks, fast: a removed node is declared dead (and its actors with it) within ~2 s, not ~30 s.
FAST_HEALTH_CHECKS = {"health_check_period_ms": 500, "health_check_failure_threshold": 4}


class LocalCluster:
    """A head node and worker nodes on loopback, with `head_cpus` and `cpus` CPUs; node `name` offers the custom
    resource {name: 1}."""

    def __init__(self, workers: tuple[str, ...] = ("node_a", "node_b"), cpus: int = 1, head_cpus: int = 1):
        from ray.cluster_utils import Cluster

        self.cpus = cpus
        self._workers = iter(f"node_{i}" for i in range(len(workers), 10**6))  # names for nodes added later
        with self._quiet_address_file(), self._loopback():
            self.cluster = Cluster(initialize_head=True, head_node_args=self._args(
                "node_head", head_cpus, _system_config=FAST_HEALTH_CHECKS))
            self.workers = {name: self._add(name) for name in workers}
        self.cluster.wait_for_nodes()

    @staticmethod
    def _args(name: str, cpus: int, **more) -> dict:
        return dict(num_cpus=cpus, resources={name: 1}, node_ip_address=LOOPBACK, include_dashboard=False, **more)

    @staticmethod
    def _loopback():
        from sparqrl.runners.actors import _loopback_node

        return _loopback_node()

    @staticmethod
    @contextlib.contextmanager
    def _quiet_address_file() -> Iterator[None]:
        """Ray's Cluster writes its address into the machine-wide file `ray.init()` and `ray start` read, and deletes
        it at shutdown: neither here."""
        import ray._common.utils as common_utils
        import ray._private.utils as private_utils

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(private_utils, "write_ray_address", lambda *args, **kwargs: None)
            patch.setattr(common_utils, "reset_ray_address", lambda *args, **kwargs: None)
            yield

    def _add(self, name: str):
        with self._loopback():
            return self.cluster.add_node(**self._args(name, self.cpus))

    @property
    def address(self) -> str:
        return self.cluster.address

    @property
    def head_id(self) -> str:
        return self.cluster.head_node.node_id

    def node_ids(self) -> dict[str, str]:
        """Node id (hex) -> name, of the nodes alive (as far as this cluster knows)."""
        return {self.head_id: "node_head", **{node.node_id: name for name, node in self.workers.items()}}

    def actor_pids(self, node_id: str) -> list[int]:
        """The processes of the actors on node `node_id` (Ray's workers, children of its raylet, titled ray::Class
        while they hold an actor; idle pooled workers are titled ray::IDLE)."""
        import psutil
        from ray._private import ray_constants

        node = self.cluster.head_node if node_id == self.head_id else self.workers[self.node_ids()[node_id]]
        raylet = node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
        return [child.pid for child in psutil.Process(raylet).children()
                if child.name().startswith("ray::") and child.name() != "ray::IDLE"]

    def addresses(self) -> list[str]:
        """The IP every node of the cluster was started on."""
        return [node.node_ip_address for node in self.cluster.list_all_nodes()]

    def remove(self, node_id: str) -> str:
        """Kill a worker node's processes, raylet and actors included, without a graceful shutdown (the node is
        lost, not drained); returns its name."""
        name = self.node_ids()[node_id]
        self.cluster.remove_node(self.workers.pop(name), allow_graceful=False)
        return name

    def restore(self, count: int = 2) -> None:
        """Add fresh worker nodes until there are `count` again (after a test removed some)."""
        while len(self.workers) < count:
            name = next(self._workers)
            self.workers[name] = self._add(name)
        self.cluster.wait_for_nodes()

    def shutdown(self) -> None:
        with self._quiet_address_file():
            self.cluster.shutdown()


@contextlib.contextmanager
def local_cluster(**kwargs) -> Iterator[LocalCluster]:
    """A `LocalCluster(**kwargs)`, shut down at the end."""
    start = time.perf_counter()
    cluster = LocalCluster(**kwargs)
    print(f"\nlocal Ray cluster of {len(cluster.addresses())} nodes up in {time.perf_counter() - start:.0f} s")
    try:
        yield cluster
    finally:
        cluster.shutdown()


def joining_env() -> dict[str, str]:
    """The environment of a process that joins the cluster (`LOOPBACK_ENV`), CPU-only JAX."""
    return {**os.environ, **LOOPBACK_ENV, "JAX_PLATFORMS": "cpu"}

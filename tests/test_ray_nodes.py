"""The actor-learner runner on a Ray cluster of several nodes (issue 35 items 1-3): a head and two worker nodes on
this machine (`ray_cluster.LocalCluster`), every server on loopback; actors spread over the nodes; a worker node
lost mid-run (its raylet and actors killed) is survived, for an off-policy (Ape-X DQN) and an on-policy (PPO) run.

Each run is `sparqrl train ... --ray-address ADDRESS` in its own process, as a user joins a cluster (a process that
ran a local Ray instance, as other tests in this worker do, cannot join one)."""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from conftest import RAY_SERIAL

pytest.importorskip("ray")

from ray_cluster import LOOPBACK, joining_env, local_cluster  # noqa: E402

from sparqrl.config import ConfigError  # noqa: E402
from sparqrl.runners.actors import Placement  # noqa: E402
from sparqrl.runners.gradients import GradientDriver  # noqa: E402
from sparqrl.runners.run_config import RunConfig, parse_resources  # noqa: E402
from sparqrl.runners.sebulba import check_learner  # noqa: E402

pytestmark = RAY_SERIAL

NODE_LINE = re.compile(r"actor (\d+) \(incarnation (\d+)\) runs on node ([0-9a-f]+)")
# Small, fast learners: the runs test placement and faults, not learning
DQN = ["dqn", "--set", "num_envs=2", "--set", "hidden=16,16", "--set", "batch_size=32", "--set", "learning_starts=100",
       "--fragment-steps", "5"]
PPO = ["ppo", "--set", "num_envs=2", "--set", "num_steps=16", "--set", "hidden=16,16", "--set", "num_minibatches=1",
       "--set", "update_epochs=1"]


@pytest.fixture(scope="module")
def cluster():
    with local_cluster() as started:
        yield started


class Run:
    """`sparqrl train ALGO --env gym:CartPole-v1 --actors 2 --ray-address CLUSTER` in its own process."""

    def __init__(self, tmp_path: Path, cluster, algo: list[str], steps: int, chunks: int, more: tuple[str, ...] = ()):
        self.out, self.log = tmp_path / "run", tmp_path / "stderr.txt"
        argv = ["train", *algo, "--env", "gym:CartPole-v1", "--actors", "2", "--ray-address", cluster.address,
                "--steps", str(steps), "--chunks", str(chunks), "--eval-every", "0", "--eval-episodes", "1",
                "--checkpoint-every", "1000", "--no-progress", "--no-energy", "--out", str(self.out), *more]
        self.start = time.perf_counter()
        with open(self.log, "w") as stderr:
            self.proc = subprocess.Popen([str(Path(sys.executable).with_name("sparqrl")), *argv], env=joining_env(),
                                         stdout=subprocess.DEVNULL, stderr=stderr)

    def nodes(self) -> dict[tuple[int, int], str]:
        """(actor, incarnation) -> node id, from the run's log."""
        return {(int(a), int(i)): node for a, i, node in NODE_LINE.findall(self.log.read_text())}

    def rows(self) -> int:
        metrics = self.out / "metrics.csv"
        return max(metrics.read_text().count("\n") - 1, 0) if metrics.exists() else 0

    def wait_for(self, what, timeout: float = 120.0):
        deadline = time.time() + timeout
        while time.time() < deadline and self.proc.poll() is None:
            if what():
                return
            time.sleep(0.1)
        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        raise AssertionError(f"not within {timeout} s; log: {self.log.read_text()[-3000:]}")

    def exit_code(self) -> int:
        try:
            code = self.proc.wait(timeout=240)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        print(f"\n{self.proc.args[1]}: {time.perf_counter() - self.start:.0f} s")
        return code

    def finish(self) -> dict:
        assert self.exit_code() == 0, self.log.read_text()[-3000:]
        return json.loads((self.out / "summary.json").read_text())


def test_every_node_of_the_test_cluster_is_on_loopback_and_named(cluster):
    import ray._private.state

    assert cluster.addresses() == [LOOPBACK] * 3
    state = ray._private.state.GlobalState()
    state._initialize_global_state(ray._raylet.GcsClientOptions.create(cluster.address, None, allow_cluster_id_nil=True,
                                                                       fetch_cluster_id_if_nil=False))
    nodes = [node for node in state.node_table() if node["Alive"]]
    assert sorted(name for node in nodes for name in node["Resources"] if name.startswith("node_")) == [
        "node_a", "node_b", "node_head"]
    assert {node["NodeManagerAddress"] for node in nodes} == {LOOPBACK}


def test_the_learner_runs_where_learner_resources_say(tmp_path, cluster):
    """`--learner-resources NODE=1`: the learner is a Ray actor on that node (logged, and summary.json's
    learner_node); it holds the node's one CPU, so the actors run on the two other nodes; the run learns and
    logs every chunk as with the learner in the driver. (Which actors deliver before the run ends depends on which
    starts first: only where each one that did ran is checked.)"""
    cluster.restore()  # (after an earlier test's loss, the nodes are named anew)
    name = sorted(cluster.workers)[-1]  # node_b, unless lost earlier
    node = {n: i for i, n in cluster.node_ids().items()}[name]
    run = Run(tmp_path, cluster, DQN, steps=1_000, chunks=4, more=("--learner-resources", f"{name}=1"))
    summary = run.finish()
    assert summary["learner_node"] == node and summary["learner_device"].startswith("cpu:"), summary
    assert (f"sparqrl: the learner runs on node {node} ({summary['learner_device']}; learner_resources {name}=1)"
            in run.log.read_text())
    assert run.nodes() and node not in run.nodes().values(), run.nodes()
    assert 1 <= summary["actor_nodes"] <= 2 and summary["actor_restarts"] == 0, summary
    assert summary["steps"] == 1_000 and summary["versions_published"] == 1_000 // (5 * 2) + 1, summary
    assert summary["learner_updates_per_s"] > 0 and 0 <= summary["final_return_mean"] <= 500, summary
    with open(run.out / "metrics.csv") as file:
        rows = list(csv.DictReader(file))
    assert [int(row["env_step"]) for row in rows] == [250, 500, 750, 1000], rows
    assert float(rows[-1]["gradient_steps"]) > 0 and math.isfinite(float(rows[-1]["loss"])), rows[-1]


def test_learner_resources_no_node_offers_is_one_line(tmp_path, cluster):
    run = Run(tmp_path, cluster, DQN, steps=1_000, chunks=4, more=("--learner-resources", "node_nowhere=1,CPU=1"))
    assert run.exit_code() != 0
    last = run.log.read_text().strip().splitlines()[-1]
    assert last.startswith("sparqrl: error: learner_resources='node_nowhere=1,CPU=1' is not allowed: no node of the "
                           "cluster offers them; its nodes offer: {"), last
    assert "node_head: 1" in last and "Traceback" not in run.log.read_text()


@pytest.mark.parametrize("value, why", [
    ("node_b", "must be NAME=NUMBER"), ("node_b=0", "must be NAME=NUMBER"), ("GPU=1,GPU=2", "each name once"),
    ("node_b=x", "must be NAME=NUMBER"), ("=1", "must be NAME=NUMBER")])
def test_malformed_learner_resources_is_one_line(value, why):
    with pytest.raises(ConfigError, match=f"learner_resources={re.escape(repr(value))} is not allowed: .*{why}"):
        RunConfig(env="gym:CartPole-v1", actors=2, ray_address="127.0.0.1:1", learner_resources=value).validate()


def test_learner_resources_needs_a_cluster_and_the_driver_s_learner():
    with pytest.raises(ConfigError, match="learner_resources='GPU=1' is not allowed: needs --ray-address"):
        RunConfig(env="gym:CartPole-v1", actors=2, learner_resources="GPU=1").validate()
    with pytest.raises(ConfigError, match="needs inference=actor"):
        RunConfig(env="gym:CartPole-v1", actors=2, ray_address="127.0.0.1:1", inference="central",
                  learner_resources="GPU=1").validate()
    run = RunConfig(env="gym:CartPole-v1", actors=2, ray_address="127.0.0.1:1", learner_resources="GPU=1")
    with pytest.raises(ConfigError, match="learner_resources='GPU=1' is not allowed: is not available for a3c"):
        check_learner("a3c", run, GradientDriver)
    assert parse_resources("node_b=1, GPU=0.5") == {"node_b": 1.0, "GPU": 0.5}


@contextlib.contextmanager
def paused(pids: list[int]) -> Iterator[None]:
    """The processes `pids` stopped (SIGSTOP) inside the block, continued after it."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def lose_a_node_mid_run(tmp_path, cluster, algo, steps, chunks) -> tuple[dict, dict, str]:
    """Start a 2-actor run; once both actors have logged their nodes and the run has logged a chunk, remove a worker
    node that runs one of them, and pause the other actor until the lost one's replacement has delivered. Returns
    (summary, {(actor, incarnation): node}, the lost node's id)."""
    cluster.restore()  # (after an earlier test's loss)
    run = Run(tmp_path, cluster, algo, steps, chunks)
    try:
        run.wait_for(lambda: len(run.nodes()) == 2 and run.rows() >= 1)
        first = run.nodes()
        assert len(set(first.values())) == 2, first  # spread: one actor per node while actors <= nodes
        lost = next(node for node in first.values() if node != cluster.head_id)
        survivors = [pid for node in set(first.values()) - {lost} for pid in cluster.actor_pids(node)]
        assert survivors, first
        cluster.remove(lost)
        print(f"\nnode lost after {time.perf_counter() - run.start:.0f} s")
        # The surviving actor paused until the replacement has delivered a fragment: otherwise, on a loaded
        # machine, the survivor alone could finish the run before the replacement has started.
        with paused(survivors):
            run.wait_for(lambda: any(place[1] >= 1 for place in run.nodes()))
        print(f"replacement's first fragment after {time.perf_counter() - run.start:.0f} s")
        summary = run.finish()
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
    return summary, run.nodes(), lost


def check_survived(summary: dict, nodes: dict, lost: str) -> None:
    assert summary["nodes_lost"] == 1 and summary["actor_restarts"] >= 1, summary
    assert summary["fragments_lost"] >= 1, summary  # the lost actor's requests in flight: dropped, counted
    assert summary["version_order_violations"] == 0, summary
    replacements = {place: node for place, node in nodes.items() if place[1] >= 1}
    assert replacements and lost not in replacements.values(), nodes  # re-created, on surviving nodes
    assert summary["actor_nodes"] == len(set(nodes.values())) >= 3, (summary, nodes)


def test_apex_dqn_actors_spread_over_nodes_and_survive_a_lost_node(tmp_path, cluster):
    summary, nodes, lost = lose_a_node_mid_run(tmp_path, cluster, DQN, steps=10_000, chunks=40)
    check_survived(summary, nodes, lost)


def test_ppo_survives_a_lost_node(tmp_path, cluster):
    summary, nodes, lost = lose_a_node_mid_run(tmp_path, cluster, PPO, steps=20_000, chunks=40)
    check_survived(summary, nodes, lost)


def test_actors_per_node_reserves_k_per_node():
    assert Placement().bundles(3) == ([{"CPU": 1.0}] * 3, "SPREAD")
    assert Placement(2).bundles(5) == ([{"CPU": 2.0}, {"CPU": 2.0}, {"CPU": 1.0}], "STRICT_SPREAD")
    assert [Placement(2).bundle(i) for i in range(5)] == [0, 0, 1, 1, 2]
    with pytest.raises(ConfigError, match="actors_per_node=2 is not allowed: needs --ray-address"):
        RunConfig(env="gym:CartPole-v1", actors=4, actors_per_node=2).validate()

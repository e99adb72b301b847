"""The actor-learner on several Ray nodes (issue 35 item 6): env steps/s with the actors on 1 and on 2 worker nodes
of a local cluster, and the learner's ingest capacity with synthetic actors.

    .venv/bin/python benchmarks/ray_nodes.py [--algos dqn,ppo] [--steps 40000] [--ingest-steps 100000] [--json OUT]

1. Nodes: a loopback cluster (`tests/ray_cluster.py`: a head with no CPU for actors, where the learner runs in the
   driver, and two worker nodes of 2 CPUs), then `sparqrl train ALGO --env gym:CartPole-v1 --actors 2 --ray-address
   CLUSTER` three times: `--actors-per-node 2` (both actors on one worker node), spread (one actor on each), and
   spread with the learner on a worker node (`--learner-resources node_b=1`: what moving it costs). Every node
   is a process tree on this one machine, so the machine's cores bound both figures: the comparison shows what
   placement costs (the object transfers between nodes' stores), not what a second machine would add.
2. Ingest: the learner of `sparqrl train ALGO --env gym:CartPole-v1` in this process, its actors replaced by a pool
   that hands it the same real fragment again and again (collected once; no environment, no acting): the fragments
   per second one learner takes, publishing every version as in a run. Divided by one actor's env steps/s (its
   `actor_steps_per_s`, from the spread run of part 1), it says how many actors of that speed one learner feeds.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the loopback cluster of the tests

from ray_cluster import joining_env, local_cluster  # noqa: E402

ENV = "gym:CartPole-v1"
COMMON = ["--env", ENV, "--eval-every", "0", "--eval-episodes", "1", "--checkpoint-every", "1000", "--no-progress",
          "--no-energy", "--seed", "0"]


def cluster_run(algo: str, steps: int, address: str, per_node: int | None, out: Path, learner: str | None = None
                ) -> dict:
    """`sparqrl train` on the cluster at `address` with 2 actors, in its own process (the learner in it, or placed
    by `--learner-resources learner`): its summary."""
    argv = ["train", algo, *COMMON, "--actors", "2", "--ray-address", address, "--steps", str(steps),
            "--out", str(out)] + ([] if per_node is None else ["--actors-per-node", str(per_node)]) + (
            [] if learner is None else ["--learner-resources", learner])
    done = subprocess.run([str(Path(sys.executable).with_name("sparqrl")), *argv], env=joining_env(),
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"sparqrl {' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    return json.loads((out / "summary.json").read_text())


class SyntheticPool:
    """A pool that hands the learner one real fragment (collected once by an in-process actor) again and again, as
    the newest version, so that the learner's loop runs at its own speed with no environment behind it."""

    backend = "synthetic"

    def __init__(self, inner):
        self.inner, self.fragment, self.version = inner, None, 0
        self.sequence = itertools.count()
        self.restarts, self.failures, self.requests_lost, self.actor_nodes = 0, [], 0, {}

    def publish(self, copy):
        self.version = copy.version
        return self.inner.publish(copy)

    def submit(self, actor_id, copy) -> None:
        if self.fragment is None:
            self.inner.submit(actor_id, copy)

    def next(self):
        if self.fragment is None:
            self.fragment = self.inner.next()
        return self.fragment._replace(version=self.version, sequence=next(self.sequence))

    def nodes_lost(self) -> int:
        return 0

    def close(self) -> None:
        self.inner.close()


def ingest(algo: str, steps: int, out: Path) -> dict:
    """The learner of `sparqrl train ALGO` fed by `SyntheticPool`: fragments/s (compilation excluded) and the
    fragment's env steps."""
    from sparqrl.cli import main
    from sparqrl.runners import sebulba

    real = sebulba.make_pool
    sebulba.make_pool = lambda *args, **kwargs: SyntheticPool(real(*args, **kwargs))
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # (the summary, read from the folder below)
            code = main(["train", algo, *COMMON, "--backend", "inline", "--steps", str(steps), "--out", str(out)])
    finally:
        sebulba.make_pool = real
    if code != 0:
        raise SystemExit(f"the {algo} ingest run failed ({code})")
    summary = json.loads((out / "summary.json").read_text())
    config = json.loads((out / "config.json").read_text())["config"]
    fragment_env_steps = summary["fragment_steps"] * config["num_envs"]
    return {"fragments_per_s": summary["env_steps_per_s"] / fragment_env_steps,
            "fragment_env_steps": fragment_env_steps, "env_steps_per_s": summary["env_steps_per_s"],
            "learner_updates_per_s": summary["learner_updates_per_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", default="dqn,ppo")
    parser.add_argument("--steps", type=int, default=40_000, help="env steps of each cluster run")
    parser.add_argument("--ingest-steps", type=int, default=100_000, help="env steps of each ingest run (0: none)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    algos = args.algos.split(",")
    rows = {algo: {} for algo in algos}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        with local_cluster(cpus=2, head_cpus=0) as cluster:
            for algo in algos:
                for label, per_node, learner in (("1 node", 2, None), ("2 nodes", None, None),
                                                 ("2 nodes, learner on node_b", None, "node_b=1")):
                    summary = cluster_run(algo, args.steps, cluster.address, per_node,
                                          Path(tmp) / f"{algo}-{per_node}-{learner}", learner)
                    rows[algo][label] = {k: summary[k] for k in ("env_steps_per_s", "actor_steps_per_s", "actor_nodes",
                                                                 "learner_wait_s", "wall_time_s")}
                    print(f"{algo}, 2 actors on {summary['actor_nodes']} node(s) ({label}): "
                          f"{summary['env_steps_per_s']:,.0f} env steps/s, each actor "
                          f"{summary['actor_steps_per_s']:,.0f} while acting, learner waited "
                          f"{summary['learner_wait_s']:.1f} s", flush=True)
        for algo in algos if args.ingest_steps else ():
            row = rows[algo]["ingest"] = ingest(algo, args.ingest_steps, Path(tmp) / f"{algo}-ingest")
            actor = rows[algo]["2 nodes"]["actor_steps_per_s"]
            row["actors_fed"] = row["env_steps_per_s"] / actor
            print(f"{algo} learner with synthetic actors: {row['fragments_per_s']:,.1f} fragments/s of "
                  f"{row['fragment_env_steps']} env steps = {row['env_steps_per_s']:,.0f} env steps/s: feeds "
                  f"{row['actors_fed']:.1f} actors of {actor:,.0f} env steps/s each", flush=True)
    print(f"{os.cpu_count()} cores, 1-min load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()

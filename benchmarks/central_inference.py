"""Actor-side against central inference (SEED RL): env steps per second of acting alone, same machine.

    .venv/bin/python benchmarks/central_inference.py [--env gym:HalfCheetah-v5] [--fragments 10] [--json OUT]

For each policy size (PPO's 64-64 MLP, and ActorQ's 3 x 2048 MLP), each actor count (1, 2) and each
layout, a pool of Ray actors (one process and one thread each; central: plus the inference server process)
collects `--fragments` fragments per actor of T = 50 steps of one environment, with one fp32 policy copy
published before (no learner: only acting is timed). The first fragment of every actor is a warm-up
(compilation, session builds) and is not timed. The figure is env steps of all actors per second of wall
time; the ratio is central over actor-side. On a GPU machine the server runs on the GPU (the same command).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax

from sparqrl.algos import ppo
from sparqrl.envs import host_spec
from sparqrl.runners.actors import ActorSpec, RayPool, network_paths, quantized_copy, ray_session

SIZES = {"64x2": (64, 64), "2048x3": (2048, 2048, 2048)}
T = 50


def measure(env: str, hidden: tuple[int, ...], actors: int, inference: str, fragments: int) -> float:
    spec_env = host_spec(env)
    config = ppo.Config(num_envs=1, num_steps=T, num_minibatches=1, total_timesteps=T, hidden=hidden).validate(spec_env)
    spec = ActorSpec("ppo", config, env, 1, actors, T, seed=0, inference=inference)
    al = ppo.make_actor_learner(config, spec_env)
    learner = jax.jit(jax.vmap(al.init))(jax.random.split(jax.random.PRNGKey(0), 1))
    policy = jax.device_get(jax.vmap(al.policy)(learner))
    paths = network_paths(al.acting, policy, spec_env.observation_shape)
    copy = quantized_copy(0, policy, al.acting, paths, "fp32", "channel", 0)._replace(params=policy)
    pool = RayPool(spec)
    try:
        ref = pool.publish(copy)
        for actor_id in range(actors):  # warm-up
            pool.submit(actor_id, ref)
        for _ in range(actors):
            pool.next()
        start = time.perf_counter()
        for actor_id in range(actors):
            pool.submit(actor_id, ref)
        done = 0
        while done < actors * fragments:
            frag = pool.next()
            done += 1
            if done + actors <= actors * fragments:
                pool.submit(frag.actor_id, ref)
        return actors * fragments * T / (time.perf_counter() - start)
    finally:
        pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="gym:HalfCheetah-v5")
    parser.add_argument("--fragments", type=int, default=10, help="timed fragments per actor")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = []
    with ray_session(None, 3):  # two actors and the server
        for size, hidden in SIZES.items():
            for actors in (1, 2):
                rates = {inference: measure(args.env, hidden, actors, inference, args.fragments)
                         for inference in ("actor", "central")}
                rows.append({"size": size, "actors": actors, **rates, "ratio": rates["central"] / rates["actor"]})
                print(f"{args.env} policy {size}, {actors} actor(s): actor-side {rates['actor']:.0f} env steps/s, "
                      f"central {rates['central']:.0f} env steps/s, central / actor-side {rows[-1]['ratio']:.2f}x",
                      flush=True)
    print(f"device: {jax.devices()[0].device_kind}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()

"""Actor-side against central inference (SEED RL): env steps per second of acting alone, same machine.

    .venv/bin/python benchmarks/central_inference.py [--env gym:HalfCheetah-v5] [--sizes 64x2,2048x3]
        [--precisions fp32] [--num-envs 1] [--fragments 10] [--json OUT]
    .venv/bin/python benchmarks/central_inference.py --env gym:ALE/Breakout-v5 --sizes nature \
        --precisions fp32,int8 --num-envs 8 --fragments 5          # Atari: the Nature CNN, fp32 and int8 actors

For each policy size (PPO's 64-64 MLP, ActorQ's 3 x 2048 MLP, or the Nature CNN with its 512-unit layer for
image observations), each actor count (1, 2) and each layout, a pool of Ray actors (one process and one thread
each; central: plus the inference server process) collects `--fragments` fragments per actor of T = 50 steps
of `--num-envs` environments, with one policy copy published before (no learner: only acting is timed).
Actor-side inference runs each of `--precisions` (the central server always runs fp32). The first fragment of
every actor is a warm-up (compilation, session builds) and is not timed. The figure is env steps of all
actors per second of wall time; the ratio is central over actor-side in the first precision. On a GPU machine the server runs
on the GPU (the same command).
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

SIZES = {"64x2": (64, 64), "2048x3": (2048, 2048, 2048), "nature": (512,)}  # nature: on image observations
T = 50


def measure(env: str, hidden: tuple[int, ...], actors: int, inference: str, fragments: int, precision: str = "fp32",
            num_envs: int = 1) -> float:
    spec_env = host_spec(env)
    config = ppo.Config(num_envs=num_envs, num_steps=T, num_minibatches=1, total_timesteps=T * num_envs,
                        hidden=hidden, activation="relu" if len(spec_env.observation_shape) == 3 else "tanh"
                        ).validate(spec_env)
    spec = ActorSpec("ppo", config, env, 1, actors, T, seed=0, inference=inference)
    al = ppo.make_actor_learner(config, spec_env)
    learner = jax.jit(jax.vmap(al.init))(jax.random.split(jax.random.PRNGKey(0), 1))
    policy = jax.device_get(jax.vmap(al.policy)(learner))
    paths = network_paths(al.acting, policy, spec_env.observation_shape)
    copy = quantized_copy(0, policy, al.acting, paths, precision, "channel", 0)._replace(params=policy)
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
        return actors * fragments * T * num_envs / (time.perf_counter() - start)
    finally:
        pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="gym:HalfCheetah-v5")
    parser.add_argument("--sizes", default="64x2,2048x3", help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--precisions", default="fp32", help="actor-side precisions, comma-separated (fp32, int8, ...)")
    parser.add_argument("--num-envs", type=int, default=1, help="environments per actor")
    parser.add_argument("--fragments", type=int, default=10, help="timed fragments per actor")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    precisions = args.precisions.split(",")
    rows = []
    with ray_session(None, 3):  # two actors and the server
        for size in args.sizes.split(","):
            for actors in (1, 2):
                rates = {f"actor-{p}": measure(args.env, SIZES[size], actors, "actor", args.fragments, p, args.num_envs)
                         for p in precisions}
                rates["central"] = measure(args.env, SIZES[size], actors, "central", args.fragments, "fp32",
                                           args.num_envs)
                rows.append({"size": size, "actors": actors, "num_envs": args.num_envs, **rates,
                             "ratio": rates["central"] / rates[f"actor-{precisions[0]}"]})
                figures = ", ".join(f"{name} {rate:.0f}" for name, rate in rates.items())
                print(f"{args.env} policy {size}, {actors} actor(s) x {args.num_envs} envs: {figures} env steps/s; "
                      f"central / actor-side {precisions[0]} {rows[-1]['ratio']:.2f}x", flush=True)
    print(f"device: {jax.devices()[0].device_kind}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()

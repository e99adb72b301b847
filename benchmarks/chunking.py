"""Cost of chunking: the runner's host loop over jitted chunks vs one jitted program for the whole run.

Both run PPO on CartPole-v1 with the same config and seeds in this process; compilation is excluded
from both (ahead-of-time compiled first). Goal (DESIGN.md): chunking costs under 5 % of throughput.

    .venv/bin/python benchmarks/chunking.py [--steps 500000] [--seeds 1] [--chunks 50] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

from sparqrl.algos import ppo
from sparqrl.algos.base import make_train_fn
from sparqrl.envs import make_env
from sparqrl.runners.anakin import chunk_bounds, chunk_program


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500_000)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--chunks", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    env = make_env("CartPole-v1")
    config = ppo.Config(total_timesteps=args.steps)
    config.validate(env)
    algo = ppo.make_algorithm(config, env)
    keys = jax.random.split(jax.random.PRNGKey(0), args.seeds)

    whole = jax.jit(jax.vmap(make_train_fn(algo))).lower(keys).compile()
    init = jax.jit(jax.vmap(algo.init)).lower(keys).compile()
    abstract = jax.eval_shape(jax.vmap(algo.init), keys)
    chunk = jax.jit(chunk_program(algo)).lower(abstract, jnp.int32(1)).compile()
    bounds = chunk_bounds(algo.num_updates, args.chunks)

    def run_whole() -> float:
        start = time.perf_counter()
        jax.block_until_ready(whole(keys))
        return time.perf_counter() - start

    def run_chunked() -> float:
        start = time.perf_counter()
        state, done = init(keys), 0
        for bound in bounds:
            state, metrics = chunk(state, jnp.int32(bound - done))
            jax.device_get(metrics)  # the host reads the metrics every chunk, as the runner does
            done = bound
        jax.block_until_ready(state)
        return time.perf_counter() - start

    # interleave the two so machine noise hits both alike; keep the best of each
    t_whole, t_chunked = [], []
    for _ in range(args.repeats):
        t_whole.append(run_whole())
        t_chunked.append(run_chunked())
    best_whole, best_chunked = min(t_whole), min(t_chunked)
    steps = algo.num_updates * algo.env_steps_per_update * args.seeds
    overhead = best_chunked / best_whole - 1
    print(f"device: {jax.devices()[0].device_kind} x{jax.device_count()}")
    print(f"PPO CartPole-v1, {steps // args.seeds} steps x {args.seeds} seed(s), {len(bounds)} chunks")
    print(f"one program : {best_whole:7.3f} s  {steps / best_whole:12,.0f} env steps/s   (runs: {[round(t, 3) for t in t_whole]})")
    print(f"chunked     : {best_chunked:7.3f} s  {steps / best_chunked:12,.0f} env steps/s   (runs: {[round(t, 3) for t in t_chunked]})")
    print(f"chunking overhead: {100 * overhead:+.1f} %  (goal < 5 %: {'PASS' if overhead < 0.05 else 'MISS'})")


if __name__ == "__main__":
    main()

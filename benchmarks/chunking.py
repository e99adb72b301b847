"""Cost of the runner: `sparqrl train` (host loop over jitted chunks, with logging, progress,
checkpoints and the final evaluation) vs the whole run as one jitted program with no output at all.

Both run PPO on CartPole-v1 with the same config and seeds in this process, interleaved, best of
`--repeats`; compilation is excluded from both. Goal (DESIGN.md): chunking costs under 5 % of
throughput.

    .venv/bin/python benchmarks/chunking.py [--steps 500000] [--seeds 1] [--chunks 50] [--repeats 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import jax

from sparqrl.algos import ppo
from sparqrl.algos.base import make_train_fn
from sparqrl.envs import make_env
from sparqrl.runners import RunConfig, train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500_000)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--chunks", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    env = make_env("CartPole-v1")
    config = ppo.Config(total_timesteps=args.steps)
    algo = ppo.make_algorithm(config, env)
    keys = jax.random.split(jax.random.PRNGKey(0), args.seeds)
    whole = jax.jit(jax.vmap(make_train_fn(algo))).lower(keys).compile()

    def run_whole() -> float:
        start = time.perf_counter()
        jax.block_until_ready(whole(keys))
        return time.perf_counter() - start

    def run_runner() -> float:
        with tempfile.TemporaryDirectory() as out:
            run = RunConfig(seeds=args.seeds, out=out, chunks=args.chunks, eval_every=0,
                            checkpoint_every=args.chunks, progress=False, overwrite=True)
            summary = train("ppo", config, run)
        return summary["wall_time_s"] - summary["compile_time_s"]

    # interleave the two so machine noise hits both alike; keep the best of each
    t_whole, t_runner = [], []
    for _ in range(args.repeats):
        t_whole.append(run_whole())
        t_runner.append(run_runner())
    best_whole, best_runner = min(t_whole), min(t_runner)
    steps = algo.num_updates * algo.env_steps_per_update * args.seeds
    overhead = best_runner / best_whole - 1
    print(f"device: {jax.devices()[0].device_kind} x{jax.device_count()}")
    print(f"PPO CartPole-v1, {steps // args.seeds} steps x {args.seeds} seed(s), {args.chunks} chunks")
    print(f"one program, no output : {best_whole:7.3f} s {steps / best_whole:12,.0f} env steps/s  runs {[round(t, 3) for t in t_whole]}")
    print(f"runner (sparqrl train) : {best_runner:7.3f} s {steps / best_runner:12,.0f} env steps/s  runs {[round(t, 3) for t in t_runner]}")
    print(f"runner overhead: {100 * overhead:+.1f} %  (goal < 5 %: {'PASS' if overhead < 0.05 else 'MISS'})")


if __name__ == "__main__":
    main()

"""Cost of chunking: `sparqrl train` with the default 50 chunks vs with 1 chunk, and both vs the whole
run as one jitted program with no output at all.

All three run PPO on CartPole-v1 with the same config and seeds in this process, interleaved, best of
`--repeats`; compilation is excluded. The runner's time (its wall time minus compilation) includes
init, the final evaluation and the final checkpoint, which cost the same with 1 chunk and with 50, so
the 50-vs-1 ratio is the cost of chunking itself (the host loop between chunks: metrics, logging,
progress). Goal (issue 11, DESIGN.md): 50 chunks within 5 % of 1 chunk.

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

    def run_runner(chunks: int) -> float:
        with tempfile.TemporaryDirectory() as out:
            run = RunConfig(seeds=args.seeds, out=out, chunks=chunks, eval_every=0, checkpoint_every=chunks,
                            progress=False, overwrite=True)
            summary = train("ppo", config, run)
        return summary["wall_time_s"] - summary["compile_time_s"]

    # interleave the three so machine noise hits all alike; keep the best of each
    times: dict[str, list[float]] = {"one program, no output": [], "runner, 1 chunk": [],
                                     f"runner, {args.chunks} chunks": []}
    for _ in range(args.repeats):
        for label, fn in zip(times, (run_whole, lambda: run_runner(1), lambda: run_runner(args.chunks))):
            times[label].append(fn())
    best = {label: min(ts) for label, ts in times.items()}
    steps = algo.num_updates * algo.env_steps_per_update * args.seeds
    print(f"device: {jax.devices()[0].device_kind} x{jax.device_count()}")
    print(f"PPO CartPole-v1, {steps // args.seeds} steps x {args.seeds} seed(s); runner: energy on (the default), "
          "checkpoint at the end")
    for label, ts in times.items():
        print(f"{label:24}: {best[label]:7.3f} s {steps / best[label]:12,.0f} env steps/s  runs {[round(t, 3) for t in ts]}")
    whole, one, many = best.values()
    chunking = many / one - 1
    print(f"{args.chunks} chunks vs 1 chunk: {100 * chunking:+.1f} %  (goal < 5 %: {'PASS' if chunking < 0.05 else 'MISS'})")
    print(f"runner ({args.chunks} chunks) vs one program: {100 * (many / whole - 1):+.1f} %")


if __name__ == "__main__":
    main()

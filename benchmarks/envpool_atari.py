"""Atari env steps/s: EnvPool (`--env-backend envpool`) against Gymnasium's vector env (the default), both
through `envpool_env.make_vec_env` with sparqrl's Atari preprocessing and training wrappers, as an actor steps them.

Random actions (drawn before timing), alternating rounds, the median ratio printed. EnvPool's thread pool uses
every core; Gymnasium's `SyncVectorEnv` steps its envs one after another in this process.

    .venv/bin/python benchmarks/envpool_atari.py --envs 8,32 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from sparqrl.envs.envpool_env import make_vec_env

BACKENDS = ("gymnasium", "envpool")


def steps_per_s(env_name: str, backend: str, num_envs: int, steps: int, warmup: int = 100) -> float:
    env = make_vec_env(env_name, num_envs, training=True, backend=backend)
    try:
        env.reset(0)
        actions = np.random.default_rng(0).integers(0, env.spec.action_space.n, (warmup + steps, num_envs))
        for t in range(warmup):
            env.step(actions[t])
        start = time.perf_counter()
        for t in range(warmup, warmup + steps):
            env.step(actions[t])
        return steps * num_envs / (time.perf_counter() - start)
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="gym:ALE/Breakout-v5")
    parser.add_argument("--envs", default="8,32", help="comma-separated env counts")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1_000, help="timed steps of all envs per round")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results = {}
    for n in (int(x) for x in args.envs.split(",")):
        rates: dict[str, list[float]] = {b: [] for b in BACKENDS}
        for _ in range(args.rounds):
            for backend in BACKENDS:
                rates[backend].append(steps_per_s(args.env, backend, n, args.steps))
        ratio = statistics.median(e / g for e, g in zip(rates["envpool"], rates["gymnasium"]))
        results[n] = {**{b: statistics.median(r) for b, r in rates.items()}, "ratio": ratio}
        print(f"{args.env} {n} envs: gymnasium {results[n]['gymnasium']:,.0f} env steps/s, envpool "
              f"{results[n]['envpool']:,.0f}: envpool/gymnasium {ratio:.2f}x (median of {args.rounds} rounds)",
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

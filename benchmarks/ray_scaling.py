"""Ray actors from 1 to N on one machine: env steps per second of whole runs (PPO or IMPALA on a host env).

    .venv/bin/python benchmarks/ray_scaling.py [--algo ppo] [--env gym:CartPole-v1] [--steps 100000]
                                               [--actors 1,2,4] [--json OUT]

Each actor count runs `sparqrl train ALGO --backend ray --actors K` in a fresh process with the algorithm's
defaults (`benchmarks/impala_vs_ppo_host.run`); the figures are the run's env steps/s (compilation excluded),
its actors' own rate (env steps per second of acting, waiting excluded) and the speed-up over one actor. The
reference point is Sample Factory's single-machine figure (reference §6: "higher than 10^5 environment
frames/second", Petrenko et al. 2020, on a 36-core machine with a GPU; Atari frames are 4 per env step).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from impala_vs_ppo_host import run  # noqa: E402 (benchmarks/ is this script's folder)

SAMPLE_FACTORY_FRAMES_PER_S = 1e5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", default="ppo", choices=("ppo", "impala"))
    parser.add_argument("--env", default="gym:CartPole-v1")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--actors", default="1,2,4", help="comma-separated actor counts")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = []
    for actors in (int(a) for a in args.actors.split(",")):
        row = {"actors": actors, **run(args.algo, args.env, args.steps, actors)}
        row["speedup"] = row["env_steps_per_s"] / rows[0]["env_steps_per_s"] if rows else 1.0
        rows.append(row)
        print(f"{args.algo} {args.env}, {actors} Ray actor(s): {row['env_steps_per_s']:,.0f} env steps/s "
              f"({row['speedup']:.2f}x one actor), actors {row['actor_steps_per_s']:,.0f} while acting, return "
              f"{row['final_return_mean']:.1f}", flush=True)
    frames = 4 if "ALE/" in args.env else 1
    best = max(row["env_steps_per_s"] for row in rows) * frames
    print(f"{os.cpu_count()} cores; best {best:,.0f} env frames/s = {best / SAMPLE_FACTORY_FRAMES_PER_S:.3f}x Sample "
          "Factory's 10^5 (36 cores and a GPU)")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()

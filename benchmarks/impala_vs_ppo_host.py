"""IMPALA against PPO on the same host actors: env steps per second of whole runs, same machine.

    .venv/bin/python benchmarks/impala_vs_ppo_host.py [--env gym:CartPole-v1] [--steps 100000] [--actors 2]
                                                      [--rounds 3] [--json OUT]

Each round runs `sparqrl train ppo` and then `sparqrl train impala` with their default configs, `--actors`
Ray actors (`--backend ray`) and `--steps` env steps, each in a fresh process; the figure is the run's
`env_steps_per_s` (compilation excluded, acting and learning included) and its final return. The medians over
the rounds are compared: the goal (issue 14) is IMPALA >= 1.0x PPO's env steps/s on the same actors.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ALGOS = ("ppo", "impala")


def run(algo: str, env: str, steps: int, actors: int, backend: str = "ray") -> dict:
    """One `sparqrl train` in a fresh process: its summary's throughput fields and final return."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "sparqrl.cli", "train", algo, "--env", env, "--steps", str(steps),
               "--actors", str(actors), "--backend", backend, "--out", tmp, "--overwrite", "--no-progress",
               "--no-energy", "--eval-episodes", "10"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{algo} failed:\n{proc.stderr[-3000:]}")
        summary = json.loads((Path(tmp) / "summary.json").read_text())
    return {k: summary[k] for k in ("env_steps_per_s", "final_return_mean", "actor_steps_per_s",
                                    "learner_updates_per_s", "versions_published", "fragment_steps", "wall_time_s")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="gym:CartPole-v1")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results: dict[str, list[dict]] = {algo: [] for algo in ALGOS}
    for r in range(args.rounds):
        for algo in ALGOS:  # alternating, so that machine noise hits both alike
            results[algo].append(run(algo, args.env, args.steps, args.actors))
            row = results[algo][-1]
            print(f"round {r + 1} {algo}: {row['env_steps_per_s']:,.0f} env steps/s, return "
                  f"{row['final_return_mean']:.1f} (T = {row['fragment_steps']}, {row['versions_published']} "
                  "versions)", flush=True)
    median = {algo: statistics.median(row["env_steps_per_s"] for row in rows) for algo, rows in results.items()}
    ratio = median["impala"] / median["ppo"]
    print(f"{args.env}, {args.actors} Ray actors, {args.steps:,} steps: median env steps/s PPO {median['ppo']:,.0f}, "
          f"IMPALA {median['impala']:,.0f}; IMPALA / PPO {ratio:.2f}x [{'PASS' if ratio >= 1.0 else 'MISS'} >= 1.0x]")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": results, "ratio": ratio}, indent=2))


if __name__ == "__main__":
    main()

"""A sweep's wall time on 1 and 2 Ray workers against the single-process sweep (issue 35 item 6).

    .venv/bin/python benchmarks/sweep_workers.py [--steps 50000] [--settings 4] [--seeds 2] [--workers 1,2]

The same `sparqrl sweep ppo --env CartPole-v1 --grid lr=...` (settings x seeds) run in this process's Python, each
in its own process: without workers, then with `--workers N` (a local Ray instance on loopback, each worker a
contiguous slice of the settings), all with --no-compile-cache so that each compiles its own programs (else a
later run loads the earlier one's). Reported per run: the command's whole time (Python start, Ray start, every
compilation: what a user waits), summary.json's wall_time_s and compile_time_s, and whether sweep.csv equals the
single-process run's. Each worker is a process with its own XLA threads: on a machine with fewer cores than
workers x XLA's threads, a second worker only shares the same cores (the figure says what the split costs there).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def sweep(out: Path, steps: int, settings: int, seeds: int, workers: int | None) -> dict:
    """One `sparqrl sweep` in its own process: its summary, the command's time and its sweep.csv."""
    lrs = ",".join(f"{1e-4 * 3 ** i:.4g}" for i in range(settings))
    argv = ["sweep", "ppo", "--env", "CartPole-v1", "--grid", f"lr={lrs}", "--seeds", str(seeds), "--steps",
            str(steps), "--eval-episodes", "10", "--no-compile-cache", "--no-progress", "--no-energy",
            "--out", str(out)]
    argv += [] if workers is None else ["--workers", str(workers)]
    start = time.perf_counter()
    done = subprocess.run([str(Path(sys.executable).with_name("sparqrl")), *argv], capture_output=True, text=True)
    command_s = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"sparqrl {' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"workers": workers, "command_s": command_s, "wall_time_s": summary["wall_time_s"],
            "compile_time_s": summary["compile_time_s"], "csv": (out / "sweep.csv").read_text()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50_000, help="env steps per member")
    parser.add_argument("--settings", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--workers", default="1,2", help="worker counts to run besides the single-process sweep")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [sweep(Path(tmp) / f"w{w}", args.steps, args.settings, args.seeds, w)
                for w in [None, *map(int, args.workers.split(","))]]
    base = runs[0]
    print(f"PPO CartPole-v1 sweep, {args.settings} settings x {args.seeds} seeds x {args.steps:,} env steps")
    print("| workers | command s | wall_time_s | compile_time_s | command vs single process | sweep.csv equal |")
    print("|---|---:|---:|---:|---:|---|")
    for run in runs:
        print(f"| {run['workers'] or 'none (one process)'} | {run['command_s']:.1f} | {run['wall_time_s']:.1f} | "
              f"{run['compile_time_s']:.1f} | {run['command_s'] / base['command_s']:.2f}x | "
              f"{run['csv'] == base['csv']} |")


if __name__ == "__main__":
    main()

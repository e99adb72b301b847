"""How fast the README's quick start starts: the `sparqrl` command, as a user runs it, without a terminal.

Runs `sparqrl train ppo --env CartPole-v1 --steps STEPS --seeds SEEDS` twice in fresh processes with
stdout a pipe (so progress is printed as complete lines): first with an empty cache folder (cold: every
program traced and compiled), then again (warm: the traced programs and XLA's compiled ones come from
`$XDG_CACHE_HOME/sparqrl`). For each it prints the seconds from the command's start to its first
progress line, the command's whole wall time, and summary.json's compile_time_s and env_steps_per_s.
Goals (issue 11, item 3): the first progress line within 10 s; a warm compile under 1 s.

    .venv/bin/python benchmarks/startup.py [--steps 500000] [--seeds 4] [--repeats 1] [--no-energy]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPARQRL = Path(sys.executable).with_name("sparqrl")


def one_run(cache: Path, out: Path, steps: int, seeds: int, extra: list[str]) -> dict:
    command = [str(SPARQRL), "train", "ppo", "--env", "CartPole-v1", "--steps", str(steps), "--seeds", str(seeds),
               "--out", str(out), "--overwrite", *extra]
    env = {"XDG_CACHE_HOME": str(cache), "PATH": "/usr/bin:/bin", "HOME": str(cache)}
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    first_line = None
    for line in proc.stdout:
        if first_line is None and "env steps" in line:
            first_line = time.perf_counter() - start
    proc.wait()
    wall = time.perf_counter() - start
    if proc.returncode:
        sys.exit(f"{' '.join(command)} failed with exit code {proc.returncode}")
    summary = json.loads((out / "summary.json").read_text())
    return {"first_progress_line_s": first_line, "command_wall_s": wall, "compile_time_s": summary["compile_time_s"],
            "env_steps_per_s": summary["env_steps_per_s"], "programs_loaded": summary["programs_loaded"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500_000)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1, help="cold + warm pairs, each in a new cache folder")
    parser.add_argument("--no-energy", action="store_true", help="pass --no-energy (codecarbon off)")
    args = parser.parse_args()
    print(f"sparqrl train ppo --env CartPole-v1 --steps {args.steps} --seeds {args.seeds}"
          f"{' --no-energy' if args.no_energy else ''} (stdout a pipe)")
    print(f"{'':5} {'first line s':>12} {'command s':>10} {'compile s':>10} {'programs loaded':>16} {'env steps/s':>12}")
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as folder:
            cache, out = Path(folder) / "cache", Path(folder) / "run"
            for label in ("cold", "warm"):
                r = one_run(cache, out, args.steps, args.seeds, ["--no-energy"] if args.no_energy else [])
                print(f"{label:5} {r['first_progress_line_s']:12.2f} {r['command_wall_s']:10.2f} "
                      f"{r['compile_time_s']:10.2f} {r['programs_loaded']:>13} of 3 {r['env_steps_per_s']:12,.0f}",
                      flush=True)


if __name__ == "__main__":
    main()

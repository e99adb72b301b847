"""Seeds over a CPU's cores: PPO CartPole-v1 with K seeds on 1 CPU device vs on one device per core.

Each configuration is the `sparqrl train` command in its own process (the device count is fixed before
JAX is imported, with XLA_FLAGS), interleaved 1 / N devices, best of `--repeats`; the figure is
summary.json's env_steps_per_s (all seeds, compilation excluded). The command's automatic choice
(`sparqrl.devices.cpu_devices_for`) is printed beside the measurement it should agree with.

    .venv/bin/python benchmarks/seed_spread.py [--seeds 1,8,16,64] [--steps 100000] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from sparqrl.devices import FLAG, cpu_devices_for


def run(seeds: int, devices: int, steps: int, out: Path) -> float:
    env = {**os.environ, "XLA_FLAGS": f"{FLAG}={devices}", "JAX_PLATFORMS": "cpu"}
    cmd = [str(Path(sys.executable).with_name("sparqrl")), "train", "ppo", "--seeds", str(seeds), "--steps", str(steps),
           "--eval-episodes", "2", "--no-progress", "--no-energy", "--no-compile-cache", "--out", str(out),
           "--overwrite"]
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    return json.loads((out / "summary.json").read_text())["env_steps_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,8,16,64")
    parser.add_argument("--steps", type=int, default=100_000, help="env steps per seed")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seeds in (int(s) for s in args.seeds.split(",")):
            spread = max(d for d in range(1, cores + 1) if seeds % d == 0)
            best = {1: 0.0, spread: 0.0}
            for _ in range(args.repeats):
                for devices in best:
                    best[devices] = max(best[devices], run(seeds, devices, args.steps, Path(tmp) / "run"))
            rows.append({"seeds": seeds, "devices": spread, "one_device_sps": best[1], "spread_sps": best[spread],
                         "ratio": best[spread] / best[1], "auto_devices": cpu_devices_for(seeds, cores)})
    print(f"PPO CartPole-v1, {args.steps:,} env steps per seed, {cores} cores, best of {args.repeats}")
    print(f"{'seeds':>6} {'1 device':>12} {'spread':>18} {'ratio':>7} {'auto':>6}")
    for r in rows:
        print(f"{r['seeds']:>6} {r['one_device_sps']:>12,.0f} {r['spread_sps']:>12,.0f} on {r['devices']:<2} "
              f"{r['ratio']:>6.2f}x {r['auto_devices']:>6}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()

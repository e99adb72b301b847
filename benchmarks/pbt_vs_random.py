"""PBT pays its way? (issue 36 item 5): at an equal total env-step budget, `sparqrl pbt`'s best member against
the best setting of `sparqrl sweep --random` over the same fields and ranges, per seed.

Per seed S, two processes (one after the other, so they never share the CPU with each other):

    sparqrl pbt ALGO --env ENV --steps STEPS --population P --fields F1,F2 --range F1=LO:HI ... --seed S
    sparqrl sweep ALGO --env ENV --steps STEPS --random F1=log:LO:HI ... --samples P --seed S

Both spend P x STEPS env steps and start from the same P settings (PBT's first population is drawn as the sweep
draws its settings: interval 0 of pbt.csv equals sweep.csv). PBT's interval is `--interval` updates (default: a
tenth of the run). Each side's "best" is the highest final evaluation (`--eval-episodes` deterministic episodes,
the run's own evaluation keys) among its P members / settings: the same selection on both sides. PBT's best/ is
that member evaluated again with fresh keys (`best_return_mean`), i.e. without the selection's luck; the sweep
keeps no per-setting run folder, so its best has no second evaluation.

Writes one CSV row per (seed, side) to `--csv` (appended per finished run, so a killed benchmark keeps what
finished) and prints the table: per seed the two bests and PBT - random, then the mean over seeds with the
range of the paired differences.

    nice -n 10 .venv/bin/python benchmarks/pbt_vs_random.py --env Breakout-MinAtar --steps 262144 \
        --population 8 --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

COLUMNS = ["env", "algo", "steps_per_member", "population", "seed", "side", "best", "best_reevaluated", "mean",
           "min", "interval_updates", "intervals", "exploits", "wall_s", "out"]


def sparqrl() -> str:
    return str(Path(sys.executable).with_name("sparqrl"))


def commands(args: argparse.Namespace, seed: int, out: Path) -> dict[str, list[str]]:
    """The two commands of one seed, by side."""
    common = ["--env", args.env, "--steps", str(args.steps), "--seed", str(seed), "--eval-episodes",
              str(args.eval_episodes), "--no-progress", "--no-energy", "--overwrite",
              *sum((["--set", s] for s in args.set), [])]
    ranges = [r.split("=", 1) for r in args.range]
    pbt = [sparqrl(), "pbt", args.algo, "--population", str(args.population), "--fields",
           ",".join(name for name, _ in ranges), *sum((["--range", f"{n}={r}"] for n, r in ranges), []),
           *([] if args.interval is None else ["--interval", str(args.interval)]), *common, "--out", str(out / "pbt")]
    sweep = [sparqrl(), "sweep", args.algo, "--samples", str(args.population),
             *sum((["--random", f"{n}=log:{r}"] for n, r in ranges), []), *common, "--out", str(out / "random")]
    return {"pbt": pbt, "random": sweep}


def pbt_row(out: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    final = np.asarray(summary["final_return_per_seed"], float)
    return {"best": final.max(), "best_reevaluated": summary["best_return_mean"], "mean": final.mean(),
            "min": final.min(), "interval_updates": summary["interval"], "intervals": summary["intervals"],
            "exploits": summary["exploits"]}


def random_row(out: Path) -> dict:
    with open(out / "sweep.csv") as f:
        final = np.asarray([float(r["return_mean"]) for r in csv.DictReader(f)])
    return {"best": final.max(), "best_reevaluated": "", "mean": final.mean(), "min": final.min(),
            "interval_updates": "", "intervals": "", "exploits": ""}


def run_side(args: argparse.Namespace, seed: int, side: str, cmd: list[str], out: Path) -> dict:
    print("$", " ".join(cmd), flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    row = (pbt_row if side == "pbt" else random_row)(out)
    return {"env": args.env, "algo": args.algo, "steps_per_member": args.steps, "population": args.population,
            "seed": seed, "side": side, **row, "wall_s": round(wall, 1), "out": str(out)}


def table(rows: list[dict]) -> str:
    """Per seed: PBT best (best/), random best, difference, and both sides' mean and min; then the mean over
    the seeds where both sides finished, with the range of the paired differences."""
    by = {(r["seed"], r["side"]): r for r in rows}
    seeds = sorted({r["seed"] for r in rows})
    lines = ["| seed | PBT best (best/ again) | random best | PBT - random | PBT mean, min | random mean, min |",
             "|---|---|---|---|---|---|"]
    diffs = []
    for s in seeds:
        p, r = by.get((s, "pbt")), by.get((s, "random"))
        diff = None if p is None or r is None else float(p["best"]) - float(r["best"])
        if diff is not None:
            diffs.append(diff)
        pbt_best = "-" if p is None else f"{float(p['best']):.1f} ({float(p['best_reevaluated']):.1f})"
        random_best = "-" if r is None else f"{float(r['best']):.1f}"
        spread = lambda x: "-" if x is None else f"{float(x['mean']):.1f}, {float(x['min']):.1f}"  # noqa: E731
        lines.append(f"| {s} | {pbt_best} | {random_best} | {'-' if diff is None else f'{diff:+.1f}'} | "
                     f"{spread(p)} | {spread(r)} |")
    if diffs:
        both = [s for s in seeds if (s, "pbt") in by and (s, "random") in by]
        mean = lambda side: np.mean([float(by[(s, side)]["best"]) for s in both])  # noqa: E731
        lines.append(f"| mean of {len(both)} | {mean('pbt'):.1f} | {mean('random'):.1f} | {np.mean(diffs):+.1f} "
                     f"[{min(diffs):+.1f}, {max(diffs):+.1f}] | | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", default="ppo")
    parser.add_argument("--env", default="Breakout-MinAtar")
    parser.add_argument("--steps", type=int, default=262_144, help="env steps per member / setting")
    parser.add_argument("--population", type=int, default=8)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--range", action="append", default=None,
                        help="FIELD=LOW:HIGH, drawn on a log scale on both sides (repeatable; default lr and "
                             "ent_coef a decade either side of the MinAtar preset's)")
    parser.add_argument("--interval", type=int, default=None, help="PBT's updates per interval (default: its own)")
    parser.add_argument("--eval-episodes", type=int, default=32)
    parser.add_argument("--set", action="append", default=[], help="a config field for both sides (repeatable)")
    parser.add_argument("--out", default="/tmp/pbt_vs_random")
    parser.add_argument("--csv", default="benchmarks/results/pbt_vs_random.csv")
    args = parser.parse_args()
    args.range = args.range or ["lr=5e-4:5e-2", "ent_coef=1e-3:1e-1"]

    rows: list[dict] = []
    csv_path = Path(args.csv)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    new = not csv_path.exists()
    for seed in [int(s) for s in args.seeds.split(",")]:
        out = Path(args.out) / f"seed{seed}"
        for side, cmd in commands(args, seed, out).items():
            rows.append(run_side(args, seed, side, cmd, out / side))
            with open(csv_path, "a", newline="") as f:
                writer = csv.DictWriter(f, COLUMNS)
                if new:
                    writer.writeheader()
                    new = False
                writer.writerow(rows[-1])
            print(table(rows), flush=True)


if __name__ == "__main__":
    main()

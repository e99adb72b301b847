"""Adversarial cheap talk on CartPole (issue 15, item 5), through `sparqrl meta act`.

    .venv/bin/python benchmarks/act.py [--popsize 32] [--generations 20] [--modes anti,pro] [--sigma S] [--lr L]
                                       [--fitness lifetime|final] [--set KEY=VALUE ...] [--seed 0] [--json OUT]
    .venv/bin/python benchmarks/act.py --popsize 1024 --generations 2048 --adversary lstm   # the paper's scale (GPU)

For each mode (anti: fitness = minus the victims' return; pro: plus), one `sparqrl.meta.run.train_meta`
run evolves the adversary (OpenES, the reference's evosax 0.0.4 preset, zero start) over `--popsize`
PPO victims trained from scratch per generation (ACT's CartPole victim: 200-step CartPole, 4 envs x 256
steps x 32 updates). Its final evaluation trains 32 victims (`--final-seeds`' default) with the final
adversary and 32 with a silent one on the same keys. Printed per mode: both groups' mean return over training (the fitness's measure)
and over the last 10 % of updates, and victims trained per second (population x seeds x generations /
the generations' compute time) against the paper's "8192 CartPole victims in parallel on one V100".
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import tempfile
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--popsize", type=int, default=32)
    parser.add_argument("--generations", type=int, default=20)
    parser.add_argument("--modes", default="anti,pro")
    parser.add_argument("--adversary", default="mlp", help="mlp (default here: cheaper on a CPU) or lstm")
    parser.add_argument("--victim", default="paper", help="the CartPole victim: paper (default here: ACT's 4 x 256 x "
                        "32, as this benchmark's runs) or cpu (`sparqrl meta act`'s default, 4 x 128 x 16)")
    parser.add_argument("--sigma", type=float, default=0.0, help="OpenES initial std (0: the preset's 0.04)")
    parser.add_argument("--lr", type=float, default=0.0, help="OpenES learning rate (0: the preset's 0.01)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="change the victim's PPO config (e.g. total_timesteps=16384 num_steps=128)")
    parser.add_argument("--fitness", default="lifetime", help="lifetime (the reference's default: mean return over "
                        "the whole training) or final (its --end-only: the last 10 %% of updates)")
    parser.add_argument("--seed", type=int, default=0, help="the meta run's seed (evolution and final evaluation)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import jax

    from sparqrl.meta import run as meta

    result = {"benchmark": "act", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": {"device": str(jax.devices()[0]), "cores": os.cpu_count(), "platform": platform.platform(),
                          "jax": jax.__version__},
              "popsize": args.popsize, "generations": args.generations, "adversary": args.adversary,
              "victim": args.victim, "sigma": args.sigma, "lr": args.lr, "set": args.set, "fitness": args.fitness, "seed": args.seed, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="sparqrl-act-") as tmp:
        for mode in args.modes.split(","):
            print(f"ACT {mode}: population {args.popsize} x {args.generations} generations ...", flush=True)
            config = meta.MetaConfig(task="act", env="CartPole-v1", mode=mode, adversary=args.adversary,
                                     victim=args.victim, popsize=args.popsize, seeds=1, generations=args.generations,
                                     sigma=args.sigma, lr=args.lr, set=tuple(args.set), fitness=args.fitness,
                                     seed=args.seed, out=str(Path(tmp) / mode), energy=False, progress=False)
            s = meta.train_meta(config)
            victims_per_s = args.popsize * args.generations / (s["generation_time_s"] * args.generations)
            keep = [k for k in s if k.startswith(("victim_", "baseline_")) and not k.endswith("per_update")]
            result["runs"][mode] = {**{k: s[k] for k in keep}, "wall_time_s": s["wall_time_s"],
                                    "compile_time_s": s["compile_time_s"], "generation_time_s": s["generation_time_s"],
                                    "victims_per_s": victims_per_s, "env_steps_per_s": s["env_steps_per_s"]}
            print(f"  victims {s['victim_lifetime_return_mean']:.1f} (last 10 %: {s['victim_final_return_mean']:.1f}) "
                  f"vs silent {s['baseline_lifetime_return_mean']:.1f} ({s['baseline_final_return_mean']:.1f}); "
                  f"{victims_per_s:.2f} victims/s, {s['wall_time_s']:.0f} s", flush=True)

    print(f"\ndevice: {result['machine']['device']}, {result['machine']['cores']} cores, jax {result['machine']['jax']}")
    print(f"{'mode':<6} {'victims, mean return':>21} {'silent, mean return':>20} {'victims, last 10 %':>19} "
          f"{'silent, last 10 %':>18} {'victims/s':>10}  goal")
    for mode, r in result["runs"].items():
        verdicts = []
        for measure in ("lifetime", "final"):  # over the whole training, over its last 10 % of updates
            lower = r[f"victim_{measure}_return_mean"] < r[f"baseline_{measure}_return_mean"]
            verdicts.append(f"{measure}: {'PASS' if lower == (mode == 'anti') else 'MISS'}")
        print(f"{mode:<6} {r['victim_lifetime_return_mean']:>21.1f} {r['baseline_lifetime_return_mean']:>20.1f} "
              f"{r['victim_final_return_mean']:>19.1f} {r['baseline_final_return_mean']:>18.1f} "
              f"{r['victims_per_s']:>10.2f}  {'lower' if mode == 'anti' else 'higher'} than silent: "
              f"{', '.join(verdicts)} (fitness: {args.fitness})")
    print("paper: 8192 CartPole victims in parallel on one V100; 8,388,608 victims in 2 h on 4 V100s "
          "(~290 victims/s per V100)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

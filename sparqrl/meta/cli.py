"""`sparqrl meta TASK [options]` and `sparqrl meta --resume DIR [--generations N]`.

Every bad input (unknown task, strategy or field, an odd population with antithetic sampling, a bad
--set) is one line before anything is compiled or written; `sparqrl.cli` turns it into exit code 2.
"""

from __future__ import annotations

import argparse
import json
from typing import Sequence

from sparqrl import config as cfg
from sparqrl.argparsing import OneLineParser, add_import_flag

DESCRIPTION = """Evolve part of a learning rule over vmapped inner trainings (evosax 0.3).

tasks:
  value-loss  PPO's value loss (a 64-64 network started at L2); fitness: mean return over the whole inner run
  lpo         PPO's drift function (the LPO network started at PPO-clip); fitness: final return
  hparams     the traced hyperparameters of --algo (ppo, dqn, td3, sac, impala, a2c); fitness: final return
  mfos        M-FOS: a meta-policy that shapes a learning opponent in a matrix game (--game, --opponent),
              trained by evolution (--trainer es) or PPO (--trainer ppo); fitness: its mean reward per round;
              --opponent self: meta-self-play, two PPO agents (fitness: their mean reward per round)
  act         adversarial cheap talk: an adversary appends a bounded message to PPO victims' observations
              (--mode anti|pro|goal); victims trained from scratch in each fitness; CartPole-v1 is ACT's
              200-step CartPole; fitness: -/+ the victims' return, or their goal reward

The best meta-parameters go to OUT/best_meta_params.npz: `sparqrl train ppo --value-loss learned:OUT` or
`--objective lpo:OUT` uses them (hparams: OUT/best_hparams.json holds --set items; `sparqrl train ALGO
--load-config OUT/best_hparams.json` runs them)."""


def parser() -> argparse.ArgumentParser:
    from sparqrl.meta.config import MetaConfig

    d = MetaConfig()
    p = OneLineParser(prog="sparqrl meta", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("task", nargs="?", help="value-loss, lpo, hparams, mfos or act")
    p.add_argument("--env", default=None, help=f"inner environment (default {d.env})")
    p.add_argument("--algo", default=None, help="inner algorithm for hparams: ppo, dqn, td3, sac, impala, a2c (default ppo)")
    p.add_argument("--strategy", default=None, help="open_es (default), snes, cma_es, simple_ga")
    p.add_argument("--generations", type=int, default=None, help="generations (default: 40 for act, else 16)")
    p.add_argument("--popsize", type=int, default=None, help=f"population size (default {d.popsize}; even for open_es)")
    p.add_argument("--seeds", type=int, default=None, help="inner seeds per member (default: 1 for mfos es and "
                   "act, else 2)")
    p.add_argument("--steps", type=int, default=None, help="inner env steps per training (default: the inner config's)")
    p.add_argument("--fitness", default=None, help="lifetime or final (default: the task's)")
    p.add_argument("--fitness-shaping", default=None, help="centered_rank or z_score (or the strategy's others; "
                   "default: z_score for mfos es with open_es, else centered_rank)")
    p.add_argument("--no-antithetic", action="store_true", default=None, help="no antithetic sampling (open_es)")
    p.add_argument("--sigma", type=float, default=None, help="initial search std (default with open_es: 0.1 for mfos "
                   "es and act, else the preset's 0.04)")
    p.add_argument("--lr", type=float, default=None, help="strategy learning rate (default with open_es: 0.2 for "
                   "mfos es, 0.05 for act, else the preset's 0.01)")
    p.add_argument("--fields", default=None, help="hparams: fields to evolve, e.g. lr,clip_eps (default all traced)")
    p.add_argument("--game", default=None, help=f"mfos: ipd, imp or chicken (default {d.game})")
    p.add_argument("--opponent", default=None, help=f"mfos: nl, lola, br, static, or self (meta-self-play, "
                   f"--trainer ppo) (default {d.opponent})")
    p.add_argument("--trainer", default=None, help=f"mfos: es or ppo (default {d.trainer})")
    p.add_argument("--games", type=int, default=None, help="mfos: games per evaluation (es, default 128) or per "
                   "meta-episode (ppo, default 4096)")
    p.add_argument("--mode", default=None, help=f"act: anti, pro or goal (default {d.mode})")
    p.add_argument("--adversary", default=None, help=f"act: mlp or lstm (default {d.adversary})")
    p.add_argument("--victim", default=None, help=f"act on CartPole-v1: the victim's budget, cpu (4 envs x 128 steps x "
                   f"16 updates) or paper (ACT's 4 x 256 x 32) (default {d.victim})")
    p.add_argument("--n-dims", type=int, default=None, help=f"act: message size (default {d.n_dims})")
    p.add_argument("--final-seeds", type=int, default=None, help="act: victims the final evaluation trains with the "
                   f"evolved adversary and, on the same keys, with a silent one (default {d.final_seeds})")
    p.add_argument("--seed", type=int, default=None, help="seed of the meta run (default 0)")
    p.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                   help="override a field of the inner algorithm's config (repeatable)")
    p.add_argument("--out", default=None, help=f"output folder (default {d.out})")
    p.add_argument("--overwrite", action="store_true", default=None, help="replace the sparqrl run in --out")
    p.add_argument("--resume", default=None, metavar="DIR", help="go on with the meta run in DIR")
    add_import_flag(p)
    p.add_argument("--workers", type=int, default=None, metavar="N", help="compute each generation's population on N "
                   "Ray workers (a local instance on loopback), a contiguous slice each")
    p.add_argument("--ray-address", default=None, metavar="ADDRESS", help="compute each generation's population on "
                   "the workers of this Ray cluster (HOST:PORT, ray://HOST:PORT or auto), one per CPU")
    p.add_argument("--no-progress", action="store_true", default=None, help="no progress bar")
    p.add_argument("--no-energy", action="store_true", default=None, help="do not measure energy")
    p.add_argument("--country", default=None, help="3-letter ISO code for the CO2 figure (default USA)")
    p.add_argument("--wandb", default=None, metavar="PROJECT", help="also log to this Weights & Biases project "
                   "(the wandb extra; W&B's folder is OUT/wandb)")
    p.add_argument("--wandb-mode", default=None, choices=("offline", "online"), help="offline (default: nothing "
                   "leaves the machine; `wandb sync OUT/wandb` uploads it later) or online")
    return p


def config_from_args(args: argparse.Namespace):
    """The MetaConfig the parsed flags give (unset flags: the defaults)."""
    from sparqrl.meta.config import MetaConfig

    values = {}
    for name in ("env", "algo", "strategy", "generations", "popsize", "seeds", "steps", "fitness", "sigma", "lr",
                 "fields", "game", "opponent", "trainer", "games", "mode", "adversary", "victim", "n_dims",
                 "final_seeds", "seed", "out", "overwrite", "country", "wandb", "wandb_mode"):
        value = getattr(args, name)
        if value is not None:
            values[name] = value
    if args.fitness_shaping is not None:
        values["fitness_shaping"] = args.fitness_shaping
    if args.no_antithetic:
        values["antithetic"] = False
    if args.no_progress:
        values["progress"] = False
    if args.no_energy:
        values["energy"] = False
    if args.set:
        values["set"] = tuple(args.set)
    if args.task is not None:
        values["task"] = args.task
    return MetaConfig(**values)


RESUME_MAY_GIVE = ("resume", "generations", "no_progress", "no_energy", "imports", "wandb_mode", "workers",
                   "ray_address")


def run_cli(argv: Sequence[str]) -> int:
    """The `meta` command (raises ConfigError for bad input; `sparqrl.cli.main` prints it, exit 2)."""
    from sparqrl import signals
    from sparqrl.meta import run as meta_run
    from sparqrl.runners.workers import check_workers
    from sparqrl.trust import named

    args = parser().parse_args(list(argv))
    workers = check_workers(args.workers, args.ray_address)
    if args.resume is not None:
        given = [name for name, value in vars(args).items() if value is not None and name not in RESUME_MAY_GIVE]
        cfg.require(not given, "--resume", args.resume, "continues a meta run with its saved settings; only "
                    "--generations, --no-progress, --no-energy, --workers, --ray-address and --wandb-mode online (to "
                    f"let it upload) may be given (got {', '.join('--' + g.replace('_', '-') for g in given)})")
        summary = meta_run.resume_meta(args.resume, args.generations, False if args.no_progress else None,
                                       trust=named(args.imports, wandb_mode=args.wandb_mode),
                                       energy=False if args.no_energy else None, workers=workers)
    else:
        cfg.require(args.task is not None, "TASK", "", "is missing: sparqrl meta value-loss|lpo|hparams|mfos|act [options]")
        cfg.require(not args.imports, "--import", args.imports, "is for --resume DIR (a new run's --env names its "
                    "module itself)")
        # train's rule: 0 would be read as "not given" (the inner config's own) while config.json said 0
        cfg.require(args.steps is None or args.steps > 0, "--steps", args.steps,
                    "must be a positive number of env steps (leave it out for the inner config's own)")
        config = config_from_args(args)
        prepared = meta_run.prepare(config)
        meta_run.check_workers(prepared, workers)
        if signals.requested():
            raise KeyboardInterrupt
        rundir = meta_run.start_meta_dir(prepared)
        summary = meta_run.run_meta(prepared, rundir, resuming=False, workers=workers)
    print(json.dumps(summary, indent=2))
    return 0


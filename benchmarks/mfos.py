"""M-FOS against a naive learner, and meta-self-play, in the IPD (issue 15, item 5), through `sparqrl meta mfos`.

    .venv/bin/python benchmarks/mfos.py [--ppo-games 256] [--ppo-episodes 1024] [--es-generations 96]
                                        [--self-play-games 256 --self-play-episodes 800 ...] [--json OUT]
    .venv/bin/python benchmarks/mfos.py --ppo-games 4096 --ppo-episodes 1024 --self-play-games 4096 \
        --self-play-episodes 1024 --self-play-decay 0.0015 --self-play-lr 2e-4    # the reference's budget (GPU)

Runs, one after another in this process (each a whole `sparqrl.meta.run.train_meta`: compile, the
generations, the checkpoints, the final evaluation of 1024 fresh meta-episodes):

  NL vs NL     both players naive learners (lr 1, exact values, gamma 0.96), 1024 games x 100 steps:
               the baseline (reference §2.9: -1.98 per round each)
  M-FOS PPO    the reference's PPO (§2.4) against NL, `--ppo-games` games per meta-episode,
               `--ppo-episodes` meta-episodes (reference: 4096 x 1024)
  M-FOS ES     the mean network (32 units) evolved by OpenES (population `--es-popsize`, 128 games per
               member, sigma 0.1, lr 0.2, z-scored fitness: tests/test_mfos.py's settings),
               `--es-generations` generations
  self-play    two M-FOS PPO agents (§2.6), each against its own NL with probability lambda, else against
               each other; lambda falls by `--self-play-decay` per meta-episode (reference: 0.0015 over 1024
               meta-episodes of 4096 games, Adam 2e-4); evaluated agent 1 against agent 2

and prints each side's mean reward per round next to the reference rerun's (M-FOS ~ -0.48, NL ~ -2.17
after 1024 meta-episodes of 4096 games; its hill-climber: -0.69 / -1.83). The extortion signature is
M-FOS above -1 (mutual cooperation) while NL falls below -2 (mutual defection); meta-self-play's claim is
mutual cooperation (-1 each).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import tempfile
import time
from pathlib import Path

REFERENCE = {"ppo": (-0.48, -2.17, "4096 games x 1024 meta-episodes"),
             "es": (-0.69, -1.83, "hill-climber: 2048 candidates x 128 games x 64 generations"),
             "self-play": (-1.0, -1.0, "mutual cooperation claimed; 4096 games x 1024 meta-episodes")}
MUTUAL_COOPERATION = -1.05
"""Both agents at or above this mean reward per round count as mutual cooperation (-1 exactly)."""


def nl_vs_nl(games: int) -> tuple[float, float]:
    import jax
    import jax.numpy as jnp

    from sparqrl.envs import matrix

    def run(key: jax.Array) -> tuple[jax.Array, jax.Array]:
        k1, k2 = jax.random.split(key)
        a, b = jax.random.normal(k1, (games, 5)), jax.random.normal(k2, (games, 5))

        def step(carry, _):
            a, b = carry
            r1, r2 = jax.vmap(lambda x, y: matrix.exact_values("ipd", x, y))(a, b)
            a2 = jax.vmap(lambda x, y: matrix.naive_step("ipd", x, y, player=1))(a, b)
            b2 = jax.vmap(lambda x, y: matrix.naive_step("ipd", x, y, player=2))(b, a)
            return (a2, b2), (r1.mean(), r2.mean())

        _, (r1, r2) = jax.lax.scan(step, (a, b), None, length=100)
        return jnp.mean(r1), jnp.mean(r2)

    r1, r2 = jax.jit(run)(jax.random.PRNGKey(0))
    return float(r1), float(r2)


def meta_run(out: Path, **fields) -> dict:
    from sparqrl.meta import run as meta

    fields = {"game": "ipd", "opponent": "nl", **fields}
    config = meta.MetaConfig(task="mfos", out=str(out), energy=False, progress=False, **fields)
    start = time.perf_counter()
    summary = meta.train_meta(config)
    summary["process_wall_s"] = time.perf_counter() - start
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ppo-games", type=int, default=256)
    parser.add_argument("--ppo-episodes", type=int, default=1024)
    parser.add_argument("--es-popsize", type=int, default=64)
    parser.add_argument("--es-generations", type=int, default=96)
    parser.add_argument("--self-play-games", type=int, default=256)
    parser.add_argument("--self-play-episodes", type=int, default=800)
    parser.add_argument("--self-play-decay", type=float, default=0.0025)
    parser.add_argument("--self-play-lr", type=float, default=5e-4)
    parser.add_argument("--skip-ppo", action="store_true")
    parser.add_argument("--skip-es", action="store_true")
    parser.add_argument("--skip-self-play", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import jax

    result = {"benchmark": "mfos", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": {"device": str(jax.devices()[0]), "cores": os.cpu_count(), "platform": platform.platform(),
                          "jax": jax.__version__}, "runs": {}}
    rows = []
    base = nl_vs_nl(1024)
    result["runs"]["nl_vs_nl"] = {"row_player": base[0], "column_player": base[1]}
    rows.append(("NL vs NL", "1024 games x 100 steps", base[1], base[0], "-1.98 / -1.98", "-"))
    with tempfile.TemporaryDirectory(prefix="sparqrl-mfos-") as tmp:
        runs = []
        if not args.skip_ppo:
            runs.append(("ppo", f"{args.ppo_games} games x {args.ppo_episodes} meta-episodes",
                         dict(trainer="ppo", games=args.ppo_games, generations=args.ppo_episodes)))
        if not args.skip_es:
            runs.append(("es", f"OpenES {args.es_popsize} x 128 games x {args.es_generations} generations",
                         dict(trainer="es", popsize=args.es_popsize, seeds=1, games=128, sigma=0.1, lr=0.2,
                              fitness_shaping="z_score", set=("hidden=32",), generations=args.es_generations)))
        if not args.skip_self_play:
            runs.append(("self-play", f"{args.self_play_games} games x {args.self_play_episodes} meta-episodes, "
                         f"decay {args.self_play_decay:g}, lr {args.self_play_lr:g}",
                         dict(trainer="ppo", opponent="self", games=args.self_play_games,
                              generations=args.self_play_episodes,
                              set=(f"self_play_decay={args.self_play_decay}", f"lr={args.self_play_lr}"))))
        for name, budget, fields in runs:
            label = "M-FOS self-play" if name == "self-play" else f"M-FOS {name} vs NL"
            print(f"{label}: {budget} ...", flush=True)
            s = meta_run(Path(tmp) / name, **fields)
            result["runs"][name] = {k: s[k] for k in ("meta_return_mean", "opponent_return_mean", "wall_time_s",
                                                        "compile_time_s", "cooperation_end", "env_steps")}
            result["runs"][name]["budget"] = budget
            ref = REFERENCE[name]
            rows.append((label, budget, s["meta_return_mean"], s["opponent_return_mean"],
                         f"{ref[0]} / {ref[1]} ({ref[2]})", f"{s['wall_time_s']:.0f} s"))
            print(f"  M-FOS (agent 1) {s['meta_return_mean']:.3f}, other {s['opponent_return_mean']:.3f} per round, "
                  f"{s['wall_time_s']:.0f} s", flush=True)

    print(f"\ndevice: {result['machine']['device']}, {result['machine']['cores']} cores, jax {result['machine']['jax']}")
    print(f"{'run':<20} {'budget':<60} {'M-FOS':>8} {'other':>8}  {'reference M-FOS / other':<60} wall")
    for run, budget, mine, theirs, ref, wall in rows:
        print(f"{run:<20} {budget:<60} {mine:>8.3f} {theirs:>8.3f}  {ref:<60} {wall}")
    for name in ("ppo", "es"):
        if name in result["runs"]:
            r = result["runs"][name]
            extortion = r["meta_return_mean"] > -1.0 and r["opponent_return_mean"] < -2.0
            print(f"{name}: extortion (M-FOS > -1, NL < -2): {'YES' if extortion else 'no'}")
    if "self-play" in result["runs"]:
        r = result["runs"]["self-play"]
        both = min(r["meta_return_mean"], r["opponent_return_mean"]) >= MUTUAL_COOPERATION
        print(f"self-play: mutual cooperation (both >= {MUTUAL_COOPERATION}): {'YES' if both else 'no'}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

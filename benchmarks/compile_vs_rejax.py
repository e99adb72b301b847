"""Compile time, sparqrl against rejax, in alternating fresh processes (issue 11, item 2: compile <= the peer's).

    bash benchmarks/setup_rejax.sh                 # once: the peer's venv (.bench-rejax-venv)
    .venv/bin/python benchmarks/compile_vs_rejax.py [--rounds 3] [--seeds 1] [--json OUT]

PPO on CartPole-v1, 976 updates (499,712 env steps), sparqrl's default hyperparameters on both sides (as
benchmarks/vs_rejax.py, whose peer script builds rejax's side). Each round runs four fresh processes, one
after the other, each compiling one thing cold (no persistent cache) and printing trace + lower + XLA
seconds:

  sparqrl whole      `jax.jit(make_train_fn(algo))` (vmapped over --seeds > 1): no evaluation
  sparqrl runner     what a run of `sparqrl.runners.train` counts in summary.json's compile_time_s: its init
                     and chunk programs, then its evaluation program (built at the first evaluation)
  rejax whole        rejax's `train` with its evaluation callback a no-op (both whole programs: kernel_counts.build)
  rejax with eval    rejax's `train` with its own evaluation (its default callback) in the program

The whole programs compare with each other; the runner, which builds an evaluation program, with rejax's
program with evaluation. Alternating the sides lets the machine's drift hit both alike; the best (lowest)
of the rounds counts, and every round and the medians are printed (the same program's cold compile varies by
10-20 % between processes on a 2-core VM).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEER_PYTHON = ROOT / ".bench-rejax-venv" / "bin" / "python"
UPDATES = 976  # 499,712 env steps of 4 envs x 128 steps, as kernel_counts.py
SIDES = ("sparqrl whole", "sparqrl runner", "rejax whole", "rejax with eval")


def keys(seeds: int):
    import jax

    return jax.random.PRNGKey(0) if seeds == 1 else jax.random.split(jax.random.PRNGKey(1), seeds)


def timed_compile(fn, seeds: int) -> float:
    from peer_rejax import compile_timed  # (benchmarks/ is this script's folder)

    import jax

    return compile_timed(fn if seeds == 1 else jax.vmap(fn), keys(seeds))[1]["compile_s"]


def compile_side(side: str, seeds: int) -> float:
    """The cold compile seconds of one side, in this (fresh) process."""
    if side.endswith("whole"):  # the two whole programs exactly as kernel_counts.py builds and times them
        from kernel_counts import build

        if side.startswith("sparqrl"):
            from sparqrl.runners.session import use_compile_cache

            use_compile_cache(False)
        return timed_compile(build(side.split()[0], UPDATES), seeds)
    if side == "rejax with eval":
        from peer_rejax import PPO_DEFAULTS, make_ppo

        algo, total = make_ppo(dict(PPO_DEFAULTS), UPDATES * 512)
        return timed_compile(algo.replace(eval_freq=max(total // 10, 1)).train, seeds)
    import tempfile

    from vs_rejax import runner_config

    from sparqrl.algos import ppo
    from sparqrl.runners.anakin import make_driver, prepare
    from sparqrl.runners.session import use_compile_cache

    use_compile_cache(False)
    with tempfile.TemporaryDirectory() as out:
        run = runner_config(seeds, 50, out)
        module, config, env = prepare("ppo", ppo.Config(total_timesteps=UPDATES * 512), run)
        driver = make_driver("ppo", module, config, env, run)
        driver.build()
        driver.evaluate(driver.init_state())  # (builds the evaluation program, as a run's first evaluation)
        return driver.compile_time_s


def run_side(side: str, seeds: int) -> float:
    python = str(PEER_PYTHON) if side.startswith("rejax") else sys.executable
    proc = subprocess.run([python, __file__, "--side", side, "--seeds", str(seeds)], capture_output=True, text=True,
                          cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"{side} failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["compile_s"]


def row(label: str, times: dict[str, float]) -> str:
    return (f"  {label:<7}" + "".join(f"{times[side]:>17.2f}" for side in SIDES)
            + f"{times['sparqrl whole'] / times['rejax whole']:>12.3f}x"
            + f"{times['sparqrl runner'] / times['rejax with eval']:>16.3f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=1, help="seeds of every program (vmapped)")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.side:
        import warnings

        warnings.filterwarnings("ignore")
        print(json.dumps({"compile_s": compile_side(args.side, args.seeds)}))
        return
    if not PEER_PYTHON.exists():
        raise SystemExit(f"{PEER_PYTHON} not found: run `bash benchmarks/setup_rejax.sh` first")
    rounds = []
    print(f"PPO CartPole-v1, {UPDATES * 512:,} steps, {args.seeds} seed(s): compile s (trace + lower + XLA), cold, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"  {'round':<7}" + "".join(f"{side:>17}" for side in SIDES) + "  whole/whole  runner/with eval")
    for r in range(args.rounds):
        times = {side: run_side(side, args.seeds) for side in SIDES}
        rounds.append(times)
        print(row(str(r + 1), times), flush=True)
    best = {side: min(r[side] for r in rounds) for side in SIDES}
    median = {side: statistics.median(r[side] for r in rounds) for side in SIDES}
    print(row("best", best))
    print(row("median", median))
    print("  goals (PASS / MISS on the best of the rounds, and on their medians):")
    for text, ours, theirs in (("whole program <= rejax's whole program", "sparqrl whole", "rejax whole"),
                               ("runner <= rejax with its evaluation", "sparqrl runner", "rejax with eval"),
                               ("runner <= rejax's whole program", "sparqrl runner", "rejax whole")):
        verdicts = [f"{name} {'PASS' if t[ours] <= t[theirs] else 'MISS'} ({t[ours] / t[theirs]:.3f}x)"
                    for name, t in (("best", best), ("median", median))]
        print(f"    {text}: " + ", ".join(verdicts))
    if args.json:
        result = {"seeds": args.seeds, "rounds": rounds, "best": best, "median": median}
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

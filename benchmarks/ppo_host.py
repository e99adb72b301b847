"""PPO on a host (Gymnasium MuJoCo) environment: sparqrl's actor-learner runner against Stable-Baselines3,
same machine, one script.

    bash benchmarks/setup_peer.sh                       # once: the peer's venv (.bench-venv)
    .venv/bin/python benchmarks/ppo_host.py [--env gym:HalfCheetah-v5] [--steps 300000] [--seeds 2] [--json OUT]

Both sides use SB3's default PPO hyperparameters with observation and reward normalisation (the peer's
VecNormalize; sparqrl's normalize_obs / normalize_reward): `SETTINGS` below and
benchmarks/peer_sb3_ppo_host.py. Each SB3 seed is its own process (torch, 1 thread), run one after the
other; sparqrl runs in this process, first every seed in its own run (1 inline actor, 1 env), then all
seeds in one run (`--seeds`: one actor steps every seed's env, the learners are vmapped). Throughput is
env steps (all seeds) per second of wall time of the training itself (sparqrl: compilation and start-up
excluded, `env_steps_per_s`; SB3: its learn() call). Returns: the deterministic policy, 10 episodes per
seed, raw rewards.

The goals (from the on-policy actor-learner issue) are printed with PASS or MISS; a MISS never fails the
script: benchmarks are not tests. For a GPU machine, the 1M-step command is the same with --steps 1000000.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PEER_PYTHON = ROOT / ".bench-venv" / "bin" / "python"
PEER_SCRIPT = ROOT / "benchmarks" / "peer_sb3_ppo_host.py"

# SB3's PPO defaults in sparqrl's fields (1 env x 2048 steps, 10 epochs x 32 minibatches of 64).
SETTINGS = dict(num_envs=1, num_steps=2048, num_minibatches=32, update_epochs=10, lr=3e-4, anneal_lr=False,
                gamma=0.99, gae_lambda=0.95, clip_eps=0.2, value_loss="l2", ent_coef=0.0, vf_coef=0.5,
                max_grad_norm=0.5, hidden=(64, 64), activation="tanh", normalize_obs=True, normalize_reward=True)


def run_sb3(env: str, steps: int, seed: int) -> dict:
    out = subprocess.run([str(PEER_PYTHON), str(PEER_SCRIPT), "--env", env.removeprefix("gym:"), "--steps", str(steps),
                          "--seed", str(seed)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_sparqrl(env: str, steps: int, seeds: int, seed: int) -> dict:
    from sparqrl.algos import ppo
    from sparqrl.runners import RunConfig, train

    with tempfile.TemporaryDirectory() as tmp:
        run = RunConfig(env=env, seeds=seeds, seed=seed, out=str(Path(tmp) / "run"), chunks=4, eval_every=0,
                        eval_episodes=10, progress=False, energy=False)
        return train("ppo", ppo.Config(total_timesteps=steps, **SETTINGS), run)


def spread(values: list[float]) -> str:
    return f"{np.mean(values):.1f} (min {np.min(values):.1f}, max {np.max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="gym:HalfCheetah-v5")
    parser.add_argument("--steps", type=int, default=300_000)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--json", default=None, help="write every figure here")
    args = parser.parse_args()
    if not PEER_PYTHON.exists():
        sys.exit(f"no peer venv at {PEER_PYTHON}: run `bash benchmarks/setup_peer.sh` first")

    sb3 = [run_sb3(args.env, args.steps, seed) for seed in range(args.seeds)]
    for r in sb3:
        print(f"SB3 seed {r['seed']}: return {r['final_return']:.1f}, {r['steps_per_s']:.0f} env steps/s "
              f"({r['learn_s']:.0f} s, {r['cores_used']:.2f} cores)", flush=True)
    single = [run_sparqrl(args.env, args.steps, 1, seed) for seed in range(args.seeds)]
    for seed, s in enumerate(single):
        print(f"sparqrl seed {seed} (own run): return {s['final_return_mean']:.1f}, {s['env_steps_per_s']:.0f} "
              f"env steps/s ({s['wall_time_s']:.0f} s wall, compile {s['compile_time_s']:.1f} s)", flush=True)
    together = run_sparqrl(args.env, args.steps, args.seeds, 0)
    print(f"sparqrl {args.seeds} seeds in one run: returns {together['final_return_per_seed']}, "
          f"{together['env_steps_per_s']:.0f} env steps/s ({together['wall_time_s']:.0f} s wall)", flush=True)

    sb3_returns = [r["final_return"] for r in sb3]
    ours_returns = [s["final_return_mean"] for s in single]
    sb3_rate = float(np.mean([r["steps_per_s"] for r in sb3]))
    one_rate = float(np.mean([s["env_steps_per_s"] for s in single]))
    all_rate = float(together["env_steps_per_s"])
    lo, hi = min(sb3_returns), max(sb3_returns)
    print(f"\n{args.env}, {args.steps:,} steps per seed, {args.seeds} seeds ({platform.processor() or platform.machine()})")
    print(f"  final return: sparqrl {spread(ours_returns)} | SB3 {spread(sb3_returns)}")
    print(f"  env steps/s:  sparqrl {one_rate:.0f} per run, {all_rate:.0f} with {args.seeds} seeds in one run | "
          f"SB3 {sb3_rate:.0f}")
    print(f"  ratio to SB3: {one_rate / sb3_rate:.2f}x (one seed per run), {all_rate / sb3_rate:.2f}x (seeds in one run)")
    within = float(np.mean(ours_returns)) >= lo  # inside SB3's seed range [lo, hi], or above it
    print(f"  goal: mean return within SB3's spread [{lo:.1f}, {hi:.1f}] or above: {'PASS' if within else 'MISS'}; "
          f">= 2x SB3's throughput: {'PASS' if one_rate >= 2 * sb3_rate else 'MISS'} (one seed per run), "
          f"{'PASS' if all_rate >= 2 * sb3_rate else 'MISS'} (seeds in one run)")
    if args.json:
        Path(args.json).write_text(json.dumps({"sb3": sb3, "sparqrl_single": single, "sparqrl_together": together},
                                              indent=2, default=str))


if __name__ == "__main__":
    main()

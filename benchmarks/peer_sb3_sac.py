"""The peer of the reproduction suite's sac-halfcheetah entry (issue 37): Stable-Baselines3's SAC on HalfCheetah-v5 at
the same budget, with its published hyperparameters, recorded where the Results page shows it beside ours.

    .venv/bin/python benchmarks/peer_sb3_sac.py                          # 300k steps x 2 seeds, one process each
    .venv/bin/python benchmarks/peer_sb3_sac.py --steps 2000 --seeds 1 --out /tmp/peer   # a smoke run

SB3 runs in the peer venv (.bench-venv: CPU torch, SB3, Gymnasium's MuJoCo envs), which this script makes with
`bash benchmarks/setup_peer.sh` when it is missing; each seed is `.bench-venv/bin/python peer_sb3_sac.py --worker`,
printing one JSON object. The results go to OUT/peers.csv (repro.py's columns; `commit` holds the peer's versions)
and OUT/curves/sb3-sac-halfcheetah.csv (repro.py's curve format), OUT being benchmarks/results by default.

Hyperparameters: rl-baselines3-zoo's hyperparams/sac.yml, entry `HalfCheetah-v3: &mujoco-defaults` (the same for
its v4 entries): n_timesteps 1e6, MlpPolicy, learning_starts 10000, everything else SB3's SAC defaults, which are
written out here so that a change of SB3's defaults cannot change the run: Adam 3e-4 for actor, critics and the
entropy coefficient, replay 1M, batch 256, tau 0.005, gamma 0.99, one gradient step per env step, twin 256-256
ReLU critics and actor, entropy coefficient learned from 1.0 towards the target entropy -dim(A), no gSDE.

The protocol is the suite's (repro.py, sparqrl's host runner): the budget is env steps per seed; each seed's final
return is its deterministic policy's mean over 10 evaluation episodes, episode j on a fresh env reset with seed
100 + seed + j (sparqrl's `evaluate_host`: env j of a vector env reset with `run.seed + 100 + i + j`); the curve is
the mean return of the training episodes finished in each of 50 equal chunks of the budget (sparqrl's default
`chunks`). What differs is the algorithms' own choices: random actions for the first 10,000 steps (sparqrl's SAC
default: 25,000, min(25k, 10 % of the budget)), the policy's log-std clipped to [-20, 2] (sparqrl: [-5, 2]), and
torch on 1 thread per seed against JAX/XLA.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PEER_PYTHON = Path(os.environ.get("BENCH_VENV", ROOT / ".bench-venv")) / "bin" / "python"
NAME = "sb3-sac-halfcheetah"
ZOO = ("rl-baselines3-zoo hyperparams/sac.yml, HalfCheetah-v3 (&mujoco-defaults): learning_starts 10000, "
       "SB3's SAC defaults otherwise")
HYPERPARAMETERS = dict(learning_rate=3e-4, buffer_size=1_000_000, learning_starts=10_000, batch_size=256, tau=0.005,
                       gamma=0.99, train_freq=1, gradient_steps=1, ent_coef="auto", target_entropy="auto",
                       use_sde=False)
CHUNKS = 50
EVAL_EPISODES = 10
EVAL_SEED_BASE = 100


def chunk_means(episodes: list[tuple[int, float]], steps: int, chunks: int) -> list[tuple[int, float | None]]:
    """(env step at an episode's end, its return) -> (each chunk's last env step, the mean return of the episodes that
    ended in it, None where none did), for `chunks` equal chunks of `steps` (sparqrl's metrics.csv rows)."""
    size = steps // chunks
    ends = [size * (i + 1) if i < chunks - 1 else steps for i in range(chunks)]
    sums: list[list[float]] = [[] for _ in ends]
    for step, ret in episodes:
        sums[min(max(step - 1, 0) // size, chunks - 1)].append(ret)
    return [(end, sum(r) / len(r) if r else None) for end, r in zip(ends, sums)]


def curve_rows(per_seed: list[list[tuple[int, float | None]]]) -> list[list[str]]:
    """Each seed's chunk means -> repro.py's curve rows [env_step, seed 0's return, ...] (empty: no episode)."""
    return [[str(step), *("" if s[i][1] is None else f"{s[i][1]:.3f}" for s in per_seed)]
            for i, (step, _) in enumerate(per_seed[0])]


def worker(env_id: str, steps: int, seed: int, threads: int) -> dict:
    """Train and evaluate one seed in this (the peer venv's) interpreter."""
    import time

    import gymnasium as gym
    import mujoco
    import numpy as np
    import stable_baselines3
    import torch
    from stable_baselines3 import SAC
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.monitor import Monitor

    torch.set_num_threads(threads)
    env = Monitor(gym.make(env_id))
    model = SAC("MlpPolicy", env, **HYPERPARAMETERS, policy_kwargs=dict(net_arch=[256, 256], n_critics=2),
                device="cpu", seed=seed, verbose=0)
    model.set_logger(Logger(folder=None, output_formats=[]))  # SB3's default logger writes to /tmp
    start, cpu_start = time.perf_counter(), time.process_time()
    model.learn(total_timesteps=steps)
    learn_s = time.perf_counter() - start
    cores_used = (time.process_time() - cpu_start) / learn_s
    ends = np.cumsum(env.get_episode_lengths())
    episodes = [(int(e), float(r)) for e, r in zip(ends, env.get_episode_rewards())]

    eval_env = gym.make(env_id)
    returns = []
    for episode in range(EVAL_EPISODES):
        obs, _ = eval_env.reset(seed=EVAL_SEED_BASE + seed + episode)
        total, done = 0.0, False
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = eval_env.step(action)
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    return {"peer": "stable-baselines3", "sb3_version": stable_baselines3.__version__,
            "torch_version": torch.__version__, "gymnasium_version": gym.__version__,
            "mujoco_version": mujoco.__version__, "env": env_id, "seed": seed,
            "steps": int(model.num_timesteps), "learn_s": learn_s, "steps_per_s": model.num_timesteps / learn_s,
            "cores_used": cores_used, "torch_threads": threads, "eval_returns": returns,
            "final_return": float(np.mean(returns)), "episodes": episodes}


def peer_venv() -> Path:
    """The peer venv's interpreter, made by benchmarks/setup_peer.sh when it is missing."""
    if not PEER_PYTHON.exists():
        subprocess.run(["bash", str(HERE / "setup_peer.sh")], check=True)
    return PEER_PYTHON


def run_seeds(env_id: str, steps: int, seeds: int, threads: int) -> list[dict]:
    """One peer-venv process per seed, all at once (the suite's seeds share the machine as well)."""
    procs = [subprocess.Popen([str(peer_venv()), str(Path(__file__).resolve()), "--worker", "--env", env_id,
                               "--steps", str(steps), "--seed", str(s), "--threads", str(threads)],
                              stdout=subprocess.PIPE, text=True) for s in range(seeds)]
    outs = [p.communicate()[0] for p in procs]
    failed = [s for s, p in enumerate(procs) if p.returncode != 0]
    if failed:
        raise SystemExit(f"peer seeds {failed} failed (exit {[procs[s].returncode for s in failed]})")
    return [json.loads(out.strip().splitlines()[-1]) for out in outs]


def record(results: list[dict], out: Path, steps: int) -> None:
    """The seeds' rows into OUT/peers.csv (replacing this peer's) and their curve, as repro.py records an entry."""
    sys.path.insert(0, str(HERE))
    import repro

    first = results[0]
    versions = (f"sb3 {first['sb3_version']}, torch {first['torch_version']}, gymnasium {first['gymnasium_version']}, "
                f"mujoco {first['mujoco_version']}")
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    rows = [{"entry": NAME, "seed": r["seed"], "final_return": f"{r['final_return']:.2f}", "budget": r["steps"],
             "wall_time_s": f"{r['learn_s']:.1f}", "commit": versions, "date": stamp, "machine": repro.machine()}
            for r in results]
    repro.replace_rows(out / "peers.csv", NAME, rows)
    per_seed = [chunk_means([tuple(e) for e in r["episodes"]], steps, CHUNKS) for r in results]
    repro.write_curve(out / "curves" / f"{NAME}.csv", curve_rows(per_seed), len(results))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--env", default="HalfCheetah-v5")
    p.add_argument("--steps", type=int, default=300_000, help="env steps per seed")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads per seed's process")
    p.add_argument("--out", type=Path, default=HERE / "results", help="where peers.csv and the curve go")
    p.add_argument("--worker", action="store_true", help="(internal) train one --seed in the peer venv")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args.env, args.steps, args.seed, args.threads)))
        return 0
    results = run_seeds(args.env, args.steps, args.seeds, args.threads)
    record(results, args.out, args.steps)
    for r in results:
        print(f"seed {r['seed']}: {r['final_return']:.1f} ({r['learn_s']:.0f} s, {r['steps_per_s']:.0f} env steps/s, "
              f"{r['cores_used']:.2f} cores)")
    print(f"{NAME}: {ZOO}; sb3 {results[0]['sb3_version']}, torch {results[0]['torch_version']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

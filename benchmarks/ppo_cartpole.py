"""PPO on CartPole-v1: sparqrl (one compiled JAX program) against Stable-Baselines3, same machine, one run.

    bash benchmarks/setup_peer.sh                       # once: the peer's venv (.bench-venv)
    .venv/bin/python benchmarks/ppo_cartpole.py [--steps 500000] [--seeds 64] [--sb3-steps 50000] [--json OUT]

Both sides use PureJaxRL's CartPole hyperparameters: 4 envs x 128 steps, 4 epochs x 4 minibatches,
Adam 2.5e-4 annealed to 0, gamma 0.99, GAE lambda 0.95, clip 0.2, entropy 0.01, value 0.5, grad norm
0.5, separate 64-64 tanh actor and critic.

sparqrl: the time to trace and compile `jax.jit(train)` (persistent compilation cache off), then the
run time of the compiled program (`block_until_ready`) for one seed, then the same for `--seeds`
seeds vmapped into one program. Final return: deterministic policy, 10 episodes per seed.

SB3 runs in a subprocess of the peer venv (benchmarks/peer_sb3_ppo.py) for `--sb3-steps` steps
(default 50k: it runs at a few thousand steps/s); its wall time for `--steps` is extrapolated from
that rate, and its final return is the one it reaches at its own, smaller budget.

The goals (from the PPO issue) are printed with PASS or MISS; this script never fails on a MISS:
benchmarks are not tests.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEER_PYTHON = ROOT / ".bench-venv" / "bin" / "python"
PEER_SCRIPT = ROOT / "benchmarks" / "peer_sb3_ppo.py"

# name, description, test on the results dict
GOALS = [
    ("speedup_vs_sb3", "sparqrl 1-seed steps/s >= 30x SB3 steps/s",
     lambda r: r["ratios"]["speedup_vs_sb3"] is not None and r["ratios"]["speedup_vs_sb3"] >= 30.0),
    ("compile_time", "compile (trace + XLA) of the 1-seed program < 6 s",
     lambda r: r["sparqrl"]["one_seed"]["compile_s"] < 6.0),
    ("one_seed_run", "one seed, 500k steps, < 5 s after compilation",
     lambda r: r["sparqrl"]["one_seed"]["run_s_for_500k"] < 5.0),
    ("vmap_scaling", "many seeds vmapped: total steps/s >= 1.5x one-seed steps/s",
     lambda r: r["ratios"]["many_seeds_over_one"] is not None and r["ratios"]["many_seeds_over_one"] >= 1.5),
]


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or "unknown"


def cpu_busy(seconds: float = 1.0) -> float | None:
    """Fraction of all cores busy over `seconds` (from /proc/stat); None where there is no /proc/stat."""
    def sample():
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        idle = values[3] + values[4]  # idle + iowait
        return sum(values), idle

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except OSError:
        return None
    return 1.0 - (idle1 - idle0) / max(total1 - total0, 1)


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def bench_sparqrl(args) -> dict:
    import jax
    import numpy as np

    # Compile times must be real compilations, never a hit in a cache left by an earlier run.
    jax.config.update("jax_enable_compilation_cache", False)

    from sparqrl.algos import ppo
    from sparqrl.algos.base import evaluate
    from sparqrl.envs import make_env

    env = make_env("CartPole-v1")
    cfg = ppo.Config(
        total_timesteps=args.steps, num_envs=4, num_steps=128, lr=2.5e-4, anneal_lr=True,
        update_epochs=4, num_minibatches=4, gamma=0.99, gae_lambda=0.95, clip_eps=0.2,
        ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, hidden=(64, 64), activation="tanh",
    )
    cfg.validate(env)
    train = ppo.make_train(cfg, env)
    algo = ppo.make_algorithm(cfg, env)
    steps_per_seed = cfg.num_updates * cfg.batch_size  # leftover steps below one batch are not run

    def eval_one(state, key):
        return evaluate(env, algo.act, algo.policy(state), key, args.eval_episodes)

    def final_returns(state, keys, batched):
        fn = jax.vmap(eval_one) if batched else eval_one
        returns = np.asarray(jax.jit(fn)(state, keys))  # [seeds, episodes] or [episodes]
        return returns.reshape(-1, args.eval_episodes)

    def curve_return(metrics, last):
        """Mean return of the episodes that finished in the last `last` updates (training policy)."""
        s = np.asarray(metrics["episode_return_sum"])[..., -last:].sum()
        c = np.asarray(metrics["episode_count"])[..., -last:].sum()
        return float(s / c) if c > 0 else float("nan")

    def measure(fn, arg, repeats):
        lowered, trace_s = timed(lambda: jax.jit(fn).lower(arg))
        compiled, xla_s = timed(lowered.compile)
        runs = []
        for _ in range(repeats):
            out, run_s = timed(lambda: jax.block_until_ready(compiled(arg)))
            runs.append(run_s)
        return out, {"trace_s": trace_s, "xla_compile_s": xla_s, "compile_s": trace_s + xla_s,
                     "run_s_each": runs, "run_s": min(runs)}

    key = jax.random.key(args.seed)
    train_key, eval_key = jax.random.split(key)
    result = {"config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(cfg).items()},
              "steps_per_seed": steps_per_seed}

    print(f"sparqrl: 1 seed x {steps_per_seed:,} steps ...", flush=True)
    (state, metrics), one = measure(train, train_key, args.repeats)
    one["steps_per_s"] = steps_per_seed / one["run_s"]
    one["run_s_for_500k"] = one["run_s"] * 500_000 / steps_per_seed
    returns = final_returns(state, eval_key, batched=False)
    one["final_return"] = float(returns.mean())
    one["eval_returns"] = returns[0].tolist()
    one["train_return_last_10_updates"] = curve_return(metrics, 10)
    result["one_seed"] = one
    print(f"  compile {one['compile_s']:.2f} s (trace {one['trace_s']:.2f} + XLA {one['xla_compile_s']:.2f}), "
          f"run {one['run_s']:.2f} s, {one['steps_per_s']:,.0f} steps/s, return {one['final_return']:.1f}",
          flush=True)

    if args.seeds > 1:
        n = args.seeds
        keys = jax.random.split(train_key, n)
        print(f"sparqrl: {n} seeds vmapped x {steps_per_seed:,} steps ...", flush=True)
        (state, metrics), many = measure(jax.vmap(train), keys, 1)
        many["seeds"] = n
        many["steps_per_s"] = n * steps_per_seed / many["run_s"]
        many["steps_per_s_per_seed"] = steps_per_seed / many["run_s"]
        returns = final_returns(state, jax.random.split(eval_key, n), batched=True)
        per_seed = returns.mean(axis=1)
        many["final_return_mean"] = float(per_seed.mean())
        many["final_return_std"] = float(per_seed.std())
        many["final_return_min"] = float(per_seed.min())
        many["seeds_solved_500"] = int((per_seed >= 500.0).sum())
        many["train_return_last_10_updates"] = curve_return(metrics, 10)
        result["many_seeds"] = many
        print(f"  compile {many['compile_s']:.2f} s, run {many['run_s']:.2f} s, "
              f"{many['steps_per_s']:,.0f} steps/s total, return {many['final_return_mean']:.1f} "
              f"+- {many['final_return_std']:.1f}", flush=True)
        del state, metrics
    return result


def bench_sb3(args) -> dict:
    if not PEER_PYTHON.exists():
        return {"error": f"{PEER_PYTHON} not found: run `bash benchmarks/setup_peer.sh` first"}
    cmd = [str(PEER_PYTHON), str(PEER_SCRIPT), "--steps", str(args.sb3_steps),
           "--seed", str(args.seed), "--threads", str(args.sb3_threads)]
    print(f"Stable-Baselines3: {args.sb3_steps:,} steps in {PEER_PYTHON.parent.parent.name} ...", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-2000:]}"}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall_s_for_500k"] = 500_000 / out["steps_per_s"]
    out["extrapolated"] = out["steps"] < 500_000
    print(f"  learn {out['learn_s']:.2f} s for {out['steps']:,} steps, {out['steps_per_s']:,.0f} steps/s, "
          f"return {out['final_return']:.1f}", flush=True)
    return out


def fmt(x, spec=",.0f", none="-"):
    return none if x is None else format(x, spec)


def print_table(r: dict) -> None:
    one = r["sparqrl"]["one_seed"]
    many = r["sparqrl"].get("many_seeds")
    sb3 = r["sb3"]
    have_sb3 = "error" not in sb3
    n = many["seeds"] if many else 0

    rows = [("", "sparqrl 1 seed", f"sparqrl {n} seeds" if many else "", "SB3 (1 seed)")]
    rows.append(("compile time (s)", fmt(one["compile_s"], ".2f"), fmt(many and many["compile_s"], ".2f"), "n/a"))
    rows.append(("env steps/s", fmt(one["steps_per_s"]), fmt(many and many["steps_per_s"]),
                 fmt(sb3.get("steps_per_s"))))
    sb3_wall = fmt(sb3.get("wall_s_for_500k"), ".1f")
    if have_sb3 and sb3["extrapolated"]:
        sb3_wall += f" (from {sb3['steps']:,})"
    rows.append(("wall per seed, 500k steps (s)", fmt(one["run_s_for_500k"], ".2f"),
                 fmt(many and many["run_s"] * 500_000 / r["sparqrl"]["steps_per_seed"], ".2f"), sb3_wall))
    sb3_ret = fmt(sb3.get("final_return"), ".1f")
    if have_sb3:
        sb3_ret += f" (at {sb3['steps']:,})"
    rows.append(("final return (det., 10 ep.)", fmt(one["final_return"], ".1f"),
                 (f"{many['final_return_mean']:.1f} +- {many['final_return_std']:.1f}" if many else ""), sb3_ret))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    print()
    for i, row in enumerate(rows):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))

    ratios = r["ratios"]
    print()
    print(f"sparqrl 1-seed steps/s / SB3 steps/s:      {fmt(ratios['speedup_vs_sb3'], '.1f')}x")
    print(f"sparqrl {n}-seed total steps/s / SB3:       {fmt(ratios['many_seeds_vs_sb3'], '.1f')}x")
    print(f"sparqrl {n}-seed total / 1-seed steps/s:     {fmt(ratios['many_seeds_over_one'], '.2f')}x")
    if have_sb3 and sb3["extrapolated"]:
        print(f"(SB3 measured over {sb3['steps']:,} steps, not {r['steps']:,}: its steps/s is steady after the "
              f"first rollout; its return is at that smaller budget)")
    if not have_sb3:
        print(f"SB3 not measured: {sb3['error']}")
    print()
    print("goals:")
    for name, desc, _ in GOALS:
        status = r["goals"][name]
        print(f"  {status:4s}  {desc}")


def main() -> None:
    parser = argparse.ArgumentParser(description="PPO CartPole-v1: sparqrl vs Stable-Baselines3 speed.")
    parser.add_argument("--steps", type=int, default=500_000, help="env steps per sparqrl seed")
    parser.add_argument("--seeds", type=int, default=64, help="seeds of the vmapped run (1: skip it)")
    parser.add_argument("--sb3-steps", type=int, default=50_000, help="env steps of the SB3 run (0: skip SB3)")
    parser.add_argument("--sb3-threads", type=int, default=os.cpu_count() or 1, help="torch threads of SB3")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of the compiled 1-seed program (best kept)")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                        help="first wait up to this long for the other processes to leave the CPU (<20%% busy)")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="dump the stacks and exit 1 if the whole benchmark takes longer (a hang is never silent)")
    parser.add_argument("--json", type=Path, default=None, help="write all numbers here")
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.timeout, exit=True)

    import jax

    r = {
        "benchmark": "ppo_cartpole",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name] + sys.argv),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "jax": jax.__version__,
                    "jax_devices": [str(d) for d in jax.devices()]},
        "steps": args.steps,
    }
    print(f"device: {jax.devices()}  cpu: {r['machine']['cpu']} ({r['machine']['cores']} cores)  jax {jax.__version__}")
    # These machines are shared: a load already near the core count means every number below is low.
    deadline = time.monotonic() + args.wait_quiet
    busy = cpu_busy()
    while busy is not None and busy > 0.2 and time.monotonic() < deadline:
        time.sleep(4.0)
        busy = cpu_busy()
    r["machine"]["cpu_busy_before_start"] = busy
    r["machine"]["loadavg_1m_start"] = os.getloadavg()[0]
    if busy is not None and busy > 0.2:
        print(f"warning: {busy:.0%} of the CPU was busy with other processes just before starting: "
              "the timings below will be low and noisy; run again on a quiet machine")

    r["sparqrl"] = bench_sparqrl(args)
    r["machine"]["loadavg_1m_after_sparqrl"] = os.getloadavg()[0]
    r["sb3"] = bench_sb3(args) if args.sb3_steps > 0 else {"error": "skipped (--sb3-steps 0)"}
    r["machine"]["loadavg_1m_end"] = os.getloadavg()[0]

    one = r["sparqrl"]["one_seed"]
    many = r["sparqrl"].get("many_seeds")
    sb3_rate = r["sb3"].get("steps_per_s")
    r["ratios"] = {
        "speedup_vs_sb3": one["steps_per_s"] / sb3_rate if sb3_rate else None,
        "many_seeds_vs_sb3": many["steps_per_s"] / sb3_rate if (many and sb3_rate) else None,
        "many_seeds_over_one": many["steps_per_s"] / one["steps_per_s"] if many else None,
    }
    r["goals"] = {name: ("PASS" if test(r) else "MISS") for name, _, test in GOALS}
    print_table(r)

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(r, indent=2) + "\n")
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()

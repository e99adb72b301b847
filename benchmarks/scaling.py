"""Seeds per device: PPO with 1 to thousands of seeds vmapped in one program, through `sparqrl train`.

    .venv/bin/python benchmarks/scaling.py [--seeds 1,64,1024,4096] [--steps 500000] [--json OUT]
    .venv/bin/python benchmarks/scaling.py --seeds 1,4 --steps 20480 --brax-steps 4096 --minatar-steps 8192  # smoke

Runs, each in its own subprocess (so each peak memory is its own, and a run that fails, e.g. out of
memory at 4096 seeds, does not stop the others):

  CartPole-v1   PPO with PureJaxRL's CartPole hyperparameters (`ppo.Config()`'s defaults: 4 envs x 128
                steps, 4 epochs x 4 minibatches, Adam 2.5e-4 annealed, separate 64-64 tanh actor and critic),
                `--steps` env steps per seed, for every seed count of `--seeds`;
  Brax          PPO on `--brax-env` (default brax:inverted_pendulum, continuous actions, observation and
                reward normalisation), `--brax-steps` per seed, for every count of `--brax-seeds`;
  MinAtar       PPO on `--minatar-env` (default Breakout-MinAtar, 10x10 image observations: the MinAtar CNN
                torso), `--minatar-steps` per seed, for every count of `--minatar-seeds`.

Every run is `sparqrl.runners.train` (the on-device runner: jitted chunks, logging, the final evaluation
and checkpoint, persistent compilation cache off so compile times are real). Per run:

  total env steps/s      all seeds' env steps / (wall time - compile time): sparqrl's summary.json figure;
  wall incl. compile     time around `train()` in the worker: compilation, training, evaluation, the
                         checkpoint and the run folder (not the Python and JAX imports: see process_wall_s
                         in the JSON);
  compile                trace + XLA compilation of the runner's programs (summary's compile_time_s);
  peak memory            on an accelerator the device allocator's peak (`memory_stats()['peak_bytes_in_use']`,
                         largest over devices); on the CPU the worker process's peak RSS (ru_maxrss).

Defaults depend on the platform (a child process asks JAX, so this process never touches the device):
on a GPU (or other accelerator) `--seeds 1,64,1024,4096`, Brax and MinAtar 1 and 64 seeds x 1M steps; on
the CPU `--seeds 1,8,64`, Brax and MinAtar 1 seed x 50k steps. `--steps` is 500k on both.

Goal (issue 11): on one H100, 1024 seeds x 500k CartPole steps in under 60 s including compilation
(PureJaxRL: 2048 agents in about 98 s on an A100). It is printed with PASS or MISS on an accelerator, and
as n/a on the CPU; this script never fails on a MISS: benchmarks are not tests.
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
WORKER_TAG = "SCALING-RESULT "
GOAL_SEEDS, GOAL_STEPS, GOAL_WALL_S = 1024, 500_000, 60.0

# PPO hyperparameters per family; `total_timesteps` is set per run. CartPole: ppo.Config()'s defaults,
# which are PureJaxRL's CartPole-v1 settings.
PPO = {
    "cartpole": {},
    # Continuous control in the style of PureJaxRL's Brax PPO (no LR annealing, no entropy bonus,
    # normalised observations and rewards), with fewer envs per seed: seeds multiply them.
    "brax": {"num_envs": 64, "num_steps": 16, "update_epochs": 4, "num_minibatches": 4, "lr": 3e-4,
             "anneal_lr": False, "ent_coef": 0.0, "hidden": (64, 64), "activation": "tanh",
             "normalize_obs": True, "normalize_reward": True},
    # MinAtar: 64 envs x 128 steps, 8 minibatches, relu; the Conv(16, 3x3) torso is chosen from the
    # [10, 10, C] observation, followed by one 128-wide layer (the MinAtar baseline network).
    "minatar": {"num_envs": 64, "num_steps": 128, "update_epochs": 4, "num_minibatches": 8, "lr": 5e-4,
                "anneal_lr": True, "hidden": (128,), "activation": "relu"},
}

DEFAULTS = {
    "accelerator": {"seeds": "1,64,1024,4096", "brax_seeds": "1,64", "brax_steps": 1_000_000,
                    "minatar_seeds": "1,64", "minatar_steps": 1_000_000},
    "cpu": {"seeds": "1,8,64", "brax_seeds": "1", "brax_steps": 50_000,
            "minatar_seeds": "1", "minatar_steps": 50_000},
}


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or "unknown"


def seed_list(text: str) -> list[int]:
    return [int(s) for s in str(text).split(",") if s.strip()]


# ---------------------------------------------------------------------------------------------
# The worker: one run in its own process


def worker(spec: dict) -> dict:
    import resource
    import tempfile

    import jax

    from sparqrl.algos import ppo
    from sparqrl.runners import RunConfig, train

    params = dict(spec["ppo"])
    if "hidden" in params:
        params["hidden"] = tuple(params["hidden"])
    config = ppo.Config(total_timesteps=spec["steps"], **params)
    with tempfile.TemporaryDirectory(prefix="sparqrl-scaling-") as tmp:
        run = RunConfig(env=spec["env"], seeds=spec["seeds"], out=str(Path(tmp) / "run"), progress=False,
                        energy=False, compile_cache=False, chunks=spec["chunks"], eval_every=0,
                        eval_episodes=spec["eval_episodes"], checkpoint_every=spec["chunks"])
        start = time.perf_counter()
        summary = train("ppo", config, run)
        wall = time.perf_counter() - start

    device = jax.devices()[0]
    peak_device = None
    if device.platform != "cpu":
        peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in jax.devices()]
        peaks = [p for p in peaks if p is not None]
        peak_device = max(peaks) if peaks else None
    steps = int(summary["steps"])
    seeds = int(summary["seeds"])
    return {
        "family": spec["family"],
        "env": spec["env"],
        "seeds": seeds,
        "steps_per_seed": steps,
        "env_steps_per_s": summary["env_steps_per_s"],
        "env_steps_per_s_incl_compile": steps * seeds / wall,
        "wall_s": wall,
        "summary_wall_time_s": summary["wall_time_s"],
        "compile_s": summary["compile_time_s"],
        "peak_device_bytes": peak_device,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # Linux: KiB
        "final_return_mean": summary["final_return_mean"],
        "final_return_std": summary["final_return_std"],
        "device": summary["device"],
        "device_kind": getattr(device, "device_kind", device.platform),
        "devices_used": summary.get("devices_used"),
        "ppo": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(config).items()},
    }


def run_worker(spec: dict, timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--worker", json.dumps(spec)]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**spec, "error": f"timed out after {timeout:.0f} s"}
    process_wall = time.perf_counter() - start
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(WORKER_TAG):
            return {**json.loads(line[len(WORKER_TAG):]), "process_wall_s": process_wall}
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
    return {**spec, "error": f"exit {proc.returncode}: " + " | ".join(tail)[-1500:]}


def probe_device() -> dict:
    """The platform and device, asked of JAX in a child process (this one never initialises a device)."""
    code = ("import jax, json; d = jax.devices()[0]; print(json.dumps({'platform': d.platform, "
            "'device_kind': getattr(d, 'device_kind', d.platform), 'count': jax.device_count(), "
            "'devices': [str(x) for x in jax.devices()], 'jax': jax.__version__}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"JAX could not start: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# Output


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def print_table(results: list[dict], accelerator: bool) -> None:
    memory = "peak device memory" if accelerator else "peak RSS (host)"
    rows = [["env", "seeds", "env steps/seed", "total env steps/s", "wall incl. compile (s)", "compile (s)",
             memory, "final return"]]
    for r in results:
        if "error" in r:
            rows.append([r["env"], str(r["seeds"]), f"{r['steps']:,}", "failed", "-", "-", "-", "-"])
            continue
        mem = r["peak_device_bytes"] if accelerator else r["peak_rss_bytes"]
        rows.append([r["env"], str(r["seeds"]), f"{r['steps_per_seed']:,}", f"{r['env_steps_per_s']:,.0f}",
                     f"{r['wall_s']:.1f}", f"{r['compile_s']:.1f}", fmt_bytes(mem),
                     f"{r['final_return_mean']:.1f} +- {r['final_return_std']:.1f}"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print()
    for i, row in enumerate(rows):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    for r in results:
        if "error" in r:
            print(f"{r['env']} x {r['seeds']} seeds failed: {r['error']}")


def goal(results: list[dict], accelerator: bool, device: str) -> dict:
    hit = [r for r in results if r["family"] == "cartpole" and r["seeds"] == GOAL_SEEDS and "error" not in r]
    desc = (f"{GOAL_SEEDS} seeds x {GOAL_STEPS // 1000}k CartPole steps, wall incl. compile < {GOAL_WALL_S:.0f} s "
            "on one H100 (PureJaxRL: 2048 agents ~98 s on an A100)")
    if not hit:
        return {"description": desc, "result": "not measured", "why": f"no successful {GOAL_SEEDS}-seed CartPole run"}
    r = hit[0]
    if r["steps_per_seed"] < GOAL_STEPS - 512:  # the last partial batch of 500k is not run
        return {"description": desc, "result": "not measured", "wall_s": r["wall_s"],
                "why": f"only {r['steps_per_seed']:,} steps per seed (--steps)"}
    if not accelerator:
        return {"description": desc, "result": "n/a", "wall_s": r["wall_s"], "why": f"measured on {device}, not a GPU"}
    return {"description": desc, "result": "PASS" if r["wall_s"] < GOAL_WALL_S else "MISS", "wall_s": r["wall_s"],
            "device": r["device"]}


# ---------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description="PPO seeds-per-device scaling through `sparqrl train`.")
    parser.add_argument("--seeds", default=None, help="CartPole seed counts, comma-separated "
                        "(default: 1,64,1024,4096 on an accelerator, 1,8,64 on the CPU)")
    parser.add_argument("--steps", type=int, default=500_000, help="CartPole env steps per seed")
    parser.add_argument("--brax-env", default="brax:inverted_pendulum")
    parser.add_argument("--brax-seeds", default=None, help="(default: 1,64 on an accelerator, 1 on the CPU)")
    parser.add_argument("--brax-steps", type=int, default=None, help="(default: 1M on an accelerator, 50k on the CPU)")
    parser.add_argument("--minatar-env", default="Breakout-MinAtar")
    parser.add_argument("--minatar-seeds", default=None, help="(default: 1,64 on an accelerator, 1 on the CPU)")
    parser.add_argument("--minatar-steps", type=int, default=None,
                        help="(default: 1M on an accelerator, 50k on the CPU)")
    parser.add_argument("--skip-brax", action="store_true")
    parser.add_argument("--skip-minatar", action="store_true")
    parser.add_argument("--chunks", type=int, default=10, help="host-loop chunks per run (RunConfig.chunks)")
    parser.add_argument("--eval-episodes", type=int, default=10, help="final deterministic episodes per seed")
    parser.add_argument("--run-timeout", type=float, default=1800.0, help="stop one run after this many seconds")
    parser.add_argument("--timeout", type=float, default=7200.0,
                        help="dump the stacks and exit 1 if the whole benchmark takes longer (a hang is never silent)")
    parser.add_argument("--json", type=Path, default=None, help="write all numbers here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.timeout, exit=True)
    if args.worker is not None:
        print(WORKER_TAG + json.dumps(worker(json.loads(args.worker))), flush=True)
        return

    dev = probe_device()
    accelerator = dev["platform"] != "cpu"
    defaults = DEFAULTS["accelerator" if accelerator else "cpu"]
    seeds = seed_list(args.seeds or defaults["seeds"])
    specs = [{"family": "cartpole", "env": "CartPole-v1", "seeds": n, "steps": args.steps} for n in seeds]
    if not args.skip_brax:
        specs += [{"family": "brax", "env": args.brax_env, "seeds": n,
                   "steps": args.brax_steps or defaults["brax_steps"]}
                  for n in seed_list(args.brax_seeds or defaults["brax_seeds"])]
    if not args.skip_minatar:
        specs += [{"family": "minatar", "env": args.minatar_env, "seeds": n,
                   "steps": args.minatar_steps or defaults["minatar_steps"]}
                  for n in seed_list(args.minatar_seeds or defaults["minatar_seeds"])]

    device = f"{dev['platform']}:{dev['device_kind']} x{dev['count']}"
    r = {
        "benchmark": "scaling",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name] + sys.argv),
        "machine": {"device": device, "devices": dev["devices"], "cpu": cpu_model(), "cores": os.cpu_count(),
                    "platform": platform.platform(), "python": platform.python_version(), "jax": dev["jax"],
                    "loadavg_1m_start": os.getloadavg()[0]},
        "runs": [],
    }
    print(f"device: {device}  cpu: {r['machine']['cpu']} ({r['machine']['cores']} cores)  jax {dev['jax']}  "
          f"load {r['machine']['loadavg_1m_start']:.2f}", flush=True)
    for spec in specs:
        spec = {**spec, "ppo": PPO[spec["family"]], "chunks": args.chunks, "eval_episodes": args.eval_episodes}
        print(f"PPO {spec['env']}: {spec['seeds']} seed(s) x {spec['steps']:,} steps ...", flush=True)
        out = run_worker(spec, args.run_timeout)
        r["runs"].append(out)
        if "error" in out:
            print(f"  failed: {out['error']}", flush=True)
        else:
            mem = out["peak_device_bytes"] if accelerator else out["peak_rss_bytes"]
            print(f"  {out['env_steps_per_s']:,.0f} env steps/s, wall {out['wall_s']:.1f} s incl. compile "
                  f"{out['compile_s']:.1f} s (process {out['process_wall_s']:.1f} s), peak "
                  f"{'device' if accelerator else 'RSS'} {fmt_bytes(mem)}, return {out['final_return_mean']:.1f}",
                  flush=True)
    r["machine"]["loadavg_1m_end"] = os.getloadavg()[0]

    print(f"\ndevice: {device}")
    print_table(r["runs"], accelerator)
    r["goal"] = g = goal(r["runs"], accelerator, device)
    print()
    print(f"goal: {g['description']}")
    notes = ([f"{g['wall_s']:.1f} s"] if "wall_s" in g else []) + ([g["why"]] if "why" in g else [])
    print(f"  {g['result']}" + (f" ({'; '.join(notes)})" if notes else ""))

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(r, indent=2) + "\n")
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()

"""PPO on CartPole-v1: sparqrl (one compiled JAX program) against Stable-Baselines3, same machine, one run.

    bash benchmarks/setup_peer.sh                       # once: the peer's venv (.bench-venv)
    .venv/bin/python benchmarks/ppo_cartpole.py [--steps 500000] [--seeds 64] [--sb3-steps 50000] [--json OUT]

Both sides use PureJaxRL's CartPole hyperparameters: 4 envs x 128 steps, 4 epochs x 4 minibatches,
Adam 2.5e-4 annealed to 0, gamma 0.99, GAE lambda 0.95, clip 0.2 (policy and value), entropy 0.01,
value 0.5, grad norm 0.5, separate 64-64 tanh actor and critic.

sparqrl, in this order:
  1 seed      the time to trace and compile `jax.jit(train)` (persistent compilation cache off), then
              the run time of the compiled program (`block_until_ready`; best of `--repeats`);
  N seeds     `jax.jit(jax.vmap(train))` over `--seeds` keys on one device: compile, run;
  N seeds sharded (CPU only, `--cpu-devices`, default: one per core) the same vmapped program split
              over that many XLA host devices with `shard_map`, the way the Anakin runner shards seeds;
              it runs in a subprocess, because the host device count is fixed when JAX starts.
Final return: the deterministic policy, `--eval-episodes` episodes per seed (`sparqrl.algos.evaluate`).

SB3 runs in a subprocess of the peer venv (benchmarks/peer_sb3_ppo.py) for `--sb3-steps` steps
(default 50k: it runs at a few thousand steps/s); its wall time for `--steps` is extrapolated from
that rate, and its final return is the one it reaches at its own, smaller budget. It runs before and
after sparqrl, each time with torch threads = cores and = 1 (`--sb3-threads`), and the fastest run
counts: these machines are shared, torch's thread pool crawls when another process holds a core, and
the doubt goes to the peer.

Every run also reports `cores used` (CPU seconds of its process per wall second), which shows how
much of the machine it really had.

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
WORKER_TAG = "SHARDED-RESULT "


def _ratio(r: dict, name: str) -> float | None:
    return r["ratios"].get(name)


# name, description, test on the results dict (None: could not be measured)
GOALS = [
    ("speedup_vs_sb3", "sparqrl 1-seed steps/s >= 30x SB3 steps/s",
     lambda r: None if _ratio(r, "speedup_vs_sb3") is None else _ratio(r, "speedup_vs_sb3") >= 30.0),
    ("compile_time", "compile (trace + XLA) of the 1-seed program < 6 s",
     lambda r: r["sparqrl"]["one_seed"]["compile_s"] < 6.0),
    ("one_seed_run", "one seed, 500k steps, < 5 s after compilation",
     lambda r: r["sparqrl"]["one_seed"]["run_s_for_500k"] < 5.0),
    ("vmap_scaling", "many seeds vmapped: total steps/s >= 1.5x one-seed steps/s",
     lambda r: None if _ratio(r, "many_seeds_over_one") is None else _ratio(r, "many_seeds_over_one") >= 1.5),
]
# Not a goal of the issue: the same bar for the seeds sharded over one host device per core.
EXTRA_GOALS = [
    ("sharded_scaling", "(extra) many seeds sharded over the CPU cores: total >= 1.5x one-seed steps/s",
     lambda r: None if _ratio(r, "sharded_over_one") is None else _ratio(r, "sharded_over_one") >= 1.5),
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


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


class Sparqrl:
    """The PPO under test and the measurements of it; JAX is imported here, not at module load."""

    def __init__(self, args):
        import jax
        import numpy as np

        # Compile times must be real compilations, never a hit in a cache left by an earlier run.
        jax.config.update("jax_enable_compilation_cache", False)

        from sparqrl.algos import ppo
        from sparqrl.algos.base import evaluate
        from sparqrl.envs import make_env

        self.jax, self.np, self.args = jax, np, args
        self.env = env = make_env("CartPole-v1")
        self.cfg = cfg = ppo.Config(
            total_timesteps=args.steps, num_envs=4, num_steps=128, lr=2.5e-4, anneal_lr=True,
            update_epochs=4, num_minibatches=4, gamma=0.99, gae_lambda=0.95, clip_eps=0.2,
            ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, hidden=(64, 64), activation="tanh",
        )
        cfg.validate(env)
        self.train = ppo.make_train(cfg, env)
        algo = ppo.make_algorithm(cfg, env)
        self.steps_per_seed = cfg.num_updates * cfg.batch_size  # leftover steps below one batch are not run
        self.eval_one = lambda state, key: evaluate(env, algo.act, algo.policy(state), key, args.eval_episodes)
        self.train_key, self.eval_key = jax.random.split(jax.random.key(args.seed))

    def measure(self, fn, arg, repeats: int):
        jax = self.jax
        lowered, trace_s = timed(lambda: jax.jit(fn).lower(arg))
        compiled, xla_s = timed(lowered.compile)
        runs, cores = [], []
        for _ in range(repeats):
            cpu0 = cpu_seconds()
            out, run_s = timed(lambda: jax.block_until_ready(compiled(arg)))
            runs.append(run_s)
            cores.append((cpu_seconds() - cpu0) / run_s)
        # cores_used: CPU seconds of this process per second of the run: how many cores it had.
        return out, {"trace_s": trace_s, "xla_compile_s": xla_s, "compile_s": trace_s + xla_s,
                     "run_s_each": runs, "run_s": min(runs), "cores_used": cores[runs.index(min(runs))]}

    def curve_return(self, metrics, last: int = 10) -> float:
        """Mean return of the episodes that finished in the last `last` updates (training policy)."""
        s = self.np.asarray(metrics["episode_return_sum"])[..., -last:].sum()
        c = self.np.asarray(metrics["episode_count"])[..., -last:].sum()
        return float(s / c) if c > 0 else float("nan")

    def one_seed(self) -> dict:
        (state, metrics), one = self.measure(self.train, self.train_key, self.args.repeats)
        one["steps_per_s"] = self.steps_per_seed / one["run_s"]
        one["run_s_for_500k"] = one["run_s"] * 500_000 / self.steps_per_seed
        returns = self.np.asarray(self.jax.jit(self.eval_one)(state, self.eval_key))
        one["final_return"] = float(returns.mean())
        one["eval_returns"] = returns.tolist()
        one["train_return_last_10_updates"] = self.curve_return(metrics)
        return one

    def many_seeds(self, n: int, devices: int = 1) -> dict:
        """n seeds vmapped in one program; with devices > 1, split over that many devices by shard_map."""
        jax, np = self.jax, self.np
        train_keys = jax.random.split(self.train_key, n)
        eval_keys = jax.random.split(self.eval_key, n)
        train_fn, eval_fn = jax.vmap(self.train), jax.vmap(self.eval_one)
        if devices > 1:
            from jax.sharding import Mesh, NamedSharding, PartitionSpec

            mesh = Mesh(np.array(jax.devices()[:devices]), ("seeds",))
            spec = PartitionSpec("seeds")
            # shard_map, not GSPMD: each device runs its own seeds and no collective is emitted (the
            # Anakin runner does the same).
            train_fn = jax.shard_map(train_fn, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
            eval_fn = jax.shard_map(eval_fn, mesh=mesh, in_specs=(spec, spec), out_specs=spec, check_vma=False)
            train_keys = jax.device_put(train_keys, NamedSharding(mesh, spec))
            eval_keys = jax.device_put(eval_keys, NamedSharding(mesh, spec))
        (state, metrics), many = self.measure(train_fn, train_keys, 1)
        many["seeds"] = n
        many["devices"] = devices
        many["steps_per_s"] = n * self.steps_per_seed / many["run_s"]
        many["run_s_for_500k"] = many["run_s"] * 500_000 / self.steps_per_seed
        per_seed = np.asarray(jax.jit(eval_fn)(state, eval_keys)).mean(axis=1)  # [seeds]
        many["final_return_mean"] = float(per_seed.mean())
        many["final_return_std"] = float(per_seed.std())
        many["final_return_min"] = float(per_seed.min())
        many["seeds_at_500"] = int((per_seed >= 500.0).sum())
        many["train_return_last_10_updates"] = self.curve_return(metrics)
        return many


def show(name: str, d: dict) -> None:
    if "error" in d:
        print(f"  {name}: not measured: {d['error']}", flush=True)
        return
    print(f"  compile {d['compile_s']:.2f} s (trace {d['trace_s']:.2f} + XLA {d['xla_compile_s']:.2f}), "
          f"run {d['run_s']:.2f} s on {d['cores_used']:.2f} cores, {d['steps_per_s']:,.0f} env steps/s, return "
          f"{d.get('final_return', d.get('final_return_mean')):.1f}", flush=True)


def bench_sharded(args, devices: int) -> dict:
    """The sharded measurement in a child process started with `devices` XLA host devices."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}").strip()
    cmd = [sys.executable, __file__, "--sharded-worker", str(devices), "--steps", str(args.steps),
           "--seeds", str(args.seeds), "--seed", str(args.seed), "--eval-episodes", str(args.eval_episodes)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(WORKER_TAG):
            return json.loads(line[len(WORKER_TAG):])
    return {"error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-2000:]}"}


def sharded_worker(args) -> None:
    import jax

    devices = args.sharded_worker
    if jax.device_count() < devices or args.seeds % devices:
        print(WORKER_TAG + json.dumps({"error": f"{jax.device_count()} devices, {args.seeds} seeds"}))
        return
    print(WORKER_TAG + json.dumps(Sparqrl(args).many_seeds(args.seeds, devices)), flush=True)


def bench_sb3(args, threads: int) -> dict:
    if not PEER_PYTHON.exists():
        return {"error": f"{PEER_PYTHON} not found: run `bash benchmarks/setup_peer.sh` first"}
    cmd = [str(PEER_PYTHON), str(PEER_SCRIPT), "--steps", str(args.sb3_steps),
           "--seed", str(args.seed), "--threads", str(threads)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=args.sb3_timeout)
    except subprocess.TimeoutExpired:
        print(f"  torch threads {threads}: still running after {args.sb3_timeout:.0f} s, stopped", flush=True)
        return {"error": f"timed out after {args.sb3_timeout:.0f} s", "torch_threads": threads}
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-2000:]}", "torch_threads": threads}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall_s_for_500k"] = 500_000 / out["steps_per_s"]
    out["extrapolated"] = out["steps"] < 500_000
    print(f"  torch threads {threads}: learn {out['learn_s']:.2f} s for {out['steps']:,} steps on "
          f"{out['cores_used']:.2f} cores, {out['steps_per_s']:,.0f} env steps/s, return {out['final_return']:.1f}",
          flush=True)
    return out


def fmt(x, spec=",.0f", none="-"):
    return none if x is None else format(x, spec)


def print_table(r: dict) -> None:
    sp = r["sparqrl"]
    one, many, sharded = sp["one_seed"], sp.get("many_seeds"), sp.get("sharded")
    if sharded is not None and "error" in sharded:
        sharded = None
    sb3 = r["sb3"]
    have_sb3 = "error" not in sb3
    columns = [("sparqrl 1 seed", one)]
    if many:
        columns.append((f"sparqrl {many['seeds']} seeds vmapped", many))
    if sharded:
        columns.append((f"{sharded['seeds']} seeds on {sharded['devices']} CPU devices", sharded))

    def ret(d):
        if "final_return" in d:
            return f"{d['final_return']:.1f}"
        return f"{d['final_return_mean']:.1f} +- {d['final_return_std']:.1f}"

    rows = [[""] + [c[0] for c in columns] + ["SB3 (1 seed)"]]
    rows.append(["compile time (s)"] + [fmt(d["compile_s"], ".2f") for _, d in columns] + ["n/a"])
    rows.append(["env steps/s (all seeds)"] + [fmt(d["steps_per_s"]) for _, d in columns]
                + [fmt(sb3.get("steps_per_s"))])
    sb3_wall = fmt(sb3.get("wall_s_for_500k"), ".1f")
    if have_sb3 and sb3["extrapolated"]:
        sb3_wall += " (extrap.)"
    rows.append(["cores used (CPU s / wall s)"] + [fmt(d["cores_used"], ".2f") for _, d in columns]
                + [fmt(sb3.get("cores_used"), ".2f")])
    rows.append(["wall for 500k steps/seed (s)"] + [fmt(d["run_s_for_500k"], ".2f") for _, d in columns]
                + [sb3_wall])
    sb3_ret = fmt(sb3.get("final_return"), ".1f")
    if have_sb3:
        sb3_ret += f" (at {sb3['steps'] // 1000}k)"
    rows.append(["final return (det., 10 ep.)"] + [ret(d) for _, d in columns] + [sb3_ret])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print()
    for i, row in enumerate(rows):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))

    ratios = r["ratios"]
    n = many["seeds"] if many else r["seeds"]
    print()
    lines = [("sparqrl 1 seed / SB3, env steps/s", fmt(ratios["speedup_vs_sb3"], ".1f"))]
    if many:
        lines += [(f"sparqrl {n} seeds vmapped (total) / SB3", fmt(ratios["many_seeds_vs_sb3"], ".1f")),
                  (f"sparqrl {n} seeds vmapped (total) / 1 seed", fmt(ratios["many_seeds_over_one"], ".2f"))]
    if sharded:
        lines.append((f"sparqrl {n} seeds on {sharded['devices']} CPU devices (total) / 1 seed",
                      fmt(ratios["sharded_over_one"], ".2f")))
    width = max(len(label) for label, _ in lines)
    for label, value in lines:
        print(f"{label.ljust(width)}  {value}x")
    if not sharded and "sharded" in sp:
        print(f"sharded run not measured: {sp['sharded']['error']}")
    if have_sb3:
        runs = ", ".join(f"{fmt(x['steps_per_s'])} ({x['torch_threads']} thr.)" for x in sb3["runs"])
        print(f"SB3: {sb3['steps']:,} steps per run, not {r['steps']:,}, so its wall for 500k is extrapolated "
              f"and its return is at that smaller budget. Its runs (before and after sparqrl), env steps/s: "
              f"{runs}; the fastest counts (torch threads: {sb3['torch_threads']}).")
    else:
        print(f"SB3 not measured: {sb3['error']}")
    print()
    print("goals:")
    for name, desc, _ in GOALS + EXTRA_GOALS:
        if name in r["goals"]:
            print(f"  {r['goals'][name]:4s}  {desc}")


def main() -> None:
    parser = argparse.ArgumentParser(description="PPO CartPole-v1: sparqrl vs Stable-Baselines3 speed.")
    parser.add_argument("--steps", type=int, default=500_000, help="env steps per sparqrl seed")
    parser.add_argument("--seeds", type=int, default=64, help="seeds of the many-seed runs (1: skip them)")
    parser.add_argument("--cpu-devices", type=int, default=os.cpu_count() or 1,
                        help="host devices of the sharded many-seed run on CPU (1: skip it)")
    parser.add_argument("--sb3-steps", type=int, default=50_000, help="env steps of each SB3 run (0: skip SB3)")
    parser.add_argument("--sb3-threads", default=",".join(dict.fromkeys(map(str, [os.cpu_count() or 1, 1]))),
                        help="torch thread counts of the SB3 runs, comma-separated; each runs before and after "
                             "sparqrl and the fastest run counts (default: one per core, and 1)")
    parser.add_argument("--sb3-timeout", type=float, default=300.0,
                        help="stop an SB3 run after this many seconds (torch's threads can crawl on busy cores)")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of the compiled 1-seed program (best kept)")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                        help="first wait up to this long for the other processes to leave the CPU (<20%% busy)")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="dump the stacks and exit 1 if the whole benchmark takes longer (a hang is never silent)")
    parser.add_argument("--json", type=Path, default=None, help="write all numbers here")
    parser.add_argument("--sharded-worker", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.timeout, exit=True)
    if args.sharded_worker:
        sharded_worker(args)
        return

    import jax

    r = {
        "benchmark": "ppo_cartpole",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name] + sys.argv),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "jax": jax.__version__,
                    "jax_devices": [str(d) for d in jax.devices()]},
        "steps": args.steps,
        "seeds": args.seeds,
    }
    print(f"device: {jax.devices()}  cpu: {r['machine']['cpu']} ({r['machine']['cores']} cores)  jax {jax.__version__}")
    # These machines are shared: another process on the cores makes every number below low.
    deadline = time.monotonic() + args.wait_quiet
    busy = cpu_busy()
    while busy is not None and busy > 0.2 and time.monotonic() < deadline:
        time.sleep(4.0)
        busy = cpu_busy()
    r["machine"]["cpu_busy_before_start"] = busy
    if busy is not None and busy > 0.2:
        print(f"warning: {busy:.0%} of the CPU was busy with other processes just before starting: "
              "the timings below will be low and noisy; run again on a quiet machine")
    load = r["machine"]["loadavg_1m"] = {"start": os.getloadavg()[0]}

    sb3_threads = [int(t) for t in str(args.sb3_threads).split(",") if t.strip()]
    sb3_runs = []
    if args.sb3_steps > 0:
        print(f"Stable-Baselines3 (before sparqrl): {args.sb3_steps:,} steps per run ...", flush=True)
        sb3_runs += [bench_sb3(args, t) for t in sb3_threads]
    load["after_sb3_1"] = os.getloadavg()[0]

    sp = Sparqrl(args)
    r["sparqrl"] = {"config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(sp.cfg).items()},
                    "steps_per_seed": sp.steps_per_seed}
    print(f"sparqrl: 1 seed x {sp.steps_per_seed:,} steps ...", flush=True)
    r["sparqrl"]["one_seed"] = sp.one_seed()
    show("1 seed", r["sparqrl"]["one_seed"])
    load["after_one_seed"] = os.getloadavg()[0]
    if args.seeds > 1:
        print(f"sparqrl: {args.seeds} seeds vmapped x {sp.steps_per_seed:,} steps ...", flush=True)
        r["sparqrl"]["many_seeds"] = sp.many_seeds(args.seeds)
        show("vmapped", r["sparqrl"]["many_seeds"])
        load["after_many_seeds"] = os.getloadavg()[0]
        if jax.devices()[0].platform == "cpu" and args.cpu_devices > 1:
            print(f"sparqrl: {args.seeds} seeds vmapped and sharded over {args.cpu_devices} CPU devices "
                  f"(subprocess) ...", flush=True)
            r["sparqrl"]["sharded"] = bench_sharded(args, args.cpu_devices)
            show("sharded", r["sparqrl"]["sharded"])
            load["after_sharded"] = os.getloadavg()[0]

    if args.sb3_steps > 0:
        print("Stable-Baselines3 (after sparqrl) ...", flush=True)
        sb3_runs += [bench_sb3(args, t) for t in sb3_threads]
        ok = [run for run in sb3_runs if "error" not in run]
        r["sb3"] = dict(max(ok, key=lambda run: run["steps_per_s"])) if ok else dict(sb3_runs[-1])
        r["sb3"]["runs"] = [{k: run.get(k) for k in ("torch_threads", "steps_per_s", "cores_used", "final_return",
                                                     "error")} for run in sb3_runs]
    else:
        r["sb3"] = {"error": "skipped (--sb3-steps 0)"}
    load["end"] = os.getloadavg()[0]

    one = r["sparqrl"]["one_seed"]
    many = r["sparqrl"].get("many_seeds")
    sharded = r["sparqrl"].get("sharded")
    sharded = sharded if sharded and "error" not in sharded else None
    sb3_rate = r["sb3"].get("steps_per_s")
    r["ratios"] = {
        "speedup_vs_sb3": one["steps_per_s"] / sb3_rate if sb3_rate else None,
        "many_seeds_vs_sb3": many["steps_per_s"] / sb3_rate if (many and sb3_rate) else None,
        "many_seeds_over_one": many["steps_per_s"] / one["steps_per_s"] if many else None,
        "sharded_over_one": sharded["steps_per_s"] / one["steps_per_s"] if sharded else None,
    }
    r["goals"] = {}
    for name, _, test in GOALS + EXTRA_GOALS:
        passed = test(r)
        if passed is not None or name in dict((g[0], 0) for g in GOALS):
            r["goals"][name] = {True: "PASS", False: "MISS", None: "n/a"}[passed]
    print_table(r)

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(r, indent=2) + "\n")
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()

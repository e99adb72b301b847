"""On-device env steps/s of every algorithm, one or more source trees side by side (issue 32, item 1's gate).

    .venv/bin/python benchmarks/on_device_speed.py [--trees BEFORE,AFTER] [--algos dqn,td3,sac,impala,ppo]
                                                   [--rounds 3] [--seeds 1] [--repeats 3] [--scale 1.0] [--json OUT]
    .venv/bin/python benchmarks/on_device_speed.py --trees A,B --rounds 1 --scale 0.05   # smoke: tiny budgets

Each algorithm runs on its home environment with its default Config, only `total_timesteps` set (`BUDGETS`,
times `--scale`): DQN (500k env steps), IMPALA (3M) and PPO (3M) on CartPole-v1, TD3 (8k) and SAC (6k: one
256x256 gradient step per env step) on Pendulum-v1. The budgets aim at one execution of roughly 10-30 s on an
idle 2-core CPU (estimated from runs on a loaded one); a worker (imports, compile, 1 + --repeats executions)
about 1-2 minutes, so a round of 5 algorithms over 2 trees about 15 minutes: the default 3 rounds about 45.

A measurement is one fresh subprocess (`--worker`) with PYTHONPATH set to the tree, so `import sparqrl` is
that tree's (checked: the worker reports the file it imported), which:
  builds  `sparqrl.algos.get_algorithm(name).make_train(config, env)`: the whole run as one function
          `train(key, hparams)`, the traced hyperparameters (the Config's `TRACED`) passed as runtime inputs as
          the runner passes them; 1 seed `jax.jit(train)`, N seeds `jax.jit(jax.vmap(train))` over N keys;
  compiles it (trace + lower + XLA, timed apart and not counted in steps/s; no persistent compile cache);
  runs    it once as a warm-up, then `--repeats` times with `block_until_ready`: the best counts;
          env steps/s = num_updates * env_steps_per_update * seeds / best time.
Only entry points that every tree has are used (`get_algorithm`, `Config(...).validate(env)`, `make_algorithm`,
`make_train`, `base.hparams_of`), so a tree whose internals changed still compares.

A round runs every algorithm once per tree, the trees' order alternating from one algorithm and round to
the next (so the machine's drift hits each tree alike). Printed per algorithm: each tree's median env
steps/s over the rounds (and the range), compile seconds, and the ratio last tree / first tree (after /
before). A benchmark never fails on a slow tree; a worker that crashes is reported with its error.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from machine import cpu_name  # (benchmarks/ is the script's folder)

ROOT = Path(__file__).resolve().parent.parent
RESULT_TAG = "ON-DEVICE-SPEED "

# algorithm -> (home environment, env steps per seed at --scale 1)
BUDGETS = {
    "dqn": ("CartPole-v1", 500_000),
    "td3": ("Pendulum-v1", 8_000),
    "sac": ("Pendulum-v1", 6_000),
    "impala": ("CartPole-v1", 3_000_000),
    "ppo": ("CartPole-v1", 3_000_000),
}


# ---------------------------------------------------------------------------------------------
# The worker: one tree, one algorithm, in a process of its own


def worker(spec: dict) -> dict:
    """Compile and time one algorithm's whole run in this process (whose `sparqrl` is the tree's)."""
    import jax
    import jax.numpy as jnp

    import sparqrl
    from sparqrl.algos import get_algorithm
    from sparqrl.algos.base import hparams_of
    from sparqrl.envs import make_env

    # the timing helpers are the rejax peer's (benchmarks/ is this script's folder, as for vs_rejax.py)
    from peer_rejax import compile_timed, run_timed

    module = get_algorithm(spec["algo"])
    env = make_env(spec["env"])
    config = module.Config(total_timesteps=spec["steps"]).validate(env)
    algo = module.make_algorithm(config, env)
    steps = algo.num_updates * algo.env_steps_per_update
    train, n = module.make_train(config, env), spec["seeds"]
    hparams = {k: jnp.float32(v) for k, v in hparams_of(config).items()}
    if n == 1:
        fn, arg = (lambda a: train(*a)), (jax.random.PRNGKey(0), hparams)
    else:
        many = {k: jnp.full((n,), v) for k, v in hparams.items()}
        fn, arg = (lambda a: jax.vmap(train)(*a)), (jax.random.split(jax.random.PRNGKey(0), n), many)
    compiled, compile_info = compile_timed(fn, arg)
    run_timed(compiled, arg, 1)  # warm-up
    _, run = run_timed(compiled, arg, spec["repeats"])
    device = jax.devices()[0]
    return {"sparqrl_file": sparqrl.__file__, "device": f"{device.platform} ({device.device_kind})",
            "env_steps": steps * n, "env_steps_per_s": steps * n / run["run_s"], **compile_info, **run}


def measure(tree: Path, spec: dict) -> dict:
    """One worker process on `tree`; its result, or {"error": ...} when it failed."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    for name in ("JAX_COMPILATION_CACHE_DIR", "JAX_ENABLE_COMPILATION_CACHE"):  # cold compiles, as vs_rejax.py
        env.pop(name, None)
    proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True,
                          cwd=tree, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            result = json.loads(line[len(RESULT_TAG):])
            if not Path(result["sparqrl_file"]).resolve().is_relative_to(tree.resolve()):
                return {"error": f"imported {result['sparqrl_file']}, not the tree's sparqrl"}
            return result
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
    return {"error": f"worker exit {proc.returncode}: " + " | ".join(tail)}


# ---------------------------------------------------------------------------------------------
# The driver


def tree_commit(tree: Path) -> str:
    """The tree's HEAD commit, '+dirty' when it has uncommitted changes to tracked files."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")




def run_rounds(trees: list[Path], algos: list[str], args: argparse.Namespace) -> dict:
    """{algo: {tree: [result per round]}}; the trees' order flips from one algorithm to the next and, for each
    algorithm, from one round to the next."""
    results = {a: {str(t): [] for t in trees} for a in algos}
    for r in range(args.rounds):
        for i, algo in enumerate(algos):
            env, budget = BUDGETS[algo]
            spec = {"algo": algo, "env": env, "steps": max(1, int(budget * args.scale)), "seeds": args.seeds,
                    "repeats": args.repeats}
            for tree in (trees[::-1] if (r + i) % 2 else trees):
                result = measure(tree, spec)
                results[algo][str(tree)].append(result)
                shown = (f"{result['env_steps_per_s']:,.0f} env steps/s (compile {result['compile_s']:.1f} s)"
                         if "error" not in result else result["error"])
                print(f"round {r + 1} {algo:<7} {tree}: {shown}", flush=True)
    return results


def summarise(results: dict, trees: list[Path]) -> dict:
    """Per algo and tree: the median (and range) over rounds of env steps/s and compile s; the ratio last/first."""
    summary = {}
    for algo, per_tree in results.items():
        entry = {}
        for tree in map(str, trees):
            ok = [r for r in per_tree[tree] if "error" not in r]
            rates = [r["env_steps_per_s"] for r in ok]
            entry[tree] = ({"median_env_steps_per_s": statistics.median(rates), "min": min(rates), "max": max(rates),
                            "median_compile_s": statistics.median(r["compile_s"] for r in ok), "rounds": len(ok)}
                           if ok else None)
        first, last = entry[str(trees[0])], entry[str(trees[-1])]
        if len(trees) > 1 and first and last:
            entry["ratio_last_over_first"] = last["median_env_steps_per_s"] / first["median_env_steps_per_s"]
        summary[algo] = entry
    return summary


def print_table(summary: dict, trees: list[Path], commits: dict, device: str, args: argparse.Namespace) -> None:
    print(f"\nOn-device env steps/s on {device}, {args.seeds} seed(s), median over {args.rounds} round(s) (min-max); "
          f"best of {args.repeats} executions after a warm-up")
    for i, tree in enumerate(trees):
        print(f"  tree {i + 1}: {tree} ({commits[str(tree)]})")
    header = "".join(f"{'tree ' + str(i + 1):>30}" for i in range(len(trees)))
    print(f"  {'algo (env, steps per seed)':<34}{header}{'  last/first' if len(trees) > 1 else ''}")
    for algo, entry in summary.items():
        env, budget = BUDGETS[algo]
        cells = ""
        for tree in map(str, trees):
            e = entry[tree]
            cells += (f"{e['median_env_steps_per_s']:>11,.0f} ({e['min']:,.0f}-{e['max']:,.0f})".rjust(30)
                      if e else f"{'failed':>30}")
        ratio = entry.get("ratio_last_over_first")
        label = f"{algo} ({env}, {max(1, int(budget * args.scale)):,})"
        print(f"  {label:<34}{cells}{f'  {ratio:.3f}x' if ratio else ''}")
        compiles = "".join(f"{'compile %.1f s' % entry[t]['median_compile_s'] if entry[t] else '':>30}"
                           for t in map(str, trees))
        print(f"  {'':<34}{compiles}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", default=str(ROOT), help="comma-separated source trees (first: before, last: after)")
    parser.add_argument("--algos", default=",".join(BUDGETS), help=f"comma-separated: {', '.join(BUDGETS)}")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each runs every tree once per algorithm")
    parser.add_argument("--seeds", type=int, default=1, help="seeds per program (more than 1: vmapped)")
    parser.add_argument("--repeats", type=int, default=3, help="timed executions after the warm-up; the best counts")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every algorithm's env-step budget")
    parser.add_argument("--json", default=None, help="write every number to this file")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker is not None:
        print(RESULT_TAG + json.dumps(worker(json.loads(args.worker))), flush=True)
        return
    trees = [Path(t.strip()).resolve() for t in args.trees.split(",") if t.strip()]
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    for tree in trees:
        if not (tree / "sparqrl" / "__init__.py").is_file():
            raise SystemExit(f"--trees: {tree} has no sparqrl/__init__.py")
    for a in algos:
        if a not in BUDGETS:
            raise SystemExit(f"--algos: {a!r} is not one of {', '.join(BUDGETS)}")
    for name in ("rounds", "seeds", "repeats"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name}: {getattr(args, name)} must be a positive int")
    if args.scale <= 0:
        raise SystemExit(f"--scale: {args.scale} must be positive")

    commits = {str(t): tree_commit(t) for t in trees}
    results = run_rounds(trees, algos, args)
    summary = summarise(results, trees)
    device = next((r["device"] for per_tree in results.values() for rs in per_tree.values() for r in rs
                   if "device" in r), "no device (every worker failed)")
    print_table(summary, trees, commits, device, args)
    if args.json:
        record = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "device": device, "cpu": cpu_name(), "cores": os.cpu_count(), "python": sys.version.split()[0],
                  "trees": [str(t) for t in trees], "commits": commits, "args": vars(args), "budgets": BUDGETS,
                  "summary": summary, "results": results}
        Path(args.json).write_text(json.dumps(record, indent=2))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()

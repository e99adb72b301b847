"""Do traced hyperparameters cost speed? The whole-run program with its hyperparameters baked in as
constants against the same program taking them as runtime inputs, side by side in one process.

    .venv/bin/python benchmarks/traced_hparams.py [--steps 500000] [--seeds-many 8] [--algos ppo,dqn]
                                                  [--repeats 3] [--json OUT]

For PPO and DQN on CartPole-v1 (sparqrl's default configs), at 1 seed (`jax.jit(train)`, no vmap) and
at --seeds-many seeds (`jax.jit(jax.vmap(train))`):
  constant  `make_train_fn(module.make_algorithm(config, env))(key)`: every hyperparameter a
            compile-time constant (the program before issue 12);
  traced    `module.make_train(config, env)(key, hparams)` with hparams (`hparams_of(config)`, a dict
            of float32 scalars, [N] when vmapped with in_axes (0, 0)) passed to the jitted function as
            ARGUMENTS, so XLA sees runtime inputs, never constants.
compile     trace + lower + XLA compile (benchmarks/peer_rejax.py's `compile_timed`), persistent cache
            off and `jax.clear_caches()` before each, so neither variant reuses the other's traces;
run         `block_until_ready` executions of the compiled program, constant and traced alternating
            (machine noise hits both alike), best of --repeats; env steps/s = steps * seeds / time.
Both variants run with the same keys and the same hyperparameter values, so they learn alike: the
mean episode return over the last 10 % of updates is printed for both (a sanity check; XLA may fold
constants in a different order, so they can differ in the last bits and drift apart over a run).
Goal (issue 12): traced/constant steps/s >= 0.95x (within noise), printed PASS / MISS.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
from pathlib import Path

# the timing helpers are the rejax peer's (benchmarks/ is this script's folder, as for vs_rejax.py)
from machine import cpu_name  # noqa: E402
from peer_rejax import compile_timed, run_timed  # noqa: E402

ALGOS = ("ppo", "dqn")



def final_return(metrics: dict) -> float:
    """Mean return of the episodes that finished in the last 10 % of updates (over all seeds)."""
    from sparqrl.algos.base import EPISODE_COUNT, EPISODE_RETURN_SUM

    total, count = metrics[EPISODE_RETURN_SUM], metrics[EPISODE_COUNT]
    last = max(1, total.shape[-1] // 10)
    count = float(count[..., -last:].sum())
    return float(total[..., -last:].sum()) / count if count else float("nan")


def bench_algo(name: str, args: argparse.Namespace) -> dict:
    import jax
    import jax.numpy as jnp

    from sparqrl.algos import get_algorithm
    from sparqrl.algos.base import hparams_of, make_train_fn
    from sparqrl.envs import make_env

    module = get_algorithm(name)
    env = make_env("CartPole-v1")
    config = module.Config(total_timesteps=args.steps).validate(env)
    algo = module.make_algorithm(config, env)
    steps = algo.num_updates * algo.env_steps_per_update
    constant = make_train_fn(algo)
    traced = module.make_train(config, env)
    hp = hparams_of(config)
    n = args.seeds_many
    key, keys = jax.random.PRNGKey(0), jax.random.split(jax.random.PRNGKey(1), n)
    cases = {  # seeds -> variant -> (function of ONE argument, that argument)
        1: {"constant": (constant, key),
            "traced": (lambda a: traced(*a), (key, {k: jnp.float32(v) for k, v in hp.items()}))},
        n: {"constant": (jax.vmap(constant), keys),
            "traced": (lambda a: jax.vmap(traced, in_axes=(0, 0))(*a),
                       (keys, {k: jnp.full((n,), v, jnp.float32) for k, v in hp.items()}))},
    }
    result = {"algo": name, "steps": steps, "hparams": hp, "traced_fields": sorted(hp), "seeds": {}}
    for seeds, variants in cases.items():
        compiled, entry = {}, {}
        for variant, (fn, arg) in variants.items():
            jax.clear_caches()
            compiled[variant], entry[variant] = compile_timed(fn, arg)
            entry[variant]["runs_s"], entry[variant]["cores_used_runs"] = [], []
        outs = {}
        for _ in range(args.repeats):
            for variant, (_, arg) in variants.items():  # alternate
                outs[variant], run = run_timed(compiled[variant], arg, 1)
                entry[variant]["runs_s"] += run["runs_s"]
                entry[variant]["cores_used_runs"].append(run["cores_used"])
        for variant, e in entry.items():
            best = min(range(len(e["runs_s"])), key=e["runs_s"].__getitem__)
            e["run_s"], e["cores_used"] = e["runs_s"][best], e["cores_used_runs"][best]
            e["env_steps_per_s"] = steps * seeds / e["run_s"]
            e["final_return"] = final_return(jax.device_get(outs[variant][1]))
        c, t = entry["constant"], entry["traced"]
        entry["ratio_steps_per_s"] = t["env_steps_per_s"] / c["env_steps_per_s"]
        entry["ratio_compile_s"] = t["compile_s"] / c["compile_s"]
        result["seeds"][str(seeds)] = entry
        del compiled, outs
    return result


def print_table(r: dict, goal: float) -> None:
    def row(label, c, t, fmt="{:,.0f}", ratio=True):
        rr = f"{t / c:8.3f}x" if ratio and c else ""
        print(f"  {label:<44}{fmt.format(c):>16}{fmt.format(t):>16}  {rr}".rstrip())

    print(f"\n{r['algo'].upper()} CartPole-v1, {r['steps']:,} env steps per seed; traced: {', '.join(r['traced_fields'])}")
    print(f"  {'':<44}{'constant':>16}{'traced':>16}  traced/constant")
    for seeds, e in r["seeds"].items():
        c, t = e["constant"], e["traced"]
        label = f"{seeds} seed" + ("s" if seeds != "1" else "")
        row(f"{label}: env steps/s (best of {len(c['runs_s'])})", c["env_steps_per_s"], t["env_steps_per_s"])
        row(f"{label}: compile s (trace+lower+XLA)", c["compile_s"], t["compile_s"], "{:.2f}")
        split = "{trace_s:.2f}/{lower_s:.2f}/{xla_s:.2f}"
        print(f"  {'  of which trace / lower / XLA s':<44}{split.format(**c):>16}{split.format(**t):>16}")
        row(f"{label}: cores used (CPU s / wall s)", c["cores_used"], t["cores_used"], "{:.2f}", ratio=False)
        row(f"{label}: return, last 10 % of updates", c["final_return"], t["final_return"], "{:.1f}", ratio=False)
    for seeds, e in r["seeds"].items():
        ok = e["ratio_steps_per_s"] >= goal
        print(f"  [{'PASS' if ok else 'MISS'}] steps/s traced >= {goal}x constant, {seeds} seed(s): "
              f"{e['ratio_steps_per_s']:.3f}x (compile {e['ratio_compile_s']:.3f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500_000, help="env steps per seed")
    parser.add_argument("--seeds-many", type=int, default=8, help="seeds of the vmapped runs")
    parser.add_argument("--algos", default="ppo,dqn", help="comma-separated: ppo, dqn")
    parser.add_argument("--repeats", type=int, default=3, help="executions of each compiled program; the best counts")
    parser.add_argument("--goal", type=float, default=0.95, help="PASS when traced/constant steps/s >= this")
    parser.add_argument("--json", default=None, help="write every number to this file")
    args = parser.parse_args()
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    for a in algos:
        if a not in ALGOS:
            raise SystemExit(f"--algos: {a!r} is not one of {', '.join(ALGOS)}")

    from sparqrl.runners.session import use_compile_cache

    use_compile_cache(False)  # before anything compiles: every compile below is a cold one
    import jax

    report = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": platform.node(),
              "cpu": cpu_name(), "cpus": os.cpu_count(), "jax": jax.__version__,
              "device": f"{jax.devices()[0].device_kind} x{jax.device_count()} ({jax.default_backend()})",
              "args": vars(args), "algos": {}}
    print(f"{report['cpu']}, {report['cpus']} cores; jax {report['jax']}; {report['device']}")
    for name in algos:
        report["algos"][name] = bench_algo(name, args)
        print_table(report["algos"][name], args.goal)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()

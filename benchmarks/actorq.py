"""ActorQ end to end: the same algorithm, environment and seed trained with fp32 actors and with int8
actors, side by side in this script (runs interleaved, so machine noise hits both alike), and how env
throughput grows from 1 to 2 actors.

Prints per run: env steps/s (all actors), actor steps/s (per second of actor busy time), learner updates/s,
wall time to the first evaluation at or above `--threshold`, final return, bytes per broadcast, policy
versions published, mean policy lag, energy (kWh) and CO2 (kg); then the int8 / fp32 ratios.

The kernel-level comparison (policy inference latency per batch size, 3 x 2048 layers) is
`benchmarks/actorq_kernel.py`.

    .venv/bin/python benchmarks/actorq.py e2e [--algo dqn] [--env gym:CartPole-v1] [--steps 60000]
        [--hidden 2048,2048,2048] [--actors 1] [--backend inline] [--threshold 195] [--repeats 1]
    .venv/bin/python benchmarks/actorq.py scaling [--precision fp32] [--actors-list 1,2] ...
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import tempfile
from pathlib import Path

import jax

from sparqrl import config as cfg
from sparqrl.algos import get_algorithm
from sparqrl.runners import RunConfig, train


def algo_config(args: argparse.Namespace) -> object:
    """The algorithm's defaults with `--set` overrides and the benchmark's size and budget."""
    module = get_algorithm(args.algo)
    sets = [f"hidden={args.hidden}", f"total_timesteps={args.steps}", *args.set]
    return cfg.override(module.Config(), cfg.parse_set(sets))


def one_run(args: argparse.Namespace, precision: str, actors: int, out: Path) -> dict:
    run = RunConfig(env=args.env, seed=args.seed, seeds=args.seeds, out=str(out), overwrite=True,
                    chunks=args.chunks, eval_every=1, eval_episodes=args.eval_episodes, checkpoint_every=10**6,
                    progress=False, actors=actors, actor_precision=precision, backend=args.backend,
                    fragment_steps=args.fragment_steps, publish_every=args.publish_every)
    summary = train(args.algo, algo_config(args), run)
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    by_chunk: dict[int, list[dict]] = {}
    for r in rows:
        by_chunk.setdefault(int(r["chunk"]), []).append(r)
    reached = [float(rs[0]["wall_time_s"]) for _, rs in sorted(by_chunk.items())
               if all(r.get("eval_return") for r in rs)
               and sum(float(r["eval_return"]) for r in rs) / len(rs) >= args.threshold]
    summary["time_to_threshold_s"] = (reached[0] - summary["compile_time_s"]) if reached else math.nan
    return summary


FIELDS = [
    ("env_steps_per_s", "env steps/s", "{:.0f}"),
    ("actor_steps_per_s", "actor steps/s (busy)", "{:.0f}"),
    ("learner_updates_per_s", "learner updates/s", "{:.1f}"),
    ("time_to_threshold_s", "time to threshold s", "{:.1f}"),
    ("wall_time_s", "wall time s", "{:.1f}"),
    ("final_return_mean", "final return (mean)", "{:.1f}"),
    ("final_return_std", "final return (std)", "{:.1f}"),
    ("broadcast_bytes", "bytes per broadcast", "{:,}"),
    ("versions_published", "versions published", "{}"),
    ("policy_lag_mean", "policy lag (updates)", "{:.2f}"),
    ("energy_kwh", "energy kWh", "{:.6f}"),
    ("co2_kg", "CO2 kg", "{:.6f}"),
]


def table(columns: dict[str, dict]) -> None:
    names = list(columns)
    print(f"{'':26s}" + "".join(f"{n:>16s}" for n in names))
    for key, label, fmt in FIELDS:
        cells = []
        for n in names:
            value = columns[n].get(key, math.nan)
            cells.append(f"{fmt.format(value) if not (isinstance(value, float) and math.isnan(value)) else 'n/a':>16s}")
        print(f"{label:26s}" + "".join(cells))


def e2e(args: argparse.Namespace) -> None:
    results: dict[str, list[dict]] = {"fp32": [], "int8": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            order = ("fp32", "int8") if r % 2 == 0 else ("int8", "fp32")
            for precision in order:
                results[precision].append(one_run(args, precision, args.actors, Path(tmp) / f"{precision}{r}"))
    print(f"device: {jax.devices()[0].device_kind}; {args.algo} on {args.env}, {args.steps} steps, hidden {args.hidden},"
          f" {args.actors} actor(s) ({args.backend}), seed {args.seed} x{args.seeds}, {args.repeats} repeat(s);"
          f" threshold {args.threshold} (mean over seeds of a chunk's evaluation)")
    for r in range(args.repeats):
        print(f"-- repeat {r}")
        table({p: results[p][r] for p in results})
        fp32, int8 = results["fp32"][r], results["int8"][r]
        for key in ("env_steps_per_s", "actor_steps_per_s"):
            print(f"int8 / fp32 {key}: {int8[key] / fp32[key]:.2f}x")
        print(f"fp32 / int8 time to threshold: {fp32['time_to_threshold_s'] / int8['time_to_threshold_s']:.2f}x; "
              f"fp32 / int8 wall time: {fp32['wall_time_s'] / int8['wall_time_s']:.2f}x; "
              f"broadcast bytes fp32 / int8: {fp32['broadcast_bytes'] / int8['broadcast_bytes']:.2f}x")
    print(json.dumps({p: [{k: v.get(k) for k, _, _ in FIELDS} for v in results[p]] for p in results}))


def scaling(args: argparse.Namespace) -> None:
    counts = [int(x) for x in args.actors_list.split(",")]
    columns = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            columns[f"{n} actor(s)"] = one_run(args, args.precision, n, Path(tmp) / f"a{n}")
    print(f"device: {jax.devices()[0].device_kind}; {args.algo} on {args.env}, {args.steps} steps, hidden {args.hidden},"
          f" {args.precision} actors ({args.backend})")
    table(columns)
    base = columns[f"{counts[0]} actor(s)"]["env_steps_per_s"]
    for n in counts[1:]:
        print(f"env steps/s, {n} vs {counts[0]} actor(s): {columns[f'{n} actor(s)']['env_steps_per_s'] / base:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("section", choices=["e2e", "scaling"])
    parser.add_argument("--algo", default="dqn")
    parser.add_argument("--env", default="gym:CartPole-v1")
    parser.add_argument("--steps", type=int, default=60_000)
    parser.add_argument("--hidden", default="2048,2048,2048")
    parser.add_argument("--set", action="append", default=[], help="algorithm config override KEY=VALUE")
    parser.add_argument("--actors", type=int, default=1)
    parser.add_argument("--actors-list", default="1,2")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--fragment-steps", type=int, default=10)
    parser.add_argument("--publish-every", type=int, default=1)
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--eval-episodes", type=int, default=3)
    parser.add_argument("--threshold", type=float, default=195.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=1, help="seeds trained at once (vmapped learner)")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    e2e(args) if args.section == "e2e" else scaling(args)


if __name__ == "__main__":
    main()

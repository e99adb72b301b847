"""A meta generation on one device against its population split over several (issue 35 item 5).

In ONE process with --devices forced CPU devices (XLA_FLAGS, set here before JAX is imported), three programs of
the same generation are timed interleaved, so a shared machine's load falls on each alike: the one-device program,
the split generation of `sparqrl meta` over the devices (`meta.run.generation_program`: ask and trainings with no
collective, host gather, tell on one device), and the same as one program (GSPMD gathers the fitness inside it),
which the split replaced. Prints each one's best and median generation time and its ratio to one device.

    python benchmarks/meta_devices.py --devices 2 --popsize 8 --seeds 2 --steps 16384 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--popsize", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    from sparqrl.meta import run as meta_run
    from sparqrl.meta.config import MetaConfig

    prepared = meta_run.prepare(MetaConfig(task="hparams", fields="lr,clip_eps", popsize=args.popsize,
                                           seeds=args.seeds, steps=args.steps, energy=False, progress=False))
    task, strategy = prepared.task, prepared.strategy
    shapes = jax.eval_shape(lambda: meta_run.init_state(prepared))
    key0 = meta_run.generation_key(0, 0)
    split_fitness = meta_run.population_fitness(task, strategy, args.seeds, args.devices)
    programs = {
        "one device": meta_run.generation_program(task, strategy, args.seeds, 1),
        f"{args.devices} devices, split (sparqrl meta)": meta_run.generation_program(task, strategy, args.seeds,
                                                                                     args.devices),
        f"{args.devices} devices, one program (before)": lambda k, s: strategy.generation(split_fitness, k, s),
    }
    compiled = {}
    for name, generation in programs.items():
        start = time.perf_counter()
        compiled[name] = meta_run.compile_generation(generation, key0, shapes)
        print(f"compiled {name} in {time.perf_counter() - start:.1f} s", flush=True)
    times: dict[str, list[float]] = {name: [] for name in programs}
    state = {name: jax.device_get(meta_run.init_state(prepared)) for name in programs}
    for g in range(args.repeats + 1):  # generation 0 warms up
        for name, program in compiled.items():
            start = time.perf_counter()
            state[name], output = program(meta_run.generation_key(0, g), state[name])
            jax.block_until_ready(output)
            if g:
                times[name].append(time.perf_counter() - start)
    base = min(times["one device"])
    print(f"\nhparams ppo CartPole-v1, population {args.popsize} x {args.seeds} seeds x {args.steps} steps, "
          f"{args.repeats} generations each, interleaved")
    print("| program | best s/generation | median | one device / this (best) |\n|---|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {min(values):.3f} | {statistics.median(values):.3f} | {base / min(values):.2f}x |")


if __name__ == "__main__":
    main(sys.argv[1:])

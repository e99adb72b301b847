"""How much splitting one PPO run into many calls of its compiled program costs (issue 11, item 1).

    .venv/bin/python benchmarks/chunk_calls.py [--repeats 5] [--seeds 1]

PPO CartPole-v1 with sparqrl's defaults (976 updates = 500k env steps per seed), one seed's state. The same
976 updates run as 1 call of a `lax.scan` of 976 updates, or as K calls of a scan of 976/K updates
(K = 8, 61, 122), or as the runner's chunk program (a `while_loop` over a traced trip count, shard_map,
traced hyperparameters) at its default 50 chunks: launched back to back (the runner's pipelining), the
final state waited for once. No logging, evaluation or checkpoint: only the calls. Interleaved, best and
median of --repeats; compilation excluded.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seeds", type=int, default=1)
    args = parser.parse_args()

    from sparqrl.algos import ppo
    from sparqrl.runners import RunConfig, anakin
    from sparqrl.runners.session import use_compile_cache

    use_compile_cache(False)
    run = RunConfig(seeds=args.seeds, out=tempfile.mkdtemp(), overwrite=True, chunks=50, progress=False,
                    energy=False, compile_cache=False)
    module, config, env = anakin.prepare("ppo", ppo.Config(), run)
    driver = anakin.make_driver("ppo", module, config, env, run)
    driver.build()
    state0 = jax.block_until_ready(driver.init_state())
    updates = config.num_updates

    def scan_program(length: int):
        def run_scan(state, hparams):
            return jax.vmap(lambda s, h: jax.lax.scan(lambda c, _: driver.algo_at(h).update(c), s, None,
                                                      length=length))(state, hparams)
        return jax.jit(run_scan).lower(state0, driver.hparams).compile()

    def calls_of(length: int):
        program, calls = scan_program(length), updates // length

        def run_calls() -> None:
            state = state0
            for _ in range(calls):
                state, _metrics = program(state, driver.hparams)
            jax.block_until_ready(state)
        return run_calls

    trips = [jax.device_put(jnp.int32(b - a), driver.replicated)
             for a, b in zip([0] + driver.bounds[:-1], driver.bounds)]

    def runner_chunks() -> None:
        state = state0
        for n in trips:
            state, _metrics = driver._chunk(state, driver.hparams, n)
        jax.block_until_ready(state)

    variants = {f"1 call x {updates} updates": (calls_of(updates), 1)}
    for calls in (8, 61, 122):
        variants[f"{calls} calls x {updates // calls} updates"] = (calls_of(updates // calls), calls)
    variants[f"runner chunk program, {len(trips)} chunks"] = (runner_chunks, len(trips))
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, (fn, _calls) in variants.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    base = min(times[next(iter(times))])
    print(f"PPO CartPole-v1, {updates} updates x {config.batch_size} env steps, {args.seeds} seed(s), "
          f"{jax.devices()[0].platform}; best and median of {args.repeats}")
    for name, values in times.items():
        calls = variants[name][1]
        extra = (min(values) - base) * 1000 / calls if calls > 1 else 0.0
        print(f"{name:>36}: best {min(values):.3f} s ({min(values) / base:.3f}x), median "
              f"{statistics.median(values):.3f} s, {extra:+.1f} ms per extra call")


if __name__ == "__main__":
    main()

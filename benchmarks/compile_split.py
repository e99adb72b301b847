"""Where the runner's compile time goes: trace + lower and XLA seconds of each program it builds (init,
chunk, evaluation) for PPO on a gymnax env, then each program's run time (best of 3), with XLA options per
program to compare. Caches off (every compile cold).

    .venv/bin/python benchmarks/compile_split.py [--env CartPole-v1] [--seeds 1] [--updates N]
        [--options '{"init": {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": false}}']

--seeds over 1 needs as many CPU devices as divide it: XLA_FLAGS=--xla_force_host_platform_device_count=2.
"""

from __future__ import annotations

import argparse
import json
import time

from sparqrl.runners.session import use_compile_cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--updates", type=int, default=None, help="updates in the timed chunk (default: the run's)")
    parser.add_argument("--options", default="{}", help="JSON: program name (init, chunk, evaluate) -> XLA options")
    args = parser.parse_args()
    options = json.loads(args.options)
    use_compile_cache(False)
    import jax
    import numpy as np
    from jax.sharding import PartitionSpec

    from sparqrl.algos import ppo
    from sparqrl.runners import anakin
    from sparqrl.runners.run_config import RunConfig

    run = RunConfig(env=args.env, seeds=args.seeds, compile_cache=False)
    module, config, env = anakin.prepare("ppo", ppo.Config(), run)
    d = anakin.make_driver("ppo", module, config, env, run)
    S, R = PartitionSpec("seeds"), PartitionSpec()
    state = d.abstract_state()
    programs = {
        "init": (anakin.init_program(d.algo_at), (S, S), S, (d.keys, d.hparams)),
        "chunk": (anakin.chunk_program(d.algo_at), (S, S, R), (S, S),
                  (state, d.hparams, jax.device_put(jax.numpy.int32(1), d.replicated))),
        "evaluate": (anakin.eval_program(d.algo_at, env, run.eval_episodes), (S, S, S), S, (state, d.hparams, d.eval_keys)),
    }
    compiled, total = {}, 0.0
    for name, (fn, in_specs, out_specs, inputs) in programs.items():
        jitted = jax.jit(anakin.per_device(fn, d.sharding, in_specs, out_specs))
        t0 = time.perf_counter()
        lowered = jitted.trace(*inputs).lower()
        t1 = time.perf_counter()
        compiled[name] = lowered.compile(options.get(name) or None)
        t2 = time.perf_counter()
        total += t2 - t0
        print(f"{name:8} trace+lower {t1 - t0:5.2f} s   XLA {t2 - t1:5.2f} s   options {options.get(name) or {}}")
    print(f"{'all':8} {total:.2f} s")

    def best(fn, *inputs):
        times = []
        for _ in range(3):
            t = time.perf_counter()
            out = jax.block_until_ready(fn(*inputs))
            times.append(time.perf_counter() - t)
        return out, min(times)

    updates = args.updates or d.algo.num_updates
    initial, t_init = best(compiled["init"], d.keys, d.hparams)
    (trained, _), t_chunk = best(compiled["chunk"], initial, d.hparams, jax.device_put(jax.numpy.int32(updates), d.replicated))
    returns, t_eval = best(compiled["evaluate"], trained, d.hparams, d.eval_keys)
    print(f"run: init {t_init * 1e3:.1f} ms, chunk of {updates} updates {t_chunk:.3f} s, evaluation {t_eval * 1e3:.1f} ms "
          f"(return {float(np.mean(returns)):.1f})")


if __name__ == "__main__":
    main()

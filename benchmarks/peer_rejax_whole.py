"""The peer of benchmarks/whole_command.py: a rejax 0.1.3 script that trains PPO on CartPole-v1 and evaluates it
as `sparqrl train ppo --env CartPole-v1` does, from import to the final return, in one process.

Runs in the rejax venv (`bash benchmarks/setup_rejax.sh`), never in sparqrl's:

    .bench-rejax-venv/bin/python benchmarks/peer_rejax_whole.py --seeds 8 [--steps 500000] [--evals 5]
                                                                [--eval-episodes 10]

What it does, as a rejax user would: import JAX and rejax; build PPO with sparqrl's default hyperparameters
(benchmarks/peer_rejax.py's `make_ppo`, whose docstring maps every field); compile `train` (1 seed:
`jax.jit(train)(key)`; more: `jax.jit(jax.vmap(train))(keys)`) with rejax's own evaluation inside it, --evals
times in the run (`eval_freq`: a whole number of updates, so the peer trains 980 updates where sparqrl trains
976 at 500k steps: 0.4 % more) over --eval-episodes episodes per seed, as sparqrl's default run evaluates 5 times
(every 10 of its 50 chunks) over 10 episodes per seed; run it; print the final evaluation's mean return. It
writes nothing: no metrics, checkpoints or picture (sparqrl's command writes all of those, inside its time).

Prints one JSON object on its last stdout line: time_s {imports, build, compile, run, total} (seconds from this
script's first line: `total` leaves out the interpreter's own start, which whole_command.py's process wall
time includes), final_return_mean, steps, seeds.
"""

from __future__ import annotations

import time

START = time.perf_counter()

import argparse  # noqa: E402 (after the clock starts)
import json  # noqa: E402
import warnings  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=500_000, help="env steps per seed (sparqrl's default)")
    parser.add_argument("--evals", type=int, default=5, help="evaluations in the run (the last at its end)")
    parser.add_argument("--eval-episodes", type=int, default=10, help="episodes per seed per evaluation")
    args = parser.parse_args()

    warnings.filterwarnings("ignore")
    import jax
    import numpy as np
    from rejax.evaluate import evaluate

    from peer_rejax import PPO_DEFAULTS, make_ppo  # (benchmarks/ is this script's folder)
    imported = time.perf_counter()

    algo, _ = make_ppo(dict(PPO_DEFAULTS), args.steps)
    per_update = algo.num_envs * algo.num_steps
    updates = args.steps // per_update
    episodes = args.eval_episodes

    def eval_callback(algo, ts, rng):
        act = algo.make_act(ts)
        return evaluate(act, rng, algo.env, algo.env_params, episodes, algo.env_params.max_steps_in_episode)

    eval_freq = per_update * -(-updates // args.evals)  # whole updates between evaluations
    algo = algo.replace(eval_freq=eval_freq, skip_initial_evaluation=True, eval_callback=eval_callback)
    train = algo.train if args.seeds == 1 else jax.vmap(algo.train)
    key = jax.random.PRNGKey(0) if args.seeds == 1 else jax.random.split(jax.random.PRNGKey(0), args.seeds)
    built = time.perf_counter()

    compiled = jax.jit(train).lower(key).compile()
    compiled_at = time.perf_counter()
    _, (lengths, returns) = jax.block_until_ready(compiled(key))
    ran = time.perf_counter()

    # returns: [evals, episodes] (1 seed) or [seeds, evals, episodes]; the final evaluation's mean per seed
    final = np.asarray(returns)[..., -1, :].reshape(args.seeds, -1).mean(axis=1)
    iterations = -(-algo.total_timesteps // eval_freq) * (eval_freq // per_update)
    times = {"imports": imported - START, "build": built - imported, "compile": compiled_at - built,
             "run": ran - compiled_at, "total": time.perf_counter() - START}
    print(json.dumps({"peer": "rejax", "seeds": args.seeds, "steps": iterations * per_update,
                      "evals": int(np.asarray(returns).shape[-2]), "eval_episodes": episodes,
                      "final_return_mean": float(final.mean()), "device": str(jax.devices()[0].platform),
                      "time_s": {k: round(v, 3) for k, v in times.items()}}), flush=True)


if __name__ == "__main__":
    main()

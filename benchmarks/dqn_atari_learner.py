"""DQN's learner on Atari fragments alone: env steps/s of `learn` on the `dqn-atari` preset (Nature CNN, batch
32, a gradient step every 4 env steps of 8 envs), fragments of random Breakout-shaped frames (T = 10), once
learning has started. Prints the compile time and the steady rate of the learner's one jitted call.

    .venv/bin/python benchmarks/dqn_atari_learner.py --fragments 5
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import numpy as np

from sparqrl import presets
from sparqrl.algos import dqn
from sparqrl.algos.base import Step
from sparqrl.envs import host_spec


def fragment(rng: np.random.Generator, t: int, n: int) -> Step:
    """T steps of N envs whose next frames continue the stacks, as an actor sends them."""
    obs = rng.integers(0, 255, (t, n, 84, 84, 4), dtype=np.uint8)
    next_obs = np.concatenate([obs[..., 1:], rng.integers(0, 255, (t, n, 84, 84, 1), dtype=np.uint8)], -1)
    obs[1:] = next_obs[:-1]
    zeros = np.zeros((t, n), bool)
    return Step(obs, rng.integers(0, 4, (t, n)).astype(np.int32), rng.normal(size=(t, n)).astype(np.float32),
                next_obs, zeros, zeros, np.zeros((t, n), np.float32), np.ones((t, n), np.float32), None)


def one_seed(steps: Step) -> Step:
    """The fragment with a seeds axis of 1 after T, as the runner passes it ([T, seeds, N, ...])."""
    return jax.tree.map(lambda x: x[:, None], steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="gym:ALE/Breakout-v5")
    parser.add_argument("--fragments", type=int, default=5, help="timed fragments, after 2 untimed")
    parser.add_argument("--fragment-steps", type=int, default=10)
    parser.add_argument("--vmap", action="store_true", help="vmapped over one seed, as the runner calls it")
    args = parser.parse_args()
    spec = host_spec(args.env)
    config = presets.apply(presets.find("dqn", spec.name), dqn.Config())
    config = dataclasses.replace(config, learning_starts=32, buffer_size=2_000).validate(spec)
    al = dqn.make_actor_learner(config, spec, args.fragment_steps)
    t, n = args.fragment_steps, config.num_envs
    rng = np.random.default_rng(0)
    learn_fn, init = al.learn, al.init
    if args.vmap:
        learn_fn = lambda learner, steps: jax.vmap(al.learn, in_axes=(0, 1))(learner, steps)  # noqa: E731
        init = lambda key: jax.vmap(al.init)(key[None])  # noqa: E731
    learn = jax.jit(learn_fn, donate_argnums=0)
    learner = init(jax.random.PRNGKey(0))
    start = time.perf_counter()
    make = (lambda: one_seed(fragment(rng, t, n))) if args.vmap else (lambda: fragment(rng, t, n))  # noqa: E731
    learner, metrics = learn(learner, make())
    jax.block_until_ready(metrics)
    compile_s = time.perf_counter() - start
    for _ in range(2):
        learner, metrics = learn(learner, make())
    jax.block_until_ready(metrics)
    frags = [make() for _ in range(args.fragments)]
    start = time.perf_counter()
    for steps in frags:
        learner, metrics = learn(learner, steps)
    jax.block_until_ready(metrics)
    per = (time.perf_counter() - start) / args.fragments
    grads = float(np.mean(metrics["gradient_steps"])) * t
    print(f"DQN learner on {args.env} fragments of {t} x {n}: compile + first call {compile_s:.1f} s; "
          f"{per:.3f} s per fragment ({grads:.0f} gradient steps of batch {config.batch_size}): "
          f"{t * n / per:,.0f} env steps/s, {per / grads * 1e3:.0f} ms per gradient step ({jax.default_backend()})")


if __name__ == "__main__":
    main()

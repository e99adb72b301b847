"""The contract between an algorithm and the runners, and the deterministic evaluation loop.

An algorithm is a bundle of pure functions over its own typed state for ONE seed (`Algorithm`).
The runners vmap it over seeds, scan `update` in chunks, and shard the seed axis over devices.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from sparqrl.envs import Env

# Keys every `update` must put in its metrics; the runner turns them into mean episode returns
# over the episodes that really finished in a chunk (a chunk with none reports NaN, never 0).
EPISODE_RETURN_SUM = "episode_return_sum"
EPISODE_COUNT = "episode_count"


class Algorithm(NamedTuple):
    """What `make_algorithm(config, env)` returns.

    init(key) -> state                      the full training state of one seed
    update(state) -> (state, metrics)       one iteration: act for `env_steps_per_update` env steps, learn;
                                            metrics is a flat dict of scalars including the two keys above
    policy(state) -> policy_params          everything the deterministic policy needs (params, normaliser)
    act(policy_params, obs, key) -> action  the deterministic (greedy / mean) action for one observation
    """

    init: Callable[[jax.Array], Any]
    update: Callable[[Any], tuple[Any, dict[str, jax.Array]]]
    policy: Callable[[Any], Any]
    act: Callable[[Any, jax.Array, jax.Array], jax.Array]
    env_steps_per_update: int
    num_updates: int
    summary: dict[str, Any] = {}
    """Static facts for summary.json (e.g. a sparse run's sparsities and size/FLOPs ratios)."""


def make_train_fn(algo: Algorithm) -> Callable[[jax.Array], tuple[Any, dict[str, jax.Array]]]:
    """The whole run as one pure function `train(key) -> (state, metrics [num_updates])`."""

    def train(key: jax.Array) -> tuple[Any, dict[str, jax.Array]]:
        state = algo.init(key)
        return jax.lax.scan(lambda s, _: algo.update(s), state, None, length=algo.num_updates)

    return train


def episode_metrics(info: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Sum and count of the returns of episodes that finished in a batch of `EpisodeStats` infos."""
    done = info["episode_done"]
    return {
        EPISODE_RETURN_SUM: jnp.sum(jnp.where(done, info["episode_return"], 0.0)),
        EPISODE_COUNT: jnp.sum(done).astype(jnp.float32),
    }


def evaluate(env: Env, act: Callable, policy_params: Any, key: jax.Array, num_episodes: int) -> jax.Array:
    """Returns [num_episodes] of the deterministic policy, each episode run to its end.

    Episodes run in parallel for `env.max_episode_steps` steps; rewards after an episode's first end
    are masked out, so an auto-reset never leaks into the score.
    """
    reset_key, step_key = jax.random.split(key)
    obs, state = jax.vmap(env.reset)(jax.random.split(reset_key, num_episodes))

    def step(carry, key):
        obs, state, total, alive = carry
        act_keys = jax.random.split(key, num_episodes + 1)
        action = jax.vmap(act, in_axes=(None, 0, 0))(policy_params, obs, act_keys[1:])
        out = jax.vmap(env.step)(jax.random.split(act_keys[0], num_episodes), state, action)
        total = total + jnp.where(alive, out.reward, 0.0)
        alive = alive & ~(out.terminated | out.truncated)
        return (out.obs, out.state, total, alive), None

    init = (obs, state, jnp.zeros(num_episodes), jnp.ones(num_episodes, bool))
    keys = jax.random.split(step_key, env.max_episode_steps)
    (_, _, total, _), _ = jax.lax.scan(step, init, keys)
    return total

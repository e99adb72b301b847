"""Wrappers over `Env`, and the running statistics used for observation/reward normalisation."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from sparqrl.envs.core import Env, Space, StepOut


class Wrapper:
    """Base of an env wrapper that keeps the wrapped env's spaces: observation_shape, action_space and
    max_episode_steps are those of `self.env` (the subclass's field); a wrapper overrides what it changes."""

    env: Env

    @property
    def observation_shape(self) -> tuple[int, ...]:
        return tuple(self.env.observation_shape)

    @property
    def action_space(self) -> Space:
        return self.env.action_space

    @property
    def max_episode_steps(self) -> int:
        return self.env.max_episode_steps


class EpisodeStatsState(NamedTuple):
    inner: Any
    episode_return: jax.Array
    episode_length: jax.Array


@dataclasses.dataclass(frozen=True, eq=False)
class EpisodeStats:
    """Adds `info["episode_return"]`, `info["episode_length"]` and `info["episode_done"]`.

    The return and length are those of the episode that ended on this step; they are meaningful only
    where `episode_done` is set, so a consumer averages with that mask and never mistakes the zeros
    of unfinished episodes for returns (gymnax #62, Stoix PR #10).
    """

    env: Env

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def reset(self, key: jax.Array) -> tuple[jax.Array, EpisodeStatsState]:
        obs, inner = self.env.reset(key)
        return obs, EpisodeStatsState(inner, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32))

    def step(self, key: jax.Array, state: EpisodeStatsState, action: jax.Array) -> StepOut:
        out = self.env.step(key, state.inner, action)
        done = jnp.logical_or(out.terminated, out.truncated)
        episode_return = state.episode_return + out.reward
        episode_length = state.episode_length + 1
        info = {
            **out.info,
            "episode_return": episode_return,
            "episode_length": episode_length,
            "episode_done": done,
        }
        next_state = EpisodeStatsState(
            out.state,
            jnp.where(done, 0.0, episode_return),
            jnp.where(done, 0, episode_length),
        )
        return out._replace(state=next_state, info=info)


class RunningStats(NamedTuple):
    """Running mean and variance of a stream of batches (shape of one sample, not of the batch)."""

    mean: jax.Array
    var: jax.Array
    count: jax.Array


def running_stats_init(shape: tuple[int, ...]) -> RunningStats:
    return RunningStats(jnp.zeros(shape, jnp.float32), jnp.ones(shape, jnp.float32), jnp.asarray(1e-4))


def running_stats_update(stats: RunningStats, batch: jax.Array) -> RunningStats:
    """Merge a batch [B, *shape] into the statistics (Chan et al.'s parallel variance update)."""
    batch_mean = jnp.mean(batch, axis=0)
    batch_var = jnp.var(batch, axis=0)
    batch_count = batch.shape[0]
    delta = batch_mean - stats.mean
    total = stats.count + batch_count
    mean = stats.mean + delta * batch_count / total
    m2 = stats.var * stats.count + batch_var * batch_count + delta**2 * stats.count * batch_count / total
    return RunningStats(mean, m2 / total, total)


def normalize(stats: RunningStats, x: jax.Array, clip: float = 10.0) -> jax.Array:
    return jnp.clip((x - stats.mean) / jnp.sqrt(stats.var + 1e-8), -clip, clip)

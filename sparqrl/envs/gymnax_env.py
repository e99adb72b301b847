"""Adapter from gymnax 1.x (six-value step with separate terminated/truncated) to `Env`: the registered
gymnax ids (`make_gymnax`) and a user's own gymnax `Environment` (`wrap_gymnax`, with its default params)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from sparqrl.config import fail
from sparqrl.envs.core import Box, Discrete, Space, StepOut, import_gymnax

gymnax = import_gymnax()
from gymnax.environments import spaces  # noqa: E402 (after gymnax's import without its render-only ones)


def _space(space: Any, name: str = "") -> Space:
    if isinstance(space, spaces.Discrete):
        return Discrete(int(space.n))
    if isinstance(space, spaces.Box):
        return Box.make(space.low, space.high, tuple(space.shape))
    fail("env", name, f"has gymnax {type(space).__name__} actions; sparqrl supports Discrete actions (dqn, ppo) and "
                      "Box actions (td3, sac, ppo)")


@dataclasses.dataclass(frozen=True, eq=False)
class GymnaxEnv:
    """A gymnax environment with its default parameters bound."""

    name: str
    env: Any
    params: Any
    observation_shape: tuple[int, ...]
    action_space: Space
    max_episode_steps: int

    def reset(self, key: jax.Array) -> tuple[jax.Array, Any]:
        obs, state = self.env.reset(key, self.params)
        return obs.astype(jnp.float32), state

    def step(self, key: jax.Array, state: Any, action: jax.Array) -> StepOut:
        obs, state, reward, terminated, truncated, info = self.env.step(key, state, action, self.params)
        terminated = jnp.asarray(terminated, jnp.bool_)
        # gymnax can flag both on the last allowed step of a terminating episode: termination wins.
        truncated = jnp.logical_and(jnp.asarray(truncated, jnp.bool_), ~terminated)
        return StepOut(
            obs=obs.astype(jnp.float32),
            state=state,
            reward=jnp.asarray(reward, jnp.float32),
            terminated=terminated,
            truncated=truncated,
            final_obs=info["final_observation"].astype(jnp.float32),
            info={},
        )


def make_gymnax(name: str) -> GymnaxEnv:
    env, params = gymnax.make(name)
    return wrap_gymnax(name, env, params)


def wrap_gymnax(name: str, env: Any, params: Any = None) -> GymnaxEnv:
    """A gymnax `Environment` instance under the sparqrl name `name`, with `params` (default: its own
    `default_params`) bound."""
    params = env.default_params if params is None else params
    obs_space = env.observation_space(params)
    if not isinstance(obs_space, spaces.Box):
        fail("env", name, f"has gymnax {type(obs_space).__name__} observations; sparqrl supports Box observations")
    return GymnaxEnv(
        name=name,
        env=env,
        params=params,
        observation_shape=tuple(obs_space.shape),
        action_space=_space(env.action_space(params), name),
        max_episode_steps=int(getattr(params, "max_steps_in_episode", 1000)),
    )

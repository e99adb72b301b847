"""Adapter from Brax environments to `Env`, with a time limit that is reported as truncation."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from sparqrl.envs.core import Box, StepOut


@dataclasses.dataclass(frozen=True, eq=False)
class BraxEnv:
    """A Brax environment; episodes end at `max_episode_steps` (truncation) or on termination."""

    name: str
    env: Any
    observation_shape: tuple[int, ...]
    action_space: Box
    max_episode_steps: int

    def reset(self, key: jax.Array) -> tuple[jax.Array, Any]:
        state = self.env.reset(key)
        return state.obs, (state, jnp.zeros((), jnp.int32))

    def step(self, key: jax.Array, state: Any, action: jax.Array) -> StepOut:
        brax_state, t = state
        stepped = self.env.step(brax_state, action)
        t = t + 1
        terminated = jnp.asarray(stepped.done) > 0.5
        truncated = jnp.logical_and(t >= self.max_episode_steps, ~terminated)
        done = jnp.logical_or(terminated, truncated)
        reset_obs, (reset_state, reset_t) = self.reset(key)
        pick = lambda new, old: jax.lax.select(done, new, old)  # noqa: E731
        next_state = jax.tree.map(pick, reset_state, stepped)
        return StepOut(
            obs=pick(reset_obs, stepped.obs),
            state=(next_state, jnp.where(done, reset_t, t)),
            reward=jnp.asarray(stepped.reward, jnp.float32),
            terminated=terminated,
            truncated=truncated,
            final_obs=stepped.obs,
            info={},
        )


def make_brax(name: str, backend: str = "positional", episode_length: int = 1000) -> BraxEnv:
    from brax import envs  # imported lazily: brax pulls in MuJoCo and is slow to import

    env = envs.get_environment(name, backend=backend)
    return BraxEnv(
        name=f"brax:{name}",
        env=env,
        observation_shape=(int(env.observation_size),),
        action_space=Box.make(-1.0, 1.0, (int(env.action_size),)),
        max_episode_steps=episode_length,
    )

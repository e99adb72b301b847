"""Adapter from Brax environments to `Env`, with a time limit that is reported as truncation."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import warnings
from typing import Any, Iterator

import jax
import jax.numpy as jnp

from sparqrl.envs.core import Adapter, Box, StepOut
from sparqrl.extras import need


@dataclasses.dataclass(frozen=True, eq=False)
class BraxEnv(Adapter):
    """A Brax environment; episodes end at `max_episode_steps` (truncation) or on termination."""

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


NOISE = ("Failed to import warp", "Failed to import mujoco_warp")
"""Lines MuJoCo prints at brax's import about its optional GPU backend (warp), which sparqrl does not use."""


@contextlib.contextmanager
def quiet_brax() -> Iterator[None]:
    """brax's import and env construction without the notices a user cannot act on: MuJoCo's `NOISE` on
    stdout and brax's "not actively being maintained" warning. Any other printed line is passed on."""
    with contextlib.redirect_stdout(io.StringIO()) as captured, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Brax System, piplines and environments are not actively",
                                category=UserWarning)
        try:
            yield
        finally:
            kept = [line for line in captured.getvalue().splitlines() if not line.startswith(NOISE)]
    if kept:
        print("\n".join(kept))


def make_brax(name: str, backend: str = "positional", episode_length: int = 1000) -> BraxEnv:
    with quiet_brax():
        envs = need("brax.envs", f"env=brax:{name}")  # imported lazily: brax pulls in MuJoCo and is slow to import

        env = envs.get_environment(name, backend=backend)
    return BraxEnv(
        name=f"brax:{name}",
        env=env,
        observation_shape=(int(env.observation_size),),
        action_space=Box.make(-1.0, 1.0, (int(env.action_size),)),
        max_episode_steps=episode_length,
    )

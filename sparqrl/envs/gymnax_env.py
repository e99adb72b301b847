"""Adapter from gymnax 1.x (six-value step with separate terminated/truncated) to `Env`: the registered
gymnax ids (`make_gymnax`) and a user's own gymnax `Environment` (`wrap_gymnax`, with its default params)."""

from __future__ import annotations

import dataclasses
import importlib
import sys
import types
from typing import Any

import jax
import jax.numpy as jnp

from sparqrl.config import fail
from sparqrl.envs.core import Adapter, Box, Discrete, Space, StepOut


class _Deferred(types.ModuleType):
    """Stands in for a module until one of its attributes is read; then imports the real one. A submodule
    that has a stand-in too is that stand-in (`import matplotlib.pyplot as plt` reads `pyplot` off the
    package)."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        sub = sys.modules.get(f"{self.__name__}.{attr}")
        if isinstance(sub, _Deferred):
            return sub
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), attr)


GYMNAX_RENDER_ONLY = ("seaborn", "matplotlib", "matplotlib.pyplot", "matplotlib.colors")
"""Modules gymnax imports at its top level but uses only to render (catch, pong, rooms, point_robot,
meta_maze): with scipy and pandas behind seaborn, ~1.4 s of a cold start that trains CartPole."""


def import_gymnax() -> Any:
    """`gymnax`, imported with its render-only imports deferred to their first use.

    Why our own: gymnax's package `__init__` imports every environment module, and some of those import
    seaborn and pyplot for `render` only. Python's `importlib.util.LazyLoader` does not help: the import
    system reads a module's `__spec__`, which makes it load. A stand-in module is bound in gymnax's modules
    instead, and taken out of `sys.modules` again, so any later import gets the real module."""
    if "gymnax" in sys.modules:
        return sys.modules["gymnax"]
    stand_ins = {name: _Deferred(name) for name in GYMNAX_RENDER_ONLY if name not in sys.modules}
    sys.modules.update(stand_ins)
    try:
        return importlib.import_module("gymnax")
    finally:
        for name, module in stand_ins.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]


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
class GymnaxEnv(Adapter):
    """A gymnax environment with its default parameters bound."""

    params: Any

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

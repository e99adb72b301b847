"""The one environment protocol every runner and algorithm uses.

An `Env` is a set of pure functions over an explicit state, for a *single* environment; algorithms
vmap it over their batch of environments. `step` auto-resets: when an episode ends, the returned
observation and state already belong to the next episode, and the observation the episode ended
on is returned as `final_obs`, so a time-limit truncation can bootstrap from it
(target = r + gamma * V(final_obs) * (1 - terminated)).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, Union

import numpy as np

if TYPE_CHECKING:  # annotations only: the command's help and set-up read the spaces without JAX
    import jax

from sparqrl.config import fail, require


@dataclasses.dataclass(frozen=True)
class Discrete:
    """Actions 0..n-1 (int32)."""

    n: int


@dataclasses.dataclass(frozen=True)
class Box:
    """Continuous actions of shape `shape`, each within [low, high]."""

    low: tuple[float, ...]
    high: tuple[float, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.low),)

    @classmethod
    def make(cls, low: Any, high: Any, shape: tuple[int, ...]) -> "Box":
        low = np.broadcast_to(np.asarray(low, np.float32), shape).reshape(-1)
        high = np.broadcast_to(np.asarray(high, np.float32), shape).reshape(-1)
        return cls(tuple(float(x) for x in low), tuple(float(x) for x in high))


Space = Union[Discrete, Box]


class StepOut(NamedTuple):
    """What `Env.step` returns. Shapes are per environment; after vmap, a leading [B]."""

    obs: jax.Array
    state: Any
    reward: jax.Array
    terminated: jax.Array  # the episode truly ended: do not bootstrap
    truncated: jax.Array  # cut by a time limit (and not terminated): bootstrap from final_obs
    final_obs: jax.Array  # the observation the transition reached, before any auto-reset
    info: dict[str, jax.Array]


class Env(Protocol):
    """A single auto-resetting environment as pure functions (jit- and vmap-safe).

    Your own JAX environment follows this protocol to run on the device (`--env jax:MODULE:ATTR`, or the
    object itself in `sparqrl.train`; a gymnax `Environment` works as it is):

    - `observation_shape`: one observation's shape; `action_space`: `Discrete(n)` (int32 actions 0..n-1) or
      `Box(low, high)` (float32 actions of shape [len(low)]); `max_episode_steps`: an int, the longest an
      episode lasts (evaluation runs that many steps); `name` (optional: sparqrl names it).
    - `reset(key) -> (obs, state)`: obs of `observation_shape`, any numeric dtype (cast to float32); state
      any pytree.
    - `step(key, state, action) -> StepOut`: one action of ONE env (sparqrl vmaps); reward, terminated and
      truncated are scalars. When the episode ends the env resets itself: `obs` and `state` already start
      the next episode and `final_obs` is the observation the episode ended on (elsewhere `final_obs` =
      `obs`). `terminated`: a true end (no bootstrap); `truncated`: a time limit (bootstrap from final_obs;
      ignored where terminated is set). `info`: a dict of arrays (may be empty).

    It is checked by tracing one reset and one step (`jax.eval_shape`) before anything is compiled.
    """

    name: str
    observation_shape: tuple[int, ...]
    action_space: Space
    max_episode_steps: int

    def reset(self, key: jax.Array) -> tuple[jax.Array, Any]: ...

    def step(self, key: jax.Array, state: Any, action: jax.Array) -> StepOut: ...


@dataclasses.dataclass(frozen=True, eq=False)
class Adapter:
    """The fields of an `Env` that adapts another library's JAX environment: its sparqrl `name`, the
    adapted `env` and the protocol's spaces, fixed when it is built."""

    name: str
    env: Any
    observation_shape: tuple[int, ...]
    action_space: Space
    max_episode_steps: int


def is_discrete(env: Env) -> bool:
    return isinstance(env.action_space, Discrete)


def action_dim(env: Env) -> int:
    space = env.action_space
    return space.n if isinstance(space, Discrete) else space.shape[0]


def require_continuous(env: Env, algo: str) -> None:
    """A continuous action space with finite bounds, low < high."""
    space = env.action_space
    if not isinstance(space, Box):
        fail(
            "env", env.name,
            f"{algo} needs a continuous (Box) action space; env {env.name} has {type(space).__name__} actions",
        )
    ok = all(math.isfinite(lo) and math.isfinite(hi) and lo < hi for lo, hi in zip(space.low, space.high))
    require(ok, "env", env.name, f"{algo} needs finite action bounds with low < high; got {space}")


HOST_PREFIX = "gym:"
"""Names of host (Gymnasium) environments start with this; everything else runs on device."""


def is_host_env(name: str) -> bool:
    """Whether `name` is a host (Gymnasium) environment rather than a device one (no Gymnasium import)."""
    return name.startswith(HOST_PREFIX)


def is_atari(name: str) -> bool:
    """Whether `name` is a `gym:ALE/...` id (built by `sparqrl.envs.atari.make_atari`; no Gymnasium import)."""
    return name.startswith(HOST_PREFIX + "ALE/")

"""Users' own environments for tests/test_own_env.py (imported as `own_envs`, tests/ on sys.path).

GoRight: a Gymnasium corridor of LENGTH cells with integer observations (cast to float32 by sparqrl);
importing this module registers it as GoRight-v0. Chain / gymnax_chain: the same corridor as JAX envs, one
with sparqrl's `Env` protocol and one as a gymnax `Environment`. The rest are broken on purpose.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import environment as gymnax_env
from gymnax.environments import spaces as gymnax_spaces

from sparqrl.envs import Discrete, StepOut

LENGTH = 4  # cells 0..3; reaching cell 3 ends the episode with reward 1
LIMIT = 12  # steps before truncation


class GoRight(gym.Env):
    """Action 1 moves right, 0 left; observation [position, cells to go] as int64."""

    observation_space = gym.spaces.Box(0, LENGTH, (2,), np.int64)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.pos, self.t = 0, 0
        return self._obs(), {}

    def _obs(self) -> np.ndarray:
        return np.array([self.pos, LENGTH - 1 - self.pos], np.int64)

    def step(self, action: Any) -> tuple:
        self.pos = max(0, self.pos + (1 if int(action) == 1 else -1))
        self.t += 1
        terminated = self.pos == LENGTH - 1
        return self._obs(), float(terminated), terminated, self.t >= LIMIT and not terminated, {}


gym.register(id="GoRight-v0", entry_point=GoRight, max_episode_steps=LIMIT)


class OldStep(GoRight):
    """The old Gym API: step returns (obs, reward, done, info)."""

    def step(self, action: Any) -> tuple:
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated or truncated, info


class MultiActions(GoRight):
    action_space = gym.spaces.MultiDiscrete([2, 3])


class TextObs(GoRight):
    """Declares numbers but returns strings."""

    def _obs(self) -> np.ndarray:
        return np.array(["left", "right"])


# ---- JAX environments --------------------------------------------------------------------------


class ChainState(NamedTuple):
    pos: jax.Array
    t: jax.Array


class Chain:
    """The corridor with sparqrl's Env protocol (observation [position / (LENGTH - 1)])."""

    name = "Chain"
    observation_shape = (1,)
    action_space = Discrete(2)
    max_episode_steps = LIMIT

    def reset(self, key: jax.Array) -> tuple[jax.Array, ChainState]:
        state = ChainState(jnp.int32(0), jnp.int32(0))
        return self._obs(state), state

    def _obs(self, state: ChainState) -> jax.Array:
        return state.pos[None].astype(jnp.float32) / (LENGTH - 1)

    def step(self, key: jax.Array, state: ChainState, action: jax.Array) -> StepOut:
        pos = jnp.maximum(state.pos + 2 * action - 1, 0)
        reached = ChainState(pos, state.t + 1)
        terminated = pos == LENGTH - 1
        truncated = reached.t >= LIMIT
        done = terminated | truncated
        _, fresh = self.reset(key)
        next_state = jax.tree.map(lambda a, b: jnp.where(done, a, b), fresh, reached)
        return StepOut(obs=self._obs(next_state), state=next_state, reward=terminated.astype(jnp.float32),
                       terminated=terminated, truncated=truncated, final_obs=self._obs(reached), info={})


@struct.dataclass
class GymnaxChainState(gymnax_env.EnvState):
    pos: jax.Array


@struct.dataclass
class GymnaxChainParams(gymnax_env.EnvParams):
    max_steps_in_episode: int = LIMIT


class GymnaxChain(gymnax_env.Environment):
    """The corridor as a gymnax Environment (observation [position], int32: cast by sparqrl)."""

    @property
    def default_params(self) -> GymnaxChainParams:
        return GymnaxChainParams()

    def reset_env(self, key: jax.Array, params: GymnaxChainParams) -> tuple[jax.Array, GymnaxChainState]:
        state = GymnaxChainState(time=0, pos=jnp.int32(0))
        return state.pos[None] / (LENGTH - 1), state

    def step_env(self, key: jax.Array, state: GymnaxChainState, action: jax.Array, params: GymnaxChainParams):
        pos = jnp.maximum(state.pos + 2 * action - 1, 0)
        state = GymnaxChainState(time=state.time + 1, pos=pos)
        terminated = pos == LENGTH - 1
        return state.pos[None] / (LENGTH - 1), state, terminated.astype(jnp.float32), terminated, {}

    def action_space(self, params: Any = None) -> gymnax_spaces.Discrete:
        return gymnax_spaces.Discrete(2)

    def observation_space(self, params: Any = None) -> gymnax_spaces.Box:
        return gymnax_spaces.Box(0.0, 1.0, (1,), jnp.float32)


gymnax_chain = GymnaxChain()


class WideChain(Chain):
    """The corridor with a second, constant observation: a shape the Chain's policies cannot take."""

    observation_shape = (2,)

    def _obs(self, state: ChainState) -> jax.Array:
        return jnp.stack([state.pos.astype(jnp.float32) / (LENGTH - 1), jnp.float32(1.0)])


class SixTuple(Chain):
    """Returns gymnax's six values instead of a StepOut."""

    def step(self, key: jax.Array, state: ChainState, action: jax.Array) -> Any:
        out = super().step(key, state, action)
        return out.obs, out.state, out.reward, out.terminated, out.truncated, out.info


# ---- a host task that needs memory (tests/test_recurrent_host.py) --------------------------------------------

CUE_STEPS = 4  # an episode's steps: the cue at the first, the answer at the last


class RememberBit(gym.Env):
    """The host form of bsuite's MemoryChain: a random bit is shown at the first step only (observation [±1, 0]),
    then [0, t / CUE_STEPS]; the action at the last step is scored +1 if it names the bit, -1 otherwise (other
    steps 0). A feed-forward policy sees the same last observation whatever the bit: 0 in expectation."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.bit, self.t = int(self.np_random.integers(2)), 0
        return np.array([2.0 * self.bit - 1.0, 0.0], np.float32), {}

    def step(self, action: Any) -> tuple:
        self.t += 1
        last = self.t == CUE_STEPS
        reward = (1.0 if int(action) == self.bit else -1.0) if last else 0.0
        return np.array([0.0, self.t / CUE_STEPS], np.float32), reward, last, False, {}


gym.register(id="RememberBit-v0", entry_point=RememberBit)

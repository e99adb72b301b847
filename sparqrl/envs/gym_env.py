"""Gymnasium environments stepped on the host (`gym:NAME`), for the actor-learner (Sebulba) runner.

Host environments (MuJoCo, Box2D, ...) cannot be jitted, so they do not implement the pure `Env`
protocol. `HostVecEnv` steps a batch of them with numpy arrays and returns the same quantities as
`EpisodeStats(env).step` under vmap: auto-reset on the same step, `final_obs` the observation the
transition reached, `terminated` kept apart from time-limit `truncated`, and episode statistics.
`HostSpec` carries what algorithms read from an env without stepping it (`observation_shape`,
`action_space`, `name`), so `make_train(config, spec)` can build networks for a host env.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from sparqrl.config import ConfigError, close_matches
from sparqrl.envs.core import HOST_PREFIX as PREFIX, Box, Discrete, Space, is_host_env

# Used only for the few registered ids without a time limit, so every episode (and every
# evaluation) ends; `max_episode_steps` is an int in the `Env` protocol too.
DEFAULT_MAX_EPISODE_STEPS = 1000


def gym_names() -> list[str]:
    """Every registered Gymnasium id, as a sparqrl name (`gym:ID`)."""
    return [PREFIX + env_id for env_id in gym.registry]


def _make(name: str) -> gym.Env:
    """One Gymnasium env for `gym:ID`, with a time limit, and no reward-changing wrappers."""
    env_id = name.removeprefix(PREFIX)
    if not is_host_env(name) or env_id not in gym.registry:
        raise ConfigError(f"env={name!r} is not a known Gymnasium environment{close_matches(name, gym_names())}")
    limit = None if gym.registry[env_id].max_episode_steps else DEFAULT_MAX_EPISODE_STEPS
    try:
        return gym.make(env_id, max_episode_steps=limit)
    except gym.error.Error as error:  # e.g. DependencyNotInstalled for mujoco-py's -v2/-v3 ids
        raise ConfigError(f"env={name!r}: Gymnasium could not build it: {error}") from error


def _action_space(name: str, space: Any) -> Space:
    if isinstance(space, spaces.Discrete):
        return Discrete(int(space.n))
    if isinstance(space, spaces.Box):
        return Box.make(space.low, space.high, tuple(space.shape))
    raise ConfigError(f"env={name!r} has {space} actions; sparqrl supports Box and Discrete")


@dataclasses.dataclass(frozen=True)
class HostSpec:
    """The static description of a host env: what algorithms read from an `Env` without stepping it."""

    name: str  # the full sparqrl name, `gym:ID`
    observation_shape: tuple[int, ...]
    action_space: Space  # sparqrl's Box (flattened) or Discrete, as for device envs
    max_episode_steps: int


def _spec_of(name: str, env: gym.Env) -> HostSpec:
    obs_space = env.observation_space
    if not isinstance(obs_space, spaces.Box):
        raise ConfigError(f"env={name!r} has {obs_space} observations; sparqrl supports Box observations")
    return HostSpec(
        name=name,
        observation_shape=tuple(obs_space.shape),
        action_space=_action_space(name, env.action_space),
        max_episode_steps=int(env.spec.max_episode_steps),
    )


def host_spec(name: str) -> HostSpec:
    """Build one `gym:ID` env, read its spaces and time limit, and close it."""
    env = _make(name)
    try:
        return _spec_of(name, env)
    finally:
        env.close()


class HostStep(NamedTuple):
    """What `HostVecEnv.step` returns: numpy arrays over the N envs, as `StepOut` + `EpisodeStats`."""

    obs: np.ndarray  # float32 [N, *obs]; where an episode ended, already the next episode's first
    reward: np.ndarray  # float32 [N]
    terminated: np.ndarray  # bool [N]: the episode truly ended, do not bootstrap
    truncated: np.ndarray  # bool [N]: time limit and not terminated, bootstrap from final_obs
    final_obs: np.ndarray  # float32 [N, *obs]: the observation the transition reached, before reset
    episode_return: np.ndarray  # float32 [N]: sum of raw rewards of the episode, valid where done
    episode_length: np.ndarray  # int32 [N]: its length in steps, valid where episode_done
    episode_done: np.ndarray  # bool [N]: terminated or truncated


class HostVecEnv:
    """`num_envs` copies of a `gym:ID` env stepped in this process, auto-resetting on the same step."""

    def __init__(self, name: str, num_envs: int):
        if num_envs < 1:
            raise ConfigError(f"num_envs={num_envs!r} must be at least 1")
        envs = [_make(name) for _ in range(num_envs)]
        self.spec = _spec_of(name, envs[0])
        self.num_envs = num_envs
        # SAME_STEP: the step that ends an episode returns the reset obs and puts the last obs in
        # info["final_obs"], exactly the `Env` convention (the default NEXT_STEP would spend a
        # no-op step on the reset instead).
        self._vec = gym.vector.SyncVectorEnv(
            [lambda env=env: env for env in envs], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
        )
        single = self._vec.single_action_space
        self._action_shape = (num_envs, *single.shape)
        self._action_dtype = single.dtype
        self._action_start = int(single.start) if isinstance(single, spaces.Discrete) else 0
        self._return = np.zeros(num_envs, np.float32)
        self._length = np.zeros(num_envs, np.int32)

    def reset(self, seed: int) -> np.ndarray:
        """Reset every env (env i seeded `seed + i`) and the episode statistics. Returns obs [N, *obs]."""
        obs, _ = self._vec.reset(seed=[seed + i for i in range(self.num_envs)])
        self._return[:] = 0.0
        self._length[:] = 0
        return obs.astype(np.float32)

    def step(self, actions: Any) -> HostStep:
        """Step every env with `actions` [N, *action] (Box: flattened allowed; Discrete: ints 0..n-1)."""
        actions = np.asarray(actions).reshape(self._action_shape).astype(self._action_dtype)
        obs, reward, terminated, truncated, info = self._vec.step(actions + self._action_start)
        terminated = np.asarray(terminated, bool)
        # Gymnasium's TimeLimit sets truncated on the last allowed step even when the episode also
        # terminated there; termination wins, as in the device adapters.
        truncated = np.asarray(truncated, bool) & ~terminated
        done = terminated | truncated
        obs = obs.astype(np.float32)
        final_obs = obs.copy()
        if done.any():  # info["final_obs"] is an object array, None where the episode goes on
            for i in np.flatnonzero(info["_final_obs"]):
                final_obs[i] = info["final_obs"][i]
        reward = np.asarray(reward, np.float32)
        self._return += reward
        self._length += 1
        out = HostStep(
            obs=obs,
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            final_obs=final_obs,
            episode_return=self._return.copy(),
            episode_length=self._length.copy(),
            episode_done=done,
        )
        self._return[done] = 0.0
        self._length[done] = 0
        return out

    def close(self) -> None:
        self._vec.close()


def evaluate_host(
    name: str, act: Callable[[np.ndarray], Any], num_episodes: int, seed: int
) -> np.ndarray:
    """Return float32 [num_episodes]: the return of one full episode per env, envs seeded seed+i.

    `act(obs [num_episodes, *obs]) -> actions [num_episodes, *action]` should be deterministic;
    the episodes run side by side, and envs whose episode has ended keep stepping (their next
    episode is ignored) so that `act` always sees a full batch.
    """
    env = HostVecEnv(name, num_episodes)
    try:
        obs = env.reset(seed)
        returns = np.zeros(num_episodes, np.float32)
        finished = np.zeros(num_episodes, bool)
        while not finished.all():
            out = env.step(act(obs))
            first = out.episode_done & ~finished
            returns[first] = out.episode_return[first]
            finished |= out.episode_done
            obs = out.obs
        return returns
    finally:
        env.close()

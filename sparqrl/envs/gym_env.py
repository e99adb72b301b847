"""Gymnasium environments stepped on the host (`gym:NAME`, or a user's own `gym:MODULE:ATTR`, see
`sparqrl.envs.custom`), for the actor-learner (Sebulba) runner.

Host environments (MuJoCo, Box2D, ...) cannot be jitted, so they do not implement the pure `Env`
protocol. `HostVecEnv` steps a batch of them with numpy arrays and returns the same quantities as
`EpisodeStats(env).step` under vmap: auto-reset on the same step, `final_obs` the observation the
transition reached, `terminated` kept apart from time-limit `truncated`, and episode statistics.
`HostSpec` carries what algorithms read from an env without stepping it (`observation_shape`,
`action_space`, `name`), so `make_train(config, spec)` can build networks for a host env.

Atari ids (`gym:ALE/...`) get the standard preprocessing of `sparqrl.envs.atari` (84x84 grey, 4 frames
stacked, sticky actions; for training envs also episodic life and clipped rewards): `HostVecEnv(name, n,
training=True)` for actors, `evaluate_host(..., training=False)` for evaluation.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.wrappers import FlattenObservation, TimeLimit

from sparqrl import quiet
from sparqrl.config import ConfigError, close_matches
from sparqrl.envs import atari, custom
from sparqrl.envs.core import HOST_PREFIX as PREFIX, Box, Discrete, Space, is_atari, is_host_env
from sparqrl.extras import available

# Used only for the few registered ids without a time limit, so every episode (and every
# evaluation) ends; `max_episode_steps` is an int in the `Env` protocol too.
DEFAULT_MAX_EPISODE_STEPS = 1000


def gym_names() -> list[str]:
    """Every registered Gymnasium id, as a sparqrl name (`gym:ID`); the Atari ids where ale_py is installed."""
    if available("ale_py"):
        atari.register()
    return [PREFIX + env_id for env_id in gym.registry]


def _make(name: str, training: bool = True) -> gym.Env:
    """One Gymnasium env for `gym:ID` (or a user's `gym:MODULE:ATTR`), with a time limit, no reward-changing
    wrappers, and observations flattened to one Box where they are not one (`_prepare`). Atari ids are
    preprocessed by `atari.make_atari`, which alone reads `training` (episodic life and reward clipping)."""
    if is_atari(name):
        return atari.make_atari(name, training)
    if custom.is_custom(name):
        return _prepare(name, custom.host_factory(name)())
    env_id = name.removeprefix(PREFIX)
    if not is_host_env(name) or env_id not in gym.registry:
        raise ConfigError(f"env={name!r} is not a known Gymnasium environment{close_matches(name, gym_names())}")
    limit = None if gym.registry[env_id].max_episode_steps else DEFAULT_MAX_EPISODE_STEPS
    quiet.before_gym_make(env_id)
    try:
        env = gym.make(env_id, max_episode_steps=limit)
    except gym.error.Error as error:  # e.g. DependencyNotInstalled for mujoco-py's -v2/-v3 ids
        raise ConfigError(f"env={name!r}: Gymnasium could not build it: {error}") from error
    except Exception as error:  # noqa: BLE001 - a user's registered env raised in its constructor
        raise ConfigError(f"env={name!r}: Gymnasium could not build it: {type(error).__name__}: {error}") from error
    return _prepare(name, env)


FLATTENED = (spaces.Dict, spaces.Tuple, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
"""Observation spaces flattened to one Box by Gymnasium's FlattenObservation (Discrete ones one-hot)."""


def _prepare(name: str, env: gym.Env) -> gym.Env:
    """Add a time limit where the env has none (every episode, and every evaluation, must end) and
    flatten Dict/Tuple/Discrete/MultiDiscrete/MultiBinary observations into one Box."""
    if _time_limit(env) is None:
        env = TimeLimit(env, DEFAULT_MAX_EPISODE_STEPS)
    obs_space = env.observation_space
    if isinstance(obs_space, FLATTENED):
        env = FlattenObservation(env)
    elif not isinstance(obs_space, spaces.Box):
        env.close()
        raise ConfigError(f"env={name!r} has {obs_space} observations; sparqrl supports Box observations (and "
                          "flattens Dict, Tuple, Discrete, MultiDiscrete and MultiBinary ones)")
    return env


def _time_limit(env: gym.Env) -> int | None:
    """The env's time limit: its spec's, or that of a TimeLimit wrapper anywhere in it; None if neither."""
    if env.spec is not None and env.spec.max_episode_steps:
        return int(env.spec.max_episode_steps)
    while isinstance(env, gym.Wrapper):
        if isinstance(env, TimeLimit):
            return int(env._max_episode_steps)
        env = env.env
    return None


def _action_space(name: str, space: Any) -> Space:
    if isinstance(space, spaces.Discrete):
        return Discrete(int(space.n))
    if isinstance(space, spaces.Box):
        return Box.make(space.low, space.high, tuple(space.shape))
    raise ConfigError(f"env={name!r} has {space} actions; {custom.ACTIONS_SUPPORTED} (on the host)")


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
    custom.check_obs_dtype(name, obs_space.dtype)
    return HostSpec(
        name=name,
        observation_shape=tuple(obs_space.shape),
        action_space=_action_space(name, env.action_space),
        max_episode_steps=int(_time_limit(env)),
    )


_checked: set[str] = set()  # names whose env `_check_api` has reset and stepped in this process


def _check_api(name: str, env: gym.Env, spec: HostSpec) -> None:
    """Reset and step the env once, through its own methods (under our wrappers), so that an env of the
    old Gym API (reset returning obs only, step returning 4 values) or returning observations that are
    not numbers of the declared shape is a one-line error before anything is compiled or written."""
    raw, obs_space = env.unwrapped, env.unwrapped.observation_space

    def call(what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as error:  # noqa: BLE001 - the user's code: one line, not a traceback
            raise ConfigError(f"env={name!r}: {what} raised {type(error).__name__}: {error}") from None

    def check_obs(what: str, obs: Any) -> None:
        if not isinstance(obs_space, spaces.Box):  # flattened by us: it must fit its space
            call(f"flattening the observation {what} returned", lambda: spaces.flatten(obs_space, obs))
            return
        try:
            array = np.asarray(obs)
        except Exception:  # noqa: BLE001 - e.g. ragged lists
            array = np.asarray(obs, dtype=object)
        custom.check_obs_dtype(name, array.dtype)
        if array.shape != tuple(obs_space.shape):
            raise ConfigError(f"env={name!r}: {what} returned observations of shape {array.shape}, not its "
                              f"observation_space's {tuple(obs_space.shape)}")

    out = call("reset(seed=0)", lambda: raw.reset(seed=0))
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
        raise ConfigError(f"env={name!r}: reset must return (obs, info) as in Gymnasium; it returned "
                          f"{_shown(out)} (an env of the old Gym API?)")
    check_obs("reset", out[0])
    action = call("action_space.sample()", raw.action_space.sample)
    out = call("step(action)", lambda: raw.step(action))
    if not (isinstance(out, tuple) and len(out) == 5):
        raise ConfigError(f"env={name!r}: step must return (obs, reward, terminated, truncated, info) as in Gymnasium; "
                          f"it returned {_shown(out)}" + (" (the old Gym API's obs, reward, done, info)"
                                                          if isinstance(out, tuple) and len(out) == 4 else ""))
    check_obs("step", out[0])
    try:
        float(out[1])
    except (TypeError, ValueError):
        raise ConfigError(f"env={name!r}: step's reward must be a number; it is {type(out[1]).__name__}") from None


def _shown(value: Any) -> str:
    return f"a tuple of {len(value)} values" if isinstance(value, tuple) else f"a {type(value).__name__}"


def host_spec(name: str) -> HostSpec:
    """Build one `gym:ID` env, read its spaces and time limit, and close it. The first time in a process,
    the env is also reset and stepped once (`_check_api`)."""
    env = _make(name)
    try:
        spec = _spec_of(name, env)
        if name not in _checked:
            _check_api(name, env, spec)
            _checked.add(name)
        return spec
    finally:
        env.close()


class HostStep(NamedTuple):
    """What `HostVecEnv.step` returns: numpy arrays over the N envs, as `StepOut` + `EpisodeStats`."""

    obs: np.ndarray  # [N, *obs] (uint8 for uint8 images, else float32); where an episode ended, already the
    #                  next episode's first
    reward: np.ndarray  # float32 [N]
    terminated: np.ndarray  # bool [N]: the episode truly ended, do not bootstrap
    truncated: np.ndarray  # bool [N]: time limit and not terminated, bootstrap from final_obs
    final_obs: np.ndarray  # [N, *obs] as obs: the observation the transition reached, before reset
    episode_return: np.ndarray  # float32 [N]: sum of raw rewards of the episode, valid where episode_done
    # (a training Atari env: of the whole game, unclipped, over all lives; see sparqrl.envs.atari)
    episode_length: np.ndarray  # int32 [N]: its length in steps, valid where episode_done
    episode_done: np.ndarray  # bool [N]: terminated or truncated (training Atari: the game is over)


class HostVecEnv:
    """`num_envs` copies of a `gym:ID` env stepped in this process, auto-resetting on the same step.

    `training` matters only for Atari ids (`sparqrl.envs.atari`): True (actors) adds episodic life and
    reward clipping, and then the episode statistics are those of whole games (unclipped, over all lives)
    while `reward` / `terminated` are per life and clipped; False is for evaluation.

    Observations are float32, except uint8 ones (Atari frames), which stay uint8: a quarter of the bytes
    actors send and learners hold; every network casts its input to float32.
    """

    def __init__(self, name: str, num_envs: int, training: bool = True):
        if num_envs < 1:
            raise ConfigError(f"num_envs={num_envs!r} must be at least 1")
        envs = [_make(name, training) for _ in range(num_envs)]
        self._game_stats = training and is_atari(name)
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
        self.obs_dtype = np.uint8 if self._vec.single_observation_space.dtype == np.uint8 else np.float32

    def reset(self, seed: int) -> np.ndarray:
        """Reset every env (env i seeded `seed + i`) and the episode statistics. Returns obs [N, *obs]."""
        obs, _ = self._vec.reset(seed=[seed + i for i in range(self.num_envs)])
        self._return[:] = 0.0
        self._length[:] = 0
        return obs.astype(self.obs_dtype)

    def step(self, actions: Any) -> HostStep:
        """Step every env with `actions` [N, *action] (Box: flattened allowed; Discrete: ints 0..n-1)."""
        actions = np.asarray(actions).reshape(self._action_shape).astype(self._action_dtype)
        obs, reward, terminated, truncated, info = self._vec.step(actions + self._action_start)
        terminated = np.asarray(terminated, bool)
        # Gymnasium's TimeLimit sets truncated on the last allowed step even when the episode also
        # terminated there; termination wins, as in the device adapters.
        truncated = np.asarray(truncated, bool) & ~terminated
        done = terminated | truncated
        obs = obs.astype(self.obs_dtype)
        final_obs = obs.copy()
        if done.any():  # info["final_obs"] is an object array, None where the episode goes on
            for i in np.flatnonzero(info["_final_obs"]):
                final_obs[i] = info["final_obs"][i]
        reward = np.asarray(reward, np.float32)
        self._return += reward
        self._length += 1
        episode_done, episode_return, episode_length = done, self._return.copy(), self._length.copy()
        if self._game_stats:  # a training Atari episode is one life: report whole games instead
            episode_done, episode_return, episode_length = atari.game_stats(info, done)
        out = HostStep(obs=obs, reward=reward, terminated=terminated, truncated=truncated, final_obs=final_obs,
                       episode_return=episode_return, episode_length=episode_length, episode_done=episode_done)
        self._return[done] = 0.0
        self._length[done] = 0
        return out

    def close(self) -> None:
        self._vec.close()


def evaluate_host(
    name: str, act: Callable[[np.ndarray], Any], num_episodes: int, seed: int, training: bool = False
) -> np.ndarray:
    """Return float32 [num_episodes]: the return of one full episode per env, envs seeded seed+i.

    `act(obs [num_episodes, *obs]) -> actions [num_episodes, *action]` should be deterministic;
    the episodes run side by side, and envs whose episode has ended keep stepping (their next
    episode is ignored) so that `act` always sees a full batch. `training=False`: an Atari episode is a
    whole game, with unclipped rewards (see `HostVecEnv`).
    """
    env = HostVecEnv(name, num_episodes, training=training)
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

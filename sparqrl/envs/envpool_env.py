"""Atari through EnvPool (`--env-backend envpool`): the same games, preprocessing and step contract as
`gym_env.HostVecEnv`, stepped by EnvPool's C++ thread pool instead of Gymnasium's Python wrappers.

EnvPool is optional (`pip install 'sparqrl[envpool]'`) and here serves Atari ids only (`gym:ALE/NAME-v5`;
EnvPool's task `NAME-v5`). Its defaults differ from the protocol of `sparqrl.envs.atari`, so every one that
matters is set: sticky actions 0.25 (EnvPool: 0), no FIRE on reset (EnvPool: on), up to 30 no-ops, 4 frames
skipped with the last 2 max-pooled, 84x84 grey, 4 stacked, a game truncated after 27,000 agent steps;
episodic life and sign-clipped rewards for training only. Three differences are bridged in `step`:

- layout: EnvPool stacks frames first, [N, 4, 84, 84]; sparqrl's Atari observations are [N, 84, 84, 4];
- auto-reset: EnvPool resets an env on the step *after* it ended (that step ignores its action and returns
  the first observation); `HostStep` wants the first observation on the same step, with the last one in
  `final_obs`. So the envs that ended are stepped once more, alone (`step(..., env_id=ended)`), which is
  exactly that reset;
- statistics: with episodic life an EnvPool episode is one life and its rewards are clipped; the whole game's
  score is summed from `info["reward"]` (the unclipped reward) and its end read from `info["terminated"]`
  (the real game over), as `atari.game_stats` does for Gymnasium.

A life-loss reset continues the game, as `atari.EpisodicLife` does; the stack it returns is EnvPool's own
(how a fresh stack is padded is not assumed anywhere in sparqrl). Evaluation always runs on Gymnasium
(`gym_env.evaluate_host`), so scores from both back-ends are measured the same way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sparqrl.config import ConfigError
from sparqrl.envs import atari
from sparqrl.envs.core import HOST_PREFIX, is_atari
from sparqrl.envs.gym_env import HostStep, HostVecEnv, host_spec
from sparqrl.extras import need

WHAT = "env_backend=envpool"


def task_id(name: str) -> str:
    """EnvPool's task for a sparqrl Atari id (`gym:ALE/Breakout-v5` -> `Breakout-v5`); a one-line error for
    any other env, or an Atari game EnvPool does not have."""
    if not is_atari(name):
        raise ConfigError(f"env_backend='envpool' steps Atari games only (gym:ALE/NAME-v5); env {name} runs on "
                          "gymnasium")
    envpool = need("envpool", WHAT)
    task = name.removeprefix(HOST_PREFIX + atari.NAMESPACE)
    if task not in envpool.list_all_envs():
        raise ConfigError(f"env={name!r}: EnvPool has no task {task!r} (env_backend='envpool' needs one of its "
                          "Atari -v5 games; env_backend=gymnasium runs every ALE id)")
    return task


def make_vec_env(name: str, num_envs: int, training: bool = True, backend: str = "gymnasium"
                 ) -> HostVecEnv | EnvPoolVecEnv:
    """The actors' host envs: Gymnasium's (`HostVecEnv`) or, for Atari with `backend="envpool"`, EnvPool's
    (`EnvPoolVecEnv`, the same interface and step contract). Here, not in `gym_env`, so that this module alone
    knows both back-ends and neither imports the other's module back."""
    if backend == "envpool":
        return EnvPoolVecEnv(name, num_envs, training)
    return HostVecEnv(name, num_envs, training)


class EnvPoolVecEnv:
    """`num_envs` copies of an Atari game stepped by EnvPool; the interface of `gym_env.HostVecEnv`."""

    def __init__(self, name: str, num_envs: int, training: bool = True):
        if num_envs < 1:
            raise ConfigError(f"num_envs={num_envs!r} must be at least 1")
        self._task, self._training = task_id(name), training
        self.spec = host_spec(name)  # the protocol's spaces, from the Gymnasium build
        self.num_envs = num_envs
        self.obs_dtype = np.uint8
        self._pool: Any = None
        self._return = np.zeros(num_envs, np.float32)
        self._length = np.zeros(num_envs, np.int32)

    def _make(self, seed: int) -> Any:
        """The pool, env i seeded `seed + i` (EnvPool seeds its envs so from one seed)."""
        envpool = need("envpool", WHAT)
        return envpool.make(
            self._task, env_type="gymnasium", num_envs=self.num_envs, seed=seed,
            repeat_action_probability=atari.STICKY_ACTION_PROB, use_fire_reset=False, noop_max=atari.NOOP_MAX,
            frame_skip=atari.FRAME_SKIP, img_height=atari.SCREEN_SIZE, img_width=atari.SCREEN_SIZE,
            gray_scale=True, stack_num=atari.FRAME_STACK, max_episode_steps=atari.MAX_EPISODE_STEPS,
            episodic_life=self._training, reward_clip=self._training,
        )

    def reset(self, seed: int) -> np.ndarray:
        """A new pool with env i seeded `seed + i`; the episode statistics cleared. Returns obs [N, 84, 84, 4]."""
        self.close()
        self._pool = self._make(seed)
        obs, _ = self._pool.reset()
        self._return[:] = 0.0
        self._length[:] = 0
        return _last_axis(obs)

    def step(self, actions: Any) -> Any:
        """Step every env with int actions [N]; the envs that ended are reset on this same step."""
        actions = np.asarray(actions).reshape(self.num_envs).astype(np.int32)
        obs, reward, terminated, truncated, info = self._pool.step(actions)
        terminated = np.asarray(terminated, bool)
        truncated = np.asarray(truncated, bool) & ~terminated
        done = terminated | truncated
        obs = _last_axis(obs)
        final_obs = obs.copy()
        if done.any():  # EnvPool's next-step reset, taken now for the envs that ended
            ended = np.flatnonzero(done).astype(np.int32)
            first, _, _, _, reset_info = self._pool.step(np.zeros(len(ended), np.int32), env_id=ended)
            obs[np.asarray(reset_info["env_id"])] = _last_axis(first)
        self._return += np.asarray(info["reward"], np.float32)  # unclipped
        self._length += 1
        game_over = done & (np.asarray(info["terminated"], bool) | truncated) if self._training else done
        out = HostStep(
            obs=obs,
            reward=np.asarray(reward, np.float32),
            terminated=terminated,
            truncated=truncated,
            final_obs=final_obs,
            episode_return=np.where(game_over, self._return, 0.0).astype(np.float32),
            episode_length=np.where(game_over, self._length, 0).astype(np.int32),
            episode_done=game_over,
        )
        self._return[game_over] = 0.0
        self._length[game_over] = 0
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def _last_axis(obs: np.ndarray) -> np.ndarray:
    """EnvPool's [N, K, H, W] frame stacks as sparqrl's [N, H, W, K] (contiguous uint8)."""
    return np.ascontiguousarray(np.moveaxis(np.asarray(obs, np.uint8), 1, -1))

"""Atari 2600 games on the host (`gym:ALE/Breakout-v5`, ...) through ale-py, with the standard preprocessing.

The ROMs ship inside the `ale_py` wheel (`ale_py.roms.get_rom_path`), so nothing is downloaded at run time.
`make_atari(name, training)` builds one game from Gymnasium's own wrappers, innermost first:

- sticky actions: the emulator repeats the previous action with probability 0.25, as the v5 ids do
  (`gym.make(..., repeat_action_probability=0.25, frameskip=1)`; Machado et al. 2018);
- up to 30 no-op actions after a (full) reset (`AtariPreprocessing(noop_max=30)`; Mnih et al. 2015);
- each action held for 4 frames, the observation the pixel-wise max of the last 2, since sprites flicker
  (`AtariPreprocessing(frame_skip=4)`; Mnih et al. 2015);
- grey, resized to 84x84, uint8 (`AtariPreprocessing(screen_size=84, grayscale_obs=True)`; Mnih et al. 2015);
- a game ends after 108,000 frames (30 minutes, 27,000 agent steps) as a truncation (v5's
  `max_num_frames_per_episode` and a `TimeLimit`; Mnih et al. 2015, kept by Machado et al. 2018);
- training only: a lost life ends the episode, episodic life (`EpisodicLife`, below; Mnih et al. 2015);
- training only: rewards clipped to their sign, {-1, 0, 1} (`TransformReward(np.sign)`; Mnih et al. 2015);
- the last 4 frames stacked on the last axis: observations uint8 [84, 84, 4] (`FrameStackObservation(4)`;
  Mnih et al. 2015).

Evaluation envs (`training=False`) are the same without episodic life and reward clipping: an episode is a
whole game and its return is the game's score.

Episodic life and `terminated`. A life loss is reported as `terminated=True`, not as a separate flag: to a
learner it means exactly what termination means (do not bootstrap through it; Mnih et al. 2015 "used to
mark the end of an episode during training"), so every learner that keeps `terminated` apart from
`truncated` handles it unchanged and no algorithm needs an Atari flag. The game itself goes on: the reset
that follows a life loss does not restart the emulator (it returns the observation the life ended on and the
agent plays its next life from there); only a real game over, or the time limit, restarts the game. Gymnasium's own
`AtariPreprocessing(terminal_on_life_loss=True)` is not used for this because its reset restarts the
whole game, so under auto-reset an agent would only ever play its first life.

Episode statistics. The training episode (one life, clipped rewards) is not what anyone reports, so a
`RecordEpisodeStatistics` sits below episodic life and reward clipping: it sees whole games and raw rewards,
and puts `info["episode"]` (return `r`, length `l`) on the step that ends a game. `HostVecEnv` reports
those (`game_stats`): a training env's `episode_return` / `episode_done` are the real, unclipped score over
all lives, exactly what an evaluation env reports; `terminated` / `reward` stay per life and clipped.

Memory: `HostVecEnv` keeps the frames uint8 (84 * 84 * 4 B = 28 kB per observation, twice per step with
`final_obs`); networks cast them to float32 and the Nature CNN (`nets.NatureCNN`) scales them by 1/255.
Storing each frame once in DQN's replay (not four stacked copies) is a later part.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.wrappers import (
    AtariPreprocessing, FrameStackObservation, RecordEpisodeStatistics, TimeLimit, TransformObservation,
    TransformReward,
)

from sparqrl.config import ConfigError, close_matches
from sparqrl.envs.core import HOST_PREFIX

NAMESPACE = "ALE/"
WHAT = "Atari environments (gym:ALE/...)"

STICKY_ACTION_PROB = 0.25  # v5's repeat_action_probability (Machado et al. 2018)
FRAME_SKIP = 4
SCREEN_SIZE = 84
NOOP_MAX = 30
FRAME_STACK = 4
MAX_FRAMES = 108_000  # 30 minutes at 60 Hz, as v5 (max_num_frames_per_episode)
MAX_EPISODE_STEPS = MAX_FRAMES // FRAME_SKIP  # 27,000 agent steps


def register() -> None:
    """Import ale_py, which registers the `ALE/...` ids with Gymnasium; a one-line `ConfigError` naming
    `pip install 'sparqrl[atari]'` where it (or OpenCV, which `AtariPreprocessing` resizes with) is not
    installed."""
    from sparqrl.extras import need

    need("ale_py", WHAT)
    need("cv2", WHAT)  # opencv-python-headless, part of the atari extra


class EpisodicLife(gym.Wrapper):
    """A lost life ends the episode (`terminated=True`) but not the game: the `reset` that follows returns
    the observation the life ended on and play goes on from there; a real game over (or truncation, or a
    seeded reset) makes `reset` restart the game.

    Wraps an env whose `unwrapped.ale.lives()` counts the lives left (ale-py's `AtariEnv`).
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._lives = 0
        self._game_over = True
        self._last_obs: Any = None

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._game_over = bool(terminated or truncated)
        lives = self.env.unwrapped.ale.lives()
        life_lost = lives < self._lives
        self._lives = lives
        self._last_obs = obs
        return obs, reward, bool(terminated or life_lost), truncated, info

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        if not self._game_over and seed is None:  # a life was lost: play on from where the game is
            return self._last_obs, {"lives": self._lives}
        obs, info = self.env.reset(seed=seed, options=options)
        self._game_over = False
        self._lives = self.env.unwrapped.ale.lives()
        return obs, info


def make_atari(name: str, training: bool, render_mode: str | None = None) -> gym.Env:
    """One `gym:ALE/...` game with the preprocessing above; observations uint8 [84, 84, 4].

    `training=True` adds episodic life and reward clipping (for actors); `training=False` is for evaluation
    (and video: `render_mode="rgb_array"`).
    """
    register()
    env_id = name.removeprefix(HOST_PREFIX)
    if env_id not in gym.registry:
        atari_names = [HOST_PREFIX + i for i in gym.registry if i.startswith(NAMESPACE)]
        raise ConfigError(f"env={name!r} is not a known Atari environment{close_matches(name, atari_names)}")
    # frameskip=1: AtariPreprocessing skips frames itself (and max-pools the last two), which v5's own
    # frameskip=4 would not do; the sticky-action probability is v5's, set explicitly so an id of another
    # version (ALE/Breakout-v5 is the one the issue names) gets the same protocol.
    env = gym.make(env_id, frameskip=1, repeat_action_probability=STICKY_ACTION_PROB,
                   max_num_frames_per_episode=MAX_FRAMES, max_episode_steps=None, render_mode=render_mode)
    env = AtariPreprocessing(env, noop_max=NOOP_MAX, frame_skip=FRAME_SKIP, screen_size=SCREEN_SIZE,
                             terminal_on_life_loss=False, grayscale_obs=True, scale_obs=False)
    # counts agent steps of the whole game (EpisodicLife's reset after a life loss does not reset it)
    env = TimeLimit(env, MAX_EPISODE_STEPS)
    if training:
        env = RecordEpisodeStatistics(env)  # whole games, raw rewards: see `game_stats`
        env = EpisodicLife(env)
        env = TransformReward(env, lambda r: float(np.sign(r)))
    env = FrameStackObservation(env, FRAME_STACK)  # [4, 84, 84]
    stacked = (SCREEN_SIZE, SCREEN_SIZE, FRAME_STACK)
    return TransformObservation(env, lambda obs: np.moveaxis(obs, 0, -1),
                                spaces.Box(0, 255, stacked, np.uint8))


def game_stats(info: dict, done: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The whole-game statistics of a training `HostVecEnv` step, from the `info` of its `SyncVectorEnv`
    (same-step auto-reset: the step's own info is `info["final_info"]` where an episode ended).

    done: bool [N], terminated or truncated. Returns (game_done bool [N], game_return float32 [N],
    game_length int32 [N]); return and length are valid where game_done.
    """
    n = len(done)
    episode = info.get("final_info", {}).get("episode", {})
    game_done = np.asarray(info.get("final_info", {}).get("_episode", np.zeros(n, bool)), bool) & done
    game_return = np.where(game_done, episode.get("r", np.zeros(n)), 0.0).astype(np.float32)
    game_length = np.where(game_done, episode.get("l", np.zeros(n)), 0).astype(np.int32)
    return game_done, game_return, game_length

"""Atari preprocessing (sparqrl.envs.atari) through HostVecEnv: shapes, sticky actions, episodic life and reward
clipping for training envs only, whole-game statistics, ROMs shipped with ale_py, a missing ale_py."""

import os
import sys

import numpy as np
import pytest

from sparqrl.config import ConfigError
from sparqrl.envs import Discrete, HostVecEnv, evaluate_host, host_spec, validate_env_name
from sparqrl.envs.atari import make_atari

pytest.importorskip("ale_py")

BREAKOUT = "gym:ALE/Breakout-v5"


def _paired(name: str, steps: int, seed: int, stop_at_game_over: bool):
    """Step a training and an evaluation env (one copy each, same seed) with the same random actions.

    Both start from the same game and emulator seed, and episodic life does not touch the emulator, so the
    two play the same game: the evaluation env is the reference for the training env. Returns the list of
    (eval HostStep, train HostStep, eval lives before, eval lives after) per step.
    """
    ev, tr = HostVecEnv(name, 1, training=False), HostVecEnv(name, 1, training=True)
    ale = ev._vec.envs[0].unwrapped.ale
    ev.reset(seed), tr.reset(seed)
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(steps):
        action = rng.integers(0, ev.spec.action_space.n, 1)
        before = ale.lives()
        e, t = ev.step(action), tr.step(action)
        rows.append((e, t, before, ale.lives()))
        if stop_at_game_over and e.episode_done[0]:
            break
    ev.close(), tr.close()
    return rows


@pytest.fixture(scope="module")
def breakout_game():
    """One whole Breakout game played at random (about 250 steps), in a training and an evaluation env."""
    rows = _paired(BREAKOUT, 1000, seed=3, stop_at_game_over=True)
    assert rows[-1][0].episode_done[0], "a random Breakout game ends within 1000 steps"
    return rows


def test_spec_shapes_and_dtypes():
    validate_env_name(BREAKOUT)
    spec = host_spec(BREAKOUT)
    assert spec.observation_shape == (84, 84, 4) and spec.action_space == Discrete(4)
    assert spec.max_episode_steps == 108_000 // 4
    env = make_atari(BREAKOUT, training=True)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (84, 84, 4) and obs.dtype == np.uint8
    env.close()
    vec = HostVecEnv(BREAKOUT, 2)
    first = vec.reset(seed=0)
    assert first.shape == (2, 84, 84, 4) and first.dtype == np.uint8  # frames stay bytes (a quarter of float32)
    # after a reset the stack is the first frame 4 times; then it rolls along the last axis
    np.testing.assert_array_equal(first, np.repeat(first[..., :1], 4, axis=-1))
    prev = first
    for _ in range(5):
        out = vec.step(np.array([1, 3]))
        assert out.obs.dtype == np.uint8 and out.final_obs.dtype == np.uint8
        np.testing.assert_array_equal(out.obs[..., :-1], prev[..., 1:])
        prev = out.obs
    assert not np.array_equal(prev[..., 0], prev[..., -1])  # the game moves
    vec.close()


@pytest.mark.parametrize("training", [True, False])
def test_sticky_actions_and_frame_skip(training):
    env = make_atari(BREAKOUT, training=training)
    raw = env.unwrapped
    assert raw.ale.getFloat("repeat_action_probability") == pytest.approx(0.25)  # v5, Machado et al. 2018
    assert raw._frameskip == 1  # frames are skipped (and max-pooled) by AtariPreprocessing, 4 at a time
    assert raw.ale.getInt("max_num_frames_per_episode") == 108_000
    env.reset(seed=0)
    frames = raw.ale.getEpisodeFrameNumber()
    env.step(0)
    assert raw.ale.getEpisodeFrameNumber() - frames == 4
    env.close()


def test_life_loss_ends_training_episodes_only(breakout_game):
    lost = [after < before for _, _, before, after in breakout_game]
    assert sum(lost) >= 4  # Breakout has 5 lives; the last one is lost at game over
    for step, (e, t, before, after) in enumerate(breakout_game):
        game_over = bool(e.terminated[0])
        assert game_over == (step == len(breakout_game) - 1)  # evaluation: only the game's end terminates
        assert t.terminated[0] == (after < before or game_over)  # training: every life lost
        assert not t.truncated[0] and not e.truncated[0]
        # the training game goes on after a lost life: both envs still show the same screen
        np.testing.assert_array_equal(t.final_obs[0, ..., -1], e.final_obs[0, ..., -1])


def test_training_statistics_are_whole_games(breakout_game):
    raw = np.array([e.reward[0] for e, *_ in breakout_game])
    train_done = np.array([t.episode_done[0] for _, t, *_ in breakout_game])
    # the training env reports the real game (all lives, unclipped), once, where it ends
    assert train_done.sum() == 1 and train_done[-1]
    last_eval, last_train = breakout_game[-1][0], breakout_game[-1][1]
    assert last_train.episode_return[0] == pytest.approx(raw.sum()) == pytest.approx(last_eval.episode_return[0])
    assert last_train.episode_length[0] == len(breakout_game) == last_eval.episode_length[0]


def test_rewards_clipped_for_training_only():
    rows = _paired("gym:ALE/SpaceInvaders-v5", 200, seed=0, stop_at_game_over=False)
    raw = np.array([e.reward[0] for e, *_ in rows])
    clipped = np.array([t.reward[0] for _, t, *_ in rows])
    assert raw.max() > 1  # invaders are worth 5 to 30 points
    assert set(np.unique(clipped)) <= {-1.0, 0.0, 1.0}
    np.testing.assert_array_equal(clipped, np.sign(raw))


def test_evaluate_host_plays_whole_unclipped_games():
    fire = lambda obs: np.ones(len(obs), np.int64)  # noqa: E731 - the paddle never moves
    returns = evaluate_host(BREAKOUT, fire, num_episodes=2, seed=5)
    reference = []
    for i in range(2):  # the same game, stepped by hand in a training env: its reported game return
        env = HostVecEnv(BREAKOUT, 1, training=True)
        env.reset(seed=5 + i)
        lives_lost = 0
        while True:
            out = env.step(np.ones(1, np.int64))
            lives_lost += int(out.terminated[0])
            if out.episode_done[0]:
                break
        env.close()
        assert lives_lost == 5
        reference.append(out.episode_return[0])
    np.testing.assert_array_equal(returns, reference)


def test_roms_ship_with_ale_py():
    import ale_py.roms

    assert os.path.isfile(ale_py.roms.get_rom_path("breakout"))
    assert os.path.isfile(ale_py.roms.get_rom_path("space_invaders"))


def test_unknown_atari_id_lists_close_matches():
    with pytest.raises(ConfigError, match="ALE/Breakout-v5"):
        host_spec("gym:ALE/Breakot-v5")


def test_missing_ale_py_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "ale_py", None)
    with pytest.raises(ConfigError) as info:
        HostVecEnv(BREAKOUT, 1)
    message = str(info.value)
    assert "pip install 'sparqrl[atari]'" in message and "\n" not in message

"""EnvPool's Atari (`--env-backend envpool`): the step contract of `HostVecEnv` (same-step resets, frames
stacked on the last axis in time order, whole-game statistics, clipping and episodic life for training only),
a short PPO run on it, and the settings it refuses."""

from __future__ import annotations

import numpy as np
import pytest

from sparqrl.algos import ppo
from sparqrl.config import ConfigError
from sparqrl.envs import host_spec
from sparqrl.envs.envpool_env import make_vec_env
from sparqrl.runners import RunConfig, train

pytest.importorskip("ale_py")
pytest.importorskip("envpool")

BREAKOUT = "gym:ALE/Breakout-v5"


@pytest.mark.parametrize("training", [True, False])
def test_envpool_steps_as_the_gymnasium_host_env(training):
    n = 3
    env = make_vec_env(BREAKOUT, n, training, "envpool")
    try:
        assert env.spec == host_spec(BREAKOUT)
        obs = env.reset(7)
        assert obs.shape == (n, 84, 84, 4) and obs.dtype == np.uint8 and obs.flags["C_CONTIGUOUS"]
        rng = np.random.default_rng(0)
        length, clipped = np.zeros(n, int), np.zeros(n)
        games = life_ends = 0
        for _ in range(1_500):
            out = env.step(rng.integers(0, 4, n))
            done = out.terminated | out.truncated
            assert out.obs.shape == out.final_obs.shape == (n, 84, 84, 4) and out.reward.dtype == np.float32
            # The stack shifts by one frame per step, oldest first, where no episode ended.
            going = ~done
            np.testing.assert_array_equal(out.final_obs[going][..., :3], obs[going][..., 1:])
            np.testing.assert_array_equal(out.obs[going], out.final_obs[going])
            length += 1
            clipped += out.reward
            if training:
                assert set(np.unique(out.reward)) <= {-1.0, 0.0, 1.0}
            else:
                np.testing.assert_array_equal(out.episode_done, done)  # an episode is a whole game
            for i in np.flatnonzero(out.episode_done):  # a game ended: a new one started on this same step
                assert out.episode_length[i] == length[i]
                assert not np.array_equal(out.final_obs[i], out.obs[i])
                if training:  # the raw score (Breakout's rows give 1, 4 or 7): at least the clipped sum
                    assert out.episode_return[i] >= clipped[i]
                else:
                    assert out.episode_return[i] == clipped[i]
                length[i], clipped[i] = 0, 0.0
            games += int(out.episode_done.sum())
            life_ends += int(out.terminated.sum())
            obs = out.obs
        assert games >= 3
        assert life_ends > games if training else life_ends == games  # episodic life: training only
    finally:
        env.close()


def test_ppo_trains_on_envpool_breakout(tmp_path):
    config = ppo.Config(num_envs=2, num_steps=8, total_timesteps=64, hidden=(32,), activation="relu")
    summary = train("ppo", config, RunConfig(env=BREAKOUT, out=str(tmp_path / "run"), env_backend="envpool",
                                             chunks=2, eval_every=0, eval_episodes=1, progress=False, energy=False,
                                             compile_cache=False))
    assert summary["steps"] == 64 and summary["actor_restarts"] == 0
    assert np.isfinite(summary["final_return_mean"])


@pytest.mark.parametrize("env", ["gym:CartPole-v1", "CartPole-v1"])
def test_envpool_backend_refuses_other_envs(tmp_path, env):
    with pytest.raises(ConfigError, match=r"env_backend='envpool' .*Atari games only"):
        train("ppo", ppo.Config(), RunConfig(env=env, out=str(tmp_path / "run"), env_backend="envpool"))
    assert not (tmp_path / "run").exists()

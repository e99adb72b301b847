import gymnasium as gym
import numpy as np
import pytest

from sparqrl.config import ConfigError
from sparqrl.envs import (
    Box, HostVecEnv, action_dim, evaluate_host, host_spec, is_host_env, make_env, validate_env_name,
)
from sparqrl.envs.core import require_continuous


def _random_actions(spec, n, steps, seed=0):
    """float32 [steps, n, dim] uniform within the action bounds."""
    rng = np.random.default_rng(seed)
    low, high = np.asarray(spec.action_space.low), np.asarray(spec.action_space.high)
    return rng.uniform(low, high, (steps, n, len(low))).astype(np.float32)


def test_specs():
    spec = host_spec("gym:HalfCheetah-v5")
    assert spec.name == "gym:HalfCheetah-v5"
    assert spec.observation_shape == (17,) and spec.max_episode_steps == 1000
    assert spec.action_space == Box((-1.0,) * 6, (1.0,) * 6) and action_dim(spec) == 6
    require_continuous(spec, "td3")  # what the algorithms' configs call on an env
    spec = host_spec("gym:Hopper-v5")
    assert spec.observation_shape == (11,) and action_dim(spec) == 3 and spec.max_episode_steps == 1000
    assert is_host_env("gym:Hopper-v5") and not is_host_env("brax:hopper")


def test_auto_reset_and_episode_stats_on_hopper():
    n, steps = 4, 300
    env = HostVecEnv("gym:Hopper-v5", n)
    obs = env.reset(seed=0)
    assert obs.shape == (n, 11) and obs.dtype == np.float32
    running = np.zeros(n)
    ends = 0
    for action in _random_actions(env.spec, n, steps):
        out = env.step(action)
        assert out.obs.dtype == out.final_obs.dtype == np.float32 and out.reward.shape == (n,)
        assert not np.any(out.terminated & out.truncated)
        np.testing.assert_array_equal(out.episode_done, out.terminated | out.truncated)
        running += out.reward
        done = out.episode_done
        # where an episode ended, obs starts the next one; elsewhere it is the observation reached
        assert all(not np.array_equal(out.final_obs[i], out.obs[i]) for i in np.flatnonzero(done))
        np.testing.assert_array_equal(out.final_obs[~done], out.obs[~done])
        np.testing.assert_allclose(out.episode_return, running, rtol=1e-5)
        ends += done.sum()
        running[done] = 0.0
    env.close()
    assert ends > 0  # a random Hopper falls within a few dozen steps


def test_time_limit_is_truncation():
    env = HostVecEnv("gym:Pendulum-v1", 2)  # never terminates; 200-step limit
    env.reset(seed=3)
    outs = [env.step(np.zeros((2, 1))) for _ in range(201)]
    env.close()
    for t, out in enumerate(outs):
        assert not out.terminated.any()
        np.testing.assert_array_equal(out.truncated, t == 199)
    last, before = outs[199], outs[198]
    assert np.all(last.episode_length == 200)
    assert not np.allclose(last.final_obs, last.obs)  # final_obs is pre-reset, obs starts a new episode
    # Pendulum's obs is (cos, sin, velocity) of the state: with zero torque it moves smoothly, so the
    # pre-reset obs lies close to the previous one
    assert np.abs(last.final_obs - before.obs).max() < 0.5
    np.testing.assert_array_equal(outs[200].episode_length, 1)


def test_same_seed_same_trajectory():
    def rollout():
        env = HostVecEnv("gym:Hopper-v5", 2)
        obs = [env.reset(seed=7)]
        rewards = []
        for action in _random_actions(env.spec, 2, 100, seed=1):
            out = env.step(action)
            obs.append(out.obs)
            rewards.append(out.reward)
        env.close()
        return np.stack(obs), np.stack(rewards)

    (obs_a, rew_a), (obs_b, rew_b) = rollout(), rollout()
    np.testing.assert_array_equal(obs_a, obs_b)
    np.testing.assert_array_equal(rew_a, rew_b)
    env = HostVecEnv("gym:Hopper-v5", 2)
    first = env.reset(seed=7)
    assert not np.array_equal(first[0], first[1])  # env i is seeded seed + i
    np.testing.assert_array_equal(first[1], env.reset(seed=8)[0])
    env.close()


def test_evaluate_host():
    act = lambda obs: np.clip(obs[:, :1], -2.0, 2.0)  # noqa: E731  a deterministic Pendulum policy
    returns = evaluate_host("gym:Pendulum-v1", act, num_episodes=3, seed=0)
    assert returns.shape == (3,) and returns.dtype == np.float32 and np.all(returns < 0)
    np.testing.assert_array_equal(returns, evaluate_host("gym:Pendulum-v1", act, num_episodes=3, seed=0))
    assert not np.array_equal(returns, evaluate_host("gym:Pendulum-v1", act, num_episodes=3, seed=1))


def test_names():
    validate_env_name("gym:HalfCheetah-v5")
    with pytest.raises(ConfigError, match="gym:HalfCheetah-v5"):
        validate_env_name("gym:HalfCheetha-v5")
    with pytest.raises(ConfigError, match="gym:HalfCheetah-v5"):
        host_spec("gym:HalfCheetha-v5")
    with pytest.raises(ConfigError, match="actor-learner"):
        make_env("gym:Pendulum-v1")


class _FallsAtFive(gym.Env):
    """Terminates on its 5th step: with a 5-step time limit, TimeLimit also flags truncation there."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float64)
    action_space = gym.spaces.Discrete(2, start=1)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1), {}

    def step(self, action):
        assert action in (1, 2)  # sparqrl's Discrete actions 0..n-1 are shifted to the space's start
        self.t += 1
        return np.full(1, self.t, np.float64), float(action), self.t >= 5, False, {}


@pytest.fixture
def registered():
    ids = {"sparqrl-test/FallsAtFive-v0": 5, "sparqrl-test/NoLimit-v0": None}
    for env_id, limit in ids.items():
        gym.register(env_id, entry_point=_FallsAtFive, max_episode_steps=limit)
    yield
    for env_id in ids:
        del gym.registry[env_id]


def test_termination_wins_over_truncation_and_default_limit(registered):
    env = HostVecEnv("gym:sparqrl-test/FallsAtFive-v0", 2)
    env.reset(seed=0)
    outs = [env.step(np.array([0, 1])) for _ in range(5)]
    env.close()
    last = outs[-1]
    assert last.terminated.all() and not last.truncated.any()  # Gymnasium sets both here
    np.testing.assert_array_equal(last.final_obs, [[5.0], [5.0]])
    np.testing.assert_array_equal(last.obs, [[0.0], [0.0]])
    np.testing.assert_array_equal(last.episode_return, [5.0, 10.0])
    assert host_spec("gym:sparqrl-test/NoLimit-v0").max_episode_steps == 1000

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparqrl.config import ConfigError
from sparqrl.envs import Box, Discrete, env_names, make_env, normalize, running_stats_init, running_stats_update


def test_unknown_env_lists_close_matches():
    with pytest.raises(ConfigError, match="CartPole-v1"):
        make_env("Cartpole-v1")
    with pytest.raises(ConfigError, match="brax:hopper"):
        make_env("brax:hoper")


@pytest.mark.parametrize("name", ["CartPole-v1", "Pendulum-v1", "Breakout-MinAtar", "Catch-bsuite", "Acrobot-v1"])
def test_gymnax_envs_step_vmapped(name):
    env = make_env(name)
    n = 3
    obs, state = jax.vmap(env.reset)(jax.random.split(jax.random.PRNGKey(0), n))
    assert obs.shape == (n, *env.observation_shape) and obs.dtype == jnp.float32
    space = env.action_space
    if isinstance(space, Discrete):
        action = jnp.zeros(n, jnp.int32)
    else:
        assert isinstance(space, Box)
        action = jnp.zeros((n, *space.shape))
    out = jax.jit(jax.vmap(env.step))(jax.random.split(jax.random.PRNGKey(1), n), state, action)
    assert out.obs.shape == obs.shape and out.final_obs.shape == obs.shape
    assert out.reward.shape == out.terminated.shape == out.truncated.shape == (n,)
    assert set(out.info) >= {"episode_return", "episode_length", "episode_done"}


def _rollout(env, steps, action):
    def body(carry, key):
        obs, state = carry
        out = env.step(key, state, action)
        return (out.obs, out.state), out

    init = env.reset(jax.random.PRNGKey(0))
    return jax.lax.scan(body, init, jax.random.split(jax.random.PRNGKey(1), steps))[1]


def test_time_limit_is_truncation_not_termination():
    env = make_env("Pendulum-v1")  # never terminates; 200-step limit
    out = _rollout(env, 450, jnp.zeros(1))
    done_at = np.flatnonzero(np.asarray(out.truncated))
    np.testing.assert_array_equal(done_at, [199, 399])
    assert not np.any(np.asarray(out.terminated))
    # the final observation is the pre-reset one; the returned observation starts the next episode
    assert not np.allclose(out.final_obs[199], out.obs[199])
    np.testing.assert_allclose(out.final_obs[198], out.obs[198])
    rewards = np.asarray(out.reward)
    np.testing.assert_allclose(out.info["episode_return"][199], rewards[:200].sum(), rtol=1e-5)
    assert int(out.info["episode_length"][399]) == 200
    assert bool(out.info["episode_done"][399]) and not bool(out.info["episode_done"][398])


def test_termination_is_not_truncation():
    env = make_env("CartPole-v1")  # always pushing left ends the episode by termination quickly
    out = _rollout(env, 100, jnp.int32(0))
    terminated = np.asarray(out.terminated)
    assert terminated.any() and not np.asarray(out.truncated).any()
    first = int(np.flatnonzero(terminated)[0])
    assert int(out.info["episode_length"][first]) == first + 1


def test_brax_env_truncates_at_its_limit():
    env = make_env("brax:inverted_pendulum")
    assert "brax:inverted_pendulum" in env_names()
    obs, state = env.reset(jax.random.PRNGKey(0))
    assert obs.shape == env.observation_shape
    out = jax.jit(env.step)(jax.random.PRNGKey(1), state, jnp.zeros(env.action_space.shape))
    assert out.obs.shape == env.observation_shape and not bool(out.truncated)


def test_running_stats_match_numpy():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(16, 5)).astype(np.float32) for _ in range(6)]
    stats = running_stats_init((5,))
    for batch in batches:
        stats = jax.jit(running_stats_update)(stats, jnp.asarray(batch))
    data = np.concatenate(batches)
    np.testing.assert_allclose(stats.mean, data.mean(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(stats.var, data.var(0), rtol=1e-3)
    x = rng.normal(size=(4, 5)).astype(np.float32)
    ref = np.clip((x - data.mean(0)) / np.sqrt(data.var(0) + 1e-8), -10, 10)
    np.testing.assert_allclose(normalize(stats, jnp.asarray(x)), ref, rtol=1e-3, atol=1e-3)


def test_brax_env_prints_no_third_party_notices():
    """MuJoCo's 'Failed to import warp' lines and brax's maintenance warning are not shown to the user."""
    import subprocess
    import sys

    code = "from sparqrl.envs import make_env; make_env('brax:ant'); print('made')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout == "made\n" and "warp" not in done.stderr and "maintained" not in done.stderr, done


def test_gymnax_imports_without_its_render_only_modules():
    """A gymnax env is made without seaborn or matplotlib imported (`import_gymnax`); gymnax's render code
    still reaches the real modules, and a later import of them is the real one."""
    import os
    import subprocess
    import sys

    code = """
import sys
from sparqrl.envs import make_env
make_env("CartPole-v1")
print(sorted(m for m in ("seaborn", "matplotlib", "matplotlib.pyplot", "scipy", "pandas") if m in sys.modules))
import gymnax.environments.misc.pong as pong
print(len(pong.sns.color_palette("cubehelix", 3)), type(pong.colors.ListedColormap(["red"])).__name__)
import matplotlib.pyplot as plt
print(type(plt.figure()).__name__, type(sys.modules["matplotlib.pyplot"]).__name__)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "MPLBACKEND": "Agg"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:3] == ["[]", "3 ListedColormap", "Figure module"]

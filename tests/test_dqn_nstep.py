"""DQN's n-step target (`nstep`): against a NumPy loop on a hand-made replay (episode ends inside windows,
truncation, Double DQN), a short run on device, and the one-line refusals of what it does not support."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import run_cli
from sparqrl.algos import dqn
from sparqrl.algos.base import Step, make_train_fn
from sparqrl.algos.dqn import train as dqn_train
from sparqrl.config import ConfigError
from sparqrl.envs import make_env
from sparqrl.nets.modules import QNetwork

GAMMA, T, N, SLOTS, NSTEP = 0.9, 9, 3, 6, 3


def _hand_made_steps():
    """T env steps of N envs: obs[t, e] = (t, e, noise...) names its step; a termination, two truncations and
    a step both terminated and truncated (which counts as terminated) lie where windows reach them."""
    rng = np.random.default_rng(0)
    obs = np.concatenate([np.stack(np.meshgrid(np.arange(T), np.arange(N), indexing="ij"), -1),
                          rng.normal(size=(T, N, 2))], -1).astype(np.float32)
    terminated, truncated = np.zeros((T, N), bool), np.zeros((T, N), bool)
    terminated[4, 0] = truncated[7, 0] = truncated[5, 1] = True
    terminated[6, 2] = truncated[6, 2] = True
    return dict(obs=obs, action=rng.integers(0, 2, size=(T, N)).astype(np.int32),
                reward=rng.normal(size=(T, N)).astype(np.float32),
                next_obs=rng.normal(size=(T, N, 4)).astype(np.float32), terminated=terminated, truncated=truncated)


def _np_nstep_target(steps, t0, e, q_target, q_online, double):
    """y = Σ_k γ^k r_k up to the window's end or its first episode end; a termination does not bootstrap, a
    truncation or the window's end bootstraps from that step's next_obs with γ^(k+1). q_target / q_online
    [T, N, A]: the networks' values of every step's next_obs."""
    y, discount = 0.0, 1.0
    for k in range(NSTEP):
        t = t0 + k
        y += discount * steps["reward"][t, e]
        discount *= GAMMA
        if steps["terminated"][t, e]:
            return y
        if steps["truncated"][t, e] or k == NSTEP - 1:
            values = q_target[t, e]
            chooser = q_online[t, e] if double else values
            return y + discount * values[int(np.argmax(chooser))]
    raise AssertionError("unreachable")


def _config(**changes):
    return dqn.Config(num_envs=N, buffer_size=SLOTS * N, batch_size=256, nstep=NSTEP, gamma=GAMMA,
                      hidden=(16,), **changes)


def test_nstep_target_matches_numpy_on_a_hand_made_replay():
    steps = _hand_made_steps()
    config = _config()
    buffer = dqn_train._init_replay(config, dqn_train._example_transition((4,)), config.buffer_size)
    for t in range(T):  # T > SLOTS rows: the ring has overwritten its oldest three
        row = {k: jnp.asarray(v[t]) for k, v in steps.items()}
        buffer = dqn_train._store(config, False, buffer, Step(**row, extra=None, priority=None))
    drawn = dqn_train._draw_windows(config, buffer, jax.random.key(3), jnp.int32(1))
    t0 = np.asarray(drawn.batch.obs[:, 0]).astype(int)
    env = np.asarray(drawn.batch.obs[:, 1]).astype(int)
    # Windows start at every step whose window lies in the ring (steps 3..8), never past the newest.
    assert set(t0) == {3, 4, 5, 6} and set(env) == {0, 1, 2}
    np.testing.assert_array_equal(np.asarray(drawn.batch.action), steps["action"][t0, env])

    network = QNetwork(2, (4,), (16,), "relu")
    params = network.init(jax.random.key(0), jnp.zeros(4))
    target_params = network.init(jax.random.key(1), jnp.zeros(4))

    q_target, q_online = (np.asarray(network.apply(p, steps["next_obs"])) for p in (target_params, params))
    targets = {}
    for double in (False, True):
        cfg = dataclasses.replace(config, double_dqn=double)
        got = np.asarray(jax.jit(lambda b: dqn_train.td_target(cfg, network, params, target_params, b))(drawn.batch))
        want = np.array([_np_nstep_target(steps, t, e, q_target, q_online, double)
                         for t, e in zip(t0, env)], np.float32)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"double={double}")
        targets[double] = got
    assert np.any(targets[True] != targets[False])  # Double DQN's online network picks other actions somewhere


def test_nstep_runs_on_device_with_windows_of_every_env(tmp_path):
    """A short run: the replay's slots are rows of N envs' steps with `truncated` kept, it reports transitions,
    and gradient steps follow the same env-step schedule as one-step DQN (learning waits for n rows)."""
    cartpole = make_env("CartPole-v1")
    config = dqn.Config(total_timesteps=1_200, num_envs=4, buffer_size=500, batch_size=16, learning_starts=8,
                        train_interval=3, target_update_interval=100, hidden=(32, 32), nstep=3)
    assert config.learning_start_step == 16  # batch_size, above nstep·num_envs (12)
    assert dataclasses.replace(config, batch_size=4).learning_start_step == 12  # a window of every env
    state, metrics = jax.jit(make_train_fn(dqn.make_algorithm(config, cartpole)))(jax.random.key(0))
    storage = state.learner.buffer.storage
    assert storage.obs.shape == (125, 4, 4) and storage.truncated.shape == (125, 4)
    assert int(state.learner.gradient_steps) == config.num_gradient_steps
    np.testing.assert_array_equal(np.asarray(metrics["buffer_size"])[[0, -1]], [4, 500])
    loss = np.asarray(metrics["loss"])
    assert np.all(loss[:3] == 0.0) and np.all(np.isfinite(loss)) and np.all(loss[4:] > 0.0)


@pytest.mark.parametrize("changes,pattern", [
    ({"nstep": 0}, r"nstep=0 .*> 0"),
    ({"nstep": 2.5}, r"nstep=2.5 .*integer"),
    ({"nstep": 4, "buffer_size": 30, "batch_size": 16}, r"nstep=4 .*buffer_size // num_envs \(3\)"),
    ({"nstep": 4, "total_timesteps": 30}, r"nstep=4 .*total_timesteps // num_envs \(3\)"),
    ({"nstep": 3, "prioritized": True}, r"nstep=3 .*prioritized"),
])
def test_bad_nstep_is_refused_before_tracing(changes, pattern):
    config = dataclasses.replace(dqn.Config(), **changes)
    with pytest.raises(ConfigError, match=pattern):
        dqn.make_algorithm(config, make_env("CartPole-v1"))


@pytest.mark.parametrize("env,sets", [
    ("CartPole-v1", ["nstep=0"]),
    ("CartPole-v1", ["nstep=3", "prioritized=true"]),
    ("gym:CartPole-v1", ["nstep=3"]),  # the actor-learner runner: its replay interleaves actors' fragments
])
def test_bad_nstep_is_one_line_and_exit_2(capsys, tmp_path, env, sets):
    sets = [arg for s in sets for arg in ("--set", s)]
    code, _, err = run_cli(capsys, "train", "dqn", "--env", env, "--steps", "2000", *sets, "--no-progress",
                           "--no-energy", "--out", str(tmp_path / "run"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "nstep=" in err, err

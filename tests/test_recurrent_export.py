"""Exporting a recurrent policy (issue 36 item 4): the ONNX graph takes the state as an input and returns the next
state as an output; stepped along episodes (a reset to zeros included) its actions and states are the library's own
recurrent act's (`algos.base.RecurrentAct`), for the LSTM and the GRU, discrete and continuous actions, observation
normalisation on; fp16 and int8 graphs run and stay close."""

from __future__ import annotations

import jax
import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from sparqrl.algos import ppo  # noqa: E402
from sparqrl.algos.base import recurrent_acts  # noqa: E402
from sparqrl.algos.ppo import train as ppo_train  # noqa: E402
from sparqrl.envs import make_env  # noqa: E402
from sparqrl.export import export_policy, session  # noqa: E402
from sparqrl.export.policy import describe, recurrent_reference  # noqa: E402

STEPS, EPISODES = 6, 16


def random_policy(memory, env_name):
    """A PPO recurrent policy with random normal weights and observation statistics (so that actions and states
    vary), its `Policy` and the library's deterministic step as (obs, carry) -> (action, carry)."""
    env = make_env(env_name)
    config = ppo.Config(memory=memory, memory_size=6, num_envs=4, num_steps=8, total_timesteps=64, hidden=(16,),
                        normalize_obs=True, num_minibatches=2)
    al = ppo_train.make_actor_learner(config, env)
    policy_params = jax.device_get(al.policy(al.init(jax.random.PRNGKey(0))))
    rng = np.random.default_rng(1)
    noisy = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), policy_params.params)
    shape = env.observation_shape
    stats = policy_params.obs_stats._replace(mean=rng.normal(size=shape).astype(np.float32),
                                             var=rng.uniform(0.5, 2.0, shape).astype(np.float32))
    policy_params = policy_params._replace(params=noisy, obs_stats=stats)
    policy = describe("ppo", config, shape, env.action_space, policy_params)
    return policy, recurrent_reference(recurrent_acts(al.acting, len(shape))[0], policy_params), stats


@pytest.mark.parametrize("memory, env_name", [("lstm", "CartPole-v1"), ("gru", "Pendulum-v1")])
def test_exported_graph_steps_as_the_library(memory, env_name):
    policy, reference, stats = random_policy(memory, env_name)
    data, report = export_policy(policy, None, "fp32", reference=reference)  # (its own check passes first)
    names = {"lstm": ("c", "h"), "gru": ("h",)}[memory]
    assert list(report["inputs"]) == ["obs"] + [f"state_{n}" for n in names]
    assert list(report["outputs"]) == ["action"] + [f"next_state_{n}" for n in names]
    graph = session(data)
    rng = np.random.default_rng(2)
    state = {f"state_{n}": np.zeros((EPISODES, 6), np.float32) for n in names}  # an episode starts from zeros
    carry = tuple(state.values()) if memory == "lstm" else state["state_h"]
    for t in range(STEPS):
        obs = (stats.mean + np.sqrt(stats.var) * rng.normal(size=(EPISODES, *policy.obs_shape))).astype(np.float32)
        action, *next_state = graph.run(None, {"obs": obs, **state})
        want_action, carry = reference(obs, carry)
        want_state = carry if memory == "lstm" else (carry,)
        if policy.head.discrete:
            np.testing.assert_array_equal(action, want_action)
        else:
            np.testing.assert_allclose(action, want_action, atol=1e-5)
        for got, want in zip(next_state, want_state):
            np.testing.assert_allclose(got, want, atol=1e-5)
            assert np.abs(got).max() > 0.05  # the state carries something
        if t == 2:  # episodes 0-3 end here: both sides start them again from zeros
            next_state = [np.where(np.arange(EPISODES)[:, None] < 4, 0.0, s).astype(np.float32) for s in next_state]
            carry = jax.tree.map(lambda c: np.where(np.arange(EPISODES)[:, None] < 4, 0.0, c).astype(np.float32),
                                 carry)
        state = dict(zip(state, next_state))
    if policy.head.discrete:
        assert len(np.unique(action)) > 1  # the actions vary


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_low_precision_recurrent_graphs_stay_close(precision):
    policy, reference, stats = random_policy("lstm", "Pendulum-v1")
    fp32 = session(export_policy(policy, None, "fp32")[0])
    low = session(export_policy(policy, None, precision)[0])
    obs = (stats.mean + np.sqrt(stats.var) * np.random.default_rng(3).normal(size=(64, 3))).astype(np.float32)
    state = {"state_c": np.ones((64, 6), np.float32) * 0.3, "state_h": np.ones((64, 6), np.float32) * -0.2}
    for want, got in zip(fp32.run(None, {"obs": obs, **state}), low.run(None, {"obs": obs, **state})):
        assert got.dtype == np.float32 and np.max(np.abs(got - want)) < 0.25 * (1 + np.max(np.abs(want)))

"""Central inference (SEED RL): the same actions as actor-side inference, batching with a deadline, a run
on Ray, and the settings it refuses."""

from __future__ import annotations

import asyncio

import jax
import numpy as np
import pytest
from conftest import RAY_SERIAL

from sparqrl.algos import dqn, ppo
from sparqrl.config import ConfigError
from sparqrl.envs import host_spec
from sparqrl.runners import RunConfig, train
from sparqrl.runners.actors import ActorSpec, InlinePool, network_paths, quantized_copy
from sparqrl.runners.inference import CentralPolicy, InferenceServer

ENV = "gym:CartPole-v1"
SMALL = dict(num_envs=3, num_steps=6, num_minibatches=2, total_timesteps=180, hidden=(16, 16), normalize_obs=True)


def _spec(inference: str, actors: int = 2) -> ActorSpec:
    config = ppo.Config(**SMALL).validate(host_spec(ENV))
    return ActorSpec("ppo", config, ENV, 2, actors, config.num_steps, seed=1, inference=inference)


def _copy(spec: ActorSpec):
    """Version 4 of two seeds' initialised learners, with observation statistics that are not the identity:
    the fp32 copy actors run, carrying the params the server runs."""
    al = ppo.make_actor_learner(spec.config, host_spec(ENV))
    learner = jax.jit(jax.vmap(al.init))(jax.random.split(jax.random.PRNGKey(7), spec.seeds))
    learner = learner._replace(obs_stats=learner.obs_stats._replace(mean=learner.obs_stats.mean + 0.1))
    policy = jax.device_get(jax.vmap(al.policy)(learner))
    paths = network_paths(al.acting, policy, host_spec(ENV).observation_shape)
    return quantized_copy(4, policy, al.acting, paths, "fp32", "channel", env_steps=0)._replace(params=policy)


def _fragments(spec: ActorSpec, copy) -> list:
    pool = InlinePool(spec)
    try:
        ticket = pool.publish(copy)
        out = []
        for _ in range(2):
            for actor_id in range(spec.actors):
                pool.submit(actor_id, ticket)
                out.append(pool.next())
        return out
    finally:
        pool.close()


def test_central_inference_acts_as_the_actors_own_copy():
    """Same parameters, observations and keys: the same actions and log-probabilities, so the same
    fragments, as actors running their fp32 copy; and the fragment carries the server's version."""
    actor_side = _fragments(_spec("actor"), _copy(_spec("actor")))
    central = _fragments(_spec("central"), _copy(_spec("central")))
    for a, c in zip(actor_side, central):
        assert (a.actor_id, a.version) == (c.actor_id, c.version) and c.version == 4
        np.testing.assert_array_equal(a.steps.action, c.steps.action)
        np.testing.assert_array_equal(a.steps.obs, c.steps.obs)
        np.testing.assert_allclose(a.steps.extra, c.steps.extra, rtol=1e-5, atol=1e-6)


def test_the_server_batches_requests_and_a_late_actor_waits_for_no_one():
    spec = _spec("central", actors=3)
    copy = _copy(spec)
    direct = CentralPolicy(spec)
    direct.load(copy)
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(3, 2, 3, 4)).astype(np.float32)
    keys = np.asarray(jax.random.split(jax.random.PRNGKey(3), 6), np.uint32).reshape(3, 2, 2)

    async def scenario():
        server = InferenceServer(spec, deadline_ms=50.0)
        # Requests of version 4 that reach the server before the learner's load of it wait for the load.
        early = asyncio.gather(*(server.act(i, obs[i], keys[i], 10, 4) for i in range(3)))
        await asyncio.sleep(0.1)
        assert not early.done() and server.stats()["batches"] == 0
        server.load(copy)
        together = await early
        alone = await server.act(1, obs[1], keys[1], 10, 4)  # the others never come: served at the deadline
        return server.stats(), together, alone

    stats, together, alone = asyncio.run(scenario())
    assert stats == {"batches": 2, "mean_batch": 2.0}  # one batch of 3, one of 1
    for i, answer in enumerate(together):
        expected = direct.act(i, obs[i], keys[i], 10)
        np.testing.assert_array_equal(answer[1], expected[1])
        np.testing.assert_allclose(answer[2], expected[2], rtol=1e-6)
        assert answer[3] == 4
    np.testing.assert_array_equal(alone[1], together[1][1])


@RAY_SERIAL
def test_a_ray_run_with_central_inference(tmp_path):
    run = RunConfig(env=ENV, out=str(tmp_path / "run"), actors=2, backend="ray", inference="central", chunks=2,
                    eval_every=0, eval_episodes=2, progress=False, energy=False)
    summary = train("ppo", ppo.Config(**SMALL | {"total_timesteps": 360}), run)
    assert summary["inference"] == "central" and summary["steps"] == 360
    assert 1.0 <= summary["inference_batch_mean"] <= 2.0
    assert summary["actor_restarts"] == 0 and summary["version_order_violations"] == 0


def test_settings_central_inference_refuses(tmp_path):
    with pytest.raises(ConfigError, match=r"actor_precision='int8' .*must be fp32 with inference=central"):
        train("ppo", ppo.Config(**SMALL), RunConfig(env=ENV, out=str(tmp_path / "a"), inference="central",
                                                    actor_precision="int8"))
    with pytest.raises(ConfigError, match=r"inference='central' is not allowed.*Ape-X priorities"):
        train("dqn", dqn.Config(total_timesteps=400, learning_starts=100),
              RunConfig(env=ENV, out=str(tmp_path / "b"), inference="central"))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_dqn_with_uniform_replay_takes_central_inference(tmp_path):
    """Without prioritized replay, DQN's actors compute nothing with their own copy: the server acts for them."""
    run = RunConfig(env=ENV, out=str(tmp_path / "c"), inference="central", eval_every=0, eval_episodes=2,
                    progress=False, energy=False)
    summary = train("dqn", dqn.Config(total_timesteps=400, learning_starts=100, prioritized=False), run)
    assert summary["inference"] == "central" and summary["steps"] == 400

"""Recurrent policies on the actor-learner runner (issue 36 item 4): a host actor carries each env's state across
steps and fragments, resets it where an episode ends and sends each step's, so the learner's re-run of a fragment
from its first state gives the actor's own behaviour log-probabilities; fp16 actors act on the weight-only copy,
int8 actors with every matmul in int8; central inference carries the state through its requests; the one-line
refusals; learning a host task that needs
memory (tests/own_envs.py's RememberBit)."""

from __future__ import annotations

import csv
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import own_envs  # noqa: F401  (registers RememberBit-v0)
from sparqrl import cli, quant
from sparqrl.algos import ppo
from sparqrl.algos.impala import train as impala_train
from sparqrl.algos.ppo import train as ppo_train
from sparqrl.algos.recurrent import fragment_outputs
from sparqrl.config import ConfigError
from sparqrl.envs import host_spec
from sparqrl.runners.actors import Actor, ActorSpec, InlinePool, quantized_copy
from test_recurrent import step_by_step

ENV = "gym:RememberBit-v0"  # 4-step episodes: the bit is shown at the first step and asked at the last


def host_fragments(algo, config, precision="fp32", fragments=3, seeds=2):
    """`fragments` fragments one host actor acts (inline, as the runner's actors) with the learner's initial policy
    published in `precision`; the learner's policy params and the network."""
    make = {"ppo": ppo_train.make_actor_learner, "impala": impala_train.make_actor_learner}[algo]
    al = make(config, host_spec(ENV))
    learner = jax.vmap(al.init)(jax.random.split(jax.random.PRNGKey(0), seeds))
    policy = jax.device_get(jax.vmap(al.policy)(learner))
    copy = quantized_copy(0, policy, al.acting, None, precision, "channel", 0)
    actor = Actor(ActorSpec(algo, config, ENV, seeds, 1, config.num_steps, 0), 0, 0)
    try:
        return [actor.collect(copy).steps for _ in range(fragments)], policy, al.acting.network
    finally:
        actor.close()


def seed_of(tree, i):
    """Seed i's leaves of a fragment's [T, seeds, n, ...] tree, as [T, n, ...]."""
    return jax.tree.map(lambda x: jnp.asarray(x)[:, i], tree)


@pytest.mark.parametrize("algo, memory, precision", [("ppo", "lstm", "fp32"), ("impala", "gru", "fp16")])
def test_host_actor_carries_and_resets_the_state_as_a_step_by_step_unroll(algo, memory, precision):
    """fp16: the actor acts as the network with fp16-rounded weights run in fp32 (weight-only)."""
    config_type = ppo.Config if algo == "ppo" else impala_train.Config
    config = config_type(num_envs=4, num_steps=6, total_timesteps=4 * 6 * 4, hidden=(8,), memory=memory,
                         memory_size=5, **({"num_minibatches": 2} if algo == "ppo" else {}))
    frags, policy, network = host_fragments(algo, config, precision)
    acted = jax.tree.map(lambda x: jnp.asarray(np.asarray(x).astype(FLOAT[precision]), jnp.float32), policy.params)
    if precision == "fp16":  # (it did round)
        assert not np.allclose(acted["params"]["Memory_0"]["hn"]["kernel"],
                               policy.params["params"]["Memory_0"]["hn"]["kernel"])
    rerun = jax.jit(fragment_outputs, static_argnums=0)
    for i in range(2):
        params = jax.tree.map(lambda x: x[i], acted)
        steps = jax.tree.map(lambda *xs: jnp.concatenate(xs), *[seed_of(f, i) for f in frags])  # [3T, n]: in order
        done = np.asarray(steps.terminated | steps.truncated)
        assert done[config.num_steps:-1].any(), "a later fragment must hold an episode start to test the reset"
        zeros = jax.tree.map(jnp.zeros_like, jax.tree.map(lambda c: c[0], steps.memory))  # where a run starts
        carries, raw, _, _ = step_by_step(network, params, steps.obs, jnp.asarray(done), zeros)
        # the stored states: the unroll's, carried across fragments, zero after an episode's end
        for stored, expected in zip(jax.tree.leaves(steps.memory), jax.tree.leaves(carries)):
            np.testing.assert_allclose(stored, expected, atol=1e-5)
            assert np.all(np.asarray(stored)[1:][done[:-1]] == 0)
            assert np.abs(np.asarray(stored)[1:][~done[:-1]]).sum() > 0
        # the learner's re-run of each fragment from its first state gives the actor's behaviour log-probabilities
        for k, frag in enumerate(frags):
            part = seed_of(frag, i)
            dist, _, _ = rerun(network, params, part.obs, part.next_obs, part)
            np.testing.assert_allclose(dist.log_prob(part.action), part.extra, atol=1e-5)
            np.testing.assert_allclose(dist.logits, jax.nn.log_softmax(raw[k * config.num_steps:][:config.num_steps]),
                                       atol=1e-5)


FLOAT = {"fp32": np.float32, "fp16": np.float16}


def test_central_inference_acts_as_the_actors_own_copy():
    """The state travels with each request and back: the same states, actions and log-probabilities, fragment after
    fragment, as actors running their own fp32 copy."""
    config = ppo.Config(num_envs=3, num_steps=6, total_timesteps=3 * 6 * 4, hidden=(8,), memory="gru", memory_size=5,
                        num_minibatches=3, normalize_obs=True).validate(host_spec(ENV))
    al = ppo_train.make_actor_learner(config, host_spec(ENV))
    learner = jax.vmap(al.init)(jax.random.split(jax.random.PRNGKey(0), 2))
    learner = learner._replace(obs_stats=learner.obs_stats._replace(mean=learner.obs_stats.mean + 0.1))
    policy = jax.device_get(jax.vmap(al.policy)(learner))
    copy = quantized_copy(4, policy, al.acting, None, "fp32", "channel", 0)._replace(params=policy)
    fragments = {}
    for inference in ("actor", "central"):
        pool = InlinePool(ActorSpec("ppo", config, ENV, 2, 1, config.num_steps, 0, inference=inference))
        try:
            ticket = pool.publish(copy)
            fragments[inference] = []
            for _ in range(3):
                pool.submit(0, ticket)
                fragments[inference].append(pool.next().steps)
        finally:
            pool.close()
    for a, c in zip(fragments["actor"], fragments["central"]):
        np.testing.assert_array_equal(a.action, c.action)
        np.testing.assert_allclose(a.extra, c.extra, atol=1e-6)
        np.testing.assert_allclose(a.memory, c.memory, atol=1e-6)
    assert np.abs(np.asarray(fragments["central"][-1].memory)).sum() > 0


class Int8:
    """`network` with every matmul in int8 (`quant.int8_apply`), for `step_by_step`."""

    def __init__(self, network):
        self.apply = functools.partial(quant.int8_apply, network)


def test_int8_actor_acts_with_the_int8_network_and_carries_its_state():
    """An int8 actor's states and behaviour log-probabilities are those of the int8 network (every matmul, the
    LSTM's included, in int8) unrolled step by step from the weights it was sent, across fragments and resets."""
    config = ppo.Config(num_envs=4, num_steps=6, total_timesteps=4 * 6 * 4, hidden=(8,), memory="lstm",
                        memory_size=5, num_minibatches=2)
    frags, policy, network = host_fragments("ppo", config, "int8")
    for i in range(2):
        sent = quant.quantize_tree(jax.tree.map(lambda x: x[i], policy.params), "int8", "channel")
        steps = jax.tree.map(lambda *xs: jnp.concatenate(xs), *[seed_of(f, i) for f in frags])
        done = np.asarray(steps.terminated | steps.truncated)
        assert done[config.num_steps:-1].any(), "a later fragment must hold an episode start to test the reset"
        zeros = jax.tree.map(jnp.zeros_like, jax.tree.map(lambda c: c[0], steps.memory))
        carries, raw, _, _ = step_by_step(Int8(network), sent, steps.obs, jnp.asarray(done), zeros)
        for stored, expected in zip(jax.tree.leaves(steps.memory), jax.tree.leaves(carries)):
            np.testing.assert_allclose(stored, expected, atol=1e-5)
        logp = jnp.take_along_axis(jax.nn.log_softmax(raw), jnp.asarray(steps.action)[..., None], -1)[..., 0]
        np.testing.assert_allclose(logp, steps.extra, atol=1e-5)
        # and not the fp32 network's: the int8 path ran
        _, raw32, _, _ = step_by_step(network, jax.tree.map(lambda x: x[i], policy.params), steps.obs,
                                      jnp.asarray(done), zeros)
        assert not np.allclose(raw, raw32, atol=1e-6)


def test_a3c_refuses_memory_in_one_line():
    from sparqrl.algos.a3c import Config as A3CConfig

    with pytest.raises(ConfigError, match="memory=.lstm.*a3c") as error:
        A3CConfig(memory="lstm", memory_size=4).validate(host_spec(ENV))
    assert "\n" not in str(error.value)


# The budget that separates them with margin on every seed (BENCHMARKS.md, "Recurrent policies on the host").
MEMORY_TASK = ("num_envs=8", "num_steps=16", "hidden=32", "memory_size=32")


def test_lstm_beats_feed_forward_on_a_host_memory_task(tmp_path):
    """Through the command (inline actor, 2 seeds): the LSTM names the bit on every seed, the feed-forward policy
    scores chance."""
    steps = 8192
    for memory in ("none", "lstm"):
        argv = ["train", "ppo", "--import", "own_envs", "--env", ENV, "--steps", str(steps), "--seeds", "2",
                "--out", str(tmp_path / memory), "--no-progress", "--no-energy"]
        assert cli.main(argv + [w for item in MEMORY_TASK + (f"memory={memory}",) for w in ("--set", item)]) == 0
    ff, lstm = late_training_return(tmp_path / "none", steps), late_training_return(tmp_path / "lstm", steps)
    evaluated = json.loads((tmp_path / "lstm" / "summary.json").read_text())["final_return_per_seed"]
    print(f"training returns, last quarter: feed-forward {ff}, lstm {lstm}; lstm evaluated {evaluated}")
    assert all(r > f + 0.5 for r, f in zip(lstm, ff)) and all(r >= 0.8 for r in evaluated)
    if evaluated[0] == 1.0:  # the exported graph, its state carried as the docs show, plays as the library
        assert onnx_returns(tmp_path / "lstm", tmp_path / "policy.onnx") == [1.0] * 8


def onnx_returns(run, out, episodes=8):
    """Returns of `episodes` RememberBit episodes side by side of the run's exported policy (seed 0), the state
    carried from zeros (`sparqrl.export`'s docstring)."""
    pytest.importorskip("onnxruntime")
    import gymnasium as gym

    from sparqrl.export import export, session

    export(run, out, trust_imports=True)
    graph = session(out)
    envs = [gym.make(ENV.removeprefix("gym:")) for _ in range(episodes)]
    obs = np.stack([env.reset(seed=i)[0] for i, env in enumerate(envs)])
    state = {i.name: np.zeros((episodes, i.shape[1]), np.float32) for i in graph.get_inputs() if i.name != "obs"}
    returns, done = [0.0] * episodes, False
    while not done:
        action, *next_state = graph.run(None, {"obs": obs, **state})
        outs = [env.step(a) for env, a in zip(envs, action)]
        returns = [r + out[1] for r, out in zip(returns, outs)]
        obs, done = np.stack([out[0] for out in outs]), outs[0][2]  # (every episode is CUE_STEPS long)
        state = dict(zip(state, next_state))
    return returns


def late_training_return(out, steps):
    """Each seed's mean training return over the fragments learned in the run's last quarter (metrics.csv, one row
    per fragment and seed): every fragment ends the same number of RememberBit's fixed-length episodes, so this is
    the mean over some hundred episodes."""
    with (out / "metrics.csv").open(newline="") as f:
        rows = [row for row in csv.DictReader(f) if int(row["env_step"]) > 0.75 * steps and row["episode_return"]]
    seeds = sorted({row["seed"] for row in rows})
    return [float(np.mean([float(r["episode_return"]) for r in rows if r["seed"] == s])) for s in seeds]

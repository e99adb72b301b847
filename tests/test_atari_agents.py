"""PPO, IMPALA and DQN on Atari (the actor-learner runner): the Nature CNN against a NumPy convolution, actors that
run its convolutions in fp32 before the Dense chain in their precision, DQN's replay of frames stored once, whole
short runs."""

from __future__ import annotations

import csv

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparqrl import presets
from sparqrl.algos import dqn, impala, ppo
from sparqrl.envs import host_spec
from sparqrl.nets import ActorCritic, NatureCNN, cnn_kind
from sparqrl.nets.modules import CONV_LAYERS
from sparqrl.runners import RunConfig, sebulba, train
from sparqrl.runners.actors import ActorSpec, InlinePool, network_paths, quantized_copy

pytest.importorskip("ale_py")

BREAKOUT = "gym:ALE/Breakout-v5"
TINY = dict(num_envs=2, num_steps=8, total_timesteps=64, hidden=(32,), activation="relu")


def _conv_np(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray, stride: int) -> np.ndarray:
    """A VALID convolution of one image [H, W, C] with a kernel [kh, kw, C, O], stride `stride`, in float64."""
    kh, kw = kernel.shape[:2]
    oh, ow = (x.shape[0] - kh) // stride + 1, (x.shape[1] - kw) // stride + 1
    out = np.empty((oh, ow, kernel.shape[3]))
    for i in range(oh):
        for j in range(ow):
            patch = x[i * stride:i * stride + kh, j * stride:j * stride + kw, :]
            out[i, j] = np.tensordot(patch, kernel, axes=3) + bias
    return out


def test_nature_cnn_equals_numpy_convolutions():
    assert cnn_kind((84, 84, 4)) == "nature" and cnn_kind((10, 10, 4)) == "minatar"
    assert cnn_kind((84, 84, 4), "mlp") is None and cnn_kind((128,)) is None
    frames = np.random.default_rng(0).integers(0, 256, (2, 84, 84, 4)).astype(np.uint8)
    net = NatureCNN((32,), "relu")
    variables = net.init(jax.random.PRNGKey(0), jnp.asarray(frames))
    out = np.asarray(net.apply(variables, jnp.asarray(frames)))
    params = jax.tree.map(lambda x: np.asarray(x, np.float64), variables["params"])
    assert out.shape == (2, 32)
    for b in range(2):
        x = frames[b].astype(np.float64) / 255.0  # the Nature CNN sees pixels in [0, 1]
        for i, (features, _, stride, padding) in enumerate(CONV_LAYERS["nature"]):
            assert padding == "VALID"
            layer = params[f"Conv_{i}"]
            x = np.maximum(_conv_np(x, layer["kernel"], layer["bias"], stride), 0.0)
            assert x.shape[-1] == features
        assert x.shape == (7, 7, 64)  # 84 -> 20 -> 9 -> 7
        dense = params["MLP_0"]["Dense_0"]
        expected = np.maximum(x.reshape(-1) @ dense["kernel"] + dense["bias"], 0.0)
        np.testing.assert_allclose(out[b], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("precision, atol", [("fp32", 1e-4), ("int8", 0.03)])
def test_actors_act_with_the_learners_cnn(precision, atol):
    """The behaviour log-probabilities an actor sends are those of the learner's own fp32 network on the same
    frames: exactly (fp32), or within int8's error, since its convolutions run in fp32 and only the Dense chain
    after them is quantized."""
    config = ppo.Config(**TINY).validate(host_spec(BREAKOUT))
    spec = ActorSpec("ppo", config, BREAKOUT, 1, 1, config.num_steps, seed=2)
    al = ppo.make_actor_learner(config, host_spec(BREAKOUT))
    assert al.acting.features is not None
    learner = jax.jit(jax.vmap(al.init))(jax.random.split(jax.random.PRNGKey(0), 1))
    policy = jax.device_get(jax.vmap(al.policy)(learner))
    # The head's init (gain 0.01) makes every state's policy nearly uniform: scaled up, the log-probabilities
    # differ by state and action, so that a wrong forward pass shows.
    head = policy.params["params"]["Dense_0"]
    head["kernel"] = head["kernel"] * 300.0
    paths = network_paths(al.acting, policy, (84, 84, 4))
    assert paths == (("params", "NatureCNN_0", "MLP_0", "Dense_0"), ("params", "Dense_0"))  # hidden layer, head
    copy = quantized_copy(1, policy, al.acting, paths, precision, "channel", env_steps=0)
    assert all(x.dtype == np.float32 for x in jax.tree.leaves(copy.features))  # convolutions in fp32
    assert copy.stacks[0].kernels[0].dtype == (np.int8 if precision == "int8" else np.float32)
    pool = InlinePool(spec)
    try:
        pool.submit(0, copy)
        frag = pool.next()
    finally:
        pool.close()
    steps = frag.steps
    assert steps.obs.dtype == np.uint8 and steps.obs.shape == (8, 1, 2, 84, 84, 4)
    network = ActorCritic(4, True, (84, 84, 4), (32,), "relu")
    params = jax.tree.map(lambda x: x[0], policy.params)
    dist, _ = network.apply(params, jnp.asarray(steps.obs[:, 0], jnp.float32))
    expected = np.asarray(dist.log_prob(jnp.asarray(steps.action[:, 0])))
    assert np.ptp(expected) > 0.5  # the check below can tell one forward pass from another
    np.testing.assert_allclose(steps.extra[:, 0], expected, atol=atol)


DQN_TINY = dict(num_envs=2, total_timesteps=64, learning_starts=24, batch_size=8, buffer_size=64, hidden=(32,))


@pytest.mark.parametrize("algo, module", [("ppo", ppo), ("impala", impala), ("dqn", dqn)])
def test_ppo_impala_and_dqn_train_on_breakout(tmp_path, algo, module):
    """A whole short run: int8 actors, the learner's updates, an evaluation of whole games (sampled actions;
    DQN: epsilon-greedy at its final epsilon). DQN's replay keeps each frame once (`replay.frames`)."""
    assert presets.find(algo, BREAKOUT).name == f"{algo}-atari"
    config = module.Config(**(DQN_TINY if algo == "dqn" else TINY))
    summary = train(algo, config, RunConfig(env=BREAKOUT, out=str(tmp_path / algo), chunks=2, eval_every=0,
                                            eval_episodes=1, actor_precision="int8", progress=False,
                                            energy=False, compile_cache=False))
    whole = 60 if algo == "dqn" else 64  # DQN: whole fragments of 10 steps x 2 envs
    assert summary["steps"] == whole and summary["versions_published"] >= 2
    assert summary["fragments_dropped"] == 0 and summary["actor_restarts"] == 0
    assert np.isfinite(summary["final_return_mean"]) and summary["final_return_mean"] >= 0.0
    if algo == "dqn":  # it learned from frames rebuilt out of the ring
        last = list(csv.DictReader((tmp_path / algo / "metrics.csv").open()))[-1]
        assert float(last["gradient_steps"]) > 0 and np.isfinite(float(last["loss"]))


def test_dqn_replay_stores_each_atari_frame_once():
    """The learner's state: a ring of uint8 frames beside transitions of K + 1 frame numbers, no observations."""
    config = dqn.Config(**DQN_TINY).validate(host_spec(BREAKOUT))
    al = dqn.make_actor_learner(config, host_spec(BREAKOUT))
    shapes = jax.eval_shape(al.init, jax.random.PRNGKey(0))
    assert shapes.frames.frames.dtype == np.uint8 and shapes.frames.frames.shape[1:] == (84, 84)
    assert shapes.buffer.buffer.storage.frames.shape == (64, 5)
    item_bytes = sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(shapes.buffer.buffer.storage)) / 64
    frame_bytes = shapes.frames.frames.size / 64
    assert item_bytes < 64 and frame_bytes < 2 * 84 * 84  # vs 2 x 84 x 84 x 4 x 4 B for float obs and next_obs


def test_dqn_frame_ring_is_sized_for_the_runs_fragments():
    """Longer fragments write fewer first stacks: the runner's T sizes the ring (`ActorLearner.for_fragments`),
    and a replay never holds more than the run's transitions."""
    spec = host_spec(BREAKOUT)
    config = dqn.Config(total_timesteps=1_000_000, buffer_size=100_000, num_envs=8).validate(spec)
    al = dqn.make_actor_learner(config, spec)
    rings = {t: jax.eval_shape(al.for_fragments(t).init, jax.random.PRNGKey(0)).frames.frames.shape[0]
             for t in (10, 100)}
    assert rings == {10: 144_001, 100: 108_001}  # 1 + 4 / T + 4 x 0.01 frames per transition
    prepared = sebulba.Prepared("dqn", config, RunConfig(env=BREAKOUT, out="unused", fragment_steps=100))
    assert prepared.learner_shape.frames.frames.shape[:2] == (1, 108_001)  # the runner passes its T
    short = dqn.Config(total_timesteps=20_000, buffer_size=100_000, num_envs=8).validate(spec)
    shapes = jax.eval_shape(dqn.make_actor_learner(short, spec).init, jax.random.PRNGKey(0))
    assert shapes.buffer.buffer.storage.frames.shape[0] == 20_000 and shapes.frames.frames.shape[0] == 28_801

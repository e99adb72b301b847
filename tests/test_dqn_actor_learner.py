"""DQN on the actor-learner contract (Ape-X): per-slot epsilon, actor priorities and the weighted loss
against NumPy, the learner's gates and prioritized replay, and CartPole learning through `sparqrl train dqn
--actors 2`."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import RAY_SERIAL, train_on_host_as_users_do

from sparqrl import replay
from sparqrl.algos import dqn
from sparqrl.algos.base import Step
from sparqrl.config import ConfigError
from sparqrl.envs import Discrete
from sparqrl.envs.gym_env import HostSpec, host_spec
from sparqrl.nets.modules import QNetwork


@pytest.fixture(scope="module")
def cartpole():
    return host_spec("gym:CartPole-v1")


# ---- math against NumPy references ---------------------------------------------------------


@pytest.mark.parametrize("total_slots", [1, 2, 5, 32])
def test_apex_epsilon_per_slot_matches_numpy(total_slots):
    eps, alpha = 0.4, 7.0
    want = [eps if total_slots == 1 else eps ** (1 + alpha * j / (total_slots - 1)) for j in range(total_slots)]
    got = jax.jit(dqn.apex_epsilons, static_argnums=1)(jnp.arange(total_slots), total_slots, eps, alpha)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)
    assert float(got[0]) == pytest.approx(0.4)
    if total_slots > 1:
        assert float(got[-1]) == pytest.approx(0.4**8, rel=1e-4)  # 6.6e-4 at Ape-X's defaults


def test_explore_uses_each_slots_epsilon_and_returns_q_of_the_action(cartpole):
    config = dqn.Config(apex_epsilon=0.5, apex_alpha=3.0)
    acting = dqn.make_acting(config, cartpole)
    total, n = 8, 4  # this actor holds slots 4..7 of 8
    slots = jnp.arange(4, 8)
    raw = jnp.tile(jnp.array([[0.2, 1.5]]), (n, 1)) * jnp.arange(1.0, n + 1)[:, None]
    keys = jax.random.split(jax.random.key(0), 20_000)
    explore = jax.jit(jax.vmap(lambda k: acting.explore(raw, k, jnp.int32(0), slots, total)))
    action, extra = explore(keys)
    assert action.dtype == jnp.int32 and action.shape == (20_000, n) and extra.shape == (20_000, n)
    chosen = np.take_along_axis(np.asarray(raw)[None], np.asarray(action)[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(extra), chosen)
    eps = 0.5 ** (1 + 3.0 * np.arange(4, 8) / 7)
    non_greedy = (np.asarray(action) != 1).mean(axis=0)  # a random action is the other one half the time
    np.testing.assert_allclose(non_greedy, eps / 2, atol=0.01)
    np.testing.assert_array_equal(np.asarray(acting.greedy(raw)), 1)
    assert acting.to_env(action) is action and acting.activation == "relu"
    assert isinstance(acting.network, QNetwork)


def _np_priority(reward, terminated, next_q, q_sa, gamma):
    out = np.zeros(len(reward))
    for i in range(len(reward)):
        bootstrap = 0.0 if terminated[i] else gamma * np.max(next_q[i])  # truncation bootstraps
        out[i] = abs(reward[i] + bootstrap - q_sa[i])
    return out


def test_actor_priority_matches_numpy_with_terminal_and_truncated_steps(cartpole):
    rng = np.random.default_rng(0)
    n = 40
    kind = rng.integers(0, 3, size=n)  # 0 ordinary, 1 terminated, 2 truncated (time limit)
    kind[:3] = [0, 1, 2]
    step = Step(
        obs=rng.normal(size=(n, 4)).astype(np.float32),
        action=rng.integers(0, 2, size=n).astype(np.int32),
        reward=rng.normal(size=n).astype(np.float32),
        next_obs=rng.normal(size=(n, 4)).astype(np.float32),
        terminated=kind == 1,
        truncated=kind == 2,
        extra=rng.normal(size=n).astype(np.float32),  # the actor's Q(s, a)
        priority=np.ones(n, np.float32),
    )
    raw_next = rng.normal(size=(n, 2)).astype(np.float32)
    gamma = 0.97
    acting = dqn.make_acting(dqn.Config(gamma=gamma), cartpole)
    want = _np_priority(step.reward, step.terminated, raw_next, step.extra, gamma)
    got = jax.jit(acting.priority)(raw_next, step)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    term, trunc = step.terminated, step.truncated
    np.testing.assert_allclose(np.asarray(got)[term], np.abs(step.reward - step.extra)[term], rtol=1e-6)
    assert not np.allclose(np.asarray(got)[trunc], np.abs(step.reward - step.extra)[trunc])
    # vmapped over a fragment's [T] axis, as the runner calls it
    stacked = jax.tree.map(lambda x: np.stack([x, x[::-1]]), step)
    got = jax.jit(jax.vmap(acting.priority))(np.stack([raw_next, raw_next[::-1]]), stacked)
    np.testing.assert_allclose(np.asarray(got[1]), want[::-1], rtol=1e-5, atol=1e-6)


def _np_weighted_loss(q_sa, target, weights, huber_delta):
    total = 0.0
    for q, y, w in zip(q_sa, target, weights):
        e = q - y
        if huber_delta is None or abs(e) <= huber_delta:
            loss = e * e if huber_delta is None else 0.5 * e * e
        else:
            loss = huber_delta * (abs(e) - 0.5 * huber_delta)
        total += w * loss
    return total / len(q_sa)


@pytest.mark.parametrize("huber_delta", [None, 1.0])
def test_weighted_td_loss_matches_numpy(huber_delta):
    rng = np.random.default_rng(1)
    q_sa, target = (3 * rng.normal(size=(2, 3, 50))).astype(np.float32)
    weights = rng.uniform(0.05, 1.0, size=(3, 50)).astype(np.float32)
    fn = jax.jit(lambda q, y, w: dqn.weighted_td_loss(q, y, w, huber_delta))
    got = jax.vmap(fn)(q_sa, target, weights)
    want = [_np_weighted_loss(q_sa[i], target[i], weights[i], huber_delta) for i in range(3)]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)
    ones = np.ones(50, np.float32)
    unweighted = float(dqn.td_loss(q_sa[0], target[0], huber_delta))
    assert float(fn(q_sa[0], target[0], ones)) == pytest.approx(unweighted, rel=1e-6)
    # The weights are constants of the loss: no gradient flows into them.
    q0, y0 = jnp.asarray(q_sa[0]), jnp.asarray(target[0])
    grad_w = jax.grad(lambda w: dqn.weighted_td_loss(q0, y0, w))(jnp.asarray(ones))
    np.testing.assert_array_equal(np.asarray(grad_w), 0.0)


# ---- config and spec checks ----------------------------------------------------------------


@pytest.mark.parametrize(
    "changes,pattern",
    [
        ({"priority_exponent": -0.1}, r"priority_exponent=-0.1 .*>= 0"),
        ({"importance_exponent": 1.5}, r"importance_exponent=1.5 .*\[0, 1\]"),
        ({"priority_epsilon": 0.0}, r"priority_epsilon=0.0 .*> 0"),
        ({"apex_epsilon": 1.2}, r"apex_epsilon=1.2 .*\[0, 1\]"),
        ({"apex_alpha": -1.0}, r"apex_alpha=-1.0 .*>= 0"),
        ({"prioritized": "yes"}, r"prioritized='yes'"),
    ],
)
def test_new_config_fields_are_checked(cartpole, changes, pattern):
    config = dataclasses.replace(dqn.Config(), **changes)
    with pytest.raises(ConfigError, match=pattern):
        dqn.make_actor_learner(config, cartpole)


def test_spec_checks_name_the_env():
    message = r"env='gym:Pendulum-v1' .*discrete action space; env gym:Pendulum-v1 has Box"
    with pytest.raises(ConfigError, match=message):
        dqn.make_actor_learner(dqn.Config(), host_spec("gym:Pendulum-v1"))
    image = HostSpec("gym:Pixels-v0", (10, 10, 3), Discrete(4), 100)
    with pytest.raises(ConfigError, match=r"env='gym:Pixels-v0' .*flat observations.*\(10, 10, 3\)"):
        dqn.make_actor_learner(dqn.Config(), image)


# ---- the learner ---------------------------------------------------------------------------

# train_interval does not divide num_envs (a call takes 1 or 2 gradient steps), tau < 1. The one-step learner
# (this runner's default n is 3: its windows are tested in tests/test_dqn_nstep.py).
SMALL = dqn.Config(
    num_envs=4, total_timesteps=2_000, buffer_size=64, batch_size=8, learning_starts=30, train_interval=3,
    target_update_interval=20, hidden=(16,), tau=0.5, double_dqn=True, lr=1e-3, nstep=1,
)


def _random_steps(count, n, seed):
    """`count` synthetic rows of n CartPole-shaped transitions (leaves [count, n, ...])."""
    rng = np.random.default_rng(seed)
    kind = rng.integers(0, 10, size=(count, n))
    return Step(
        obs=rng.normal(size=(count, n, 4)).astype(np.float32),
        action=rng.integers(0, 2, size=(count, n)).astype(np.int32),
        reward=np.ones((count, n), np.float32),
        next_obs=rng.normal(size=(count, n, 4)).astype(np.float32),
        terminated=kind == 0,
        truncated=kind == 1,
        extra=rng.normal(size=(count, n)).astype(np.float32),
        priority=rng.uniform(0.0, 2.0, size=(count, n)).astype(np.float32),
    )


def _learn_one(al):
    """`learn` on a fragment of one env step (T = 1): metrics per call."""
    return lambda learner, step: al.learn(learner, jax.tree.map(lambda x: x[None], step))


def _scan_learn(al, key, steps):
    """init, then `learn` on one-step fragments, row by row."""
    return jax.lax.scan(_learn_one(al), al.init(key), steps)


def test_learner_gates_match_the_on_device_schedule(cartpole):
    al = dqn.make_actor_learner(SMALL, cartpole)
    assert al.num_envs == 4
    calls = 30
    learner, metrics = jax.jit(lambda k, s: _scan_learn(al, k, s))(jax.random.key(0), _random_steps(calls, 4, 0))

    # NumPy model of the env-step gates (the on-device DQN's update, module docstring of dqn/train.py).
    start, n, grads, targets = SMALL.learning_start_step, 4, [], []
    for c in range(calls):
        tm1, t = c * n, (c + 1) * n
        learning = t >= start
        grads.append(t // 3 - tm1 // 3 if learning else 0)
        targets.append(learning and t // 20 > tm1 // 20)
    np.testing.assert_array_equal(np.asarray(metrics["gradient_steps"]), grads)
    assert int(learner.gradient_steps) == sum(grads)
    assert int(learner.env_steps) == calls * n
    loss = np.asarray(metrics["loss"])
    assert np.all(loss[np.array(grads) == 0] == 0.0) and np.all(loss[np.array(grads) > 0] > 0.0)
    np.testing.assert_array_equal(np.asarray(metrics["buffer_size"]), np.minimum(4 * np.arange(1, calls + 1), 64))
    for name, value in metrics.items():
        assert value.dtype == jnp.float32 and value.shape == (calls,), name
    w = np.asarray(metrics["is_weight_min"])
    assert np.all((w > 0) & (w <= 1)) and np.all(w[np.array(grads) == 0] == 1.0) and np.any(w < 1.0)

    # The target network moved exactly at the due calls: replay the run call by call.
    learn = jax.jit(_learn_one(al))
    state = al.init(jax.random.key(0))
    steps = _random_steps(calls, 4, 0)
    for c in range(calls):
        before = state.target_params
        state, _ = learn(state, jax.tree.map(lambda x: x[c], steps))
        pairs = zip(jax.tree.leaves(before), jax.tree.leaves(state.target_params))
        moved = not all(np.array_equal(a, b) for a, b in pairs)
        assert moved == targets[c], c
    for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(learner.params)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_learner_stores_actor_priorities_then_replaces_sampled_ones(cartpole):
    config = dataclasses.replace(SMALL, learning_starts=1_000, total_timesteps=2_000)
    al = dqn.make_actor_learner(config, cartpole)
    steps = _random_steps(5, 4, 1)
    learner, _ = jax.jit(lambda k, s: _scan_learn(al, k, s))(jax.random.key(1), steps)
    # Before learning starts: row r, env i sits in slot 4r + i with weight (|p| + ε)^α.
    want = (np.abs(steps.priority.reshape(-1)) + config.priority_epsilon) ** config.priority_exponent
    np.testing.assert_allclose(np.asarray(learner.buffer.weights)[:20], want, rtol=1e-5)
    stored = learner.buffer.buffer.storage
    np.testing.assert_array_equal(np.asarray(stored.action)[:20], steps.action.reshape(-1))
    np.testing.assert_array_equal(np.asarray(stored.terminated)[:20], steps.terminated.reshape(-1))

    # Once learning, the replayed items' weights change to (|δ| + ε)^α; the others keep theirs.
    al = dqn.make_actor_learner(dataclasses.replace(SMALL, learning_starts=20), cartpole)
    learner, m = jax.jit(lambda k, s: _scan_learn(al, k, s))(jax.random.key(1), steps)
    assert float(m["gradient_steps"][-1]) > 0
    weights = np.asarray(learner.buffer.weights)[:20]
    changed = ~np.isclose(weights, want, rtol=1e-6)
    assert 0 < changed.sum() < 20


def test_vmapped_seeds_equal_separate_runs_and_uniform_mode(cartpole):
    al = dqn.make_actor_learner(SMALL, cartpole)
    keys = jax.random.split(jax.random.key(3), 3)
    steps = jax.tree.map(lambda *x: np.stack(x), *[_random_steps(20, 4, s) for s in range(3)])
    run = jax.jit(lambda k, s: _scan_learn(al, k, s))
    states, metrics = jax.jit(jax.vmap(lambda k, s: _scan_learn(al, k, s)))(keys, steps)
    for i in range(3):
        state, m = run(keys[i], jax.tree.map(lambda x: x[i], steps))
        for name in m:
            np.testing.assert_allclose(
                np.asarray(metrics[name][i]), np.asarray(m[name]), rtol=1e-5, atol=1e-5, err_msg=name
            )
        np.testing.assert_allclose(np.asarray(states.buffer.weights[i]), np.asarray(state.buffer.weights), rtol=1e-5)
    assert not np.allclose(np.asarray(metrics["loss"][0]), np.asarray(metrics["loss"][1]))

    uniform = dqn.make_actor_learner(dataclasses.replace(SMALL, prioritized=False), cartpole)
    state, m = jax.jit(lambda k, s: _scan_learn(uniform, k, s))(keys[0], jax.tree.map(lambda x: x[0], steps))
    # Uniform replay keeps a plain ring (no priorities to store or report) and weighs nothing.
    assert isinstance(state.buffer, replay.BufferState) and "is_weight_min" not in m
    assert np.asarray(m["loss"])[-1] > 0
    assert int(state.gradient_steps) == int(np.asarray(metrics["gradient_steps"][0]).sum())


# ---- learning ------------------------------------------------------------------------------

HOST_STEPS = 100_000
HOST_THRESHOLD = 100.0


@RAY_SERIAL
@pytest.mark.slow
def test_apex_dqn_learns_cartpole_on_the_host(tmp_path):
    """The host runner's default (Ape-X: prioritized replay, per-slot epsilons, 3-step targets, Adam 2.5e-4, a
    10,000 replay) as a user runs it: `sparqrl train dqn --env gym:CartPole-v1 --actors 2 --seeds 2`, the actors on
    the back-end the command picks (Ray), HOST_STEPS env steps (the defaults matrix row runs 500k): every seed's
    greedy return (10 episodes) >= HOST_THRESHOLD; random play scores about 22. The actors race, so every run is a
    new draw: seeds ended at 184-500 at this budget (benchmarks/history.md, "RLx2 and host learning tests through
    the command (issue 31 item 5)"); with a constant learning rate and a 10,000 replay a seed's greedy return still
    swings between evaluations here (one went 440.9 at 60k, 184.3 at 100k), so the bar asks for learning, not
    mastery."""
    summary = train_on_host_as_users_do(tmp_path / "run", "dqn", "gym:CartPole-v1", HOST_STEPS)
    assert summary["actor_restarts"] == 0 and summary["version_order_violations"] == 0
    assert min(summary["final_return_per_seed"]) >= HOST_THRESHOLD, summary["final_return_per_seed"]

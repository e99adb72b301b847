"""SAC: losses against NumPy (its squashed Gaussian: test_distributions.py), config checks, the training loop
(n-step switch, paper-rule dynamic buffer, mean-action behaviour), determinism, a Brax smoke run, and Pendulum
learning."""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparqrl.algos import evaluate, get_algorithm, sac
from sparqrl.algos.base import EPISODE_COUNT, make_train_fn
from sparqrl.config import ConfigError
from sparqrl.envs import host_spec, make_env

from conftest import RAY_SERIAL, train_as_users_do, train_on_host_as_users_do

# ---- math against NumPy ----------------------------------------------------------------------


def test_bounded_log_std_matches_numpy():
    raw = np.linspace(-20, 20, 41, dtype=np.float32)
    got = np.asarray(sac.bounded_log_std(raw, -5.0, 2.0))
    np.testing.assert_allclose(got, -5.0 + 0.5 * 7.0 * (np.tanh(raw) + 1.0), rtol=1e-6, atol=1e-6)
    assert got.min() >= -5.0 and got.max() <= 2.0


def test_losses_match_numpy():
    rng = np.random.default_rng(1)
    q1, q2, y, lp, qmin = (2 * rng.normal(size=(5, 4, 64))).astype(np.float32)
    alpha, target_entropy = 0.3, -2.0
    for i in range(4):
        want = np.mean((q1[i] - y[i]) ** 2) + np.mean((q2[i] - y[i]) ** 2)
        assert float(sac.critic_loss(q1[i], q2[i], y[i])) == pytest.approx(want, rel=1e-5)
        got = float(sac.actor_loss(jnp.float32(alpha), lp[i], qmin[i]))
        assert got == pytest.approx(np.mean(alpha * lp[i] - qmin[i]), rel=1e-5, abs=1e-6)
        log_alpha = np.log(alpha)
        loss, grad = jax.value_and_grad(sac.temperature_loss)(jnp.float32(log_alpha), lp[i], target_entropy)
        want = sum(alpha * (-lp[i, b] - target_entropy) for b in range(64)) / 64
        assert float(loss) == pytest.approx(want, rel=1e-5)
        assert float(grad) == pytest.approx(want, rel=1e-5)  # d/dlogα of α·c is α·c
    vm = jax.jit(jax.vmap(sac.critic_loss))(q1, q2, y)
    want = [np.mean((q1[i] - y[i]) ** 2) + np.mean((q2[i] - y[i]) ** 2) for i in range(4)]
    np.testing.assert_allclose(np.asarray(vm), want, rtol=1e-5)
    # No gradient into the target, the temperature (actor loss) or log π (temperature loss).
    g = jax.grad(lambda t: sac.critic_loss(jnp.asarray(q1[0]), jnp.asarray(q2[0]), t))(jnp.asarray(y[0]))
    np.testing.assert_array_equal(np.asarray(g), 0.0)
    assert float(jax.grad(lambda a: sac.actor_loss(a, jnp.asarray(lp[0]), jnp.asarray(qmin[0])))(0.3)) == 0.0
    g = jax.grad(lambda l: sac.temperature_loss(jnp.float32(0.0), l, -1.0))(jnp.asarray(lp[0]))
    np.testing.assert_array_equal(np.asarray(g), 0.0)


def test_networks_match_rlx2_layout_and_orthogonal_init():
    env = make_env("Pendulum-v1")
    nets = sac.make_networks(sac.Config(), env)
    actor = nets.actor.init(jax.random.key(0), jnp.zeros(3))
    critic = nets.critic.init(jax.random.key(1), jnp.zeros(3), jnp.zeros(1))
    assert sorted(x.shape for x in jax.tree.leaves(actor)) == sorted([(3, 256), (256,), (256, 256), (256,), (256, 2), (2,)])
    assert set(critic["params"]) == {"q1", "q2"}
    w = np.asarray(critic["params"]["q1"]["Dense_1"]["kernel"])
    np.testing.assert_allclose(w.T @ w, np.eye(256), atol=1e-4)  # orthogonal, gain 1
    assert all(np.all(np.asarray(b) == 0) for b in jax.tree.leaves(critic) if b.ndim == 1)
    mean, log_std = nets.actor.apply(actor, jnp.ones((5, 3)) * 100.0)
    assert mean.shape == log_std.shape == (5, 1) and np.all((np.asarray(log_std) >= -5) & (np.asarray(log_std) <= 2))


# ---- config ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pendulum():
    return make_env("Pendulum-v1")


@pytest.mark.parametrize(
    "changes,pattern",
    [
        ({"total_timesteps": 0}, r"total_timesteps=0 .*> 0"),
        ({"num_envs": -2}, r"num_envs=-2 .*> 0"),
        ({"batch_size": 0}, r"batch_size=0 .*> 0"),
        ({"alpha_lr": 0.0}, r"alpha_lr=0.0 .*> 0"),
        ({"init_alpha": 0.0}, r"init_alpha=0.0 .*> 0"),
        ({"nstep": 0}, r"nstep=0 .*>= 1"),
        ({"actor_update_interval": 0}, r"actor_update_interval=0 .*> 0"),
        ({"target_update_interval": -1}, r"target_update_interval=-1 .*> 0"),
        ({"buffer_min_size": 4_000_000}, r"buffer_min_size=4000000 .*<= buffer_max_size \(3000000\)"),
        ({"buffer_max_size": 0}, r"buffer_max_size=0 .*> 0"),
        ({"buffer_min_size": 100, "dynamic_buffer": True}, r"buffer_min_size=100 .*>= max\(batch_size, 2·nstep·num_envs\) = 256"),
        ({"buffer_shrink": "all"}, r"buffer_shrink='all' .*tenth, until_below"),
        ({"buffer_distance": "cos"}, r"buffer_distance='cos' .*half_mse, l2"),
        ({"learning_starts": 3_000_000}, r"learning_starts=3000000 .*total_timesteps"),
        ({"log_std_min": 3.0}, r"log_std_min=3.0 .*< log_std_max \(2.0\)"),
        ({"target_entropy_per_dim": float("nan")}, r"target_entropy_per_dim=nan .*finite"),
        ({"behaviour": "greedy"}, r"behaviour='greedy' .*mean, sample"),
        ({"gamma": -0.1}, r"gamma=-0.1 .*\[0, 1\]"),
        ({"tau": 2.0}, r"tau=2.0 .*\(0, 1\]"),
        ({"hidden": (256, 0)}, r"hidden=\(256, 0\)"),
        ({"actor_sparsity": 0.9}, r"actor_sparsity=0.9 .*sparse=dense"),
    ],
)
def test_config_validate_names_field_value_and_allowed(pendulum, changes, pattern):
    config = dataclasses.replace(sac.Config(), **changes)
    with pytest.raises(ConfigError, match=pattern):
        config.validate(pendulum)
    with pytest.raises(ConfigError, match=pattern):
        sac.make_algorithm(config, pendulum)


def test_config_rejects_discrete_actions():
    with pytest.raises(ConfigError, match=r"env='CartPole-v1' .*sac needs a continuous \(Box\) action space"):
        sac.make_algorithm(sac.Config(), make_env("CartPole-v1"))


def test_config_defaults_are_rlx2s_and_derived_values(pendulum):
    c = sac.Config().validate(pendulum)
    assert (c.hidden, c.batch_size, c.actor_lr, c.critic_lr, c.alpha_lr, c.tau) == ((256, 256), 256, 3e-4, 3e-4, 3e-4, 0.005)
    assert (c.init_alpha, c.log_std_min, c.log_std_max, c.behaviour, c.target_entropy(6)) == (1.0, -5.0, 2.0, "mean", -6.0)
    assert (c.sparse, c.nstep, c.dynamic_buffer, c.nstep_delay, c.buffer_max_size) == ("dense", 1, False, 300_000, 3_000_000)
    assert (c.buffer_min_size, c.num_oldest) == (200_000, 2048)
    # rlx2 on a paper environment: the delayed 3-step target, the dynamic buffer, Table 2's sparsities.
    r = sac.Config(sparse="rlx2").validate(host_spec("gym:Walker2d-v5"))
    assert (r.nstep, r.dynamic_buffer, r.actor_sparsity, r.critic_sparsity) == (3, True, 0.9, 0.9)
    assert get_algorithm("sac") is sac


# ---- the training loop -------------------------------------------------------------------------

# One env, a wrapping buffer, the n-step switch, and the paper's pop-until-below rule with the L2 distance.
SMALL = sac.Config(
    total_timesteps=600, learning_starts=100, batch_size=32, hidden=(32, 32), nstep=3, dynamic_buffer=True, nstep_delay_fraction=0.5,
    buffer_max_size=400, buffer_min_size=100, buffer_check_interval=50, buffer_num_oldest=32,
    buffer_threshold=0.3, buffer_shrink="until_below", buffer_distance="l2",
)


@pytest.fixture(scope="module")
def small_runs(pendulum):
    algo = sac.make_algorithm(SMALL, pendulum)
    train = make_train_fn(algo)
    keys = jax.random.split(jax.random.key(7), 2)
    single = jax.jit(train)
    return algo, keys, single, jax.jit(jax.vmap(train))(keys)


def test_same_key_same_metrics(small_runs):
    _, keys, single, _ = small_runs
    (_, m1), (_, m2) = single(keys[0]), single(keys[0])
    for name in m1:
        np.testing.assert_array_equal(np.asarray(m1[name]), np.asarray(m2[name]), err_msg=name)


def test_vmapped_seeds_equal_separate_runs_and_differ(small_runs):
    """A vmapped seed is the separate run of its key: bit for bit until the first gradient step (acting, env
    and noise draws, the buffer: a draw that depended on the layout would differ at once), counts exact
    throughout, and equal to float reassociation over the first gradient steps (XLA orders the batched matmuls
    otherwise: ~1e-9 at the first, up to ~4e-6 by the tenth). Later the gap grows chaotically over hundreds of
    gradient steps (1e-5 to 6e-3 at the end, by key), so the end is only checked for different seeds differing."""
    _, keys, single, (states, metrics) = small_runs
    first_step = SMALL.learning_starts  # update index of the first gradient step
    for i, key in enumerate(keys):
        state, m = single(key)
        for name in m:
            vmapped, separate = np.asarray(metrics[name][i]), np.asarray(m[name])
            if name in ("buffer_size", "nstep", EPISODE_COUNT):
                np.testing.assert_array_equal(vmapped, separate, err_msg=name)
                continue
            np.testing.assert_array_equal(vmapped[:first_step], separate[:first_step], err_msg=name)
            np.testing.assert_allclose(vmapped[first_step:first_step + 5], separate[first_step:first_step + 5],
                                       rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_array_equal(np.asarray(states.learner.gradient_steps[i]), np.asarray(state.learner.gradient_steps))
    k0 = jax.tree.leaves(states.learner.agent.actor)[0]
    assert not np.allclose(np.asarray(k0[0]), np.asarray(k0[1]))


def test_training_loop_counters_nstep_switch_temperature_and_buffer(small_runs):
    algo, _, _, (states, metrics) = small_runs
    assert algo.env_steps_per_update == 1 and algo.num_updates == 600
    np.testing.assert_array_equal(np.asarray(states.learner.gradient_steps), 500)
    critic_loss = np.asarray(metrics["critic_loss"])
    assert np.all(critic_loss[:, :100] == 0.0) and np.all(critic_loss[:, 100:] > 0.0)
    nstep_metric = np.asarray(metrics["nstep"][0])  # gradient step j = u − 99 uses n = 3 from j = 300
    assert np.all(nstep_metric[100:399] == 1.0) and np.all(nstep_metric[399:] == 3.0)
    alpha = np.asarray(metrics["alpha"])
    assert np.all(alpha[:, :100] == 1.0) and np.all(alpha[:, -1] < 1.0)  # learned, from α = 1
    assert np.all(np.isfinite(np.asarray(metrics["entropy"])))
    size = np.asarray(metrics["buffer_size"])
    assert size.max() <= 400 and np.any(np.diff(size) < 0) and np.all(size[:, -1] >= 100)
    assert np.asarray(metrics[EPISODE_COUNT]).sum() == 2 * 3


def test_behaviour_is_the_mean_action_after_warmup(small_runs):
    """RLx2's SAC collects data with tanh(μ(s)): stored action == reference action after warm-up."""
    _, _, _, (states, _) = small_runs
    buf = jax.tree.map(lambda x: np.asarray(x[0]), states.learner.buffer)
    np.testing.assert_allclose(buf.storage.action, buf.storage.reference_action)  # all 400 slots are post-warm-up


def test_act_maps_to_env_bounds_and_evaluates(small_runs, pendulum):
    algo, _, _, (states, _) = small_runs
    params = jax.tree.map(lambda x: x[0], jax.vmap(algo.policy)(states))
    action = jax.jit(algo.act)(params, jnp.array([1.0, 0.0, 0.5]), jax.random.key(0))
    assert action.shape == (1,) and abs(float(action[0])) <= 2.0
    returns = jax.jit(lambda p, k: evaluate(pendulum, algo.act, p, k, 2))(params, jax.random.key(1))
    assert returns.shape == (2,) and np.all(np.isfinite(np.asarray(returns)))


def test_brax_smoke_with_sampled_behaviour():
    """A few updates on brax:inverted_pendulum with behaviour='sample' (stored actions are samples)."""
    env = make_env("brax:inverted_pendulum")
    config = sac.Config(total_timesteps=48, learning_starts=16, batch_size=8, hidden=(16, 16), buffer_max_size=64,
                        buffer_min_size=8, buffer_check_interval=16, buffer_num_oldest=8, nstep_delay_fraction=0.5,
                        behaviour="sample")
    t0 = time.time()
    state, metrics = jax.jit(sac.make_train(config, env))(jax.random.key(0))
    assert int(state.learner.gradient_steps) == 32
    assert np.all(np.isfinite(np.asarray(metrics["critic_loss"])))
    storage = jax.tree.map(np.asarray, state.learner.buffer.storage)
    assert not np.allclose(storage.action[16:48], storage.reference_action[16:48])
    print(f"SAC brax:inverted_pendulum smoke: {time.time() - t0:.1f} s including compilation")


# ---- learning ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_sac_learns_pendulum(tmp_path):
    """RLx2's dense SAC (256-256, batch 256, mean-action behaviour, learned α, delayed 3-step target,
    dynamic buffer) on Pendulum-v1, through `sparqrl train sac --seeds 2` with the seeds spread over 2 CPU
    devices as the command spreads them.

    6,000 env steps: 1,000 random, then one gradient step each; 3-step targets after 600 gradient steps; the
    dynamic buffer checked above 5,000 transitions. Deterministic evaluation, 10 episodes. Random play scores
    about −1,200, a good policy about −200. Measured through the command (benchmarks/history.md, "Pendulum
    learning tests at smaller budgets"): seeds −182.1 and −148.1, at −240 or better from 3,600 env steps on; at
    8,000 steps −176.8 and −146.8. Threshold −400 on every seed.
    """
    summary = train_as_users_do(tmp_path / "run", "sac", "Pendulum-v1", steps=6_000, sets=[
        "learning_starts=1000", "nstep=3", "dynamic_buffer=true", "buffer_min_size=5000", "buffer_check_interval=2000"])
    assert min(summary["final_return_per_seed"]) >= -400


def test_critic_grow_score_adds_the_actor_loss_gradient(pendulum):
    """RLx2 quirk 6: the critic's RigL grow score includes d(actor loss)/d(critic) of the iteration before
    the update. It is computed on that iteration only (49 = ΔT - 1 here) and kept; nothing else in
    training changes before the update (gradient step 50, taken at update 149)."""
    def run(score):
        config = sac.Config(total_timesteps=199, learning_starts=100, batch_size=16, hidden=(16, 16),
                            sparse="rigl", actor_sparsity=0.8, critic_sparsity=0.8, topology_interval=50,
                            critic_grow_score=score)
        state, metrics = jax.jit(make_train_fn(sac.make_algorithm(config, pendulum)))(jax.random.key(0))
        return state.learner, metrics

    learner_a, metrics_a = run("with_actor_grad")
    learner_b, metrics_b = run("critic_loss")
    assert int(learner_a.gradient_steps) == 99
    for name in ("critic_loss", "actor_loss", "alpha"):
        np.testing.assert_array_equal(np.asarray(metrics_a[name][:149]), np.asarray(metrics_b[name][:149]), err_msg=name)
    grad_a = jax.tree.leaves(learner_a.agent.critic_actor_grad)
    assert all(np.all(np.asarray(g) == 0.0) for g in jax.tree.leaves(learner_b.agent.critic_actor_grad))
    assert any(np.any(np.asarray(g) != 0.0) for g in grad_a)
    with pytest.raises(ConfigError, match=r"critic_grow_score='actor' .*with_actor_grad, critic_loss"):
        sac.Config(critic_grow_score="actor").validate(pendulum)


HOST_STEPS = 8_000
HOST_THRESHOLD = -700.0


@RAY_SERIAL
@pytest.mark.slow
def test_sac_learns_pendulum_on_the_host(tmp_path):
    """The defaults as a user runs them on a host env: `sparqrl train sac --env gym:Pendulum-v1 --actors 2 --seeds
    2`, the actors on the back-end the command picks (Ray), HOST_STEPS env steps (800 random ones, RLx2's 25,000
    capped at 10 % of the run, then one gradient step each): every seed's deterministic return (10 episodes) >=
    HOST_THRESHOLD; random play scores about -1,200, a good policy about -200. The actors race, so every run is a
    new draw: 6 seeds over 3 draws ended at -170 to -232 (benchmarks/history.md, "RLx2 and host learning tests
    through the command (issue 31 item 5)"), but at 6k one seed of 4 fell from -205 (4.8k) to -658: a greedy
    policy can still fail hard starts after it has learned, so the bar is td3-host's, not the device test's -400."""
    summary = train_on_host_as_users_do(tmp_path / "run", "sac", "gym:Pendulum-v1", HOST_STEPS)
    assert summary["steps"] == HOST_STEPS
    assert min(summary["final_return_per_seed"]) >= HOST_THRESHOLD, summary["final_return_per_seed"]

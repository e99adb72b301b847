"""TD3: losses and noise against NumPy, config checks, the training loop (n-step switch, dynamic buffer,
truncation storage), determinism, a Brax smoke run, and Pendulum learning."""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparqrl.algos import evaluate, get_algorithm, td3
from sparqrl.algos.base import EPISODE_COUNT, EPISODE_RETURN_SUM, Step, make_train_fn
from sparqrl.config import ConfigError
from sparqrl.envs import host_spec, make_env
from sparqrl.runners import sebulba

from conftest import RAY_SERIAL, last_metric, train_as_users_do, train_on_host_as_users_do

# ---- math against NumPy ----------------------------------------------------------------------


def test_smoothed_target_action_matches_numpy():
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (4, 300, 2)).astype(np.float32)
    a[:, :20] = np.sign(a[:, :20])  # at the bounds: the final clip matters
    keys = jax.random.split(jax.random.key(0), 4)
    fn = jax.jit(jax.vmap(lambda x, k: td3.smoothed_target_action(x, k, 0.2, 0.5)))
    got = np.asarray(fn(a, keys))
    for i in range(4):
        eps = np.asarray(jax.random.normal(keys[i], a[i].shape))
        want = np.empty_like(a[i])
        for b in range(a.shape[1]):
            for j in range(a.shape[2]):
                noise = min(max(0.2 * eps[b, j], -0.5), 0.5)
                want[b, j] = min(max(a[i, b, j] + noise, -1.0), 1.0)
        np.testing.assert_allclose(got[i], want, rtol=1e-6, atol=1e-6)
    assert np.all(np.abs(got - a) <= 0.5 + 1e-6) and np.all(np.abs(got) <= 1.0)


def test_exploration_action_matches_numpy():
    a = np.linspace(-1, 1, 40, dtype=np.float32).reshape(20, 2)
    key = jax.random.key(3)
    got = np.asarray(jax.jit(lambda x, k: td3.exploration_action(x, jax.random.normal(k, x.shape), 0.1))(a, key))
    want = np.clip(a + 0.1 * np.asarray(jax.random.normal(key, a.shape)), -1, 1)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_critic_and_actor_losses_match_numpy():
    rng = np.random.default_rng(1)
    q1, q2, y = (3 * rng.normal(size=(3, 4, 64))).astype(np.float32)
    got = jax.jit(jax.vmap(td3.critic_loss))(q1, q2, y)
    for i in range(4):
        want = sum((q1[i, b] - y[i, b]) ** 2 + (q2[i, b] - y[i, b]) ** 2 for b in range(64)) / 64
        assert float(got[i]) == pytest.approx(want, rel=1e-5)
        assert float(td3.actor_loss(q1[i])) == pytest.approx(-np.mean(q1[i]), rel=1e-5)
    # No gradient flows into the target.
    g = jax.grad(lambda t: td3.critic_loss(jnp.asarray(q1[0]), jnp.asarray(q2[0]), t))(jnp.asarray(y[0]))
    np.testing.assert_array_equal(np.asarray(g), 0.0)


def test_networks_match_rlx2_layout_and_torch_init():
    env = make_env("Pendulum-v1")
    nets = td3.make_networks(td3.Config(), env)
    actor = nets.actor.init(jax.random.key(0), jnp.zeros(3))
    critic = nets.critic.init(jax.random.key(1), jnp.zeros(3), jnp.zeros(1))
    shapes = [x.shape for x in jax.tree.leaves(actor)]
    assert sorted(shapes) == sorted([(3, 256), (256,), (256, 256), (256,), (256, 1), (1,)])
    assert set(critic["params"]) == {"q1", "q2"}
    kernel = np.asarray(critic["params"]["q1"]["Dense_0"]["kernel"])  # fan_in = obs 3 + action 1
    bias = np.asarray(critic["params"]["q1"]["Dense_0"]["bias"])
    assert np.abs(kernel).max() <= 0.5 and np.abs(kernel).max() > 0.45  # U(−1/√4, 1/√4)
    assert np.abs(bias).max() <= 0.5 and np.abs(bias).std() > 0.05  # biases are random too (PyTorch)
    a = nets.actor.apply(actor, jnp.ones((5, 3)) * 100.0)
    assert a.shape == (5, 1) and np.all(np.abs(np.asarray(a)) <= 1.0)


# ---- config ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pendulum():
    return make_env("Pendulum-v1")


@pytest.mark.parametrize(
    "changes,pattern",
    [
        ({"total_timesteps": 0}, r"total_timesteps=0 .*> 0"),
        ({"num_envs": 0}, r"num_envs=0 .*> 0"),
        ({"batch_size": -1}, r"batch_size=-1 .*> 0"),
        ({"actor_lr": 0.0}, r"actor_lr=0.0 .*> 0"),
        ({"critic_lr": -1e-3}, r"critic_lr=-0.001 .*> 0"),
        ({"nstep": 0}, r"nstep=0 .*>= 1"),
        ({"policy_delay": 0}, r"policy_delay=0 .*> 0"),
        ({"buffer_min_size": 2_000_000, "dynamic_buffer": True}, r"buffer_min_size=2000000 .*<= buffer_max_size \(1000000\)"),
        ({"buffer_max_size": 0}, r"buffer_max_size=0 .*> 0"),
        ({"buffer_min_size": 100, "dynamic_buffer": True}, r"buffer_min_size=100 .*>= max\(batch_size, 2·nstep·num_envs\) = 256"),
        ({"buffer_max_size": 2, "buffer_min_size": 1, "buffer_num_oldest": 1, "nstep": 3}, r"buffer_max_size=2 .*n-step window"),
        ({"buffer_num_oldest": 10**7}, r"buffer_num_oldest=10000000 .*<= buffer_max_size"),
        ({"buffer_check_interval": 0}, r"buffer_check_interval=0 .*> 0"),
        ({"buffer_threshold": 0.0}, r"buffer_threshold=0.0 .*> 0"),
        ({"buffer_shrink": "half"}, r"buffer_shrink='half' .*tenth, until_below"),
        ({"buffer_distance": "l1"}, r"buffer_distance='l1' .*half_mse, l2"),
        ({"learning_starts": -1}, r"learning_starts=-1 .*>= 0"),
        ({"learning_starts": 3_000_000}, r"learning_starts=3000000 .*total_timesteps"),
        ({"gamma": 1.5}, r"gamma=1.5 .*\[0, 1\]"),
        ({"tau": 0.0}, r"tau=0.0 .*\(0, 1\]"),
        ({"nstep_delay_fraction": 1.5}, r"nstep_delay_fraction=1.5 .*\[0, 1\]"),
        ({"exploration_noise": -0.1}, r"exploration_noise=-0.1 .*>= 0"),
        ({"target_noise_clip": -1.0}, r"target_noise_clip=-1.0 .*>= 0"),
        ({"hidden": ()}, r"hidden=\(\) .*non-empty"),
        ({"activation": "gelu"}, r"activation='gelu' .*relu, tanh"),
        ({"sparse": "snip"}, r"sparse='snip' .*dense, tiny, ss, set, rigl, rlx2"),
        ({"sparse": "rigl", "actor_sparsity": 1.0, "critic_sparsity": 0.5}, r"actor_sparsity=1.0 .*\[0, 1\)"),
        ({"sparse": "rlx2"}, r"actor_sparsity=None .*must be given for env 'Pendulum-v1'.*halfcheetah, hopper"),
        ({"sparse": "ss", "actor_sparsity": 0.9}, r"critic_sparsity=None .*must be given"),
        ({"critic_sparsity": 0.9}, r"critic_sparsity=0.9 .*sparse=dense"),
    ],
)
def test_config_validate_names_field_value_and_allowed(pendulum, changes, pattern):
    config = dataclasses.replace(td3.Config(), **changes)
    with pytest.raises(ConfigError, match=pattern):
        config.validate(pendulum)
    with pytest.raises(ConfigError, match=pattern):
        td3.make_algorithm(config, pendulum)  # checked before anything is traced


def test_config_rejects_discrete_actions():
    with pytest.raises(ConfigError, match=r"env='CartPole-v1' .*td3 needs a continuous \(Box\) action space"):
        td3.make_algorithm(td3.Config(), make_env("CartPole-v1"))


def test_config_defaults_are_rlx2s_and_derived_values(pendulum):
    c = td3.Config().validate(pendulum)
    assert (c.hidden, c.batch_size, c.actor_lr, c.critic_lr, c.tau, c.gamma) == ((256, 256), 256, 3e-4, 3e-4, 0.005, 0.99)
    assert (c.policy_delay, c.exploration_noise, c.target_noise, c.target_noise_clip) == (2, 0.1, 0.2, 0.5)
    assert (c.sparse, c.nstep, c.dynamic_buffer, c.actor_sparsity, c.critic_sparsity) == ("dense", 1, False, 0.0, 0.0)
    assert (c.nstep_delay, c.learning_start_step, c.num_envs) == (300_000, 25_000, 1)
    # a short budget: RLx2's 25,000 random steps capped at 10 % of the run, so it learns
    assert td3.Config(total_timesteps=5_000).validate(pendulum).learning_start_step == 500
    assert (c.buffer_max_size, c.buffer_min_size, c.num_oldest, c.buffer_threshold) == (1_000_000, 100_000, 2048, 0.2)
    assert (c.buffer_shrink, c.buffer_distance, c.buffer_check_interval) == ("tenth", "half_mse", 10_000)
    assert c.num_updates == 3_000_000 and c.buffer_capacity == 1_000_000
    assert dataclasses.replace(c, total_timesteps=20_000).buffer_capacity == 20_000
    assert dataclasses.replace(c, total_timesteps=20_000).nstep_delay == 2_000  # scales with the budget
    assert get_algorithm("td3") is td3
    # rlx2 on a paper environment: the delayed 3-step target, the dynamic buffer, Table 2's sparsities.
    r = td3.Config(sparse="rlx2").validate(host_spec("gym:Hopper-v5"))
    assert (r.nstep, r.dynamic_buffer, r.actor_sparsity, r.critic_sparsity) == (3, True, 0.98, 0.95)
    assert td3.Config(sparse="set", nstep=3).validate(host_spec("gym:Ant-v5")).nstep == 3


# ---- the training loop -------------------------------------------------------------------------

# Two envs, a wrapping buffer, the n-step switch half-way, and a dynamic buffer that really shrinks.
SMALL = td3.Config(
    total_timesteps=800, num_envs=2, learning_starts=200, batch_size=32, hidden=(32, 32), nstep=3, dynamic_buffer=True,
    nstep_delay_fraction=0.5, buffer_max_size=600, buffer_min_size=100, buffer_check_interval=100,
    buffer_num_oldest=64, buffer_threshold=0.02,
)


@pytest.fixture(scope="module")
def small_runs(pendulum):
    algo = td3.make_algorithm(SMALL, pendulum)
    train = make_train_fn(algo)
    keys = jax.random.split(jax.random.key(42), 2)
    single = jax.jit(train)
    return algo, keys, single, jax.jit(jax.vmap(train))(keys)


def test_same_key_same_metrics(small_runs):
    _, keys, single, _ = small_runs
    (_, m1), (_, m2) = single(keys[0]), single(keys[0])
    for name in m1:
        np.testing.assert_array_equal(np.asarray(m1[name]), np.asarray(m2[name]), err_msg=name)


def test_vmapped_seeds_equal_separate_runs_and_differ(small_runs):
    """Equal up to float reassociation: XLA orders the batched matmuls of the vmapped program differently,
    and ~1e-7 differences grow to ~1e-4 relative over hundreds of gradient steps; counts are exact."""
    _, keys, single, (states, metrics) = small_runs
    for i, key in enumerate(keys):
        state, m = single(key)
        for name in m:
            exact = name in ("buffer_size", "nstep", EPISODE_COUNT)
            tol = 0.0 if exact else 2e-3
            np.testing.assert_allclose(np.asarray(metrics[name][i]), np.asarray(m[name]), rtol=tol, atol=tol, err_msg=name)
        np.testing.assert_allclose(
            np.asarray(states.learner.buffer.storage.action[i]), np.asarray(state.learner.buffer.storage.action), atol=2e-3
        )
        np.testing.assert_array_equal(np.asarray(states.learner.gradient_steps[i]), np.asarray(state.learner.gradient_steps))
    k0 = jax.tree.leaves(states.learner.agent.actor)[0]
    assert not np.allclose(np.asarray(k0[0]), np.asarray(k0[1]))


def test_training_loop_counters_nstep_switch_and_dynamic_buffer(small_runs):
    algo, _, _, (states, metrics) = small_runs
    assert algo.env_steps_per_update == 2 and algo.num_updates == 400
    np.testing.assert_array_equal(np.asarray(states.learner.env_steps), 800)
    np.testing.assert_array_equal(np.asarray(states.learner.gradient_steps), 600)  # one per env step from step 200
    critic_loss = np.asarray(metrics["critic_loss"])
    assert np.all(critic_loss[:, :100] == 0.0) and np.all(critic_loss[:, 100:] > 0.0)
    # Gradient step j uses n = 3 from j = nstep_delay = 400 on: update u holds steps 2(u−100)+1, +2.
    nstep_metric = np.asarray(metrics["nstep"][0])
    assert np.all(nstep_metric[100:299] == 1.0) and nstep_metric[299] == 2.0 and np.all(nstep_metric[300:] == 3.0)
    # The actor learns every 2nd gradient step: one actor update per update of 2 env steps.
    assert np.all(np.asarray(metrics["actor_loss"])[:, 100:] != 0.0)
    # The dynamic buffer shrank below its 300-slot capacity, never below the minimum.
    size = np.asarray(metrics["buffer_size"])
    assert size.max() <= 600 and np.any(np.diff(size[0]) < 0) and size[0, -1] < 600
    drops = np.diff(size[0])[np.diff(size[0]) < 0]
    assert np.all(drops >= -0.1 * 600 - 2)
    assert np.all(np.asarray(metrics["buffer_distance"])[:, 60:] > 0)
    assert np.asarray(metrics[EPISODE_COUNT]).sum() == 2 * 2 * 2  # seeds · envs · 400 steps / 200-step episodes
    assert np.all(np.isfinite(np.asarray(metrics[EPISODE_RETURN_SUM])))


def test_stored_next_obs_is_the_pre_reset_final_obs(small_runs):
    """Within a stream, next_obs[i] == obs[i+1] except where an episode was truncated (auto-reset)."""
    _, _, _, (states, _) = small_runs
    buf = jax.tree.map(lambda x: np.asarray(x[0]), states.learner.buffer)
    cap, size = buf.storage.obs.shape[0], int(buf.size)
    slots = (int(buf.insert_pos) - size + np.arange(size)) % cap
    obs, next_obs, trunc = buf.storage.obs[slots], buf.storage.next_obs[slots], buf.storage.truncated[slots]
    assert trunc.any() and not buf.storage.terminated.any()
    same = np.all(np.isclose(next_obs[:-1], obs[1:]), axis=-1)  # [size−1, S]
    np.testing.assert_array_equal(same, ~trunc[:-1])
    # Actions are stored normalised to [-1, 1] (Pendulum's box is [-2, 2]).
    assert np.abs(buf.storage.action).max() <= 1.0


@pytest.mark.parametrize("nstep, cut", [(3, True), (1, False)])
def test_host_fragments_end_n_step_windows(nstep, cut):
    """On the actor-learner runner the replay stores fragments in arrival order, perhaps from different actors'
    envs: with n-step targets the runner marks each fragment's last step truncated (`sebulba._learn_fragment`,
    for a learner that `joins_fragments`), so no window joins two fragments; one-step targets store the flags as
    they came, and so does the learner itself (on device consecutive fragments are the same envs' steps)."""
    al = td3.make_actor_learner(td3.Config(nstep=nstep, num_envs=2, learning_starts=1_000), host_spec("gym:Pendulum-v1"))
    assert al.joins_fragments == cut
    t, n = 4, 2
    truncated = np.zeros((t, n), bool)
    truncated[1, 0] = True  # a time limit inside the fragment, kept
    steps = Step(obs=np.zeros((t, n, 3), np.float32), action=np.zeros((t, n, 1), np.float32),
                 reward=np.ones((t, n), np.float32), next_obs=np.zeros((t, n, 3), np.float32),
                 terminated=np.zeros((t, n), bool), truncated=truncated, extra=np.zeros((t, n, 1), np.float32),
                 priority=np.ones((t, n), np.float32))
    seeds = jax.vmap(al.init)(jax.random.split(jax.random.key(0), 1))
    learner, _ = jax.jit(sebulba._learn_fragment(al))(seeds, jax.tree.map(lambda x: x[:, None], steps))  # [T, S=1, N]
    stored = np.asarray(learner.buffer.storage.truncated)[0, :t]
    expected = truncated.copy()
    expected[-1] |= cut
    np.testing.assert_array_equal(stored, expected)
    learner, _ = jax.jit(al.learn)(al.init(jax.random.key(0)), steps)
    np.testing.assert_array_equal(np.asarray(learner.buffer.storage.truncated)[:t], truncated)


def test_act_maps_to_env_bounds_and_evaluates(small_runs, pendulum):
    algo, _, _, (states, _) = small_runs
    params = jax.tree.map(lambda x: x[0], jax.vmap(algo.policy)(states))
    action = jax.jit(algo.act)(params, jnp.array([1.0, 0.0, 0.5]), jax.random.key(0))
    assert action.shape == (1,) and action.dtype == jnp.float32 and abs(float(action[0])) <= 2.0
    returns = jax.jit(lambda p, k: evaluate(pendulum, algo.act, p, k, 2))(params, jax.random.key(1))
    assert returns.shape == (2,) and np.all(np.isfinite(np.asarray(returns)))


def test_brax_smoke():
    """A few updates on brax:inverted_pendulum (continuous, terminating) compile and run."""
    env = make_env("brax:inverted_pendulum")
    config = td3.Config(total_timesteps=48, learning_starts=16, batch_size=8, hidden=(16, 16), buffer_max_size=64,
                        buffer_min_size=8, buffer_check_interval=16, buffer_num_oldest=8, nstep_delay_fraction=0.5)
    t0 = time.time()
    state, metrics = jax.jit(td3.make_train(config, env))(jax.random.key(0))
    assert int(state.learner.gradient_steps) == 32 and int(state.learner.env_steps) == 48
    assert np.all(np.isfinite(np.asarray(metrics["critic_loss"])))
    print(f"TD3 brax:inverted_pendulum smoke: {time.time() - t0:.1f} s including compilation")


# ---- learning ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_td3_learns_pendulum(tmp_path):
    """RLx2's dense TD3 (256-256, batch 256, delayed 3-step target, dynamic buffer) on Pendulum-v1, through
    `sparqrl train td3 --seeds 2` with the seeds spread over 2 CPU devices as the command spreads them.

    8,000 env steps: 1,000 random, then one gradient step each; 3-step targets after 800 gradient steps; the
    dynamic buffer checked every 2,000 env steps above 5,000 transitions (it shrinks here). Deterministic
    evaluation, 10 episodes. Random play scores about −1,200, a good policy about −200. Measured through the
    command (benchmarks/history.md, "Pendulum learning tests at smaller budgets"): seeds −168.8 and −158.3, at
    −400 or better from 3,840 env steps on; at 6,000 steps −177.6 and −161.0. Threshold −400 on every seed.
    """
    out = tmp_path / "run"
    summary = train_as_users_do(out, "td3", "Pendulum-v1", steps=8_000, sets=[
        "learning_starts=1000", "nstep=3", "dynamic_buffer=true", "buffer_min_size=5000", "buffer_check_interval=2000"])
    assert min(summary["final_return_per_seed"]) >= -400
    # the last chunk's mean size: 7,920 had every transition been kept, 7,316 measured
    assert max(last_metric(out, "buffer_size")) < 7_800  # the dynamic buffer dropped old data


HOST_STEPS = 8_000
HOST_THRESHOLD = -700.0


@RAY_SERIAL
@pytest.mark.slow
def test_td3_learns_pendulum_on_the_host(tmp_path):
    """The defaults as a user runs them on a host env: `sparqrl train td3 --env gym:Pendulum-v1 --actors 2 --seeds
    2`, the actors on the back-end the command picks (Ray), HOST_STEPS env steps (800 random ones, RLx2's 25,000
    capped at 10 % of the run, then one gradient step each): every seed's deterministic return (10 episodes) >=
    HOST_THRESHOLD; random play scores about -1,200 (these runs -1,300 to -1,650 after 1,600 steps), a good policy
    about -200. The actors race, so every run is a new draw: 6 seeds over 3 draws ended at -190 to -355
    (benchmarks/history.md, "RLx2 and host learning tests through the command (issue 31 item 5)"). 8k steps is the
    steep end of the curve (-340 to -670 at 6.4k): a seed's greedy policy can still fail a hard start or two, so
    the bar sits between that and random play, not at the device test's -400."""
    summary = train_on_host_as_users_do(tmp_path / "run", "td3", "gym:Pendulum-v1", HOST_STEPS)
    assert summary["steps"] == HOST_STEPS
    assert min(summary["final_return_per_seed"]) >= HOST_THRESHOLD, summary["final_return_per_seed"]

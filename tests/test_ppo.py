"""PPO: the math against NumPy loops, config checks, determinism, and (slow) learning tests."""

from __future__ import annotations

import dataclasses
import json
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparqrl.algos import base, ppo
from sparqrl.algos.ppo import train as ppo_train  # a submodule: `ppo.train` exists once something imported it
from sparqrl.nets.distributions import categorical, diag_gaussian, sampling_noise
from sparqrl.config import ConfigError
from sparqrl.envs import make_env, normalize
from conftest import train_as_users_do

# ---------------------------------------------------------------------------------------------------
# GAE


def gae_reference(rewards, values, next_values, terminated, truncated, gamma, lam):
    """Plain loop: bootstrap from next_values unless terminated; restart the trace at every episode end."""
    T, B = rewards.shape
    advantages = np.zeros((T, B), np.float64)
    for b in range(B):
        running = 0.0
        for t in reversed(range(T)):
            bootstrap = 0.0 if terminated[t, b] else gamma * next_values[t, b]
            delta = rewards[t, b] + bootstrap - values[t, b]
            episode_ends = terminated[t, b] or truncated[t, b]
            running = delta + (0.0 if episode_ends else gamma * lam * running)
            advantages[t, b] = running
    return advantages, advantages + values


def random_rollout(rng, T=24, B=5):
    rewards = rng.normal(size=(T, B)).astype(np.float32)
    values = rng.normal(size=(T, B)).astype(np.float32)
    next_values = rng.normal(size=(T, B)).astype(np.float32)
    terminated = rng.random((T, B)) < 0.15
    truncated = (rng.random((T, B)) < 0.15) & ~terminated
    # Make sure both kinds of episode end are present, and a step that is both (it counts as terminated).
    terminated[3, 0], truncated[3, 0] = True, False
    terminated[5, -1], truncated[5, -1] = False, True
    terminated[7, B // 2], truncated[7, B // 2] = True, True
    return rewards, values, next_values, terminated, truncated


def call_gae(rewards, values, next_values, terminated, truncated, gamma, lam):
    return ppo.gae(rewards, values, next_values, terminated, terminated | truncated, gamma, lam)


@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 1.0), (1.0, 0.0)])
def test_gae_matches_numpy_loop(gamma, lam):
    data = random_rollout(np.random.default_rng(0))
    expected_adv, expected_targets = gae_reference(*data, gamma, lam)
    adv, targets = call_gae(*map(jnp.asarray, data), gamma, lam)
    np.testing.assert_allclose(adv, expected_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(targets, expected_targets, rtol=1e-5, atol=1e-5)


def test_gae_truncation_bootstraps_and_termination_does_not():
    # One step, three envs: env 0 terminated, env 1 truncated, env 2 both (terminated wins: no bootstrap,
    # whatever PPO's `bootstrap_values` put there); lambda irrelevant for T = 1.
    rewards = jnp.array([[1.0, 1.0, 1.0]])
    values = jnp.array([[0.5, 0.5, 0.5]])
    truncated = jnp.array([[False, True, True]])
    next_values = base.bootstrap_values(values, jnp.array([7.0, 7.0, 7.0]), truncated, jnp.full((1, 3), 10.0))
    terminated = jnp.array([[True, False, True]])
    adv, _ = ppo.gae(rewards, values, next_values, terminated, terminated | truncated, 0.9, 0.95)
    np.testing.assert_allclose(adv, [[1.0 - 0.5, 1.0 + 0.9 * 10.0 - 0.5, 1.0 - 0.5]], rtol=1e-6)


def test_bootstrap_values_matches_numpy_loop():
    rng = np.random.default_rng(3)
    T, B = 7, 3
    values, truncated_value = rng.normal(size=(2, T, B)).astype(np.float32)
    last_value = rng.normal(size=B).astype(np.float32)
    truncated = rng.random((T, B)) < 0.3
    expected = np.empty((T, B), np.float32)
    for t in range(T):
        for b in range(B):
            following = values[t + 1, b] if t + 1 < T else last_value[b]
            expected[t, b] = truncated_value[t, b] if truncated[t, b] else following
    got = base.bootstrap_values(values, last_value, truncated, truncated_value)
    np.testing.assert_array_equal(np.asarray(got), expected)


def test_gae_does_not_leak_across_episode_ends():
    # The advantage at an episode's last step must not depend on what follows it.
    rng = np.random.default_rng(1)
    rewards, values, next_values, terminated, truncated = random_rollout(rng, T=8, B=1)
    terminated[:], truncated[:] = False, False
    truncated[3, 0] = True
    adv_a, _ = call_gae(*map(jnp.asarray, (rewards, values, next_values, terminated, truncated)), 0.99, 0.95)
    rewards[4:] += 100.0
    adv_b, _ = call_gae(*map(jnp.asarray, (rewards, values, next_values, terminated, truncated)), 0.99, 0.95)
    np.testing.assert_allclose(adv_a[:4], adv_b[:4], rtol=1e-6)


def test_gae_jit_and_vmap():
    rng = np.random.default_rng(2)
    batches = [random_rollout(rng) for _ in range(3)]
    stacked = [jnp.asarray(np.stack(field)) for field in zip(*batches)]
    gammas = jnp.array([0.99, 0.9, 0.5])
    adv, targets = jax.jit(jax.vmap(call_gae, in_axes=(0, 0, 0, 0, 0, 0, None)))(*stacked, gammas, 0.95)
    for i, data in enumerate(batches):
        expected_adv, expected_targets = gae_reference(*data, float(gammas[i]), 0.95)
        np.testing.assert_allclose(adv[i], expected_adv, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(targets[i], expected_targets, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------
# Losses


def policy_loss_reference(log_prob, old_log_prob, advantages, eps):
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    total = 0.0
    for lp, olp, a in zip(log_prob, old_log_prob, advantages):
        ratio = np.exp(lp - olp)
        total += min(ratio * a, np.clip(ratio, 1 - eps, 1 + eps) * a)
    return -total / len(log_prob)


def value_loss_reference(values, old_values, targets, eps, clip):
    total = 0.0
    for v, v_old, t in zip(values, old_values, targets):
        loss = (v - t) ** 2
        if clip:
            v_clipped = v_old + np.clip(v - v_old, -eps, eps)
            loss = max(loss, (v_clipped - t) ** 2)
        total += 0.5 * loss
    return total / len(values)


def random_minibatch(seed, n=64):
    rng = np.random.default_rng(seed)
    old_log_prob = rng.normal(size=n).astype(np.float32)
    log_prob = (old_log_prob + rng.normal(scale=0.4, size=n)).astype(np.float32)
    advantages = rng.normal(loc=0.3, scale=2.0, size=n).astype(np.float32)
    old_values = rng.normal(size=n).astype(np.float32)
    values = (old_values + rng.normal(scale=0.5, size=n)).astype(np.float32)
    targets = rng.normal(size=n).astype(np.float32)
    return log_prob, old_log_prob, advantages, values, old_values, targets


@pytest.mark.parametrize("seed", [0, 1])
def test_policy_loss_matches_numpy(seed):
    log_prob, old_log_prob, advantages, *_ = random_minibatch(seed)
    expected = policy_loss_reference(log_prob.astype(np.float64), old_log_prob, advantages.astype(np.float64), 0.2)
    got = jax.jit(ppo.policy_loss, static_argnums=3)(log_prob, old_log_prob, advantages, 0.2)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("clip", [True, False])
def test_value_loss_matches_numpy(clip):
    _, _, _, values, old_values, targets = random_minibatch(3)
    expected = value_loss_reference(values, old_values, targets, 0.2, clip)
    got = ppo.value_loss(values, old_values, targets, 0.2, clip=clip)
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_ppo_loss_combines_parts():
    log_prob, old_log_prob, advantages, values, old_values, targets = random_minibatch(4)
    entropy = np.abs(np.random.default_rng(5).normal(size=log_prob.shape)).astype(np.float32)
    total, info = ppo.ppo_loss(
        log_prob, old_log_prob, advantages, values, old_values, targets, entropy,
        clip_eps=0.2, clip_value=True, vf_coef=0.5, ent_coef=0.01,
    )
    np.testing.assert_allclose(total, info.policy_loss + 0.5 * info.value_loss - 0.01 * entropy.mean(), rtol=1e-5)
    np.testing.assert_allclose(info.total_loss, total)
    ratio = np.exp(log_prob.astype(np.float64) - old_log_prob)
    np.testing.assert_allclose(info.approx_kl, np.mean(ratio - 1 - np.log(ratio)), rtol=1e-4)
    np.testing.assert_allclose(info.clip_frac, np.mean(np.abs(ratio - 1) > 0.2), rtol=1e-6)
    assert float(info.approx_kl) >= 0.0


def test_dpo_objective_matches_numpy():
    """objective=dpo's policy loss as the PPO trainer builds it: advantages normalised over the minibatch,
    loss = -mean(r A - f(r, A)) with DPO's drift f (alpha on (r-1)A for A >= 0, beta on log(r)A for A < 0)."""
    log_prob, old_log_prob, advantages, values, old_values, targets = random_minibatch(6)
    entropy = np.zeros_like(log_prob)
    config = ppo.Config(objective="dpo", dpo_alpha=2.0, dpo_beta=0.6)
    objective = ppo_train.policy_objective_for(config)
    _, info = ppo.ppo_loss(log_prob, old_log_prob, advantages, values, old_values, targets, entropy,
                           clip_eps=0.2, clip_value=True, vf_coef=0.5, ent_coef=0.01, policy_objective=objective)
    a = advantages.astype(np.float64)
    a = (a - a.mean()) / (a.std() + 1e-8)
    r = np.exp(log_prob.astype(np.float64) - old_log_prob)
    relu = lambda x: np.maximum(x, 0.0)  # noqa: E731
    drift = np.where(a >= 0, relu((r - 1) * a - 2.0 * np.tanh((r - 1) * a / 2.0)),
                     relu(np.log(r) * a - 0.6 * np.tanh(np.log(r) * a / 0.6)))
    np.testing.assert_allclose(info.policy_loss, -np.mean(r * a - drift), rtol=1e-5, atol=1e-7)
    assert ppo_train.policy_objective_for(ppo.Config()) is None  # PPO-clip: ppo_loss's own surrogate


# ---------------------------------------------------------------------------------------------------
# Config


@pytest.fixture(scope="module")
def cartpole():
    return make_env("CartPole-v1")


@pytest.fixture(scope="module")
def pendulum():
    return make_env("Pendulum-v1")


def test_sampling_from_noise_drawn_ahead_follows_the_distribution():
    """PPO's rollouts sample from noise drawn for the whole rollout: Gumbel-max gives softmax(logits)'s
    frequencies (NumPy reference), the Gaussian's draw is loc + scale * a standard normal."""
    logits = np.array([[0.5, -1.0, 2.0], [0.0, 0.0, -3.0]], np.float32)
    noise = sampling_noise(jax.random.PRNGKey(0), (100_000, 2, 3), discrete=True)
    actions = np.asarray(categorical(jnp.asarray(logits)).sample_with_noise(noise))
    assert actions.shape == (100_000, 2) and actions.dtype == np.int32
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    for row in range(2):  # 100k draws: a frequency's standard deviation is at most 0.0016
        np.testing.assert_allclose(np.bincount(actions[:, row], minlength=3) / len(actions), probs[row], atol=0.008)
    loc, scale = np.array([0.3, -2.0], np.float32), np.array([0.5, 2.0], np.float32)
    noise = np.asarray(sampling_noise(jax.random.PRNGKey(1), (100_000, 2), discrete=False))
    draws = np.asarray(diag_gaussian(jnp.asarray(loc), jnp.asarray(scale)).sample_with_noise(noise))
    np.testing.assert_allclose(draws, loc + scale * noise, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(noise.mean(axis=0), 0.0, atol=0.015)
    np.testing.assert_allclose(noise.std(axis=0), 1.0, atol=0.015)


def test_default_config_is_purejaxrl_cartpole(cartpole):
    config = ppo.Config()
    config.validate(cartpole)
    assert (config.batch_size, config.minibatch_size, config.num_updates) == (512, 128, 976)


@pytest.mark.parametrize(
    "field,value",
    [
        ("total_timesteps", 0),
        ("total_timesteps", 100),  # smaller than one batch of 512
        ("num_envs", 0),
        ("num_envs", 2.5),
        ("num_steps", -1),
        ("lr", 0.0),
        ("update_epochs", 0),
        ("num_minibatches", 0),
        ("num_minibatches", 3),  # does not divide 512
        ("gamma", 1.5),
        ("gae_lambda", -0.1),
        ("ent_coef", -0.01),
        ("vf_coef", -1.0),
        ("clip_eps", 0.0),
        ("max_grad_norm", 0.0),
        ("hidden", ()),
        ("activation", "gelu"),
        ("torso", "cnn"),
        ("objective", "ppo"),
        ("dpo_alpha", 0.0),
        ("dpo_beta", -0.6),
    ],
)
def test_config_validate_names_the_field(cartpole, field, value):
    config = dataclasses.replace(ppo.Config(), **{field: value})
    with pytest.raises(ConfigError, match=field) as excinfo:
        config.validate(cartpole)
    assert repr(value) in str(excinfo.value)
    # make_algorithm checks before it builds or traces anything.
    with pytest.raises(ConfigError, match=field):
        ppo.make_algorithm(config, cartpole)


@pytest.mark.parametrize("torso,has_conv", [("auto", True), ("mlp", False)])
def test_torso_on_grid_observations(torso, has_conv):
    """MinAtar's [10, 10, C] grid: auto puts a Conv before the hidden layers, mlp flattens the grid into them."""
    env = make_env("Breakout-MinAtar")
    algo = ppo.make_algorithm(ppo.Config(num_envs=2, num_steps=8, num_minibatches=1, torso=torso), env)
    leaves = {"/".join(str(getattr(k, "key", k)) for k in path): leaf
              for path, leaf in jax.tree_util.tree_flatten_with_path(algo.policy(algo.init(jax.random.PRNGKey(0))).params)[0]}
    assert any("Conv" in path for path in leaves) == has_conv
    first = next(leaf for path, leaf in leaves.items() if path.endswith("MLP_0/Dense_0/kernel"))
    assert first.shape[0] == (10 * 10 * 16 if has_conv else int(np.prod(env.observation_shape)))


# ---------------------------------------------------------------------------------------------------
# Determinism and the continuous path (fast: a few updates)

SMALL = ppo.Config(total_timesteps=3 * 4 * 32, num_steps=32, num_minibatches=2, update_epochs=2)

METRIC_KEYS = {
    base.EPISODE_RETURN_SUM, base.EPISODE_COUNT, "total_loss", "value_loss", "policy_loss", "entropy",
    "approx_kl", "clip_frac",
}


def test_same_key_same_metrics_and_vmapped_seeds_equal_separate_runs(cartpole):
    train = ppo.make_train(SMALL, cartpole)
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    single = jax.jit(train)
    _, first = single(keys[0])
    _, again = single(keys[0])
    assert set(first) == METRIC_KEYS
    for name in first:
        assert first[name].shape == (SMALL.num_updates,) and first[name].dtype == jnp.float32
        np.testing.assert_array_equal(first[name], again[name])
    _, other = single(keys[1])
    _, batched = jax.jit(jax.vmap(train))(keys)
    for name in first:
        np.testing.assert_allclose(batched[name][0], first[name], rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(batched[name][1], other[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert not np.array_equal(first["total_loss"], other["total_loss"])


def test_continuous_with_normalisation_runs_and_acts_within_bounds(pendulum):
    config = dataclasses.replace(SMALL, normalize_obs=True, normalize_reward=True, num_envs=8)
    algo = ppo.make_algorithm(config, pendulum)

    def run(key):
        train_key, eval_key = jax.random.split(key)
        state, metrics = base.make_train_fn(algo)(train_key)
        policy = algo.policy(state)
        obs = jnp.array([1.0, 0.0, 50.0])  # far outside the observed range: the mean may leave the bounds
        return metrics, policy, algo.act(policy, obs, eval_key)

    metrics, policy, action = jax.jit(jax.vmap(run))(jax.random.split(jax.random.PRNGKey(1), 2))
    assert set(metrics) == METRIC_KEYS
    for name, value in metrics.items():
        assert value.shape == (2, config.num_updates) and np.all(np.isfinite(value)), name
    assert action.shape == (2, 1) and action.dtype == jnp.float32 and np.all(np.abs(action) <= 2.0)
    # The saved policy carries the observation statistics it was trained with.
    assert policy.obs_stats is not None and policy.obs_stats.mean.shape == (2, 3)
    assert float(policy.obs_stats.count[0]) > config.batch_size * config.num_updates


def test_on_device_hands_the_learner_the_values_it_would_compute(pendulum):
    """On device the fragment is acted with the learner's own network (lag 0), so the values computed while
    acting (`Step.value`, and `Step.next_value`: the next step's value, V(final obs) where a time limit
    truncated the episode, the value after the fragment at its end) are those the learner would compute on
    the fragment's observations, normalised with the statistics before it."""
    config = dataclasses.replace(SMALL, normalize_obs=True, num_envs=2, num_steps=256, num_minibatches=1,
                                 total_timesteps=512)  # one update
    al = ppo.make_actor_learner(config, pendulum, unroll=False)
    network = ppo_train.ActorCritic(action_dim=1, discrete=False, obs_shape=(3,), hidden=tuple(config.hidden),
                                    activation=config.activation, torso=config.torso)

    def learn(learner, steps):
        obs = normalize(learner.obs_stats, steps.obs)
        recomputed = ppo_train.fragment_values(network, learner, obs, steps._replace(value=None, next_value=None))
        return learner, {"carried": jnp.stack([steps.value, steps.next_value]), "recomputed": jnp.stack(recomputed),
                         "truncated": steps.truncated}

    algo = base.on_device(al._replace(learn=learn), pendulum, config.num_steps, 1)
    state = algo.init(jax.random.PRNGKey(4))
    stats = state.learner.obs_stats._replace(mean=jnp.array([0.3, -0.2, 0.5]), var=jnp.array([0.5, 0.4, 4.0]))
    state = state._replace(learner=state.learner._replace(obs_stats=stats))
    _, out = jax.jit(algo.update)(state)
    assert int(jnp.sum(out["truncated"])) == 2  # Pendulum's 200-step limit, once in each env
    np.testing.assert_allclose(out["carried"], out["recomputed"], rtol=1e-4, atol=1e-5)


def test_vmapped_init_equals_separate_inits_and_does_not_hang(cartpole):
    """Batched LAPACK QR (orthogonal init) deadlocked jaxlib 0.10's CPU thread pool on 2 cores, at
    nearly every call of a vmapped init; every orthogonal kernel is drawn one key at a time under vmap
    instead (`nets.modules.orthogonal`)."""
    algo = ppo.make_algorithm(SMALL, cartpole)
    keys = jax.random.split(jax.random.PRNGKey(3), (2, 3))  # e.g. hyperparameters x seeds: nested vmap
    init = jax.jit(jax.vmap(jax.vmap(lambda key: algo.policy(algo.init(key)).params)))
    finished = threading.Event()
    result = {}  # stays empty if a call raised

    def repeat():
        try:
            for i in range(20):
                result["params"] = jax.block_until_ready(init(keys))
        finally:
            finished.set()

    threading.Thread(target=repeat, daemon=True).start()
    assert finished.wait(timeout=120), "vmapped init hung (batched QR deadlock in the XLA CPU thread pool)"
    batched = result["params"]
    single = jax.jit(lambda key: algo.policy(algo.init(key)).params)
    for i, j in [(0, 0), (1, 2)]:
        jax.tree.map(lambda b, s: np.testing.assert_array_equal(b[i, j], s), batched, single(keys[i, j]))


# ---------------------------------------------------------------------------------------------------
# Learning (slow)


@pytest.mark.slow
def test_ppo_learns_cartpole(tmp_path):
    """PureJaxRL's CartPole config (the defaults), 500k steps, through `sparqrl train ppo --seeds 2` with the
    seeds spread over 2 CPU devices as the command spreads them: every seed's deterministic return >= 475.

    Measured: every seed scores 500 (the v1 maximum), in-process and through the command.
    """
    summary = train_as_users_do(tmp_path / "run", "ppo", "CartPole-v1")
    assert min(summary["final_return_per_seed"]) >= 475.0


@pytest.mark.slow
def test_dpo_learns_cartpole(tmp_path):
    """objective=dpo (DPO's drift, alpha 2, beta 0.6, no ratio clipping) with PureJaxRL's CartPole config,
    500k steps, through `sparqrl train ppo --set objective=dpo --seeds 2` over 2 CPU devices: every seed >= 475,
    as PPO. Measured: 500, 500 (benchmarks/history.md, "Learning tests through the command (issue 31 item 5)")."""
    summary = train_as_users_do(tmp_path / "run", "ppo", "CartPole-v1", sets=["objective=dpo"])
    assert min(summary["final_return_per_seed"]) >= 475.0, summary["final_return_per_seed"]


@pytest.mark.slow
def test_ppo_learns_pendulum(tmp_path):
    """Continuous actions with observation and reward normalisation on Pendulum-v1 (gymnax), as a user gets them:
    `sparqrl train ppo --env Pendulum-v1 --seeds 2 --steps 300000` (the ppo-pendulum preset: 16 envs x 128 steps,
    gamma 0.95, both normalisers), the seeds over 2 CPU devices: every seed >= -400. Random play scores about
    -1200, gymnax's reference PPO -130. Measured: -186.8, -153.5; the defaults matrix's 4 seeds -126 to -217 on
    both layouts (benchmarks/history.md, "Learning tests through the command (issue 31 item 5)", "After the PPO
    merge")."""
    summary = train_as_users_do(tmp_path / "run", "ppo", "Pendulum-v1", steps=300_000)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["run"]["preset"] == "ppo-pendulum"
    assert min(summary["final_return_per_seed"]) >= -400.0, summary["final_return_per_seed"]

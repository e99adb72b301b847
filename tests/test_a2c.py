"""A2C: its loss and optimizer against NumPy, config checks, and learning CartPole on both runners."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import RAY_SERIAL, train_as_users_do, train_on_host_as_users_do
from sparqrl.algos import a2c
from sparqrl.algos.base import Step, actor_critic_optimizer
from sparqrl.algos.ppo import train as ppo_train
from sparqrl.config import ConfigError
from sparqrl.envs import make_env
from sparqrl.runners import RunConfig, train


def lambda_returns_reference(r, v_next, term, trunc, gamma, lam):
    """Plain loop over a fragment [T, N]: the lambda-return, bootstrapped from V of the fragment's last next
    observation, from V(final obs) at a truncation and from nothing at a termination; lam = 1 is the paper's
    n-step return R_t = r_t + gamma r_t+1 + ... + gamma^k V(s_t+k)."""
    T, N = r.shape
    returns = np.zeros((T, N), np.float64)
    for n in range(N):
        for t in reversed(range(T)):
            ends = term[t, n] or trunc[t, n] or t == T - 1
            after = v_next[t, n] if ends else (1 - lam) * v_next[t, n] + lam * returns[t + 1, n]
            returns[t, n] = r[t, n] + (0.0 if term[t, n] else gamma * after)
    return returns


def a2c_loss_reference(log_prob, v, entropy, returns, vf_coef, ent_coef):
    advantages = returns - v
    policy = -np.mean(advantages * log_prob)
    value = 0.5 * np.mean((v - returns) ** 2)
    return policy + vf_coef * value - ent_coef * np.mean(entropy), policy, value, advantages


@pytest.mark.parametrize("lam", [1.0, 0.9])
def test_the_learners_a2c_loss_matches_numpy(lam):
    """The loss A2C's learner takes a gradient of, from a fragment with terminations and truncations (each
    truncation bootstrapping from its own final observation's value): the returns and advantages PPO's learner
    computes for it (`fragment_advantages`) and `a2c_rule`'s loss, jitted and vmapped over two fragments."""
    rng = np.random.default_rng(3)
    S, T, N = 2, 9, 4
    kind = rng.choice(3, size=(S, T, N), p=[0.7, 0.15, 0.15])
    term, trunc = kind == 1, kind == 2
    r, v, v_next, log_prob = rng.normal(size=(4, S, T, N)).astype(np.float32)
    v_next = np.where(trunc | term, v_next, np.roll(v, -1, axis=1))  # V(next obs) is the next row's V in-episode
    entropy = rng.uniform(0.1, 0.7, size=(S, T, N)).astype(np.float32)
    config = a2c.Config(gamma=0.9, gae_lambda=lam, vf_coef=0.7, ent_coef=0.05, num_envs=N, num_steps=T)
    rule = a2c.a2c_rule(config)

    def loss(r, v, v_next, term, trunc, log_prob, entropy):
        steps = Step(None, None, r, None, term, trunc, None, None)
        advantages, targets = ppo_train.fragment_advantages(config, v, v_next, steps, r)
        batch = ppo_train.Batch(None, None, None, v, advantages, targets)
        return rule.loss(log_prob, v, entropy, batch)

    total, terms = jax.jit(jax.vmap(loss))(r, v, v_next, term, trunc, log_prob, entropy)
    for s in range(S):
        returns = lambda_returns_reference(r[s], v_next[s], term[s], trunc[s], 0.9, lam)
        ref_total, ref_policy, ref_value, advantages = a2c_loss_reference(log_prob[s], v[s], entropy[s], returns,
                                                                          0.7, 0.05)
        np.testing.assert_allclose(float(terms["policy_loss"][s]), ref_policy, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(float(terms["value_loss"][s]), ref_value, rtol=1e-5)
        np.testing.assert_allclose(float(terms["entropy"][s]), np.mean(entropy[s]), rtol=1e-6)
        np.testing.assert_allclose(float(total[s]), ref_total, rtol=1e-5, atol=1e-6)

    # -A·log π: no ratio, no clip, no normalisation; d loss / d log π = -A / (T N), d loss / d V = vf_coef (V - R)
    # / (T N) (the advantages and returns are constants)
    returns = lambda_returns_reference(r[0], v_next[0], term[0], trunc[0], 0.9, lam)
    grad_log_prob, grad_v = jax.grad(lambda lp, vv: a2c.a2c_loss(lp, vv, entropy[0], jnp.asarray(returns - v[0]),
                                                                 jnp.asarray(returns), vf_coef=0.7, ent_coef=0.05)[0],
                                     argnums=(0, 1))(log_prob[0], v[0])
    np.testing.assert_allclose(np.asarray(grad_log_prob), -(returns - v[0]) / (T * N), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(np.asarray(grad_v), 0.7 * (v[0] - returns) / (T * N), rtol=1e-4, atol=1e-7)


def test_rmsprop_is_tf1s_eps_inside_the_root_from_ones():
    """`actor_critic_optimizer`'s RMSProp as TF1 (Baselines' a2c) steps: ms starts at 1, ms ← α ms + (1 - α) g²,
    step -lr g / sqrt(ms + ε), after the global-norm clip; three steps of a NumPy loop, no annealing."""
    config = a2c.Config(lr=0.1, rmsprop_alpha=0.9, rmsprop_eps=0.01, max_grad_norm=1.0, anneal_lr=False)
    optimizer = actor_critic_optimizer(config)
    params = {"w": jnp.array([1.0, -2.0]), "b": jnp.array([0.5])}
    grads = [{"w": jnp.array([0.3, -0.2]), "b": jnp.array([0.1])}, {"w": jnp.array([3.0, 0.0]), "b": jnp.array([-4.0])},
             {"w": jnp.array([0.01, 0.02]), "b": jnp.array([0.0])}]
    state = optimizer.init(params)
    ms = {k: np.ones_like(np.asarray(p)) for k, p in params.items()}
    expected = {k: np.asarray(p, np.float64) for k, p in params.items()}
    for g in grads:
        updates, state = optimizer.update(g, state, params)
        params = jax.tree.map(lambda p, u: p + u, params, updates)
        norm = np.sqrt(sum(np.sum(np.square(np.asarray(x))) for x in g.values()))
        for k in ms:
            clipped = np.asarray(g[k]) * min(1.0, 1.0 / norm)
            ms[k] = 0.9 * ms[k] + 0.1 * clipped ** 2
            expected[k] = expected[k] - 0.1 * clipped / np.sqrt(ms[k] + 0.01)
    for k in expected:
        np.testing.assert_allclose(np.asarray(params[k]), expected[k], rtol=1e-5)


def test_one_fragment_is_one_gradient_step():
    """The learner both runners drive takes a fragment [T = num_steps, N = num_envs] (here as a host actor sends
    it: no values) in one step: every parameter moves once, and A2C's metrics have no ratio terms."""
    env = make_env("CartPole-v1")
    T, N = 5, 4
    al = a2c.make_actor_learner(a2c.Config(num_envs=N, num_steps=T, total_timesteps=40), env)
    rng = np.random.default_rng(0)
    obs, next_obs = rng.normal(size=(2, T, N, 4)).astype(np.float32)
    steps = Step(obs, rng.integers(0, 2, size=(T, N)).astype(np.int32), np.ones((T, N), np.float32), next_obs,
                 rng.random((T, N)) < 0.1, np.zeros((T, N), bool), np.full((T, N), -0.69, np.float32),
                 np.ones((T, N), np.float32))
    learner = al.init(jax.random.PRNGKey(0))
    after, metrics = jax.jit(al.learn)(learner, steps)
    assert int(after.gradient_steps) == 1 and int(after.env_steps) == T * N
    assert set(metrics) == {"policy_loss", "value_loss", "entropy", "total_loss"}  # no ratio: no clip_frac, approx_kl
    moved = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), learner.params, after.params)
    assert all(jax.tree.leaves(moved))


def test_adam_is_an_option():
    """optimizer=adam: Adam (eps 1e-5) after the same clip, whose first step is lr·g/(|g| + eps), about lr·sign(g)."""
    config = a2c.Config(lr=0.1, max_grad_norm=100.0, anneal_lr=False, optimizer="adam")
    params = {"w": jnp.array([1.0, -2.0, 3.0])}
    grads = {"w": jnp.array([0.3, -0.2, 0.0])}
    optimizer = actor_critic_optimizer(config)
    updates, _ = optimizer.update(grads, optimizer.init(params), params)
    g = np.asarray(grads["w"])
    np.testing.assert_allclose(np.asarray(updates["w"]), -0.1 * g / (np.abs(g) + 1e-5), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("field, value, allowed", [
    ("optimizer", "sgd", "must be one of rmsprop, adam"), ("rmsprop_alpha", 1.0, r"must be in \[0, 1\)"),
    ("rmsprop_eps", 0.0, "must be > 0"), ("gae_lambda", 1.5, r"must be in \[0, 1\]"), ("num_steps", 0, "must be > 0"),
    ("lr", -1e-3, "must be > 0"),
])
def test_bad_config_is_a_one_line_error(field, value, allowed):
    with pytest.raises(ConfigError, match=f"^{field}=.*{allowed}$") as error:
        a2c.Config(**{field: value}).validate(make_env("CartPole-v1"))
    assert "\n" not in str(error.value)


def test_a2c_learns_cartpole_on_device(tmp_path):
    """The defaults (8 envs x 5 steps, TF1 RMSProp 7e-4 annealed, no entropy bonus), 500k steps, through
    `sparqrl train a2c --seeds 2` over 2 CPU devices: every seed >= 450."""
    summary = train_as_users_do(tmp_path / "run", "a2c", "CartPole-v1")
    assert min(summary["final_return_per_seed"]) >= 450.0, summary["final_return_per_seed"]


def test_a2c_runs_on_the_host(tmp_path):
    """The same learner on gym:CartPole-v1 through the actor-learner runner: a few thousand steps complete and
    every step is learned from (one gradient step per 8 x 5 fragment)."""
    run = RunConfig(env="gym:CartPole-v1", out=str(tmp_path / "run"), chunks=2, eval_every=0, progress=False,
                    energy=False, eval_episodes=2)
    summary = train("a2c", dataclasses.replace(a2c.Config(), total_timesteps=4_000), run)
    assert summary["algo"] == "a2c" and summary["env"] == "gym:CartPole-v1"
    assert np.isfinite(summary["final_return_mean"]) and summary["fragments_dropped"] == 0


HOST_STEPS = 100_000
HOST_THRESHOLD = 200.0


@RAY_SERIAL
@pytest.mark.slow
def test_a2c_learns_cartpole_on_the_host(tmp_path):
    """The defaults as a user runs them on a host env: `sparqrl train a2c --env gym:CartPole-v1 --actors 2 --seeds
    2`, the actors on the back-end the command picks (Ray), HOST_STEPS env steps: every seed's greedy return (10
    episodes) >= HOST_THRESHOLD; random play scores about 22. The actors race, so every run is a new draw: 8 seeds
    over 4 draws ended at 359 or more at this budget (benchmarks/history.md, "RLx2 and host learning tests through
    the command (issue 31 item 5)"); the learning rate anneals to 0 over the run, and at 100k the greedy policy is
    past 300 while the sampled one still scores about 100-140, so the bar asks for learning, not mastery (the
    defaults matrix row asks 400 at 500k)."""
    summary = train_on_host_as_users_do(tmp_path / "run", "a2c", "gym:CartPole-v1", HOST_STEPS)
    assert min(summary["final_return_per_seed"]) >= HOST_THRESHOLD, summary["final_return_per_seed"]

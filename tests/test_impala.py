"""IMPALA: its loss against NumPy, learning CartPole on both runners with the one learner."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from conftest import train_as_users_do
from sparqrl.algos import impala
from sparqrl.algos.base import Step
from sparqrl.config import ConfigError
from sparqrl.envs import make_env
from sparqrl.runners import RunConfig, train


def _numpy_vtrace(log_rho, r, v, next_v, term, trunc, gamma, rho_bar, c_bar):
    """The reference's recursive V-trace (lambda 1), cut at every episode end, as a plain loop."""
    T = r.shape[0]
    rho, c = np.minimum(rho_bar, np.exp(log_rho)), np.minimum(c_bar, np.exp(log_rho))
    done = term | trunc
    disc = gamma * (1.0 - term)
    vs_minus_v, pg = np.zeros_like(r), np.zeros_like(r)
    acc = np.zeros_like(r[0])
    for t in reversed(range(T)):
        delta = rho[t] * (r[t] + disc[t] * next_v[t] - v[t])
        acc = delta + gamma * c[t] * (1.0 - done[t]) * acc
        vs_minus_v[t] = acc
    vs = vs_minus_v + v
    for t in range(T):
        boot = next_v[t] + (0.0 if t == T - 1 else (1.0 - done[t]) * (vs[t + 1] - v[t + 1]))
        pg[t] = rho[t] * (r[t] + disc[t] * boot - v[t])
    return vs, pg


def test_loss_matches_numpy():
    rng = np.random.default_rng(1)
    T, N = 12, 3
    kind = rng.choice(3, size=(T, N), p=[0.7, 0.15, 0.15])
    term, trunc = kind == 1, kind == 2
    log_prob = rng.normal(size=(T, N)).astype(np.float32) * 0.5 - 1.0
    behaviour = log_prob + rng.normal(size=(T, N)).astype(np.float32) * 0.7  # off-policy: some rho clipped
    v, next_v = rng.normal(size=(2, T, N)).astype(np.float32)
    r = rng.normal(size=(T, N)).astype(np.float32)
    entropy = rng.uniform(0.1, 0.7, size=(T, N)).astype(np.float32)
    config = impala.Config(gamma=0.95, rho_bar=1.0, c_bar=0.9, vf_coef=0.4, ent_coef=0.02)
    steps = Step(None, None, r, None, term, trunc, behaviour, None)
    loss, metrics = jax.jit(lambda *a: impala.impala_loss(*a, steps, config))(log_prob, behaviour, v, next_v, entropy)

    vs, pg = _numpy_vtrace(log_prob - behaviour, r, v, next_v, term, trunc, 0.95, 1.0, 0.9)
    policy = -np.mean(pg * log_prob)
    value = 0.5 * np.mean((vs - v) ** 2)
    np.testing.assert_allclose(float(metrics["policy_loss"]), policy, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["value_loss"]), value, rtol=1e-5)
    np.testing.assert_allclose(float(loss), policy + 0.4 * value - 0.02 * np.mean(entropy), rtol=1e-5)
    assert 0.0 < float(metrics["rho_clipped_fraction"]) < 1.0

    # The gradient flows through log pi and V only: d loss / d log_prob = -pg / (T N).
    grad = jax.grad(lambda lp: impala.impala_loss(lp, behaviour, v, next_v, entropy, steps, config)[0])(log_prob)
    np.testing.assert_allclose(np.asarray(grad), -pg / (T * N), rtol=1e-4, atol=1e-7)


def test_impala_learns_cartpole_on_device(tmp_path):
    """The defaults (8 envs x 20 steps, the IMPALA paper's unroll and gradient clip 40; Adam 4e-3 annealed,
    entropy 0.003), 500k steps, through `sparqrl train --seeds 2` over 2 CPU devices: every seed >= 400."""
    summary = train_as_users_do(tmp_path / "run", "impala", "CartPole-v1")
    assert min(summary["final_return_per_seed"]) >= 400.0, summary["final_return_per_seed"]


def test_impala_learns_cartpole_on_the_host(tmp_path):
    """The same learner on gym:CartPole-v1 through one inline actor with two requests in flight, so that
    fragments lag the learner by one version (V-trace corrects them), 200k steps, seed 0."""
    run = RunConfig(env="gym:CartPole-v1", out=str(tmp_path / "run"), chunks=2, eval_every=0, progress=False,
                    energy=False, in_flight=2)
    summary = train("impala", impala.Config(total_timesteps=200_000), run)
    print(f"IMPALA on the host: {summary['final_return_mean']:.1f}, lag {summary['policy_lag_mean']:.2f}, "
          f"{summary['env_steps_per_s']:.0f} env steps/s")
    assert summary["final_return_mean"] >= 400.0
    assert summary["fragments_dropped"] == 0 and summary["policy_lag_mean"] > 0.5  # V-trace corrects the lag


def test_on_device_fragments_are_on_policy():
    """`base.on_device` acts with the learner's current policy: one update is one gradient step on T x N env
    steps whose behaviour log-probabilities equal the learner's (rho = 1)."""
    env = make_env("CartPole-v1")
    config = impala.Config(num_envs=2, num_steps=4, total_timesteps=64).validate(env)
    algo = impala.make_algorithm(config, env)
    after, metrics = jax.jit(algo.update)(algo.init(jax.random.PRNGKey(0)))
    assert int(after.learner.gradient_steps) == 1 and int(after.env_steps) == 8
    assert abs(float(metrics["rho_mean"]) - 1.0) < 1e-5 and float(metrics["rho_clipped_fraction"]) == 0.0


@pytest.mark.parametrize("field, value, allowed", [("num_steps", 0, "must be > 0"), ("gamma", 1.5, "in \\[0, 1\\]"),
                                                   ("c_bar", -1.0, "must be > 0")])
def test_bad_config_is_a_clear_error(field, value, allowed):
    with pytest.raises(ConfigError, match=f"{field}.*{allowed}"):
        impala.Config(**{field: value}).validate(make_env("CartPole-v1"))

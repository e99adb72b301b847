"""sparqrl.nets.distributions against SciPy and NumPy references written here: the categorical (also at
extreme logits, where probabilities underflow), the diagonal Gaussian, and the tanh-squashed Gaussian (its
change-of-variables term against a numeric derivative)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from sparqrl.nets.distributions import TanhGaussian, categorical, diag_gaussian, sampling_noise, tanh_log_det_jacobian

# ---- categorical -----------------------------------------------------------------------------

LOGITS = np.array([
    [0.5, -1.0, 2.0, 0.0],
    [3.0, 3.0, 3.0, 3.0],
    [1e4, 0.0, -1e4, 5.0],  # probabilities 1, 0, 0, 0 in float32
    [0.0, -200.0, -200.0, -90.0],  # exp(-200) underflows to 0 in float32: p log p must be 0, not NaN
], np.float32)


def _np_log_softmax(logits):
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def test_categorical_log_prob_entropy_and_mode_match_numpy():
    log_p = _np_log_softmax(LOGITS)
    dist = categorical(jnp.asarray(LOGITS))
    for action in range(4):
        values = jnp.full(len(LOGITS), action)
        got = jax.jit(lambda d, a: d.log_prob(a))(dist, values)
        np.testing.assert_allclose(np.asarray(got), log_p[:, action], rtol=1e-6, atol=1e-5)
    p = np.exp(log_p)
    want_entropy = np.array([stats.entropy(row) for row in p])  # scipy: -Σ p log p, 0 log 0 = 0
    np.testing.assert_allclose(np.asarray(dist.entropy()), want_entropy, rtol=1e-5, atol=1e-6)
    assert np.asarray(dist.mode()).tolist() == [2, 0, 0, 0]
    assert np.asarray(dist.log_prob(jnp.array([-1, 4, 0, 3]))).tolist()[:2] == [-np.inf, -np.inf]  # outside 0..K-1


def test_categorical_gradients_stay_finite_at_extreme_logits():
    """The loss of a policy whose other actions' probabilities underflowed, or whose log-probabilities
    overflowed to -inf (a logit spread of 6e38): value and gradient finite (log_softmax, products masked
    where the one-hot or p is 0), and the gradient is ∂log p_a + ∂H with ∂H/∂logit = -p (log p + H)."""
    logits = np.concatenate([LOGITS, [[3e38, -3e38, 0.0, 1.0]]]).astype(np.float32)

    def loss(logits):
        dist = categorical(logits)
        return jnp.sum(dist.log_prob(jnp.array([0, 1, 0, 0, 0]))) + jnp.sum(dist.entropy())

    value, grad = jax.value_and_grad(loss)(jnp.asarray(logits))
    assert np.isfinite(float(value)) and np.all(np.isfinite(np.asarray(grad)))
    grad = np.asarray(grad)
    log_p = _np_log_softmax(LOGITS[:2])
    p = np.exp(log_p)
    entropy = -(p * log_p).sum(axis=-1, keepdims=True)
    chosen = np.eye(4)[[0, 1]]
    want = (chosen - p) - p * (log_p + entropy)  # ∂log p_a/∂logits + ∂H/∂logits
    np.testing.assert_allclose(grad[:2], want, rtol=1e-4, atol=1e-5)


def test_categorical_draws_follow_softmax():
    """sample(key) is sample_with_noise of that key's Gumbel noise; 100k draws give softmax's frequencies
    (a frequency's standard deviation is at most 0.0016)."""
    dist = categorical(jnp.asarray(LOGITS[:2]))
    keys = jax.random.split(jax.random.key(0), 100_000)
    draws = np.asarray(jax.vmap(dist.sample)(keys))
    noise = jax.vmap(lambda k: sampling_noise(k, LOGITS[:2].shape, discrete=True))(keys)
    np.testing.assert_array_equal(draws, np.asarray(jax.vmap(dist.sample_with_noise)(noise)))
    assert draws.dtype == np.int32
    p = np.exp(_np_log_softmax(LOGITS[:2]))
    for row in range(2):
        np.testing.assert_allclose(np.bincount(draws[:, row], minlength=4) / len(draws), p[row], atol=0.008)


# ---- diagonal Gaussian -----------------------------------------------------------------------


def test_diag_gaussian_matches_scipy():
    rng = np.random.default_rng(0)
    loc = rng.normal(size=(5, 3)).astype(np.float32)
    scale = np.exp(rng.uniform(-4, 2, (5, 3))).astype(np.float32)
    value = (loc + scale * rng.normal(size=(5, 3)) * 3).astype(np.float32)
    dist = diag_gaussian(jnp.asarray(loc), jnp.asarray(scale))
    want = stats.norm.logpdf(value.astype(np.float64), loc, scale).sum(axis=-1)
    got = jax.jit(jax.vmap(lambda d, v: d.log_prob(v)))(dist, jnp.asarray(value))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(np.asarray(dist.entropy()), stats.norm.entropy(loc, scale).sum(axis=-1),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(dist.mode()), loc)
    key = jax.random.key(3)
    noise = np.asarray(jax.random.normal(key, loc.shape))
    np.testing.assert_allclose(np.asarray(dist.sample(key)), loc + scale * noise, rtol=1e-6, atol=1e-6)


# ---- tanh-squashed Gaussian ------------------------------------------------------------------


def _np_log_prob(u, mean, log_std):
    """log N(u; mean, σ²) − log(1 − tanh(u)²), summed over the last axis, in float64."""
    u, mean, log_std = (np.asarray(x, np.float64) for x in (u, mean, log_std))
    total = np.zeros(u.shape[:-1])
    for idx in np.ndindex(u.shape):
        std = np.exp(log_std[idx])
        gauss = -0.5 * ((u[idx] - mean[idx]) / std) ** 2 - np.log(std) - 0.5 * np.log(2 * np.pi)
        total[idx[:-1]] += gauss - np.log(1.0 - np.tanh(u[idx]) ** 2)
    return total


def test_squashed_gaussian_sample_and_log_prob_match_numpy():
    rng = np.random.default_rng(0)
    mean = rng.normal(size=(3, 50, 2)).astype(np.float32)
    log_std = rng.uniform(-3, 1, (3, 50, 2)).astype(np.float32)
    keys = jax.random.split(jax.random.key(0), 3)
    action, log_prob = jax.jit(jax.vmap(lambda k, m, s: TanhGaussian(m, s).sample(k)))(keys, mean, log_std)
    for i in range(3):
        u = mean[i] + np.exp(log_std[i]) * np.asarray(jax.random.normal(keys[i], mean[i].shape))
        np.testing.assert_allclose(np.asarray(action[i]), np.tanh(u), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(log_prob[i]), _np_log_prob(u, mean[i], log_std[i]), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(TanhGaussian(jnp.asarray(mean), jnp.asarray(log_std)).mode()), np.tanh(mean),
                               rtol=1e-6)
    # Stable far in the tails, where 1 − tanh(u)² underflows in float32.
    lp = TanhGaussian(jnp.array([[30.0]]), jnp.array([[0.0]])).pre_tanh_log_prob(jnp.array([[30.0]]))
    want = -0.5 * np.log(2 * np.pi) - 2 * (np.log(2) - 30)  # log(1 − tanh(u)²) ≈ 2(log 2 − u) for large u
    assert np.isfinite(float(lp[0])) and float(lp[0]) == pytest.approx(want, rel=1e-4)


def test_tanh_correction_matches_a_numeric_derivative():
    """log|d tanh(u)/du| against a central difference of tanh in float64, across both tails."""
    u = np.linspace(-8.0, 8.0, 161)
    h = 1e-5
    numeric = np.log((np.tanh(u + h) - np.tanh(u - h)) / (2 * h))
    np.testing.assert_allclose(np.asarray(tanh_log_det_jacobian(jnp.asarray(u, jnp.float32))), numeric,
                               rtol=1e-4, atol=1e-4)

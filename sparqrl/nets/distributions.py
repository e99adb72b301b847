"""The policy distributions the algorithms sample and score: categorical (PPO, IMPALA on discrete actions),
diagonal Gaussian (PPO, IMPALA on continuous actions, M-FOS's meta-policy), tanh-squashed Gaussian (SAC).

Each is a NamedTuple of arrays (a pytree: it passes through `jit`, `vmap` and a flax module's return value)
whose methods are pure functions of its fields. They replace distrax (issue 33, item 4: distrax pulled in
TensorFlow Probability, 1.8 s of imports and a pinned nightly build). The categorical and diagonal Gaussian
compute exactly what distrax's `Categorical` and `MultivariateNormalDiag` computed, operation for operation
(log_softmax-normalised logits; the Gaussian's log-density as the standardised sum plus the log-determinant
sum), so the learning results are bit for bit those of before. `sample_with_noise` draws from noise drawn
ahead (`sampling_noise`); `sample(key)` draws that noise itself.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def sampling_noise(key: jax.Array, shape: tuple[int, ...], discrete: bool) -> jax.Array:
    """Noise for `sample_with_noise` [..., action_dim]: standard Gumbel for a `Categorical`, standard normal for
    a Gaussian. Drawing a whole rollout's at once is one random-number program per update instead of one per
    step (BENCHMARKS.md, "one draw per update")."""
    return jax.random.gumbel(key, shape) if discrete else jax.random.normal(key, shape)


class Categorical(NamedTuple):
    """A categorical distribution over the last axis; `logits` [..., K] are normalised log-probabilities
    (`categorical` makes them from a network's raw logits)."""

    logits: jax.Array

    def log_prob(self, value: jax.Array) -> jax.Array:
        """log p(value) [...] of integer actions [...]; -inf outside 0..K-1. The one-hot product is masked where
        the one-hot is 0, so a log-probability of -inf (a logit far below the others) gives 0 there, not NaN."""
        categories = self.logits.shape[-1]
        one_hot = jax.nn.one_hot(value, categories, dtype=self.logits.dtype)
        picked = jnp.where(one_hot == 0, jnp.zeros((), self.logits.dtype), self.logits * one_hot)
        outside = jnp.logical_or(value < 0, value > categories - 1)
        return jnp.where(outside, -jnp.inf, jnp.sum(picked, axis=-1))

    def entropy(self) -> jax.Array:
        """-Σ p log p [...], with p log p = 0 where p underflows to 0. The logits are normalised once more
        (log_softmax is idempotent up to rounding), as distrax did: the entropy bonus's rounding, and so every
        learning result, stays what it was."""
        log_probs = jax.nn.log_softmax(self.logits)
        probs = jnp.exp(log_probs)
        return -jnp.sum(jnp.where(probs == 0, 0.0, log_probs) * probs, axis=-1)

    def mode(self) -> jax.Array:
        """The likeliest category [...] (int32; the first of equals)."""
        return jnp.argmax(self.logits, axis=-1).astype(jnp.int32)

    def sample_with_noise(self, noise: jax.Array) -> jax.Array:
        """A draw [...] (int32) from standard Gumbel noise [..., K]: argmax(logits + noise) is distributed as
        softmax(logits) (the Gumbel-max trick, as `jax.random.categorical`)."""
        return jnp.argmax(self.logits + noise, axis=-1).astype(jnp.int32)

    def sample(self, key: jax.Array) -> jax.Array:
        """A draw [...] (int32) with `key`."""
        return self.sample_with_noise(sampling_noise(key, self.logits.shape, discrete=True))


def categorical(logits: jax.Array) -> Categorical:
    """The `Categorical` of raw logits [..., K] (any offset: normalised here with log_softmax)."""
    return Categorical(jax.nn.log_softmax(logits, axis=-1))


class DiagGaussian(NamedTuple):
    """A Gaussian with diagonal covariance over the last axis: mean `loc` [..., D], standard deviations
    `scale` [..., D] (> 0, same shape) and their logs `log_scale` (`diag_gaussian` makes it). The log is
    computed once for log_prob and entropy, as distrax did: their gradients then add up before the log's,
    in the same order, and learning stays bit for bit what it was."""

    loc: jax.Array
    scale: jax.Array
    log_scale: jax.Array

    def log_prob(self, value: jax.Array) -> jax.Array:
        """log N(value; loc, diag(scale²)) [...]: Σ(-z²/2 - log √(2π)) - Σ log scale, z = (value - loc)/scale
        computed as (1/scale)·(value - loc) (distrax's affine bijector: the same rounding)."""
        z = (1.0 / self.scale) * (value - self.loc)
        standard = jnp.sum(-0.5 * jnp.square(z) - _HALF_LOG_2PI, axis=-1)
        return standard + jnp.sum(-self.log_scale, axis=-1)

    def entropy(self) -> jax.Array:
        """Σ(½ + log √(2π)) + Σ log scale [...] (each dimension's term summed, as distrax did)."""
        per_dim = 0.5 + jnp.full_like(self.loc, _HALF_LOG_2PI)
        return jnp.sum(per_dim, axis=-1) + jnp.sum(self.log_scale, axis=-1)

    def mode(self) -> jax.Array:
        """The mean [..., D]."""
        return self.loc

    def sample_with_noise(self, noise: jax.Array) -> jax.Array:
        """A draw [..., D] from standard normal noise [..., D]: loc + scale · noise."""
        return self.loc + self.scale * noise

    def sample(self, key: jax.Array) -> jax.Array:
        """A draw [..., D] with `key`."""
        return self.sample_with_noise(sampling_noise(key, self.loc.shape, discrete=False))


def diag_gaussian(loc: jax.Array, scale: jax.Array) -> DiagGaussian:
    """The `DiagGaussian` of means and standard deviations [..., D]."""
    return DiagGaussian(loc, scale, jnp.log(jnp.abs(scale)))


class TanhGaussian(NamedTuple):
    """a = tanh(u), u ~ N(loc, exp(log_std)²) per dimension [..., D]: SAC's policy on the box [-1, 1]^D
    (Haarnoja et al. 2018, appendix C). Scored on the pre-tanh u, which SAC keeps from its sample: atanh of a
    float32 action near ±1 cannot recover u. No `entropy`: it has no closed form (SAC's objectives use
    -log π of samples)."""

    loc: jax.Array
    log_std: jax.Array

    def pre_tanh_log_prob(self, pre_tanh: jax.Array) -> jax.Array:
        """log π(tanh(u)) [...] of pre-tanh values u [..., D]: the Gaussian log-density of u minus
        Σ log(1 − tanh(u)²) (change of variables), the latter as 2·(log 2 − u − softplus(−2u)), finite where
        1 − tanh(u)² underflows."""
        z = (pre_tanh - self.loc) * jnp.exp(-self.log_std)
        gaussian = -0.5 * jnp.square(z) - self.log_std - _HALF_LOG_2PI
        return jnp.sum(gaussian - tanh_log_det_jacobian(pre_tanh), axis=-1)

    def mode(self) -> jax.Array:
        """tanh(loc) [..., D]: the Gaussian's mode squashed, the deterministic action SAC acts and is evaluated
        with (RLx2's "mean action"; for large σ the squashed density's own peak lies elsewhere)."""
        return jnp.tanh(self.loc)

    def sample_with_noise(self, noise: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(a [..., D], log π(a) [...]) from standard normal noise [..., D]: a = tanh(loc + exp(log_std)·noise),
        reparameterised (gradients flow to loc and log_std)."""
        pre_tanh = self.loc + jnp.exp(self.log_std) * noise
        return jnp.tanh(pre_tanh), self.pre_tanh_log_prob(pre_tanh)

    def sample(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(a [..., D], log π(a) [...]) with `key`."""
        return self.sample_with_noise(sampling_noise(key, self.loc.shape, discrete=False))


def tanh_log_det_jacobian(pre_tanh: jax.Array) -> jax.Array:
    """log(1 − tanh(u)²) elementwise, = 2·(log 2 − u − softplus(−2u))."""
    return 2.0 * (jnp.log(2.0) - pre_tanh - jax.nn.softplus(-2.0 * pre_tanh))

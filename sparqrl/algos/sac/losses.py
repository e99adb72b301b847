"""SAC's losses as small pure functions (Haarnoja et al. 2018, with automatic entropy tuning; RLx2
`rlx2.md` §4.5, §6).

Actions live in the normalised box [-1, 1]^|A|: a = tanh(u), u ~ N(μ, σ²), the policy
`sparqrl.nets.distributions.TanhGaussian` (its log π(a|s) with the change-of-variables term); `train.py` maps
actions to the env's [low, high]. The multi-step soft target is `sparqrl.returns.nstep_soft_q_target`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def bounded_log_std(raw: jax.Array, log_std_min: float, log_std_max: float) -> jax.Array:
    """log σ = min + ½(max − min)(tanh(raw) + 1) ∈ (min, max), the soft bound of pytorch_sac / RLx2."""
    return log_std_min + 0.5 * (log_std_max - log_std_min) * (jnp.tanh(raw) + 1.0)


def critic_loss(q1: jax.Array, q2: jax.Array, target: jax.Array) -> jax.Array:
    """[]: MSE(Q1(s, a), y) + MSE(Q2(s, a), y); q1, q2, target [B] (target without gradient)."""
    target = jax.lax.stop_gradient(target)
    return jnp.mean(jnp.square(q1 - target)) + jnp.mean(jnp.square(q2 - target))


def actor_loss(alpha: jax.Array, log_prob: jax.Array, q_min: jax.Array) -> jax.Array:
    """[]: mean(α·log π(a|s) − min(Q1, Q2)(s, a)), a ~ π reparameterised; α [] without gradient; [B] inputs."""
    return jnp.mean(jax.lax.stop_gradient(alpha) * log_prob - q_min)


def temperature_loss(log_alpha: jax.Array, log_prob: jax.Array, target_entropy: float) -> jax.Array:
    """[]: mean(α · (−log π(a|s) − H_target)) with α = exp(log_alpha); log_prob [B] without gradient.

    Its gradient raises α when the policy's entropy −log π is below the target H_target (−|A| by default).
    """
    return jnp.mean(jnp.exp(log_alpha) * jax.lax.stop_gradient(-log_prob - target_entropy))

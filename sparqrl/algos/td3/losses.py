"""TD3 losses and action noise as small pure functions (Fujimoto et al. 2018; RLx2 `rlx2.md` §4.4, §6).

Actions here live in the normalised box [-1, 1]^|A| (the actor ends in tanh); `train.py` maps them to
the environment's [low, high] only when stepping it. Fractions of "the action half-range" are
therefore plain numbers here: RLx2's N(0, 0.2·a_max) clipped to ±0.5·a_max is N(0, 0.2) clipped to ±0.5.
The multi-step target itself is `sparqrl.returns.nstep_q_target`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def smoothed_target_action(
    target_action: jax.Array, key: jax.Array, noise: float, noise_clip: float
) -> jax.Array:
    """Target-policy smoothing [B, |A|]: clip(π'(s) + clip(N(0, noise²), ±noise_clip), −1, 1).

    target_action [B, |A|] = π'(s'_m), the target actor at the bootstrap state only (one draw per sample).
    """
    eps = jnp.clip(noise * jax.random.normal(key, target_action.shape), -noise_clip, noise_clip)
    return jnp.clip(target_action + eps, -1.0, 1.0)


def exploration_action(action: jax.Array, eps: jax.Array, noise: float) -> jax.Array:
    """Behaviour action [..., |A|]: clip(π(s) + noise · ε, −1, 1), ε [..., |A|] standard normal (drawn ahead)."""
    return jnp.clip(action + noise * eps, -1.0, 1.0)


def critic_loss(q1: jax.Array, q2: jax.Array, target: jax.Array) -> jax.Array:
    """[]: MSE(Q1(s, a), y) + MSE(Q2(s, a), y) over the batch; q1, q2, target [B] (target without gradient)."""
    target = jax.lax.stop_gradient(target)
    return jnp.mean(jnp.square(q1 - target)) + jnp.mean(jnp.square(q2 - target))


def actor_loss(q1_of_policy: jax.Array) -> jax.Array:
    """[]: −mean Q1(s, π(s)) over the batch (TD3 follows the first critic only); q1_of_policy [B]."""
    return -jnp.mean(q1_of_policy)

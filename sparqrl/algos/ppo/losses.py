"""PPO math as small pure functions: GAE, the surrogate (clipped or with a drift), the (clipped) value loss.

All functions work on any batch shape; the docstrings name the shapes PPO uses.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

DriftFn = Callable[[jax.Array, jax.Array], jax.Array]
"""f(r, Â) -> drift, elementwise, same shape as r (`sparqrl.algos.ppo.objectives`)."""


def gae(
    rewards: jax.Array,
    values: jax.Array,
    next_values: jax.Array,
    terminated: jax.Array,
    done: jax.Array,
    gamma: float,
    lam: float,
) -> tuple[jax.Array, jax.Array]:
    """Generalized Advantage Estimation (Schulman et al. 2016, arXiv 1506.02438), truncation-aware.

        δ_t = r_t + γ · V(s'_t) · (1 − terminated_t) − V(s_t)
        A_t = δ_t + γλ · (1 − done_t) · A_{t+1},      A_T = 0
        targets_t = A_t + V(s_t)

    s'_t is the state the transition reached before any auto-reset, so a time-limit truncation
    bootstraps from V(s'_t) while a termination does not; the recursion stops at every episode end
    (done = terminated | truncated), because the next row of the batch belongs to a new episode.

    Args:
      rewards, values, next_values: [T, B] float; next_values[t] = V(final_obs_t), which equals
        values[t + 1] wherever the episode goes on.
      terminated, done: [T, B] bool (or 0/1 float).
    Returns:
      (advantages, targets), both [T, B].
    """
    dtype = values.dtype
    not_terminated = 1.0 - jnp.asarray(terminated, dtype)
    deltas = rewards + gamma * next_values * not_terminated - values
    continues = gamma * lam * (1.0 - jnp.asarray(done, dtype))

    def backward(adv_tp1: jax.Array, step: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        delta_t, continue_t = step
        adv_t = delta_t + continue_t * adv_tp1
        return adv_t, adv_t

    _, advantages = jax.lax.scan(backward, jnp.zeros_like(values[0]), (deltas, continues), reverse=True)
    return advantages, advantages + values


def normalize_advantages(advantages: jax.Array, eps: float = 1e-8) -> jax.Array:
    """(A − mean A) / (std A + eps) over the whole minibatch."""
    return (advantages - advantages.mean()) / (advantages.std() + eps)


def policy_loss(
    log_prob: jax.Array,
    old_log_prob: jax.Array,
    advantages: jax.Array,
    clip_eps: float,
    normalize: bool = True,
    drift: DriftFn | None = None,
) -> jax.Array:
    """Clipped surrogate objective of PPO (Schulman et al. 2017, arXiv 1707.06347, eq. 7), as a loss,
    or with `drift` the mirror-learning surrogate (Kuba et al. 2022; LPO/DPO, Lu et al. 2022, §4.1, §5.2):

        ρ = exp(log π(a|s) − log π_old(a|s))
        L = −mean( min(ρ · Â, clip(ρ, 1 − ε, 1 + ε) · Â) )       drift None (clip_eps = ε)
        L = −mean( ρ · Â − f(ρ, Â) )                              drift f (clip_eps unused)

    Â are the advantages normalised over the minibatch when `normalize` (PureJaxRL, CleanRL).

    Args:
      log_prob, old_log_prob, advantages: [N] (a minibatch).
    Returns:
      scalar loss.
    """
    if normalize:
        advantages = normalize_advantages(advantages)
    ratio = jnp.exp(log_prob - old_log_prob)
    if drift is not None:
        return -jnp.mean(ratio * advantages - drift(ratio, advantages))
    unclipped = ratio * advantages
    clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    return -jnp.mean(jnp.minimum(unclipped, clipped))


def value_loss(
    values: jax.Array,
    old_values: jax.Array,
    targets: jax.Array,
    clip_eps: float,
    clip: bool = True,
) -> jax.Array:
    """Value regression loss, optionally clipped around the rollout's values (PPO2 baselines).

        clipped:    0.5 · mean( max((v − t)², (v_clip − t)²) ),  v_clip = v_old + clip(v − v_old, −ε, ε)
        unclipped:  0.5 · mean( (v − t)² )

    Args:
      values, old_values, targets: [N].
    Returns:
      scalar loss.
    """
    squared = jnp.square(values - targets)
    if clip:
        values_clipped = old_values + jnp.clip(values - old_values, -clip_eps, clip_eps)
        squared = jnp.maximum(squared, jnp.square(values_clipped - targets))
    return 0.5 * jnp.mean(squared)


class LossInfo(NamedTuple):
    """The parts of the PPO loss and the diagnostics of one minibatch (scalars)."""

    total_loss: jax.Array
    policy_loss: jax.Array
    value_loss: jax.Array
    entropy: jax.Array
    approx_kl: jax.Array  # mean((ρ − 1) − log ρ), an unbiased, non-negative estimate of KL(π_old || π)
    clip_frac: jax.Array  # fraction of samples with |ρ − 1| > ε


def ppo_loss(
    log_prob: jax.Array,
    old_log_prob: jax.Array,
    advantages: jax.Array,
    values: jax.Array,
    old_values: jax.Array,
    targets: jax.Array,
    entropy: jax.Array,
    *,
    clip_eps: float,
    clip_value: bool,
    vf_coef: float,
    ent_coef: float,
    policy_objective: Callable[[jax.Array, jax.Array, jax.Array], jax.Array] | None = None,
    value_objective: Callable[[jax.Array, jax.Array, jax.Array], jax.Array] | None = None,
) -> tuple[jax.Array, LossInfo]:
    """total = policy_loss + vf_coef · value_loss − ent_coef · mean(entropy).

    Args:
      log_prob, values, entropy: [N] under the current parameters.
      old_log_prob, old_values, advantages, targets: [N] from the rollout.
      policy_objective: (log_prob, old_log_prob, advantages) -> policy loss; None: PPO-clip (`policy_loss`
        with clip_eps). Another drift (DPO, LPO) plugs in here (`sparqrl.algos.ppo.objectives`).
      value_objective: (values, old_values, targets) -> value loss; None: `value_loss` with clip_value.
        A learned value loss plugs in here.
    Returns:
      (scalar total loss, LossInfo).
    """
    if policy_objective is None:
        pi_loss = policy_loss(log_prob, old_log_prob, advantages, clip_eps)
    else:
        pi_loss = policy_objective(log_prob, old_log_prob, advantages)
    if value_objective is None:
        v_loss = value_loss(values, old_values, targets, clip_eps, clip=clip_value)
    else:
        v_loss = value_objective(values, old_values, targets)
    mean_entropy = jnp.mean(entropy)
    total = pi_loss + vf_coef * v_loss - ent_coef * mean_entropy
    log_ratio = log_prob - old_log_prob
    ratio = jnp.exp(log_ratio)
    info = LossInfo(
        total_loss=total,
        policy_loss=pi_loss,
        value_loss=v_loss,
        entropy=mean_entropy,
        approx_kl=jax.lax.stop_gradient(jnp.mean((ratio - 1.0) - log_ratio)),
        clip_frac=jax.lax.stop_gradient(jnp.mean((jnp.abs(ratio - 1.0) > clip_eps).astype(jnp.float32))),
    )
    return total, info

"""A2C's loss (Mnih et al. 2016, arXiv 1602.01783, Algorithm S3, as OpenAI Baselines' a2c computes it)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def a2c_loss(log_prob: jax.Array, values: jax.Array, entropy: jax.Array, advantages: jax.Array, targets: jax.Array,
             *, vf_coef: float, ent_coef: float) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The vanilla policy-gradient actor-critic loss on a batch [N]:

        L = −mean(A_t · log π(a_t|s_t)) + vf_coef · ½ · mean((V(s_t) − R_t)²) − ent_coef · mean(H[π(·|s_t)])

    with A_t = R_t − V(s_t) the fragment's n-step (or GAE) advantages, held constant, and R_t the returns the
    value regresses on. No probability ratio and no clipping: every sample was acted by the policy that is
    learning (on device; on the host up to `--max-lag` versions older, without a correction). The advantages are
    not normalised (Baselines' A2C does not).

    Args:
      log_prob, values, entropy: [N] under the current parameters (they carry the gradient).
      advantages, targets: [N] from the fragment.
    Returns:
      (scalar loss, its terms by name).
    """
    policy_loss = -jnp.mean(jax.lax.stop_gradient(advantages) * log_prob)
    value_loss = 0.5 * jnp.mean(jnp.square(values - jax.lax.stop_gradient(targets)))
    mean_entropy = jnp.mean(entropy)
    total = policy_loss + vf_coef * value_loss - ent_coef * mean_entropy
    return total, {"total_loss": total, "policy_loss": policy_loss, "value_loss": value_loss,
                   "entropy": mean_entropy}

"""DQN targets and losses as small pure functions (shapes in the docstrings; any leading batch axes).

Truncation-aware: the next observation stored with a transition is the environment's `final_obs`
(the observation the step reached, before any auto-reset), and only `terminated` cuts the
bootstrap. A time-limit truncation therefore still bootstraps from Q(final_obs).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def q_target(
    reward: jax.Array,
    terminated: jax.Array,
    next_q_target: jax.Array,
    next_q_online: jax.Array,
    gamma: float | jax.Array,
    double: bool,
) -> jax.Array:
    """One-step Q-learning target, [B].

        y = r + γ · (1 − terminated) · Q_target(s', a*)
        a* = argmax_a Q_target(s', a)   (DQN, Mnih et al. 2015)
        a* = argmax_a Q_online(s', a)   (Double DQN, van Hasselt et al. 2016)

    reward [B], terminated bool [B], next_q_target / next_q_online [B, A] (values of s' = final_obs);
    `double` is static. `next_q_online` is ignored when `double` is False. Gradients do not flow
    through the target.
    """
    chooser = next_q_online if double else next_q_target
    next_action = jnp.argmax(chooser, axis=-1)
    next_value = jnp.take_along_axis(next_q_target, next_action[..., None], axis=-1)[..., 0]
    not_done = 1.0 - terminated.astype(next_value.dtype)
    return jax.lax.stop_gradient(reward + gamma * not_done * next_value)


def chosen_q(q: jax.Array, action: jax.Array) -> jax.Array:
    """Q(s, a) [B] from q [B, A] and integer actions [B]."""
    return jnp.take_along_axis(q, action[..., None].astype(jnp.int32), axis=-1)[..., 0]


def td_loss(q_sa: jax.Array, target: jax.Array, huber_delta: float | None = None) -> jax.Array:
    """Mean TD loss over the batch, [] from q_sa [B] and target [B].

    Default (huber_delta=None): mean squared TD error, mean((Q(s,a) − y)²), as PureJaxRL and
    CleanRL's DQN. With `huber_delta=δ`: mean Huber loss, ½e² for |e| ≤ δ, else δ(|e| − ½δ)
    (the Nature DQN's error clipping).
    """
    error = q_sa - target
    if huber_delta is None:
        return jnp.mean(jnp.square(error))
    abs_error = jnp.abs(error)
    quadratic = jnp.minimum(abs_error, huber_delta)
    return jnp.mean(0.5 * jnp.square(quadratic) + huber_delta * (abs_error - quadratic))

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
    next_value = bootstrap_value(next_q_target, next_q_online, double)
    not_done = 1.0 - terminated.astype(next_value.dtype)
    return jax.lax.stop_gradient(reward + gamma * not_done * next_value)


def bootstrap_value(next_q_target: jax.Array, next_q_online: jax.Array, double: bool) -> jax.Array:
    """Q_target(s', a*) [B], the value every Q-learning target bootstraps from (one-step `q_target`, and the
    n-step target at the window's bootstrap state), with a* = argmax_a Q_target(s', a) (DQN) or
    argmax_a Q_online(s', a) (Double DQN). next_q_target / next_q_online [B, A]; `double` is static."""
    chooser = next_q_online if double else next_q_target
    next_action = jnp.argmax(chooser, axis=-1)
    return jnp.take_along_axis(next_q_target, next_action[..., None], axis=-1)[..., 0]


def chosen_q(q: jax.Array, action: jax.Array) -> jax.Array:
    """Q(s, a) [B] from q [B, A] and integer actions [B]."""
    return jnp.take_along_axis(q, action[..., None].astype(jnp.int32), axis=-1)[..., 0]


def _td_loss_elementwise(error: jax.Array, huber_delta: float | None) -> jax.Array:
    """½e²-style loss per element: e² (huber_delta None) or Huber(e; δ)."""
    if huber_delta is None:
        return jnp.square(error)
    abs_error = jnp.abs(error)
    quadratic = jnp.minimum(abs_error, huber_delta)
    return 0.5 * jnp.square(quadratic) + huber_delta * (abs_error - quadratic)


def td_loss(q_sa: jax.Array, target: jax.Array, huber_delta: float | None = None) -> jax.Array:
    """Mean TD loss over the batch, [] from q_sa [B] and target [B].

    Default (huber_delta=None): mean squared TD error, mean((Q(s,a) − y)²), as PureJaxRL and
    CleanRL's DQN. With `huber_delta=δ`: mean Huber loss, ½e² for |e| ≤ δ, else δ(|e| − ½δ)
    (the Nature DQN's error clipping).
    """
    return jnp.mean(_td_loss_elementwise(q_sa - target, huber_delta))


def weighted_td_loss(
    q_sa: jax.Array, target: jax.Array, weights: jax.Array, huber_delta: float | None = None
) -> jax.Array:
    """Importance-weighted mean TD loss, [] from q_sa, target and weights [B]:

        mean_i w_i · ℓ(Q(s_i, a_i) − y_i)

    with ℓ as in `td_loss`; w_i the prioritized-replay importance weights (Schaul et al. 2016, Alg. 1:
    the update is Σ_i w_i δ_i ∇Q, here divided by B). Gradients do not flow into `weights`.
    """
    weights = jax.lax.stop_gradient(weights)
    return jnp.mean(weights * _td_loss_elementwise(q_sa - target, huber_delta))


def apex_priority(
    reward: jax.Array, terminated: jax.Array, next_q: jax.Array, q_sa: jax.Array, gamma: float | jax.Array
) -> jax.Array:
    """An actor's initial replay priority (Ape-X, Horgan et al. 2018, arXiv 1803.00933, §3), [B]:

        p = | r + γ · (1 − terminated) · max_a Q(s', a) − Q(s, a) |

    from the actor's own copy of the network: q_sa [B] its Q(s, a) when acting, next_q [B, A] its
    values of s' = final_obs. One-step, like this DQN's target (Ape-X uses its n-step return); a
    time-limit truncation bootstraps, a termination does not. Plain max even for Double DQN: the
    actor holds no target network.
    """
    target = q_target(reward, terminated, next_q, next_q, gamma, double=False)
    return jnp.abs(target - q_sa)

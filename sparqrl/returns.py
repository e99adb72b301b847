"""Multi-step TD targets shared by the off-policy actor-critics (TD3, SAC): pure functions of [B, n] windows.

RLx2's delayed multi-step TD target (Tan et al., ICLR 2023, arXiv 2205.15043, §4.2.1; reference spec
`rlx2.md` §4.4-§4.6) with the episode-end bookkeeping of its code, for windows of n consecutive stored
transitions that may cross episode boundaries:

    acc = 0; nd = 1; nr = 1; m = 0          nd: no terminal yet;  nr: no time-limit reset yet
    for k in 0 .. n_active-1:
        acc += nr · nd · γ^k · r_k
        nd  *= max(not_done_k, 1 − nr)      past a reset, later terminals belong to another episode
        w_k  = nr · nd · γ^(k+1)            weight of SAC's entropy bonus at s'_k (nd updated, nr not)
        if k == n_active − 1: stop          the reset flag of the window's last element never counts
        nr  *= 1 − reset_k
        m   += nr                           m: the last index before any reset (the bootstrap index)
    y = acc [+ Σ_k w_k · (−α log π(a'_k|s'_k))] + nd · γ^(m+1) · Q'(s'_m, ·)

`not_done_k = 1 − terminated_k · (1 − truncated_k)`: a step flagged both terminated and truncated counts
as a truncation, as RLx2's code does (its `done_bool` is 0 on the time-limit step); `reset_k =
truncated_k`. So a terminal keeps its own reward and cuts every later reward and the bootstrap; a
time-limit truncation stops the return at that step and bootstraps from that episode's final (pre-reset)
next observation s'_m with discount γ^(m+1). With n_active = 1 this is the ordinary one-step target.

`n_active` may be traced (the switch from 1-step to n-step targets happens inside a jitted loop); the
window length n is static. Window elements k >= n_active get zero weight and never move m.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class NStepTerms(NamedTuple):
    """The bootstrap-independent parts of an n-step target (all without gradient).

    reward_sum      [B]     Σ_k nr·nd·γ^k·r_k, the rewards that belong to the sample's episode
    boot_index      [B]     int32 m: bootstrap from next_obs[:, m]
    boot_discount   [B]     nd · γ^(m+1): 0 when a terminal lies in the window before any reset
    entropy_weight  [B, n]  nr·nd·γ^(k+1) for each element (0 for k >= n_active); used by SAC only
    """

    reward_sum: jax.Array
    boot_index: jax.Array
    boot_discount: jax.Array
    entropy_weight: jax.Array


def nstep_terms(
    reward: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    gamma: float | jax.Array,
    n_active: int | jax.Array | None = None,
) -> NStepTerms:
    """Episode-end bookkeeping of RLx2's multi-step target (module docstring) for windows [B, n].

    reward [B, n] float, terminated [B, n] bool, truncated [B, n] bool (the time-limit reset flag);
    element k is the k-th consecutive stored transition after the sampled one (k = 0).
    `n_active` (int or traced int32 [], 1 <= n_active <= n; default n) is the target's horizon: only
    the first n_active elements are used.
    """
    reward = jnp.asarray(reward, jnp.float32)
    n = reward.shape[-1]
    if n_active is None:
        n_active = n
    terminated = jnp.asarray(terminated, jnp.bool_)
    truncated = jnp.asarray(truncated, jnp.bool_)
    not_done = 1.0 - (terminated & ~truncated).astype(jnp.float32)
    reset = truncated.astype(jnp.float32)
    gamma = jnp.asarray(gamma, jnp.float32)

    batch_shape = reward.shape[:-1]
    acc = jnp.zeros(batch_shape, jnp.float32)
    nd = jnp.ones(batch_shape, jnp.float32)
    nr = jnp.ones(batch_shape, jnp.float32)
    m = jnp.zeros(batch_shape, jnp.int32)
    weights = []
    for k in range(n):  # n is small and static: unrolled, one fused program
        active = k < n_active
        acc = acc + jnp.where(active, nr * nd * gamma**k * reward[..., k], 0.0)
        nd = jnp.where(active, nd * jnp.maximum(not_done[..., k], 1.0 - nr), nd)
        weights.append(jnp.where(active, nr * nd * gamma ** (k + 1), 0.0))
        if k == n - 1:
            break
        last = k >= n_active - 1
        nr = jnp.where(last, nr, nr * (1.0 - reset[..., k]))
        m = jnp.where(last, m, m + nr.astype(jnp.int32))
    boot_discount = nd * gamma ** (m + 1).astype(jnp.float32)
    terms = NStepTerms(acc, m, boot_discount, jnp.stack(weights, axis=-1))
    return jax.tree.map(jax.lax.stop_gradient, terms)


def at_index(x: jax.Array, index: jax.Array) -> jax.Array:
    """x[b, index[b]] for x [B, n, ...] and index int [B] -> [B, ...] (e.g. the bootstrap next_obs)."""
    return jax.vmap(lambda row, i: row[i])(x, index)


def nstep_q_target(terms: NStepTerms, boot_q: jax.Array) -> jax.Array:
    """TD3's multi-step target [B] (rlx2.md §4.4): reward_sum + nd·γ^(m+1)·min Q'(s'_m, a*).

    boot_q [B]: min(Q1', Q2') at the bootstrap state s'_m and the smoothed target action there.
    """
    return jax.lax.stop_gradient(terms.reward_sum + terms.boot_discount * boot_q)


def nstep_soft_q_target(terms: NStepTerms, boot_q: jax.Array, alpha: jax.Array, log_prob: jax.Array) -> jax.Array:
    """SAC's multi-step soft target [B] (rlx2.md §4.5).

        y = reward_sum + Σ_k w_k · (−α · log π(a'_k | s'_k)) + nd·γ^(m+1)·min Q'(s'_m, a'_m)

    boot_q [B]: min(Q1', Q2') at s'_m and the action a'_m sampled there from the current policy;
    alpha []: the temperature (no gradient); log_prob [B, n]: log π(a'_k|s'_k) of fresh samples at
    every next observation of the window. For n = 1: r + γ·not_done·(min Q' − α log π).
    """
    entropy = jnp.sum(terms.entropy_weight * (-alpha * log_prob), axis=-1)
    return jax.lax.stop_gradient(terms.reward_sum + entropy + terms.boot_discount * boot_q)

"""Return targets as pure functions: multi-step TD targets on [B, n] windows (TD3, SAC); V-trace on [T, N].

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

`not_done_k = 1 − terminated_k`, `reset_k = truncated_k`. So a terminal keeps its own reward and cuts
every later reward and the bootstrap; a time-limit truncation stops the return at that step and
bootstraps from that episode's final (pre-reset) next observation s'_m with discount γ^(m+1). A step
flagged both terminated and truncated counts as terminated, as everywhere in sparqrl (docs/environments.md):
RLx2's code counts it as a truncation (its `done_bool` is 0 on the time-limit step), which would
bootstrap from a state whose episode really ended. With n_active = 1 this is the ordinary one-step target.

`n_active` may be traced (the switch from 1-step to n-step targets happens inside a jitted loop); the
window length n is static. Window elements k >= n_active get zero weight and never move m.

IMPALA's V-trace targets and policy-gradient advantages (`vtrace`) are at the end of the module.
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
    not_done = 1.0 - terminated.astype(jnp.float32)  # terminated wins over truncated
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


# ---- IMPALA V-trace (Espeholt et al., ICML 2018, arXiv 1802.01561) ---------------------------------


class VTraceOut(NamedTuple):
    """V-trace targets of a fragment (both without gradient).

    vs             [T, ...]  v_s, the value targets (value loss: (v_s − V(x_s))²)
    pg_advantages  [T, ...]  ρ^pg_s · (r_s + γ·v_{s+1} − V(x_s)), the weights of −log π(a_s|x_s)
    """

    vs: jax.Array
    pg_advantages: jax.Array


def _vtrace_inputs(log_rho: jax.Array, rewards: jax.Array, values: jax.Array, next_values: jax.Array,
                   terminated: jax.Array, truncated: jax.Array) -> tuple[jax.Array, ...]:
    """`vtrace`'s fragment, checked to be of one shape [T, ...]: the first four as float32, then
    terminated and done = terminated | truncated as bool."""
    inputs = dict(log_rho=log_rho, rewards=rewards, values=values, next_values=next_values,
                  terminated=terminated, truncated=truncated)
    shapes = {name: jnp.shape(x) for name, x in inputs.items()}
    if len(set(shapes.values())) != 1 or len(shapes["values"]) < 1:
        raise ValueError(f"vtrace needs inputs of one shape [T, ...]; got {shapes}")
    floats = [jnp.asarray(x, jnp.float32) for x in (log_rho, rewards, values, next_values)]
    terminated = jnp.asarray(terminated, jnp.bool_)
    return *floats, terminated, terminated | jnp.asarray(truncated, jnp.bool_)


def vtrace(
    log_rho: jax.Array,
    rewards: jax.Array,
    values: jax.Array,
    next_values: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    gamma: float | jax.Array,
    rho_bar: float | jax.Array = 1.0,
    c_bar: float | jax.Array = 1.0,
    rho_bar_pg: float | jax.Array | None = None,
    lambda_: float | jax.Array = 1.0,
) -> VTraceOut:
    """V-trace targets and policy-gradient advantages for a fragment of auto-resetting envs.

    The recursive form of IMPALA's V-trace (arXiv 1802.01561 §4.1; reference `actorq_distributed.md`
    §4.2), made truncation-aware the way PPO's `gae` is, and computed by a reverse `lax.scan`:

        ρ_t = min(ρ̄, π/μ),   c_t = λ · min(c̄, π/μ),   ρ^pg_t = min(ρ̄_pg, π/μ)   (clipped in log space)
        δ_t = ρ_t · (r_t + γ_t · V(s'_t) − V(x_t)),     γ_t = γ · (1 − terminated_t)
        a_t = δ_t + γ · c_t · (1 − done_t) · a_{t+1},   a_T = 0        a_t = v_t − V(x_t)
        pg_t = ρ^pg_t · (r_t + γ_t · (V(s'_t) + λ · (1 − done_t) · a_{t+1}) − V(x_t))

    with done_t = terminated_t | truncated_t. s'_t is the observation step t reached before any
    auto-reset (the env's `final_obs`, a Step's `next_obs`), so `next_values[t] = V(s'_t)` equals
    `values[t + 1]` wherever the episode goes on and is the bootstrap value at the fragment's last step
    and at every episode end: a time-limit truncation bootstraps from its own final observation, a
    termination does not bootstrap, and both cut the trace, because row t + 1 belongs to a new episode.
    A step flagged both terminated and truncated counts as terminated (as in `gae` and the `Env`
    protocol). This is PPO's layout: `next_values` is what `algos.base.bootstrap_values` builds, or V of a
    fragment's `next_obs` computed in one batched pass.

    λ (`lambda_`) scales the traces as in rlax's `vtrace` and mixes λ into the policy-gradient bootstrap
    (λ·v_{t+1} + (1 − λ)·V(x_{t+1}), as rlax's `vtrace_td_error_and_advantage`); with λ = 1 this is the
    reference's pg advantage ρ^pg_t·(r_t + γ·v_{t+1} − V(x_t)). On-policy (log_rho = 0, ρ̄, c̄ ≥ 1) both
    v_t − V(x_t) and pg_t are then exactly the GAE(λ) advantage.

    Args:
      log_rho: [T, ...] log π(a_t|x_t) − log μ(a_t|x_t), the learner's over the behaviour policy's.
      rewards, values, next_values: [T, ...] float; values[t] = V(x_t), next_values[t] = V(s'_t).
      terminated, truncated: [T, ...] bool (or 0/1).
      gamma, rho_bar, c_bar, rho_bar_pg (default: rho_bar), lambda_: floats or traced scalars (or
        arrays broadcastable to [T, ...]); the paper assumes ρ̄ ≥ c̄.
    Returns:
      VTraceOut(vs [T, ...], pg_advantages [T, ...]), under stop_gradient.
    """
    log_rho, rewards, values, next_values, terminated, done = _vtrace_inputs(
        log_rho, rewards, values, next_values, terminated, truncated
    )
    if rho_bar_pg is None:
        rho_bar_pg = rho_bar
    f32 = jnp.float32
    gamma, lambda_ = jnp.asarray(gamma, f32), jnp.asarray(lambda_, f32)

    # min(ρ̄, exp(log ρ)) as exp(min(log ρ̄, log ρ)): no overflow for large log ratios (the paper's
    # "operations on rhos in log-space"); log(inf) = inf leaves the ratios unclipped.
    def clipped(bar: float | jax.Array) -> jax.Array:
        return jnp.exp(jnp.minimum(log_rho, jnp.log(jnp.asarray(bar, f32))))

    rho, c, rho_pg = clipped(rho_bar), lambda_ * clipped(c_bar), clipped(rho_bar_pg)
    discount = gamma * (1.0 - terminated.astype(f32))  # γ_t: 0 only at a true end
    goes_on = 1.0 - done.astype(f32)  # row t + 1 continues step t's episode
    deltas = rho * (rewards + discount * next_values - values)
    trace = gamma * c * goes_on

    def backward(acc_tp1: jax.Array, step: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        delta_t, trace_t = step
        acc_t = delta_t + trace_t * acc_tp1  # v_t − V(x_t)
        return acc_t, (acc_t, acc_tp1)

    _, (vs_minus_v, vs_minus_v_tp1) = jax.lax.scan(
        backward, jnp.zeros_like(values[0]), (deltas, jnp.broadcast_to(trace, deltas.shape)), reverse=True
    )
    # acc_tp1 is v_{t+1} − V(x_{t+1}) (0 after the last step); the episode-end mask keeps a new
    # episode's correction out of the bootstrap.
    q = rewards + discount * (next_values + lambda_ * goes_on * vs_minus_v_tp1)
    out = VTraceOut(vs=vs_minus_v + values, pg_advantages=rho_pg * (q - values))
    return jax.tree.map(jax.lax.stop_gradient, out)

"""Dynamic topology: SET and RigL drop/grow, and their schedule. Everything here is jittable.

Drop/grow of one sparse layer (RLx2 reference §3.6, ``_dst_step``; Evci et al. 2020 "RigL";
Mocanu et al. 2018 "SET"), with n_active = |M| (constant) and zeta_t the drop fraction::

    n_prune = floor(n_active * zeta_t)
    M_keep  = top (n_active - n_prune) of |w| among active positions        (drop the smallest)
    M_grow  = top n_prune of score among positions not in M_keep             (just-dropped ones eligible)
              score = |dense gradient|  (RigL)   or   U(0, 1)  (SET, random grow)
    M_new   = M_keep ∨ M_grow                                                (|M_new| = n_active exactly)
    w_new   = w ⊙ M_new ⊙ M_old      (connections new to the mask start at exactly 0, also for SET;
                                       a just-dropped position that is regrown keeps its value)

Ties go to the lower flat index (PyTorch's topk order is unspecified; reference §11).

Schedule (§3.7): the reference scheduler counts its calls. `step` here is that count *including the
current call* (1 at the first training iteration; pass ``iteration + 1`` for a 0-based counter)::

    should_update(step) = step > 0  and  step mod ΔT == 0  and  step < T_end
    zeta(step)          = zeta_0 / 2 * (1 + cos(pi * step / T_end))

Defaults are the reference's: ΔT = 10,000, zeta_0 = 0.5, T_end = 2,975,000 (3M steps minus 25k
warm-up; the TD3 actor's scheduler is called every 2nd iteration and uses T_end = 1,487,500).
`n_prune` is computed in float32 on device; it can differ from the reference's float64
``int(n * zeta)`` only when n * zeta lies within ~1e-7 relative of an integer.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from sparqrl.config import in_unit_interval, is_number, one_of, positive_int, require
from sparqrl.lockstep import lockstep_cond
from sparqrl.sparse.masks import MaskTree, Params, is_sparse, top_k_mask, uniform_scores

TOPOLOGY_METHODS = ("rigl", "set", "static")
"""rigl: gradient grow; set: random grow; static: the mask never changes (the SS baseline)."""


def check_method(value: Any, field: str = "method") -> None:
    one_of(field, value, TOPOLOGY_METHODS)


def cosine_drop_fraction(step: jax.Array | int, zeta0: float, t_end: int) -> jax.Array:
    """zeta_t = zeta_0 / 2 * (1 + cos(pi * t / T_end)) as float32 (RigL's cosine annealing)."""
    t = jnp.asarray(step, jnp.float32)
    return jnp.float32(zeta0) * 0.5 * (1.0 + jnp.cos(jnp.float32(math.pi) * t / jnp.float32(t_end)))


def should_update(step: jax.Array | int, interval: int, t_end: int) -> jax.Array:
    """bool[]: ``step > 0 and step % interval == 0 and step < t_end`` (usable as a lax.cond predicate)."""
    step = jnp.asarray(step)
    return (step > 0) & (step % interval == 0) & (step < t_end)


@dataclasses.dataclass(frozen=True)
class TopologySchedule:
    """When and how the sparse topology changes. Frozen and hashable: close over it in jitted code.

    Checked on construction: a bad value raises ConfigError naming the field.
    """

    method: str = "rigl"
    """'rigl' (grow by |dense gradient|), 'set' (grow at random) or 'static' (never change: SS)."""

    interval: int = 10_000
    """ΔT: scheduler calls between topology updates."""

    t_end: int = 2_975_000
    """T_end: no update at step >= t_end; also the period of the cosine decay of zeta."""

    zeta0: float = 0.5
    """zeta_0: drop fraction at step 0, decayed by the cosine."""

    reset_moments_on_grow: bool = False
    """Zero the optimizer's per-weight state (Adam moments) where the mask changed. The reference
    leaves the moments untouched (quirk 4); this is the option it lists."""

    skip_step_on_update: bool = True
    """Skip the optimizer step on a topology-update iteration, as the reference does (quirk 5)."""

    def __post_init__(self) -> None:
        check_method(self.method)
        positive_int("interval", self.interval)
        positive_int("t_end", self.t_end)
        require(is_number(self.zeta0), "zeta0", self.zeta0,
                "must be a number in [0, 1]")
        in_unit_interval("zeta0", float(self.zeta0))

    def drop_fraction(self, step: jax.Array | int) -> jax.Array:
        """zeta at `step` (float32)."""
        return cosine_drop_fraction(step, self.zeta0, self.t_end)

    def should_update(self, step: jax.Array | int) -> jax.Array:
        """bool[]: whether `step` is a topology-update step (always False for 'static')."""
        if self.method == "static":
            return jnp.zeros((), bool)
        return should_update(step, self.interval, self.t_end)


def n_prune(n_active: jax.Array, drop_fraction: jax.Array | float) -> jax.Array:
    """floor(n_active * zeta), int32, clipped to [0, n_active]."""
    n = jnp.floor(jnp.asarray(n_active, jnp.float32) * jnp.asarray(drop_fraction, jnp.float32)).astype(jnp.int32)
    return jnp.clip(n, 0, n_active)


def drop_and_grow(
    weights: jax.Array, mask: jax.Array, grow_score: jax.Array, n_drop: jax.Array | int
) -> tuple[jax.Array, jax.Array]:
    """One layer's update (module docstring) with an explicit drop count. Returns (weights, mask).

    weights, grow_score: float[*shape]; mask: bool[*shape]; n_drop: int (may be traced),
    0 <= n_drop <= |mask|. Pure and exact: |new mask| == |mask|.
    """
    shape = weights.shape
    w, m = weights.reshape(-1), mask.reshape(-1)
    n_active = jnp.sum(m, dtype=jnp.int32)
    # Inactive positions rank below every active one, so M_keep ⊆ M_old whatever the values.
    drop_score = jnp.where(m, jnp.nan_to_num(jnp.abs(w)), -jnp.inf)
    keep = top_k_mask(drop_score, n_active - n_drop)
    # Finite scores for candidates, -inf for kept positions: M_grow never overlaps M_keep, and there
    # are N - |M_keep| >= n_drop candidates, so exactly n_drop positions are grown.
    candidates = jnp.nan_to_num(grow_score.reshape(-1).astype(jnp.float32), nan=0.0)
    grow = top_k_mask(jnp.where(keep, -jnp.inf, candidates), n_drop)
    new_mask = keep | grow
    new_w = jnp.where(new_mask & m, w, jnp.zeros_like(w))
    return new_w.reshape(shape), new_mask.reshape(shape)


def update_topology(
    key: jax.Array,
    params: Params,
    masks: MaskTree,
    dense_grads: Params | None,
    drop_fraction: jax.Array | float,
    method: str = "rigl",
) -> tuple[Params, MaskTree]:
    """Drop/grow every sparse leaf once. Returns (params, masks); dense leaves are untouched.

    dense_grads: gradient of the loss w.r.t. the stored (zero-filled) params, *before* masking,
    i.e. the dense gradient (required for 'rigl', ignored otherwise). SET draws its grow scores with
    ``masks.uniform_scores(key, shapes of the sparse leaves in tree-flatten order)``.
    'static' returns the inputs.
    """
    check_method(method)
    if method == "static":
        return params, masks
    require(method != "rigl" or dense_grads is not None, "dense_grads", None, "RigL needs the dense gradient")
    p_leaves, treedef = jax.tree.flatten(params)
    m_leaves = treedef.flatten_up_to(masks)
    g_leaves = treedef.flatten_up_to(dense_grads) if method == "rigl" else [None] * len(p_leaves)
    sparse_shapes = [m.shape for m in m_leaves if is_sparse(m)]
    random_scores = uniform_scores(key, sparse_shapes) if method == "set" else [None] * len(sparse_shapes)
    out_p, out_m, i = [], [], 0
    for p, m, g in zip(p_leaves, m_leaves, g_leaves):
        if not is_sparse(m):
            out_p.append(p)
            out_m.append(m)
            continue
        score = jnp.abs(g) if method == "rigl" else random_scores[i]
        k = n_prune(jnp.sum(m, dtype=jnp.int32), drop_fraction)
        new_p, new_m = drop_and_grow(p, m, score, k)
        out_p.append(new_p)
        out_m.append(new_m)
        i += 1
    return jax.tree.unflatten(treedef, out_p), jax.tree.unflatten(treedef, out_m)


def maybe_update_topology(
    key: jax.Array,
    step: jax.Array | int,
    params: Params,
    masks: MaskTree,
    dense_grads: Params | None,
    schedule: TopologySchedule,
) -> tuple[Params, MaskTree, jax.Array]:
    """``update_topology`` under ``lax.cond(schedule.should_update(step))``, for masks kept outside
    the optimizer. Returns (params, masks, updated: bool[])."""
    if schedule.method == "static":
        return params, masks, jnp.zeros((), bool)
    updated = schedule.should_update(step)

    def update(operand: tuple) -> tuple[Params, MaskTree]:
        key, step, params, masks, dense_grads = operand
        return update_topology(key, params, masks, dense_grads, schedule.drop_fraction(step), schedule.method)

    operand = (key, jnp.asarray(step), params, masks, dense_grads)
    params, masks = lockstep_cond(updated, update, lambda op: (op[2], op[3]), operand)
    return params, masks, updated

"""The optax wrapper that keeps pruned weights at exactly 0, and the sparse training step.

``masked(inner, masks)`` wraps any optax transformation (reference §3.5, §3.9, §11)::

    g   <- g ⊙ M                          (the optimizer only ever sees masked gradients)
    u   <- inner(g)
    u'  <- where(M, u, -p)                so that p + u' = M ⊙ (p + u): pruned weights become exactly 0

It must be the outermost transformation (nothing may rescale its output). The masks live in the
optimizer state (``MaskedState.masks``), so they travel with ``opt_state`` through jit, scan, vmap
and checkpoints, and change with ``set_masks`` after a topology update (``topology_step`` and
``apply_gradients`` do this for you). Adam's moments are left untouched by default, as in the
reference (§3.9, quirk 4: inactive weights get zero gradients so their moments decay, and a
regrown weight's moments are ≈0 after the ≥10k steps it typically spent inactive);
``reset_moments_on_grow=True`` instead zeroes every per-weight state entry whose mask changed.

Typical use (TD3 critic, masks in the optimizer state)::

    params, masks = init_masks(key, params, 0.85)                  # ER + magnitude mask
    tx = masked(optax.adam(3e-4), masks)
    opt_state = tx.init(params)
    target = params                                                # already masked
    ...
    grads = jax.grad(loss)(params)                                 # dense gradient
    step = apply_gradients(key, it + 1, params, opt_state, grads, tx, schedule)
    params, opt_state = step.params, step.opt_state
    target = masked_polyak(params, target, tau, get_masks(opt_state))

Under ``vmap`` over seeds the gates are `sparqrl.lockstep.lockstep_cond`s: a batched step counter
(seeds in lockstep) still skips the sort-based topology update on the iterations that do not update.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from sparqrl.lockstep import lockstep_cond
from sparqrl.sparse.masks import MaskTree, Params, is_sparse
from sparqrl.sparse.topology import TopologySchedule, update_topology


class MaskedState(NamedTuple):
    """State of `masked`: the inner optimizer's state and the current masks."""

    inner: optax.OptState
    masks: MaskTree


def _check_masks(masks: MaskTree, params: Params) -> None:
    if jax.tree.structure(masks) != jax.tree.structure(params):
        raise ValueError("masks must have exactly the structure of params (see sparqrl.sparse.masks)")
    for m, p in zip(jax.tree.leaves(masks), jax.tree.leaves(params)):
        if is_sparse(m) and m.shape != p.shape:
            raise ValueError(f"mask shape {m.shape} does not match parameter shape {p.shape}")


def masked(
    inner: optax.GradientTransformation, masks: MaskTree | Callable[[Params], MaskTree]
) -> optax.GradientTransformationExtraArgs:
    """Wrap `inner` so that pruned weights stay exactly 0 (module docstring).

    masks: the initial mask tree, or a function ``params -> masks`` called by ``init``.
    ``update(grads, state, params, **extra)`` requires `params`; extra arguments go to `inner`.
    """
    inner = optax.with_extra_args_support(inner)

    def init_fn(params: Params) -> MaskedState:
        m = masks(params) if callable(masks) else masks
        _check_masks(m, params)
        return MaskedState(inner.init(params), m)

    def update_fn(updates, state: MaskedState, params: Params | None = None, **extra_args: Any):
        if params is None:
            raise ValueError("sparqrl.sparse.masked needs params: call tx.update(grads, state, params)")
        grads = jax.tree.map(lambda g, m: jnp.where(m, g, jnp.zeros_like(g)) if is_sparse(m) else g,
                             updates, state.masks)
        updates, inner_state = inner.update(grads, state.inner, params, **extra_args)
        updates = jax.tree.map(
            lambda u, p, m: jnp.where(m, u, -p).astype(u.dtype) if is_sparse(m) else u,
            updates, params, state.masks,
        )
        return updates, MaskedState(inner_state, state.masks)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _is_masked_state(x: Any) -> bool:
    return isinstance(x, MaskedState)


def get_masks(opt_state: optax.OptState) -> MaskTree:
    """The masks of the (single) `masked` state inside `opt_state` (which may be a chain's tuple)."""
    found = [x for x in jax.tree.leaves(opt_state, is_leaf=_is_masked_state) if _is_masked_state(x)]
    if len(found) != 1:
        raise ValueError(f"expected exactly one MaskedState in the optimizer state, found {len(found)}")
    return found[0].masks


def reset_changed_entries(inner_state: optax.OptState, old: MaskTree, new: MaskTree) -> optax.OptState:
    """Zero the per-weight entries of every params-shaped subtree of `inner_state` (Adam's mu and
    nu, momentum traces...) where the mask changed (grown or dropped). Scalars such as Adam's step
    count are not touched."""
    treedef = jax.tree.structure(new)
    changed = jax.tree.map(lambda o, n: (o != n) if is_sparse(n) else n, old, new)

    def params_like(x: Any) -> bool:
        return not _is_masked_state(x) and jax.tree.structure(x) == treedef

    def reset(sub: Any) -> Any:
        if not params_like(sub):
            return sub
        return jax.tree.map(
            lambda x, c: jnp.where(c, jnp.zeros_like(x), x) if is_sparse(c) and x.shape == c.shape else x,
            sub, changed,
        )

    return jax.tree.map(reset, inner_state, is_leaf=params_like)


def set_masks(opt_state: optax.OptState, masks: MaskTree, *, reset_changed: bool = False) -> optax.OptState:
    """Replace the masks held by the `masked` state inside `opt_state`; with `reset_changed`,
    also zero the inner optimizer's entries where the mask changed (`reset_changed_entries`)."""

    def swap(x: Any) -> Any:
        if not _is_masked_state(x):
            return x
        inner = reset_changed_entries(x.inner, x.masks, masks) if reset_changed else x.inner
        return MaskedState(inner, masks)

    get_masks(opt_state)  # exactly one MaskedState, or a clear error
    return jax.tree.map(swap, opt_state, is_leaf=_is_masked_state)


class SparseStep(NamedTuple):
    """Result of `topology_step` / `apply_gradients`."""

    params: Params
    opt_state: optax.OptState
    topology_updated: jax.Array
    """bool[]: whether this step changed the topology."""


def topology_step(
    key: jax.Array,
    step: jax.Array | int,
    params: Params,
    opt_state: optax.OptState,
    dense_grads: Params | None,
    schedule: TopologySchedule,
) -> SparseStep:
    """If ``schedule.should_update(step)``: drop/grow with ``zeta = schedule.drop_fraction(step)``
    and the masks held in `opt_state`, then store the new masks there (resetting changed optimizer
    entries if ``schedule.reset_moments_on_grow``). Otherwise returns the inputs. Jittable.

    step: scheduler-call count including this call (1-based; see `sparqrl.sparse.topology`).
    dense_grads: unmasked gradient w.r.t. `params` (RigL); may be None for 'set'/'static'.
    """
    if schedule.method == "static":
        return SparseStep(params, opt_state, jnp.zeros((), bool))
    updated = schedule.should_update(step)

    def update(operand: tuple) -> tuple[Params, optax.OptState]:
        key, step, params, opt_state, dense_grads = operand
        new_params, masks = update_topology(
            key, params, get_masks(opt_state), dense_grads, schedule.drop_fraction(step), schedule.method
        )
        return new_params, set_masks(opt_state, masks, reset_changed=schedule.reset_moments_on_grow)

    def keep(operand: tuple) -> tuple[Params, optax.OptState]:
        return operand[2], operand[3]

    operand = (key, jnp.asarray(step), params, opt_state, dense_grads)
    new_params, new_state = lockstep_cond(updated, update, keep, operand)
    return SparseStep(new_params, new_state, updated)


def apply_gradients(
    key: jax.Array,
    step: jax.Array | int,
    params: Params,
    opt_state: optax.OptState,
    grads: Params,
    tx: optax.GradientTransformation,
    schedule: TopologySchedule,
    grow_grads: Params | None = None,
) -> SparseStep:
    """One training iteration of a sparse network, as the reference runs it (§3.7):

    1. `topology_step` (drop/grow on update steps, RigL scoring with the dense `grads`, or with
       `grow_grads` when given: e.g. RLx2 SAC's critic score, which adds the actor loss's gradient);
    2. the optimizer step ``params + tx.update(grads, opt_state, params)``, skipped on update steps
       when ``schedule.skip_step_on_update`` (quirk 5; both params and optimizer state then stay as
       the topology update left them). If not skipped it uses the new masks.

    `tx` must be (or end with) `masked`. Jittable.
    """
    score = grads if grow_grads is None else grow_grads
    params, opt_state, updated = topology_step(key, step, params, opt_state, score, schedule)

    def optimize(operand: tuple) -> tuple[Params, optax.OptState]:
        params, opt_state, grads = operand
        updates, new_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_state

    operand = (params, opt_state, grads)
    if schedule.skip_step_on_update and schedule.method != "static":
        params, opt_state = lockstep_cond(updated, lambda op: (op[0], op[1]), optimize, operand)
    else:
        params, opt_state = optimize(operand)
    return SparseStep(params, opt_state, updated)

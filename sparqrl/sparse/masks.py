"""Mask trees, the initial mask, and sparsity metrics.

A *mask tree* has exactly the structure of its parameter tree (so ``jax.tree.map(f, params, masks)``
works), with two kinds of leaves:

* sparse leaf: ``bool[shape of the kernel]``, True where the weight is active;
* dense leaf (biases, log-std, conv kernels by default...): the scalar ``True`` (shape ``()``).

Whether a leaf is sparse is therefore static (``mask.ndim > 0``) and ``where(mask, p, 0)`` is the
identity on dense leaves by broadcasting. Inactive weights are stored as exact zeros, so the forward
pass of the ordinary (dense) module computes the sparse network, and the gradient with respect to a
stored kernel is the dense gradient RigL's grow step needs (reference §11).

Caveat: inside ``vmap`` over seeds every leaf is unbatched, as required; a mask tree stacked
*outside* vmap gives its dense leaves shape [n_seeds], so call the helpers here inside the vmap.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sparqrl.config import one_of, require
from sparqrl.sparse.allocation import Sparsity, allocate
from sparqrl.sparse.paths import Rule, is_dense_kernel, path_str

Params = Any
MaskTree = Any

INIT_METHODS = ("magnitude", "random")
"""Allowed values of the initial-mask `method`."""


def is_sparse(mask_leaf: Any) -> bool:
    """A mask leaf is sparse iff it has dimensions (static under jit)."""
    return jnp.ndim(mask_leaf) > 0


def dense_mask() -> jax.Array:
    """The mask leaf of a dense parameter: scalar True."""
    return jnp.ones((), dtype=bool)


def apply_masks(tree: Params, masks: MaskTree) -> Params:
    """Zero the inactive entries: ``where(m, x, 0)`` leafwise; dense leaves pass through.

    Use it on gradients, on a freshly initialised tree, and on target networks after each Polyak
    update (targets share the online masks; reference §3.8).
    """
    return jax.tree.map(lambda x, m: jnp.where(m, x, jnp.zeros_like(x)) if is_sparse(m) else x, tree, masks)


def masked_polyak(online: Params, target: Params, tau: float | jax.Array, masks: MaskTree) -> Params:
    """Target update of TD3/SAC with the online masks (RLx2 TD3.py:120-132, SAC.py:150-156)::

        target <- M ⊙ (tau * online + (1 - tau) * target)
    """
    return apply_masks(jax.tree.map(lambda o, t: tau * o + (1.0 - tau) * t, online, target), masks)


def top_k_mask(score: jax.Array, k: jax.Array | int) -> jax.Array:
    """bool[N]: True at the k largest entries of a flat `score` [N]; ties go to the lower index.

    Built from ranks (stable argsort), so `k` may be a traced integer (reference §11). Exactly k
    entries are True for 0 <= k <= N, whatever the scores (NaN included).
    """
    order = jnp.argsort(-score, stable=True)
    ranks = jnp.zeros(score.shape, jnp.int32).at[order].set(jnp.arange(score.shape[0], dtype=jnp.int32))
    return ranks < k


def uniform_scores(key: jax.Array, shapes: Sequence[tuple[int, ...]]) -> list[jax.Array]:
    """U(0, 1) scores for several leaves from one draw: ``jax.random.uniform(key, (sum_l N_l,))``
    cut in order and reshaped (one PRNG call compiles much faster than one per leaf)."""
    sizes = [math.prod(s) for s in shapes]
    flat = jax.random.uniform(key, (sum(sizes),))
    bounds = np.cumsum([0] + sizes)
    return [flat[a:b].reshape(s) for a, b, s in zip(bounds[:-1], bounds[1:], shapes)]


def check_init_method(value: Any, field: str = "init_mask") -> None:
    one_of(field, value, INIT_METHODS)


def init_masks(
    key: jax.Array | None,
    params: Params,
    sparsity: Sparsity,
    *,
    allocation: str = "er",
    method: str = "magnitude",
    rule: Rule = is_dense_kernel,
    keep_dense: Sequence[str] = (),
) -> tuple[Params, MaskTree]:
    """Sparsify a freshly initialised tree. Returns (params with inactive weights = 0, masks).

    Per sparse leaf l the allocation (`allocate`) fixes n_active = N_l - int(s_l N_l), and the mask
    keeps exactly n_active entries:

    * ``magnitude`` (reference default, §3.4 ``weight_sparsify``): the n_active largest |w| of the
      dense initialisation; survivors keep their values (no rescaling). `key` is unused (may be None).
    * ``random``: n_active positions uniformly at random (quirk 7's option); needs `key`; the
      scores are `uniform_scores(key, shapes of the sparse leaves in flatten order)`.

    Ties go to the lower flat index. Jittable and vmappable over `key` (counts are static).
    `sparsity`, `allocation` and `method` are checked on the host (ConfigError).
    """
    check_init_method(method, "method")
    allocs = {a.path: a for a in allocate(params, sparsity, allocation, rule=rule, keep_dense=keep_dense)}
    require(method != "random" or key is not None, "key", key, "a PRNG key is needed for method='random'")
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    sparse_shapes = [a.shape for a in allocs.values()]
    scores = uniform_scores(key, sparse_shapes) if method == "random" else [None] * len(allocs)
    new_params, masks, i = [], [], 0
    for path, leaf in leaves:
        alloc = allocs.get(path_str(path))
        if alloc is None:
            new_params.append(leaf)
            masks.append(dense_mask())
            continue
        score = jnp.abs(leaf) if method == "magnitude" else scores[i]
        mask = top_k_mask(score.reshape(-1), alloc.n_active).reshape(leaf.shape)
        new_params.append(jnp.where(mask, leaf, jnp.zeros_like(leaf)))
        masks.append(mask)
        i += 1
    return jax.tree.unflatten(treedef, new_params), jax.tree.unflatten(treedef, masks)


def layer_active_counts(masks: MaskTree) -> dict[str, jax.Array]:
    """{path: number of active weights} for every sparse leaf (int32 scalars; jittable)."""
    return {
        path_str(p): jnp.sum(m, dtype=jnp.int32)
        for p, m in jax.tree_util.tree_flatten_with_path(masks)[0]
        if is_sparse(m)
    }


def global_sparsity(masks: MaskTree) -> jax.Array:
    """Fraction of zeros over all sparse leaves together: 1 - sum_l active_l / sum_l N_l (0 if none)."""
    sparse = [m for m in jax.tree.leaves(masks) if is_sparse(m)]
    if not sparse:
        return jnp.zeros((), jnp.float32)
    active = sum(jnp.sum(m, dtype=jnp.int32) for m in sparse)
    return 1.0 - active / sum(m.size for m in sparse)

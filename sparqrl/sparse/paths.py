"""Naming the leaves of a parameter tree, and the rule that says which leaves are sparse.

A leaf's *path* is its tree keys joined by '/', e.g. ``"params/MLP_0/Dense_1/kernel"`` for a flax tree
``{'params': {'MLP_0': {'Dense_1': {'kernel': ..., 'bias': ...}}}}``. Paths identify layers in
allocations, group patterns, accounting and metrics.

Which leaves are sparse (RLx2, Tan et al. ICLR 2023; reference §3.2): only the weight matrices of
fully connected layers. In a flax tree these are the leaves named ``kernel`` with two dimensions
(``nn.Dense``). Biases, log-std vectors, conv kernels (4-D) and anything else stay dense. No layer is
forced dense by position: the reference hard-codes ``keep_first_layer_dense=False`` and lets ER
allocation make the small layers dense on its own (§3.3, §3.10). `keep_dense` patterns exist to
opt layers out explicitly (the reference's unexposed ``keep_first_layer_dense``, quirk 16).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

import jax
import numpy as np

from sparqrl.config import require

Rule = Callable[[str, Any], bool]
"""Decides whether the leaf at `path` (a '/'-joined string) is sparse: ``rule(path, leaf) -> bool``."""


def _key_name(key: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def path_str(path: Sequence[Any]) -> str:
    """'/'-joined names of a jax key path (DictKey, GetAttrKey, SequenceKey...)."""
    return "/".join(_key_name(k) for k in path)


def leaf_shape(leaf: Any) -> tuple[int, ...]:
    """Shape of an array, a ``jax.ShapeDtypeStruct`` or a scalar."""
    return tuple(getattr(leaf, "shape", np.shape(leaf)))


def is_dense_kernel(path: str, leaf: Any) -> bool:
    """Default rule: a 2-D leaf named ``kernel`` (the weight matrix [I, O] of ``flax.linen.Dense``)."""
    return path.rsplit("/", 1)[-1] == "kernel" and len(leaf_shape(leaf)) == 2


def is_any_kernel(path: str, leaf: Any) -> bool:
    """Dense and conv kernels (any leaf named ``kernel`` with >= 2 dims). Not the reference's choice:
    RLx2 only sparsifies ``nn.Linear`` weights; offered for CNN torsos (ER then uses the ERK score)."""
    return path.rsplit("/", 1)[-1] == "kernel" and len(leaf_shape(leaf)) >= 2


def _check_patterns(keep_dense: Sequence[str]) -> None:
    require(not isinstance(keep_dense, str), "keep_dense", keep_dense, "must be a sequence of regex patterns")
    for pattern in keep_dense:
        try:
            re.compile(pattern)
        except re.error as err:
            require(False, "keep_dense", pattern, f"must be a valid regular expression ({err})")


def sparse_leaves(
    params: Any, rule: Rule = is_dense_kernel, keep_dense: Sequence[str] = ()
) -> list[tuple[str, tuple[int, ...]]]:
    """(path, shape) of every sparse leaf, in ``jax.tree_util`` flatten order (dict keys sorted).

    A leaf is sparse when ``rule(path, leaf)`` holds and no `keep_dense` regex ``re.search``-matches
    its path.
    """
    _check_patterns(keep_dense)
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        name = path_str(path)
        if rule(name, leaf) and not any(re.search(p, name) for p in keep_dense):
            out.append((name, leaf_shape(leaf)))
    return out

"""Parameter counts, model size and FLOPs ratios of sparse networks versus their dense versions.

Host-side (masks must be concrete). What is counted, following RLx2 Table 2 as analysed in the
reference (§3.11, §7):

* **Weights** are the leaves with >= 2 dims (Dense and conv kernels); a weight is *active* if its
  mask entry is True (dense leaves are fully active). **Other** parameters (biases, log-std,
  scalars: leaves with < 2 dims) are always dense.
* **Size ratio** = sum of active weights / sum of weights over the networks listed, weights only
  (no biases). List every stored copy: RLx2's "Total Size" counts target networks too, which is
  what makes the SAC rows match (actor + critic + critic target; TD3 rows are unchanged by targets
  because every network has its target). ``include_other=True`` adds the dense other-parameters
  to both sides (the "with biases" figure of quirk 15).
* **FLOPs** of one forward pass per sample = multiply-accumulates of the weights:
  F = sum_l u_l * active_l, dense F_D = sum_l u_l * N_l, with u_l = 1 for a Dense kernel (each
  weight is used once per sample) and u_l given by `uses` otherwise (e.g. H_out * W_out for a
  conv kernel). Biases, activations and distribution heads are not counted: with them the paper's
  FLOPs (Test) could not equal the actor density exactly, which it does in all 8 rows.
* **Inference FLOPs ratio** = F / F_D of the acting network alone (the paper counts only the
  actor's forward pass: FLOPs (Test) = actor density).
* **Training FLOPs ratio** = sum_n c_n F_n / sum_n c_n F_D,n with c_n the forward-pass
  equivalents of network n per training iteration (a trained network costs 3: forward, backward to
  activations, backward to weights; a target-network forward pass costs 1; an update every k-th
  iteration costs 3/k). The paper's exact formula is in its App. C.3, not available here; its
  TD3 rows are reproduced to 0.001 by weighting the actor and the twin critic 1 : 1.5
  (c_actor = 1, c_critic = 1.5, i.e. dense FLOPs about 1 : 3; reference §7), its SAC rows include
  a dense term that cannot be identified. The cost of the dense gradient on topology-update steps
  (once per ΔT = 10,000 iterations) is ignored, as the paper calls it negligible.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from sparqrl.sparse.masks import MaskTree, Params, is_sparse
from sparqrl.sparse.paths import leaf_shape, path_str


@dataclasses.dataclass(frozen=True)
class WeightCount:
    """One weight leaf: its path, its size N_l and its number of active entries."""

    path: str
    size: int
    active: int


@dataclasses.dataclass(frozen=True)
class ParamCount:
    """Counts of one network (one stored copy)."""

    weights: tuple[WeightCount, ...]
    """Every leaf with >= 2 dims."""
    other: int
    """Entries of the leaves with < 2 dims (biases, log-std...): always dense."""

    @property
    def total_weights(self) -> int:
        return sum(w.size for w in self.weights)

    @property
    def active_weights(self) -> int:
        return sum(w.active for w in self.weights)

    @property
    def total(self) -> int:
        """All parameters of the dense network."""
        return self.total_weights + self.other

    @property
    def active(self) -> int:
        """Parameters actually stored by the sparse network (active weights + other)."""
        return self.active_weights + self.other

    def flops(self, uses: Mapping[str, int] | None = None) -> tuple[int, int]:
        """(dense, sparse) multiply-accumulates of one forward pass per sample (module docstring)."""
        uses = uses or {}
        dense = sum(uses.get(w.path, 1) * w.size for w in self.weights)
        sparse = sum(uses.get(w.path, 1) * w.active for w in self.weights)
        return dense, sparse


def count_params(params: Params, masks: MaskTree | None = None, *, active: Mapping[str, int] | None = None) -> ParamCount:
    """Count a network's weights (active per `masks`, or per `active` {path: count}; all if neither)
    and other parameters.

    `params` may hold arrays or ``jax.ShapeDtypeStruct``s; `masks` must be concrete.
    """
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    mask_leaves = [None] * len(leaves) if masks is None else jax.tree.structure(params).flatten_up_to(masks)
    weights, other = [], 0
    for (path, leaf), m in zip(leaves, mask_leaves):
        shape = leaf_shape(leaf)
        size = math.prod(shape)
        if len(shape) < 2:
            other += size
            continue
        name = path_str(path)
        if m is not None and is_sparse(m):
            n_active = int(np.asarray(m).sum())
        else:
            n_active = (active or {}).get(name, size)
        weights.append(WeightCount(name, size, n_active))
    return ParamCount(tuple(weights), other)


def size_ratio(networks: Sequence[ParamCount], *, include_other: bool = False) -> float:
    """Stored size of the sparse networks / that of the dense ones (list targets too, see above)."""
    num = sum(n.active_weights + (n.other if include_other else 0) for n in networks)
    den = sum(n.total_weights + (n.other if include_other else 0) for n in networks)
    return num / den


def train_flops_ratio(
    networks: Sequence[tuple[ParamCount, float]], uses: Mapping[str, int] | None = None
) -> float:
    """sum_n c_n F_n / sum_n c_n F_D,n for (count, c_n) pairs (module docstring)."""
    dense = sum(c * n.flops(uses)[0] for n, c in networks)
    sparse = sum(c * n.flops(uses)[1] for n, c in networks)
    return sparse / dense


def inference_flops_ratio(policy: ParamCount, uses: Mapping[str, int] | None = None) -> float:
    """F / F_D of one forward pass of the acting network."""
    dense, sparse = policy.flops(uses)
    return sparse / dense


def summary(counts: Mapping[str, ParamCount], *, acting: str, train_weights: Mapping[str, float],
            stored: Sequence[str] | None = None, dense: Mapping[str, ParamCount] | None = None) -> dict[str, Any]:
    """The sparse fields of ``summary.json`` from named network counts.

    counts: {'actor': ..., 'critic': ...}; acting: the name of the network that acts;
    train_weights: c_n per name; stored: the names to count in the size ratio, repeated for target
    copies (default: every name once); dense: the counts of the dense networks the ratios are
    against, when they differ in shape from `counts` (a narrower "Tiny" network; default: the dense
    versions of `counts` themselves). Returns ``{NAME_sparsity, size_ratio, train_flops_ratio,
    infer_flops_ratio}``; NAME_sparsity is 1 - active weights / dense weights.
    """
    dense = counts if dense is None else dense
    names = list(stored if stored is not None else counts)
    out: dict[str, Any] = {f"{k}_sparsity": 1.0 - v.active_weights / dense[k].total_weights for k, v in counts.items()}
    out["size_ratio"] = sum(counts[k].active_weights for k in names) / sum(dense[k].total_weights for k in names)
    out["train_flops_ratio"] = (sum(c * counts[k].flops()[1] for k, c in train_weights.items())
                                / sum(c * dense[k].flops()[0] for k, c in train_weights.items()))
    out["infer_flops_ratio"] = counts[acting].flops()[1] / dense[acting].flops()[0]
    return out

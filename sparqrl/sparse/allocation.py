"""Layer sparsity allocation: how a network's global sparsity S is split over its sparse layers.

Everything here runs on the host, in Python floats, before tracing: the per-layer counts fix the
array shapes of everything downstream.

* ``uniform``: s_l = S for every sparse layer.
* ``er`` (Erdős–Rényi; Mocanu et al. 2018, Evci et al. 2020; RLx2 reference §3.3, ``sparse_set``):
  density 1 - s_l = eps * (I_l + O_l) / (I_l * O_l), with eps solved so that the kept weights total
  (1 - S) * sum_l N_l. While some density would exceed 1, the layer(s) with the largest raw score
  (I+O)/(I*O) are made dense, their weights leave the budget and eps is solved again::

      dense = {}
      repeat:
          budget = (1 - S) * sum_l N_l - sum_{l in dense} N_l
          eps    = budget / sum_{l not in dense} (I_l + O_l)
          if eps * max_{l not in dense} score_l <= 1: stop
          dense |= {l not in dense with score_l == max score}

  Layers tied at the maximum score (twin Q-networks) are made dense together, as the reference code
  does; adding them one at a time gives the same result (eps only grows as layers leave the budget).
  For kernels with more than 2 dims the score is sum(shape)/prod(shape) (ERK; equal to ER in 2-D).
* The number of zeros of layer l is ``int(s_l * N_l)`` (floor, as the reference); it keeps
  ``N_l - int(s_l * N_l)`` weights. This count stays exact for the whole run.

ER is solved jointly over all sparse leaves of the tree given (the reference has one scheduler per
network, and the twin critics share one). Pass a mapping ``{regex: S}`` as `sparsity` to solve
several groups in one tree separately (e.g. PPO's actor and critic living in one ActorCritic tree).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Mapping, Sequence

from sparqrl.config import fail, in_unit_interval, is_number, one_of, require
from sparqrl.sparse.paths import Rule, is_dense_kernel, sparse_leaves

ALLOCATIONS = ("er", "uniform")
"""Allowed values of `allocation`."""

Sparsity = float | Mapping[str, float]
"""A global sparsity in [0, 1), or ``{regex: sparsity}`` groups solved separately."""


def check_sparsity(value: Any, field: str = "sparsity") -> None:
    """ConfigError unless `value` is a number in [0, 1) (1 would leave a layer without weights)."""
    require(
        is_number(value), field, value, "must be a number in [0, 1)"
    )
    in_unit_interval(field, float(value), closed_right=False)


def check_allocation(value: Any, field: str = "allocation") -> None:
    one_of(field, value, ALLOCATIONS)


@dataclasses.dataclass(frozen=True)
class LayerAllocation:
    """The fixed budget of one sparse leaf: shape, sparsity s_l and exact kept count."""

    path: str
    """Leaf path, e.g. 'params/Dense_0/kernel'."""
    shape: tuple[int, ...]
    """Kernel shape ([I, O] for Dense)."""
    sparsity: float
    """s_l from the allocation rule (before rounding the count)."""

    @property
    def size(self) -> int:
        """N_l = prod(shape)."""
        return math.prod(self.shape)

    @property
    def n_zeros(self) -> int:
        """int(s_l * N_l), the reference's count of pruned weights."""
        return int(self.sparsity * self.size)

    @property
    def n_active(self) -> int:
        """N_l - int(s_l * N_l): the exact number of active weights, constant through training."""
        return self.size - self.n_zeros

def uniform_sparsities(shapes: Sequence[Sequence[int]], sparsity: float) -> list[float]:
    """s_l = S for every layer."""
    check_sparsity(sparsity)
    return [float(sparsity)] * len(shapes)


def er_sparsities(shapes: Sequence[Sequence[int]], sparsity: float) -> list[float]:
    """Per-layer sparsities s_l of the Erdős–Rényi rule (module docstring), solved jointly.

    shapes: kernel shapes, e.g. [(17, 256), (256, 256), (256, 6)]. Returns [s_l] in the same order.
    """
    check_sparsity(sparsity)
    sizes = [math.prod(s) for s in shapes]
    scores = [sum(s) / math.prod(s) for s in shapes]
    total = sum(sizes)
    dense: set[int] = set()
    eps = 0.0
    while True:
        free = [i for i in range(len(shapes)) if i not in dense]
        if not free:
            break
        budget = (1.0 - sparsity) * total - sum(sizes[i] for i in dense)
        divisor = sum(scores[i] * sizes[i] for i in free)
        eps = budget / divisor
        top = max(scores[i] for i in free)
        if eps * top <= 1.0:
            break
        dense |= {i for i in free if scores[i] == top}
    return [0.0 if i in dense else 1.0 - eps * scores[i] for i in range(len(shapes))]


def layer_sparsities(shapes: Sequence[Sequence[int]], sparsity: float, allocation: str = "er") -> list[float]:
    """Dispatch on `allocation` ('er' or 'uniform')."""
    check_allocation(allocation)
    return (er_sparsities if allocation == "er" else uniform_sparsities)(shapes, sparsity)


def _groups(paths: Sequence[str], sparsity: Sparsity) -> list[tuple[float, list[int]]]:
    """Split leaf indices into (sparsity, members) groups; the first matching pattern wins."""
    if not isinstance(sparsity, Mapping):
        check_sparsity(sparsity)
        return [(float(sparsity), list(range(len(paths))))]
    members: dict[str, list[int]] = {p: [] for p in sparsity}
    for pattern, value in sparsity.items():
        check_sparsity(value, f"sparsity[{pattern!r}]")
        try:
            re.compile(pattern)
        except re.error as err:
            fail("sparsity", pattern, f"group keys must be valid regular expressions ({err})")
    for i, path in enumerate(paths):
        match = next((p for p in sparsity if re.search(p, path)), None)
        if match is None:
            fail("sparsity", dict(sparsity), f"no group pattern matches the sparse layer {path!r}")
        members[match].append(i)
    return [(float(sparsity[p]), idx) for p, idx in members.items() if idx]


def allocate(
    params: Any,
    sparsity: Sparsity,
    allocation: str = "er",
    *,
    rule: Rule = is_dense_kernel,
    keep_dense: Sequence[str] = (),
) -> tuple[LayerAllocation, ...]:
    """The per-leaf budget of a parameter tree (arrays or ``jax.ShapeDtypeStruct`` leaves).

    Returns one LayerAllocation per sparse leaf (see `sparse_leaves`), in tree-flatten order.
    Raises ConfigError for a sparsity outside [0, 1) or an unknown allocation.
    """
    check_allocation(allocation)
    leaves = sparse_leaves(params, rule, keep_dense)
    paths = [p for p, _ in leaves]
    out: list[LayerAllocation | None] = [None] * len(leaves)
    for value, idx in _groups(paths, sparsity):
        for i, s in zip(idx, layer_sparsities([leaves[i][1] for i in idx], value, allocation)):
            out[i] = LayerAllocation(leaves[i][0], leaves[i][1], s)
    return tuple(a for a in out if a is not None)

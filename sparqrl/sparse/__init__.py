"""Dynamic sparse training (RLx2: Tan et al., ICLR 2023, arXiv 2205.15043; RigL: Evci et al. 2020;
SET: Mocanu et al. 2018), for any flax parameter tree.

Parts, each a small set of pure functions:

* `paths`      — leaf paths and the rule for which leaves are sparse (2-D ``kernel`` leaves).
* `allocation` — per-layer sparsities: ``uniform`` and Erdős–Rényi (``er``), exact kept counts.
* `masks`      — mask trees (same structure as params; scalar True for dense leaves), the
                 magnitude/random initial mask, ``apply_masks``/``masked_polyak`` for targets,
                 sparsity metrics.
* `topology`   — SET/RigL drop and grow, cosine drop fraction, ``TopologySchedule``.
* `optim`      — ``masked(inner, masks)`` optax wrapper (pruned weights stay exactly 0; masks
                 in its state), ``get_masks``/``set_masks``, ``topology_step``, ``apply_gradients``.
* `trainer`    — ``NetTraining``: one network's optimizer + sparsity + schedule (init, step,
                 masked Polyak, counts), the one entry point algorithms use; ``matching_width``
                 for the Tiny baseline.
* `transform`  — ``transform(training)``: the same as one optax transformation whose state also counts
                 its calls and holds SET's key (``init_transform``), for learners with a plain optax update.
* `accounting` — parameter counts, size ratio, training/inference FLOPs ratios (RLx2 Table 2).

Bad values (sparsity outside [0, 1), unknown allocation/init/method names, bad schedule fields)
raise ``sparqrl.config.ConfigError`` on the host, before tracing.
"""

from sparqrl.sparse.accounting import (
    ParamCount,
    WeightCount,
    count_params,
    inference_flops_ratio,
    size_ratio,
    summary,
    train_flops_ratio,
)
from sparqrl.sparse.allocation import (
    ALLOCATIONS,
    LayerAllocation,
    allocate,
    check_allocation,
    check_sparsity,
    er_sparsities,
    layer_sparsities,
    uniform_sparsities,
)
from sparqrl.sparse.masks import (
    INIT_METHODS,
    apply_masks,
    check_init_method,
    dense_mask,
    global_sparsity,
    init_masks,
    is_sparse,
    layer_active_counts,
    masked_polyak,
    top_k_mask,
)
from sparqrl.sparse.optim import (
    MaskedState,
    SparseStep,
    apply_gradients,
    get_masks,
    masked,
    reset_changed_entries,
    set_masks,
    topology_step,
)
from sparqrl.sparse.paths import is_any_kernel, is_dense_kernel, path_str, sparse_leaves
from sparqrl.sparse.trainer import NetTraining, matching_width
from sparqrl.sparse.transform import ScheduledState, init_transform, transform
from sparqrl.sparse.topology import (
    TOPOLOGY_METHODS,
    TopologySchedule,
    check_method,
    cosine_drop_fraction,
    drop_and_grow,
    maybe_update_topology,
    n_prune,
    should_update,
    update_topology,
)

__all__ = [
    "ALLOCATIONS",
    "INIT_METHODS",
    "TOPOLOGY_METHODS",
    "LayerAllocation",
    "MaskedState",
    "NetTraining",
    "ParamCount",
    "ScheduledState",
    "SparseStep",
    "TopologySchedule",
    "WeightCount",
    "allocate",
    "apply_gradients",
    "apply_masks",
    "check_allocation",
    "check_init_method",
    "check_method",
    "check_sparsity",
    "cosine_drop_fraction",
    "count_params",
    "dense_mask",
    "drop_and_grow",
    "er_sparsities",
    "get_masks",
    "global_sparsity",
    "inference_flops_ratio",
    "init_masks",
    "init_transform",
    "is_any_kernel",
    "is_dense_kernel",
    "is_sparse",
    "layer_active_counts",
    "layer_sparsities",
    "masked",
    "masked_polyak",
    "matching_width",
    "maybe_update_topology",
    "n_prune",
    "path_str",
    "reset_changed_entries",
    "set_masks",
    "should_update",
    "size_ratio",
    "sparse_leaves",
    "summary",
    "top_k_mask",
    "topology_step",
    "train_flops_ratio",
    "transform",
    "uniform_sparsities",
    "update_topology",
]

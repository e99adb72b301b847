"""How one network is trained under a sparsity budget, the same way for any algorithm.

`NetTraining` bundles the choices of one network — its optimizer, its sparsity (0: dense), its layer
allocation, initial mask and topology schedule — and gives the four operations an algorithm needs:

    params, opt_state = training.init(key, params)          # masks applied, kept in opt_state
    step = training.step(key, count, params, opt_state, grads)   # topology update + masked optimizer step
    target = training.polyak(params, target, tau, opt_state)     # target masked like its online net
    count = training.param_count(abstract_params)            # host-side, for size/FLOPs accounting

A dense network (sparsity 0) goes through the same calls with a plain optimizer and no masks, so an
algorithm has one code path for dense, SS (static schedule), SET and RigL networks. PPO, DQN, TD3 and
SAC networks are all plain flax parameter trees; nothing here knows which algorithm uses it.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from sparqrl.sparse.accounting import ParamCount, count_params
from sparqrl.sparse.allocation import Sparsity, allocate, check_allocation, check_sparsity
from sparqrl.sparse.masks import MaskTree, Params, check_init_method, global_sparsity, init_masks, masked_polyak
from sparqrl.sparse.optim import SparseStep, apply_gradients, get_masks, masked
from sparqrl.sparse.topology import TopologySchedule


def _masks_come_from_init(params: Params) -> MaskTree:
    raise ValueError("NetTraining.tx is for updates only: build the optimizer state with NetTraining.init")


@dataclasses.dataclass(frozen=True)
class NetTraining:
    """One network's optimizer and sparsity. Frozen and hashable: close over it in jitted code."""

    inner: optax.GradientTransformation
    """The optimizer of the active weights (e.g. optax.adam(3e-4))."""
    sparsity: float | tuple[tuple[str, float], ...] = 0.0
    """Fraction of the network's weights pruned (0: dense, no masks), or ``((regex, fraction), ...)``
    groups of one parameter tree solved separately (e.g. the actor and critic of one ActorCritic)."""
    schedule: TopologySchedule = TopologySchedule(method="static")
    """When and how the topology changes; method 'static' is static sparse training (SS)."""
    allocation: str = "er"
    """Layer allocation of the sparsity: 'er' (Erdős–Rényi, RLx2) or 'uniform'."""
    init_method: str = "magnitude"
    """Initial mask: 'magnitude' (largest |w| of the dense init, RLx2's code) or 'random'."""

    def __post_init__(self) -> None:
        groups = self.groups
        if isinstance(groups, dict):
            for pattern, value in groups.items():
                check_sparsity(value, f"sparsity[{pattern!r}]")
        else:
            check_sparsity(groups)
        check_allocation(self.allocation)
        check_init_method(self.init_method)

    @property
    def groups(self) -> Sparsity:
        """`sparsity` as `sparse.allocate` takes it: a float, or a {regex: fraction} dict."""
        return dict(self.sparsity) if isinstance(self.sparsity, tuple) else self.sparsity

    @property
    def is_sparse(self) -> bool:
        groups = self.groups
        return any(v > 0.0 for v in groups.values()) if isinstance(groups, dict) else groups > 0.0

    @property
    def tx(self) -> optax.GradientTransformation:
        """The update transformation; a sparse network's masks live in the state `init` builds."""
        return masked(self.inner, _masks_come_from_init) if self.is_sparse else self.inner

    def init(self, key: jax.Array, params: Params) -> tuple[Params, optax.OptState]:
        """Sparsify freshly initialised `params` (if sparse) and build the optimizer state. Jittable."""
        if not self.is_sparse:
            return params, self.inner.init(params)
        params, masks = init_masks(key, params, self.groups, allocation=self.allocation, method=self.init_method)
        return params, masked(self.inner, masks).init(params)

    def step(
        self, key: jax.Array, count: jax.Array, params: Params, opt_state: optax.OptState, grads: Params,
        grow_grads: Params | None = None,
    ) -> SparseStep:
        """One training iteration: on a topology-update iteration drop/grow (RigL scores with the dense
        `grads`, or `grow_grads` when given), then the masked optimizer step (`sparse.apply_gradients`).
        `count` is this network's scheduler-call count including this call (1-based)."""
        if not self.is_sparse:
            updates, opt_state = self.inner.update(grads, opt_state, params)
            return SparseStep(optax.apply_updates(params, updates), opt_state, jnp.zeros((), bool))
        return apply_gradients(key, count, params, opt_state, grads, self.tx, self.schedule, grow_grads)

    def masks(self, opt_state: optax.OptState) -> MaskTree | None:
        return get_masks(opt_state) if self.is_sparse else None

    def polyak(self, online: Params, target: Params, tau: float, opt_state: optax.OptState) -> Params:
        """target <- tau·online + (1−tau)·target, with the online masks applied (RLx2 §3.8)."""
        if not self.is_sparse:
            return optax.incremental_update(online, target, tau)
        return masked_polyak(online, target, tau, get_masks(opt_state))

    def measured_sparsity(self, opt_state: optax.OptState) -> jax.Array:
        """Fraction of weights inactive in the masks held by `opt_state` (0 for a dense network)."""
        if not self.is_sparse:
            return jnp.zeros((), jnp.float32)
        return global_sparsity(get_masks(opt_state)).astype(jnp.float32)

    def param_count(self, params: Params) -> ParamCount:
        """Weight counts of this network from shapes alone (arrays or ShapeDtypeStructs): the
        allocation fixes every layer's active count, and topology updates never change it."""
        if not self.is_sparse:
            return count_params(params)
        allocation = allocate(params, self.groups, self.allocation)
        return count_params(params, active={a.path: a.n_active for a in allocation})


def matching_width(weights_at_width: Callable[[int], int], budget: int, *, largest: int) -> int:
    """The largest hidden width w in [1, largest] whose dense network has at most `budget` weights
    (`weights_at_width(w)`, increasing in w); 1 if even w = 1 is over. RLx2's "Tiny" baseline: a
    dense network with the parameter count of the sparse one."""
    lo, hi = 1, largest
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if weights_at_width(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo

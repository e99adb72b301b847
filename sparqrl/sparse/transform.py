"""Sparse training as one optax transformation any learner composes (issue 32 item 7).

`NetTraining.step` needs a key and a step count from its caller (TD3 and SAC thread them). A learner
whose update is plain optax (PPO, IMPALA, DQN) instead keeps both in the optimizer state, so its update
code is unchanged::

    optimizer = sparse.transform(training)                 # training.inner for a dense network
    params, opt_state = sparse.init_transform(training, key, params)   # masks applied to params
    ...
    updates, opt_state = optimizer.update(grads, opt_state, params)    # dense grads (RigL scores them)
    params = optax.apply_updates(params, updates)          # the mask-aware parameter update

Each `update` is one scheduler call: it counts itself, and on a topology-update call
(`TopologySchedule.should_update`) drops and grows with the dense `grads` (RigL) or a key split from the
state's (SET), then takes the `masked` optimizer step with the new masks, skipped (pruned weights still
zeroed) when ``schedule.skip_step_on_update``. The updates it returns are ``where(M, u, -p)``, so
``p + update`` is exactly 0 on every pruned weight: the same arithmetic as `apply_gradients`, which
moves the parameters itself, expressed as an update.

A dense `NetTraining` gives back its inner optimizer and draws nothing from `key`: a dense run is bit
for bit what it was before sparse training existed.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from sparqrl.lockstep import lockstep_cond
from sparqrl.sparse.masks import Params, is_sparse
from sparqrl.sparse.optim import MaskedState, topology_step
from sparqrl.sparse.trainer import NetTraining

_MASK_STREAM = 0x5BA25E
"""Folded into the caller's key, so the masks' and topology's streams never reuse the caller's."""


class ScheduledState(NamedTuple):
    """State of `transform`: the `masked` state (inner optimizer and masks), the scheduler's count of
    its calls so far (int32 []) and the key SET's random grow draws from."""

    masked: MaskedState
    count: jax.Array
    key: jax.Array


def init_transform(training: NetTraining, key: jax.Array, params: Params) -> tuple[Params, optax.OptState]:
    """(params with the pruned weights at 0, the state of `transform(training)`) for freshly initialised
    `params`; a dense network's are `params` and ``inner.init(params)``, and `key` is not used. Jittable."""
    if not training.is_sparse:
        return params, training.inner.init(params)
    mask_key, topology_key = jax.random.split(jax.random.fold_in(key, _MASK_STREAM))
    params, masked_state = training.init(mask_key, params)
    return params, ScheduledState(masked_state, jnp.zeros((), jnp.int32), topology_key)


def _skipped(params: Params, masks: Any) -> Params:
    """The update of a skipped optimizer step: 0, but −p on pruned weights (they become exactly 0)."""
    return jax.tree.map(lambda p, m: jnp.where(m, jnp.zeros_like(p), -p) if is_sparse(m) else jnp.zeros_like(p),
                        params, masks)


def transform(training: NetTraining) -> optax.GradientTransformation:
    """The one gradient transformation of `training` (module docstring); build its state with
    `init_transform`. Dense: `training.inner` itself."""
    if not training.is_sparse:
        return training.inner
    tx, schedule = training.tx, training.schedule

    def init_fn(params: Params) -> ScheduledState:
        raise ValueError("sparse.transform's state holds masks and a key: build it with sparse.init_transform")

    def update_fn(grads: Params, state: ScheduledState, params: Params | None = None) -> tuple[Params, ScheduledState]:
        if params is None:
            raise ValueError("sparse.transform needs params: call tx.update(grads, state, params)")
        count = state.count + 1
        key, topology_key = jax.random.split(state.key)
        # Only the masks matter here: the topology's new parameters are where(M_new, p, 0), which the
        # masked update below produces from p itself.
        _, masked_state, updated = topology_step(topology_key, count, params, state.masked, grads, schedule)

        def optimize(operand: tuple) -> tuple[Params, MaskedState]:
            return tx.update(operand[0], operand[1], params)

        def skip(operand: tuple) -> tuple[Params, MaskedState]:
            return _skipped(params, operand[1].masks), operand[1]

        operand = (grads, masked_state)
        if schedule.skip_step_on_update and schedule.method != "static":
            updates, masked_state = lockstep_cond(updated, skip, optimize, operand)
        else:
            updates, masked_state = optimize(operand)
        return updates, ScheduledState(masked_state, count, key)

    return optax.GradientTransformation(init_fn, update_fn)

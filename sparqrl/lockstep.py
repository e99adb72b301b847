"""Control flow that stays cheap when vmapped over seeds whose step counters move in lockstep."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp


def lockstep_cond(pred: jax.Array, true_fn: Callable[[Any], Any], false_fn: Callable[[Any], Any], operand: Any) -> Any:
    """`lax.cond(pred, true_fn, false_fn, operand)` that stays a real branch when vmapped.

    Why: under `vmap` a batched predicate turns `lax.cond` into a select that runs BOTH branches for
    every element, every time. The runners vmap every update over seeds, whose step counters move in
    lockstep, so gates such as "check the buffer every 10,000 env steps" or "update the actor every
    2nd gradient step" would pay for the expensive branch on every update. Here a batched predicate
    becomes `lax.cond(any(pred), per-element select, false branch)`: the same results for any
    predicate, and the expensive branch only runs when some element takes it.

    true_fn and false_fn return the same structure. `custom_vmap` needs every batched input explicit, so
    the traced values they close over (e.g. a learning rate that is a traced hyperparameter, batched over
    members) are hoisted by `jax.closure_convert` and passed along with `operand`.
    """
    true_pure, true_consts = jax.closure_convert(true_fn, operand)
    false_pure, false_consts = jax.closure_convert(false_fn, operand)
    true_fn = lambda o: true_pure(o[0], *o[1])  # noqa: E731
    false_fn = lambda o: false_pure(o[0], *o[2])  # noqa: E731
    operand = (operand, true_consts, false_consts)

    @jax.custom_batching.custom_vmap
    def run(pred: jax.Array, operand: Any) -> Any:
        return jax.lax.cond(pred, true_fn, false_fn, operand)

    @run.def_vmap
    def _rule(axis_size: int, in_batched: list[Any], pred: jax.Array, operand: Any) -> tuple[Any, Any]:
        pred_batched, operand_batched = in_batched
        axes = jax.tree.map(lambda batched: 0 if batched else None, operand_batched)

        def vmapped(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
            return jax.vmap(fn, in_axes=(axes,), axis_size=axis_size)

        if pred_batched:
            per_element = jax.vmap(
                lambda p, o: jax.lax.cond(p, true_fn, false_fn, o), in_axes=(0, axes), axis_size=axis_size
            )
            out = jax.lax.cond(jnp.any(pred), lambda o: per_element(pred, o), vmapped(false_fn), operand)
        else:
            out = jax.lax.cond(pred, vmapped(true_fn), vmapped(false_fn), operand)
        return out, jax.tree.map(lambda _: True, out)

    return run(pred, operand)

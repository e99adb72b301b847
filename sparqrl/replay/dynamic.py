"""RLx2's dynamic-capacity replay: drop the oldest data once the current policy disagrees with it.

Tan et al., ICLR 2023 (arXiv 2205.15043), §4.2.2 and Eq. 6; reference spec `rlx2.md` §5. The buffer is
the uniform ring (`sparqrl.replay.uniform`) whose valid items are the `size` most recent ones (see
`sparqrl.replay.nstep`); dropping the oldest p items is just `size -= p`. The stored items carry a
reference action ā (RLx2's `action_mean`: the behaviour policy's noise-free action, or the random action
itself during warm-up) and the policy distance over the K oldest transitions is

    half_mse (reference code, default):  D = 1/(2·K·|A|) · Σ_i ‖π(s_i) − ā_i‖²    (PyTorch MSE / 2)
    l2       (paper, Eq. 6):             D = 1/K · Σ_i ‖π(s_i) − ā_i‖₂

with actions in the normalised [-1, 1] box (the code divides by a_max). Two shrink rules:

    tenth        (reference code, default): if D > threshold and size > min_size, drop the oldest
                 int(0.1 · size) items; at most one cut per check.
    until_below  (paper): drop the oldest items one by one until D (recomputed over the K oldest that
                 remain) is <= threshold. Here at most K items go per check (the next check goes on),
                 and never below min_size, so the buffer can always be sampled.

How often to check is the caller's choice (`check_due`; the code checks every 10,000 env steps, the
paper "upon any update"); `maybe_adjust` runs the check only when due, through `lockstep_cond`, a
`lax.cond` that stays a real branch when vmapped over seeds.

Units. A ring slot holds one time step of S parallel environments (`sparqrl.replay.nstep`). Sizes
given in transitions are converted to slots: capacity = max_size // S, K_slots = ceil(K / S), and the
min-size test `size·S > min_size` is `size > min_size // S`. With S = 1 (RLx2's single environment)
slots are transitions.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Literal, NamedTuple, get_args

import jax
import jax.numpy as jnp

from sparqrl.config import in_unit_interval, one_of, positive, positive_int, require
from sparqrl.lockstep import lockstep_cond
from sparqrl.replay.nstep import oldest_items
from sparqrl.replay.uniform import BufferState

ShrinkRule = Literal["tenth", "until_below"]
Distance = Literal["half_mse", "l2"]


class DynamicReplay(NamedTuple):
    """The checked, bound settings of a dynamic-capacity buffer (from `make_dynamic_replay`); sizes in slots."""

    capacity: int  # slots in the ring (hard maximum)
    min_size: int  # never shrink a buffer of this many slots or fewer
    num_oldest: int  # K in slots: D is averaged over this many oldest slots
    threshold: float
    shrink: str
    distance: str
    drop_fraction: float  # the `tenth` rule's cut: int(drop_fraction · size)


def make_dynamic_replay(
    max_size: int,
    min_size: int,
    num_oldest: int,
    threshold: float = 0.2,
    shrink: ShrinkRule = "tenth",
    distance: Distance = "half_mse",
    streams: int = 1,
    drop_fraction: float = 0.1,
) -> DynamicReplay:
    """Check the settings on the host (a `ConfigError` names the field) and convert transitions to slots.

    max_size, min_size, num_oldest (K) are in transitions; `streams` is S, the environments per slot.
    """
    for name, value in (("buffer_max_size", max_size), ("buffer_min_size", min_size),
                        ("buffer_num_oldest", num_oldest), ("num_envs", streams)):
        positive_int(name, value)
    require(min_size <= max_size, "buffer_min_size", min_size, f"must be <= buffer_max_size ({max_size})")
    require(max_size >= streams, "buffer_max_size", max_size, f"must be >= num_envs ({streams}): one slot per step")
    require(num_oldest <= max_size, "buffer_num_oldest", num_oldest, f"must be <= buffer_max_size ({max_size})")
    positive("buffer_threshold", threshold)
    one_of("buffer_shrink", shrink, get_args(ShrinkRule))
    one_of("buffer_distance", distance, get_args(Distance))
    in_unit_interval("drop_fraction", drop_fraction)
    return DynamicReplay(
        capacity=max_size // streams,
        min_size=min_size // streams,
        num_oldest=math.ceil(num_oldest / streams),
        threshold=float(threshold),
        shrink=shrink,
        distance=distance,
        drop_fraction=float(drop_fraction),
    )


def action_distance(policy_action: jax.Array, reference_action: jax.Array, kind: str) -> jax.Array:
    """Per-transition distance [...] from actions [..., |A|].

    "half_mse": ½·mean_a (π − ā)²;  "l2": ‖π − ā‖₂.

    Averaging it over the K oldest transitions gives D of the module docstring.
    """
    diff = policy_action - reference_action
    if kind == "half_mse":
        return 0.5 * jnp.mean(jnp.square(diff), axis=-1)
    if kind == "l2":
        return jnp.sqrt(jnp.sum(jnp.square(diff), axis=-1))
    raise ValueError(f"unknown distance {kind!r}; use one of {get_args(Distance)}")


def window_means(values: jax.Array, valid: jax.Array, width: int) -> jax.Array:
    """D(p) = mean of the valid `values` in positions [p, p + width), for p = 0 .. len − width; [len − width + 1].

    values [L] (per-slot distances, oldest first), valid bool [L]. A window with no valid position gives 0.
    """
    values = jnp.where(valid, values, 0.0)
    csum = jnp.concatenate([jnp.zeros(1, values.dtype), jnp.cumsum(values)])
    ccount = jnp.concatenate([jnp.zeros(1, jnp.float32), jnp.cumsum(valid.astype(jnp.float32))])
    total = csum[width:] - csum[:-width]
    count = ccount[width:] - ccount[:-width]
    return jnp.where(count > 0, total / jnp.maximum(count, 1.0), 0.0)


def tenth_rule(size: jax.Array, distance: jax.Array, rule: DynamicReplay) -> jax.Array:
    """Number of oldest slots the reference code drops: int(0.1·size) if D > threshold and size > min_size, else 0."""
    cut = jnp.floor(rule.drop_fraction * size.astype(jnp.float32)).astype(jnp.int32)
    return jnp.where((distance > rule.threshold) & (size > rule.min_size), cut, 0).astype(jnp.int32)


def until_below_rule(size: jax.Array, distances: jax.Array, rule: DynamicReplay) -> jax.Array:
    """Number of oldest slots the paper's rule drops: the smallest p with D(p) <= threshold.

    distances [P + 1]: D(p) after dropping p slots (`window_means`). p never exceeds size − min_size
    (nor P); if no allowed p brings D under the threshold, the largest allowed p is dropped.
    """
    p = jnp.arange(distances.shape[0], dtype=jnp.int32)
    allowed = p <= jnp.maximum(size - rule.min_size, 0)
    below = (distances <= rule.threshold) & allowed
    first_below = jnp.argmax(below).astype(jnp.int32)
    largest_allowed = jnp.minimum(jnp.maximum(size - rule.min_size, 0), distances.shape[0] - 1)
    return jnp.where(jnp.any(below), first_below, largest_allowed).astype(jnp.int32)


class AdjustInfo(NamedTuple):
    distance: jax.Array  # float32 [], D over the K oldest transitions before dropping (0 if not checked)
    dropped: jax.Array  # int32 [], slots dropped


def adjust(
    state: BufferState,
    rule: DynamicReplay,
    actions_fn: Callable[[Any], tuple[jax.Array, jax.Array]],
) -> tuple[BufferState, AdjustInfo]:
    """One check of the dynamic buffer: measure D over the oldest items, drop per `rule.shrink`.

    actions_fn(items) -> (policy_action, reference_action), both [R, S, |A|] in the normalised box, for
    items whose leaves are [R, S, ...] (R = K slots for `tenth`, 2K for `until_below`).
    """
    k = rule.num_oldest
    count = k if rule.shrink == "tenth" else 2 * k
    count = min(count, state.capacity)
    items, valid = oldest_items(state, count)
    policy_action, reference_action = actions_fn(items)
    per_slot = jnp.mean(action_distance(policy_action, reference_action, rule.distance), axis=-1)  # over streams
    distances = window_means(per_slot, valid, min(k, count))
    if rule.shrink == "tenth":
        dropped = tenth_rule(state.size, distances[0], rule)
    else:
        dropped = until_below_rule(state.size, distances, rule)
    new_state = state.replace(size=(state.size - dropped).astype(jnp.int32))
    return new_state, AdjustInfo(distances[0], dropped)


def maybe_adjust(
    due: jax.Array,
    state: BufferState,
    rule: DynamicReplay,
    actions_fn: Callable[[Any, Any], tuple[jax.Array, jax.Array]],
    params: Any,
) -> tuple[BufferState, AdjustInfo]:
    """`adjust` when `due` (bool []), else the state unchanged and a zero `AdjustInfo`.

    actions_fn(params, items) -> (policy_action, reference_action) must close over no traced value
    (pass them in `params`): the check is a `lockstep_cond`, so vmapped seeds pay for the K-item
    policy evaluation only on the updates that check, not on every update.
    """

    def check(operand: tuple[BufferState, Any]) -> tuple[BufferState, AdjustInfo]:
        buffer, params = operand
        return adjust(buffer, rule, lambda items: actions_fn(params, items))

    def skip(operand: tuple[BufferState, Any]) -> tuple[BufferState, AdjustInfo]:
        return operand[0], AdjustInfo(jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32))

    return lockstep_cond(due, check, skip, (state, params))


def check_due(env_steps_tm1: jax.Array, env_steps_t: jax.Array, interval: int) -> jax.Array:
    """bool []: an interval of `interval` env steps ended within (env_steps_tm1, env_steps_t].

    With one env step per update this is the code's `(t + 1) % interval == 0`, checked right after the
    new transition is stored.
    """
    return env_steps_t // interval > env_steps_tm1 // interval


"""n-step windows of consecutive transitions, sampled from the uniform buffer's ring storage.

RLx2's delayed multi-step TD target (Tan et al., ICLR 2023; `rlx2.md` §4.2) trains on windows of n
consecutive *stored* transitions: a start offset i is drawn uniformly from {0, ..., size − n} counted
from the oldest valid item, and the window is items i, ..., i+n−1. Windows may cross episode
boundaries (the target's masks handle that, see `sparqrl.returns`) but never run past the newest item.

Layout. A slot of the ring (`sparqrl.replay.uniform.BufferState`) holds ONE time step of S parallel
streams (environments): every storage leaf is [capacity, S, ...], so consecutive slots are consecutive
steps of the same environment. A sampled window is (start, stream): [B, n, ...].

Valid region. The valid items are the `size` most recent ones, the slots
(insert_pos − size + j) mod capacity for j = 0 .. size−1. `uniform.add` keeps this true, and it stays
true when the RLx2 dynamic buffer (`sparqrl.replay.dynamic`) drops the oldest items by lowering `size`.
(`uniform.sample` instead assumes the filled slots are [0, size), which only holds without shrinking.)

Prioritized windows (DQN's n-step targets with prioritized replay): the same ring, plus one sampling weight
per (slot, stream), the priority of the window that starts there (`prioritized.PrioritizedState` with weights
[capacity · S]). A draw picks a start by weight among those whose whole window is stored (`window_starts`,
the starts the uniform draw allows), so the replayed item is the window and its priority the window's |δ|.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from sparqrl import returns
from sparqrl.replay import prioritized, uniform
from sparqrl.replay.prioritized import PrioritizedSample, PrioritizedState
from sparqrl.replay.uniform import BufferState, gather


def oldest_slot(state: BufferState) -> jax.Array:
    """int32 []: the slot of the oldest valid item."""
    return ((state.insert_pos - state.size) % state.capacity).astype(jnp.int32)


def slots_from_oldest(state: BufferState, offsets: jax.Array) -> jax.Array:
    """Ring slots [...] of the items `offsets` [...] positions after the oldest valid one."""
    return ((oldest_slot(state) + offsets) % state.capacity).astype(jnp.int32)


def num_streams(state: BufferState) -> int:
    """S, the static stream (environment) axis of every slot."""
    return jax.tree.leaves(state.storage)[0].shape[1]


def sample_window_starts(
    state: BufferState, key: jax.Array, batch_size: int, n_active: int | jax.Array
) -> jax.Array:
    """int32 [batch_size] start offsets from the oldest valid item, uniform on {0, ..., size − n_active}.

    `n_active` may be traced (1 before RLx2's n-step delay, n after), so the windows the target really
    uses never run past the newest item. Needs size >= n_active (guard before learning starts).
    """
    high = jnp.maximum(state.size - n_active + 1, 1)
    return jax.random.randint(key, (batch_size,), 0, high, dtype=jnp.int32)


def sample_windows(
    state: BufferState, key: jax.Array, batch_size: int, n: int, n_active: int | jax.Array | None = None
) -> Any:
    """A batch of windows, every leaf [batch_size, n, ...] (the stream axis is sampled away).

    Starts are uniform on {0, ..., size − n_active} (default n_active = n), streams uniform on
    {0, ..., S−1}. Elements k >= n_active of a window may lie past the newest item (stale or zero
    storage); callers give them zero weight (`sparqrl.returns.nstep_terms(..., n_active)`).
    """
    if n_active is None:
        n_active = n
    start_key, stream_key = jax.random.split(key)
    starts = sample_window_starts(state, start_key, batch_size, n_active)
    slots = slots_from_oldest(state, starts[:, None] + jnp.arange(n, dtype=jnp.int32))  # [B, n]
    streams = jax.random.randint(stream_key, (batch_size,), 0, num_streams(state), dtype=jnp.int32)
    return jax.tree.map(lambda store: store[slots, streams[:, None]], state.storage)


def oldest_items(state: BufferState, count: int) -> tuple[Any, jax.Array]:
    """The `count` oldest slots, oldest first: (items, every leaf [count, S, ...]; valid bool [count]).

    `valid` is False for positions at or beyond `size` (their contents are newer items or stale data).
    """
    offsets = jnp.arange(count, dtype=jnp.int32)
    return gather(state, slots_from_oldest(state, offsets)), offsets < state.size


# ---- prioritized windows (DQN's n-step targets with prioritized replay) ---------------------------------


def init_prioritized(example_row: Any, capacity: int) -> PrioritizedState:
    """An empty prioritized window replay: slots shaped like `example_row` (every leaf [S, ...]), and one sampling
    weight per (slot, stream), the window that starts there (item slot·S + stream; `sample_prioritized_windows`)."""
    buffer = uniform.init(example_row, capacity)
    return PrioritizedState(buffer, jnp.zeros((buffer.capacity * num_streams(buffer),), jnp.float32))


def add_prioritized(state: PrioritizedState, rows: Any, priorities: jax.Array,
                    priority_exponent: float | jax.Array) -> PrioritizedState:
    """Write slots `rows` (every leaf [R, S, ...]) in ring order with the priorities p [R, S] (> 0) of the windows
    that start at their items, stored as p^α; an overwritten slot's windows get the new ones'."""
    streams = num_streams(state.buffer)
    slots = (state.buffer.insert_pos + jnp.arange(jnp.shape(priorities)[0], dtype=jnp.int32)) % state.buffer.capacity
    items = (slots[:, None] * streams + jnp.arange(streams, dtype=jnp.int32)).reshape(-1)
    weights = prioritized.priority_weights(priorities, priority_exponent).reshape(-1)
    return PrioritizedState(uniform.add(state.buffer, rows), state.weights.at[items].set(weights, unique_indices=True))


def window_starts(state: BufferState, n: int) -> jax.Array:
    """bool [capacity]: the slots a window of n consecutive valid slots starts at, those at least n − 1 slots older
    than the newest (the valid region's first size − n + 1, as `sample_window_starts` draws offsets)."""
    age = (state.insert_pos - 1 - jnp.arange(state.capacity, dtype=jnp.int32)) % state.capacity  # newest: 0
    return (age >= n - 1) & (age < state.size)


def sample_prioritized_windows(state: PrioritizedState, key: jax.Array, batch_size: int, n: int,
                               importance_exponent: float | jax.Array) -> PrioritizedSample:
    """A prioritized batch of windows: items [batch_size, n, ...] (the stream axis sampled away), each drawn with
    P ∝ the weight of the (slot, stream) it starts at among the `window_starts` (an incomplete window, whose
    later slots are not yet written, is never drawn); slots: those items (slot·S + stream), for
    `prioritized.update_priorities`; importance weights as `prioritized.importance_weights` over the windows
    that can be drawn."""
    streams = num_streams(state.buffer)
    starts = jnp.repeat(window_starts(state.buffer, n), streams)  # [capacity · S]
    items, probs = prioritized.sample_weighted(jnp.where(starts, state.weights, 0.0), key, batch_size)
    slots = (items[:, None] // streams + jnp.arange(n, dtype=jnp.int32)) % state.buffer.capacity  # [B, n]
    windows = jax.tree.map(lambda store: store[slots, (items % streams)[:, None]], state.buffer.storage)
    weights = prioritized.importance_weights(probs, jnp.sum(starts), importance_exponent)
    return PrioritizedSample(windows, items, probs, weights)


# ---- the one n-step draw of every learner (DQN's, TD3's and SAC's) -----------------------------------------------


class DrawnWindows(NamedTuple):
    """A batch of n-step windows as a gradient step reads them."""

    items: Any  # every leaf [B, n, ...], with reward, terminated and truncated fields
    terms: returns.NStepTerms  # their n-step return terms, cut at n_active (`returns.nstep_terms`)
    weights: jax.Array | None = None  # float32 [B], prioritized replay's importance weights; None: uniform
    slots: jax.Array | None = None  # int32 [B], prioritized replay's drawn items (slot·S + stream); None: uniform


def draw_windows(buffer: BufferState | PrioritizedState, key: jax.Array, batch_size: int, horizon: int,
                 gamma: float | jax.Array, n_active: int | jax.Array | None = None,
                 importance_exponent: float | jax.Array | None = None) -> DrawnWindows:
    """B windows of `horizon` consecutive steps of one stream and their n-step terms, cut at `n_active` (None:
    horizon; traced: RLx2's delayed target, 1 before its delay, n after): uniformly (`sample_windows`, starts that
    keep the first n_active steps stored) or, `importance_exponent` β given, by the priority of their start
    (`sample_prioritized_windows`: whole windows only) with their importance weights and slots. One draw for
    every n-step learner, so the windows and their targets' episode-end bookkeeping are written once."""
    if importance_exponent is None:
        items, weights, slots = sample_windows(buffer, key, batch_size, horizon, n_active), None, None
    else:
        drawn = sample_prioritized_windows(buffer, key, batch_size, horizon, importance_exponent)
        items, weights, slots = drawn.items, drawn.importance_weights, drawn.slots
    terms = returns.nstep_terms(items.reward, items.terminated, items.truncated, gamma, n_active)
    return DrawnWindows(items, terms, weights, slots)

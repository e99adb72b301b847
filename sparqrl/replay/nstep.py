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
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

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

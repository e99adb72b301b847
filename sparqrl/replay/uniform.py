"""A uniform ring-buffer replay memory that lives on the device, as pure functions over a typed state.

The state holds one storage pytree whose leaves have a leading [capacity] axis, the next insert
position and the number of filled slots. `add` writes a batch [B, ...] in ring order (the oldest
items are overwritten first), `sample` draws items uniformly, with replacement, from the filled
slots. Everything is jit-, vmap- (over seeds) and scan-safe: shapes are static, positions are arrays.

Why our own rather than flashbax (whose style we follow: pure functions over a state, arguments
checked before tracing): RLx2's dynamic-capacity buffer (Tan et al., ICLR 2023, arXiv 2205.15043)
shrinks and grows the *active* part of the buffer during a run, and its delayed multi-step TD target
needs n-step windows of consecutive transitions, both read from this same state. With the storage,
insert position and size in our own hands, those buffers are a few functions over `BufferState`
(e.g. windows are `gather` at `(start + arange(n)) % capacity`), not a wrapper around another
library's private layout.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp

from sparqrl.config import is_int, positive, require


@flax.struct.dataclass
class BufferState:
    """A ring buffer of items (any pytree).

    storage     the items, every leaf [capacity, *item_shape]
    insert_pos  int32 [], the slot the next item goes to (when full, also the oldest item)
    size        int32 [], how many slots hold data; the filled slots are always [0, size)
    """

    storage: Any
    insert_pos: jax.Array
    size: jax.Array

    @property
    def capacity(self) -> int:
        return capacity_of(self.storage)


def capacity_of(storage: Any) -> int:
    """The static capacity: the leading axis length of the storage leaves."""
    return jax.tree.leaves(storage)[0].shape[0]


def init(example_item: Any, capacity: int) -> BufferState:
    """An empty buffer for items shaped like `example_item` (one item, no batch axis).

    Only shapes and dtypes of `example_item` are used; the storage is zeros [capacity, *shape].
    """
    require(is_int(capacity) and capacity > 0, "capacity", capacity, "must be an int > 0")
    capacity = int(capacity)
    leaves = jax.tree.leaves(example_item)
    require(len(leaves) > 0, "example_item", example_item, "must contain at least one array")
    storage = jax.tree.map(
        lambda x: jnp.zeros((capacity,) + jnp.shape(x), jnp.asarray(x).dtype), example_item
    )
    return BufferState(storage, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))


def _batch_size_of(state: BufferState, batch: Any) -> int:
    """Check `batch` against the storage (structure, item shapes, dtypes); return its leading B.

    Shapes are static, so this runs once at trace time and fails with a readable message.
    """
    storage_def = jax.tree.structure(state.storage)
    batch_def = jax.tree.structure(batch)
    if storage_def != batch_def:
        raise ValueError(f"replay add: batch structure {batch_def} differs from the buffer's {storage_def}")
    sizes = set()
    for slot, item in zip(jax.tree.leaves(state.storage), jax.tree.leaves(batch)):
        if jnp.ndim(item) != slot.ndim or jnp.shape(item)[1:] != slot.shape[1:]:
            raise ValueError(
                f"replay add: batch leaf of shape {jnp.shape(item)} does not match items of shape "
                f"{slot.shape[1:]} (expected [B, *item_shape])"
            )
        sizes.add(jnp.shape(item)[0])
    if len(sizes) != 1:
        raise ValueError(f"replay add: batch leaves disagree on the leading batch size: {sorted(sizes)}")
    (batch_size,) = sizes
    if batch_size > state.capacity:
        # Several items would land on the same slot in one scatter, whose order is unspecified.
        raise ValueError(f"replay add: batch of {batch_size} items exceeds the capacity {state.capacity}")
    return batch_size


def add(state: BufferState, batch: Any) -> BufferState:
    """Write `batch` (the item pytree with a leading [B]) at insert_pos, insert_pos+1, ... (mod capacity).

    batch[0] is older than batch[1]; once full, the oldest items are overwritten first.
    Requires B <= capacity (checked at trace time).
    """
    batch_size = _batch_size_of(state, batch)
    capacity = state.capacity
    slots = (state.insert_pos + jnp.arange(batch_size, dtype=jnp.int32)) % capacity
    storage = jax.tree.map(
        lambda store, item: store.at[slots].set(item.astype(store.dtype), unique_indices=True),
        state.storage,
        batch,
    )
    return BufferState(
        storage=storage,
        insert_pos=(state.insert_pos + batch_size) % capacity,
        size=jnp.minimum(state.size + batch_size, capacity).astype(jnp.int32),
    )


def gather(state: BufferState, slots: jax.Array) -> Any:
    """The items at `slots` (int [...]) as a pytree with leading [...]."""
    return jax.tree.map(lambda store: store[slots], state.storage)


def sample_slots(state: BufferState, key: jax.Array, batch_size: int) -> jax.Array:
    """int32 [batch_size] slots drawn uniformly, with replacement, from the filled slots [0, size).

    With an empty buffer the slots are 0 (zeros come back); guard with `can_sample`.
    """
    return jax.random.randint(key, (batch_size,), 0, jnp.maximum(state.size, 1), dtype=jnp.int32)


def sample(state: BufferState, key: jax.Array, batch_size: int) -> Any:
    """A batch of `batch_size` items (leading [batch_size]) drawn uniformly from the filled slots."""
    require(is_int(batch_size) and batch_size > 0, "batch_size", batch_size, "must be an int > 0")
    return gather(state, sample_slots(state, key, int(batch_size)))


def can_sample(state: BufferState, batch_size: int) -> jax.Array:
    """bool []: the buffer holds at least `batch_size` items."""
    return state.size >= batch_size


class UniformBuffer(NamedTuple):
    """The buffer functions with capacity and batch size bound (from `make_uniform_buffer`).

    init(example_item) -> state;  add(state, batch [B]) -> state;
    sample(state, key) -> batch [batch_size];  can_sample(state) -> bool []
    """

    init: Callable[[Any], BufferState]
    add: Callable[[BufferState, Any], BufferState]
    sample: Callable[[BufferState, jax.Array], Any]
    can_sample: Callable[[BufferState], jax.Array]
    capacity: int
    batch_size: int


def check_sizes(capacity: int, batch_size: int) -> tuple[int, int]:
    """`capacity` and `batch_size` as Python ints, checked on the host before any tracing (a `ConfigError`
    names the bad one): static integers > 0, batch_size <= capacity. Every buffer's factory starts here."""
    require(is_int(capacity), "capacity", capacity, "must be an int")
    require(is_int(batch_size), "batch_size", batch_size, "must be an int")
    positive("capacity", capacity)
    positive("batch_size", batch_size)
    capacity, batch_size = int(capacity), int(batch_size)
    require(batch_size <= capacity, "batch_size", batch_size, f"must be <= capacity ({capacity})")
    return capacity, batch_size


def make_uniform_buffer(capacity: int, batch_size: int) -> UniformBuffer:
    """Bind and check `capacity` and `batch_size` on the host (`check_sizes`)."""
    capacity, batch_size = check_sizes(capacity, batch_size)
    return UniformBuffer(
        init=lambda example_item: init(example_item, capacity),
        add=add,
        sample=lambda state, key: sample(state, key, batch_size),
        can_sample=lambda state: can_sample(state, batch_size),
        capacity=capacity,
        batch_size=batch_size,
    )

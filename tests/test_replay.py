"""The uniform replay buffer keeps order and capacity, samples only filled slots, and is jit/vmap safe."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparqrl import replay
from sparqrl.config import ConfigError


def _item():
    return {"id": jnp.zeros((), jnp.int32), "obs": jnp.zeros((2, 3), jnp.float32), "done": jnp.zeros((), jnp.bool_)}


def _batch(ids):
    ids = jnp.asarray(ids, jnp.int32)
    return {
        "id": ids,
        "obs": jnp.broadcast_to(ids[:, None, None].astype(jnp.float32), (ids.shape[0], 2, 3)),
        "done": ids % 2 == 0,
    }


def _ring_model(capacity, batches):
    """The plain-Python ring buffer: slot contents, insert position and size after the batches."""
    slots, pos, size = [0] * capacity, 0, 0
    for batch in batches:
        for value in batch:
            slots[pos] = value
            pos = (pos + 1) % capacity
            size = min(size + 1, capacity)
    return np.array(slots), pos, size


def test_init_shapes_and_dtypes():
    state = replay.init(_item(), 5)
    assert state.capacity == 5
    assert state.storage["id"].shape == (5,) and state.storage["id"].dtype == jnp.int32
    assert state.storage["obs"].shape == (5, 2, 3) and state.storage["obs"].dtype == jnp.float32
    assert state.storage["done"].dtype == jnp.bool_
    assert int(state.size) == 0 and int(state.insert_pos) == 0
    assert not bool(replay.can_sample(state, 1))


@pytest.mark.parametrize("capacity,batch_sizes", [(7, [3] * 6), (6, [3] * 5), (5, [1, 4, 2, 5, 3]), (4, [4, 4, 1])])
def test_add_keeps_ring_order_and_capacity_through_wraparound(capacity, batch_sizes):
    add = jax.jit(replay.add)
    state = replay.init(_item(), capacity)
    next_id, batches = 1, []
    for b in batch_sizes:
        ids = list(range(next_id, next_id + b))
        next_id += b
        batches.append(ids)
        state = add(state, _batch(ids))
        slots, pos, size = _ring_model(capacity, batches)
        np.testing.assert_array_equal(np.asarray(state.storage["id"]), slots)
        np.testing.assert_array_equal(np.asarray(state.storage["obs"])[:, 0, 0], slots.astype(np.float32))
        assert int(state.insert_pos) == pos and int(state.size) == size
        assert int(state.size) <= capacity
    # Read in age order from the oldest slot: the last `capacity` items in insertion order.
    assert int(state.size) == capacity
    oldest_first = (int(state.insert_pos) + np.arange(capacity)) % capacity
    np.testing.assert_array_equal(np.asarray(state.storage["id"])[oldest_first], np.arange(next_id - capacity, next_id))


def test_sample_draws_only_filled_slots_uniformly():
    state = replay.add(replay.init(_item(), 100), _batch(np.arange(1, 6)))
    assert bool(replay.can_sample(state, 5)) and not bool(replay.can_sample(state, 6))
    batch = jax.jit(replay.sample, static_argnums=2)(state, jax.random.key(0), 5000)
    ids = np.asarray(batch["id"])
    assert ids.shape == (5000,)
    assert set(ids.tolist()) == {1, 2, 3, 4, 5}  # never an empty (id 0) slot, every filled one
    counts = np.bincount(ids, minlength=6)[1:]
    assert np.all(np.abs(counts / 5000 - 0.2) < 0.03)
    # Items stay whole: every leaf of a sampled item comes from the same slot.
    np.testing.assert_array_equal(np.asarray(batch["obs"])[:, 1, 2], ids.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(batch["done"]), ids % 2 == 0)


def test_sample_after_wraparound_sees_only_the_latest_items():
    state = replay.init(_item(), 8)
    for start in range(1, 30, 3):
        state = replay.add(state, _batch(np.arange(start, start + 3)))
    ids = np.asarray(replay.sample(state, jax.random.key(1), 4000)["id"])
    assert set(ids.tolist()) == set(range(23, 31))  # ids 1..30 added; the last 8 remain


def test_jit_scan_and_vmap_match_single_runs():
    def run(key):
        state = replay.init(_item(), 10)

        def step(state, ids):
            return replay.add(state, _batch(ids)), None

        state, _ = jax.lax.scan(step, state, jnp.arange(1, 1 + 4 * 7).reshape(7, 4))
        return state, replay.sample(state, key, 16)

    keys = jax.random.split(jax.random.key(3), 3)
    states, samples = jax.jit(jax.vmap(run))(keys)
    single = jax.jit(run)
    for i, key in enumerate(keys):
        state, sample = single(key)
        np.testing.assert_array_equal(np.asarray(states.storage["id"][i]), np.asarray(state.storage["id"]))
        np.testing.assert_array_equal(np.asarray(samples["id"][i]), np.asarray(sample["id"]))
        assert int(states.insert_pos[i]) == int(state.insert_pos) == 28 % 10
        assert int(states.size[i]) == 10
    # Different keys, different samples.
    assert not np.array_equal(np.asarray(samples["id"][0]), np.asarray(samples["id"][1]))


def test_vmap_over_buffers_with_different_fill():
    """Batched sizes: each buffer samples only its own filled part."""

    @jax.jit
    def run(keys):
        state = replay.add(replay.init(_item(), 6), _batch([1, 2, 3]))
        # Only the second buffer gets three more items.
        states = jax.tree.map(lambda a, b: jnp.stack([a, b]), state, replay.add(state, _batch([4, 5, 6])))
        return jax.vmap(replay.sample, in_axes=(0, 0, None))(states, keys, 2000)

    samples = run(jax.random.split(jax.random.key(0), 2))
    assert set(np.asarray(samples["id"][0]).tolist()) == {1, 2, 3}
    assert set(np.asarray(samples["id"][1]).tolist()) == {1, 2, 3, 4, 5, 6}


def test_make_uniform_buffer_binds_and_checks_arguments():
    buf = replay.make_uniform_buffer(capacity=8, batch_size=4)
    state = buf.init(_item())
    assert not bool(buf.can_sample(state))
    state = buf.add(state, _batch([1, 2, 3, 4]))
    assert bool(buf.can_sample(state))
    assert buf.sample(state, jax.random.key(0))["id"].shape == (4,)
    with pytest.raises(ConfigError, match="capacity=0"):
        replay.make_uniform_buffer(capacity=0, batch_size=1)
    with pytest.raises(ConfigError, match="batch_size=9.*capacity"):
        replay.make_uniform_buffer(capacity=8, batch_size=9)
    with pytest.raises(ConfigError, match="batch_size"):
        replay.make_uniform_buffer(capacity=8, batch_size=0)


def test_add_rejects_bad_batches_at_trace_time():
    state = replay.init(_item(), 4)
    with pytest.raises(ValueError, match="exceeds the capacity"):
        replay.add(state, _batch([1, 2, 3, 4, 5]))
    bad = _batch([1, 2])
    bad["obs"] = jnp.zeros((2, 3, 2))
    with pytest.raises(ValueError, match="does not match"):
        replay.add(state, bad)
    with pytest.raises(ValueError, match="structure"):
        replay.add(state, {"id": jnp.zeros(2, jnp.int32)})
    bad = _batch([1, 2])
    bad["done"] = jnp.zeros(3, jnp.bool_)
    with pytest.raises(ValueError, match="leading batch size"):
        replay.add(state, bad)

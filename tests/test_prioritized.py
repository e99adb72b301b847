"""Prioritized replay against NumPy references: P(i) ∝ p^α, importance weights, priority updates,
ring overwrite, and jit / vmap over seeds."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from sparqrl import replay
from sparqrl.config import ConfigError
from sparqrl.replay import prioritized as per


def _item():
    return {"id": jnp.zeros((), jnp.int32), "obs": jnp.zeros((2,), jnp.float32)}


def _batch(ids):
    ids = jnp.asarray(ids, jnp.int32)
    return {"id": ids, "obs": jnp.stack([ids, -ids], axis=-1).astype(jnp.float32)}


def _np_probabilities(priorities, alpha):
    w = np.asarray(priorities, np.float64) ** alpha
    return w / w.sum()


def _np_importance_weights(probs, n, beta):
    w = (n * np.asarray(probs, np.float64)) ** -beta
    return w / w.max()


def _draw(state, key, count):
    return jax.jit(per.sample_slots, static_argnums=2)(state, key, count)


def _chi_square_p_value(slots, expected_probs):
    """p-value of the draws' counts over the slots with expected_probs > 0 (none elsewhere allowed)."""
    counts = np.bincount(np.asarray(slots), minlength=len(expected_probs))
    assert counts[expected_probs == 0].sum() == 0, "drew a slot with probability 0"
    keep = expected_probs > 0
    return stats.chisquare(counts[keep], len(slots) * expected_probs[keep]).pvalue


@pytest.mark.parametrize("alpha", [0.6, 1.0, 0.0])
def test_sampling_frequencies_follow_priority_to_the_alpha(alpha):
    # capacity 10 -> 3 blocks of 4 (last one partial); 7 items fill two blocks and part of the third.
    priorities = np.array([0.1, 2.0, 0.5, 4.0, 1.0, 0.05, 3.0], np.float32)
    state = per.add(per.init(_item(), 10), _batch(np.arange(1, 8)), priorities, alpha)
    want = np.zeros(10)
    want[:7] = _np_probabilities(priorities, alpha)
    np.testing.assert_allclose(np.asarray(per.probabilities(state)), want, rtol=1e-5)
    slots, probs = _draw(state, jax.random.key(0), 200_000)
    assert _chi_square_p_value(slots, want) > 1e-3
    np.testing.assert_allclose(np.asarray(probs), want[np.asarray(slots)], rtol=1e-5)


def test_frequencies_on_a_larger_partly_filled_buffer():
    """Many blocks, a partial last block and skewed priorities: only filled slots, in proportion."""
    rng = np.random.default_rng(3)
    capacity, size = 300, 217  # blocks of 18; slot 216 sits inside block 12
    priorities = rng.exponential(size=size).astype(np.float32) ** 2 + 1e-3
    state = per.add(per.init(_item(), capacity), _batch(np.arange(size)), priorities, 0.6)
    want = np.zeros(capacity)
    want[:size] = _np_probabilities(priorities, 0.6)
    slots, _ = _draw(state, jax.random.key(1), 400_000)
    assert int(np.max(slots)) < size
    assert _chi_square_p_value(slots, want) > 1e-3


def test_a_dominant_item_never_pushes_draws_into_empty_slots():
    # The last filled slot carries almost all the mass: u · total rounding up must not leave [0, size).
    priorities = np.array([1e-6] * 12 + [1e6], np.float32)
    state = per.add(per.init(_item(), 40), _batch(np.arange(13)), priorities, 1.0)
    slots, probs = _draw(state, jax.random.key(2), 100_000)
    assert int(np.max(slots)) == 12 and int(np.min(slots)) >= 0
    assert np.all(np.asarray(probs) > 0)


def test_weight_zero_slots_anywhere_are_never_drawn():
    """`sample_weighted` over weights with zeros between and after positive ones (n-step windows not yet
    complete sit in the middle of a wrapped ring): draws in proportion, none of weight 0, even where a dominant
    item's block is followed by zero-weight slots in it and in later blocks."""
    rng = np.random.default_rng(4)
    weights = rng.exponential(size=100).astype(np.float32)
    weights[rng.random(100) < 0.4] = 0.0
    weights[37:45] = 0.0
    weights[90:] = 0.0
    slots, probs = jax.jit(per.sample_weighted, static_argnums=2)(jnp.asarray(weights), jax.random.key(5), 200_000)
    want = weights.astype(np.float64) / weights.astype(np.float64).sum()
    assert _chi_square_p_value(slots, want) > 1e-3
    np.testing.assert_allclose(np.asarray(probs), want[np.asarray(slots)], rtol=1e-5)
    dominant = np.zeros(100, np.float32)
    dominant[:12], dominant[12] = 1e-6, 1e6  # slot 12 starts block 1 of 10; zeros after it
    slots, probs = jax.jit(per.sample_weighted, static_argnums=2)(jnp.asarray(dominant), jax.random.key(6), 100_000)
    assert int(np.max(slots)) == 12 and np.all(np.asarray(probs) > 0)


def test_importance_weights_match_numpy():
    rng = np.random.default_rng(0)
    priorities = rng.uniform(0.01, 3.0, size=20).astype(np.float32)
    alpha, beta = 0.6, 0.4
    state = per.add(per.init(_item(), 32), _batch(np.arange(20)), priorities, alpha)
    drawn = jax.jit(per.sample, static_argnums=2)(state, jax.random.key(5), 64, beta)
    slots = np.asarray(drawn.slots)
    probs = _np_probabilities(priorities, alpha)[slots]
    np.testing.assert_allclose(np.asarray(drawn.probabilities), probs, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(drawn.importance_weights), _np_importance_weights(probs, 20, beta), rtol=1e-5)
    assert float(jnp.max(drawn.importance_weights)) == pytest.approx(1.0)
    np.testing.assert_array_equal(np.asarray(drawn.items["id"]), slots)  # items come from the drawn slots
    # The formula on its own, on extreme probabilities (log-space: no overflow before normalising).
    p = jnp.array([1e-30, 0.5, 1e-3], jnp.float32)
    np.testing.assert_allclose(
        np.asarray(per.importance_weights(p, jnp.int32(1000), 0.7)),
        _np_importance_weights(np.array([1e-30, 0.5, 1e-3]), 1000, 0.7), rtol=1e-4,
    )


def test_uniform_priorities_give_unit_weights():
    state = per.add(per.init(_item(), 16), _batch(np.arange(9)), jnp.full(9, 2.5), 0.6)
    drawn = per.sample(state, jax.random.key(0), 32, 0.4)
    np.testing.assert_allclose(np.asarray(drawn.probabilities), 1 / 9, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(drawn.importance_weights), 1.0, rtol=1e-6)


def test_update_priorities_changes_only_the_sampled_slots():
    rng = np.random.default_rng(1)
    alpha = 0.6
    priorities = rng.uniform(0.1, 1.0, size=12).astype(np.float32)
    state = per.add(per.init(_item(), 16), _batch(np.arange(12)), priorities, alpha)
    drawn = per.sample(state, jax.random.key(3), 5, 0.4)
    slots = np.asarray(drawn.slots)
    # Duplicate draws of one slot carry the same |δ| (same item, same parameters).
    per_slot = {s: rng.uniform(0.0, 5.0) for s in slots}
    td_abs = np.array([per_slot[s] for s in slots], np.float32)
    new = jax.jit(per.update_priorities)(state, drawn.slots, jnp.asarray(td_abs) + 1e-6, alpha)

    want = priorities.astype(np.float64) ** alpha
    for s, d in zip(slots, td_abs):
        want[s] = (d + 1e-6) ** alpha
    np.testing.assert_allclose(np.asarray(new.weights)[:12], want, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(new.weights)[12:], 0.0)
    np.testing.assert_allclose(np.asarray(per.probabilities(new))[:12], want / want.sum(), rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(new.buffer.storage["id"]), np.asarray(state.buffer.storage["id"]))


def test_ring_overwrite_keeps_priorities_aligned_with_items():
    """A plain-Python ring of (id, priority): after wraparound each slot's weight is its item's p^α."""
    capacity, alpha = 7, 0.5
    rng = np.random.default_rng(2)
    add = jax.jit(per.add)
    state = per.init(_item(), capacity)
    ids, prios, pos, size, next_id = [0] * capacity, [0.0] * capacity, 0, 0, 1
    for b in [3, 3, 2, 5, 1, 4]:
        new_ids = np.arange(next_id, next_id + b)
        new_p = rng.uniform(0.1, 2.0, size=b).astype(np.float32)
        next_id += b
        state = add(state, _batch(new_ids), jnp.asarray(new_p), alpha)
        for i, p in zip(new_ids, new_p):
            ids[pos], prios[pos] = int(i), float(p)
            pos, size = (pos + 1) % capacity, min(size + 1, capacity)
        np.testing.assert_array_equal(np.asarray(state.buffer.storage["id"]), ids)
        np.testing.assert_allclose(np.asarray(state.weights), np.asarray(prios) ** alpha, rtol=1e-6)
        assert int(state.size) == size and int(state.buffer.insert_pos) == pos
    # A drawn item's reported probability is its own priority's share.
    drawn = per.sample(state, jax.random.key(0), 50, 0.4)
    by_id = dict(zip(ids, _np_probabilities(prios, alpha)))
    want = [by_id[int(i)] for i in np.asarray(drawn.items["id"])]
    np.testing.assert_allclose(np.asarray(drawn.probabilities), want, rtol=1e-5)


def _run(key, priorities):
    """add -> sample -> update -> add (wraps) -> sample: one seed's sequence."""
    k1, k2 = jax.random.split(key)
    state = per.add(per.init(_item(), 8), _batch(jnp.arange(6)), priorities[:6], 0.6)
    drawn = per.sample(state, k1, 16, 0.4)
    state = per.update_priorities(state, drawn.slots, jnp.abs(drawn.items["obs"][:, 0]) + 0.5, 0.6)
    state = per.add(state, _batch(jnp.arange(6, 10)), priorities[6:], 0.6)
    return state, drawn, per.sample(state, k2, 16, 0.4)


def test_vmapped_seeds_equal_separate_runs_and_jit():
    keys = jax.random.split(jax.random.key(7), 3)
    priorities = jax.random.uniform(jax.random.key(8), (3, 10), minval=0.1, maxval=2.0)
    batched = jax.jit(jax.vmap(_run))(keys, priorities)
    for i in range(3):
        single = jax.jit(_run)(keys[i], priorities[i])
        for got, want in zip(jax.tree.leaves(jax.tree.map(lambda x: x[i], batched)), jax.tree.leaves(single)):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
        eager = _run(keys[i], priorities[i])
        for got, want in zip(jax.tree.leaves(eager), jax.tree.leaves(single)):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
    slots = np.asarray(batched[2].slots)
    assert not all(np.array_equal(slots[0], slots[i]) for i in (1, 2))  # seeds draw differently


def test_empty_buffer_and_can_sample():
    state = per.init(_item(), 4)
    assert state.capacity == 4 and int(state.size) == 0
    assert not bool(per.can_sample(state, 1))
    drawn = per.sample(state, jax.random.key(0), 3, 0.4)
    np.testing.assert_array_equal(np.asarray(drawn.slots), 0)
    np.testing.assert_array_equal(np.asarray(drawn.probabilities), 0.0)
    assert np.all(np.isfinite(np.asarray(drawn.importance_weights)))
    state = per.add(state, _batch([1, 2]), jnp.ones(2), 0.6)
    assert bool(per.can_sample(state, 2)) and not bool(per.can_sample(state, 3))


def test_add_checks_shapes_at_trace_time():
    state = per.init(_item(), 4)
    with pytest.raises(ValueError, match=r"priorities of shape \(3,\) for a batch of 2"):
        per.add(state, _batch([1, 2]), jnp.ones(3), 0.6)
    with pytest.raises(ValueError, match="exceeds the capacity"):
        per.add(state, _batch(np.arange(5)), jnp.ones(5), 0.6)


def test_bound_buffer_adds_epsilon_and_checks_arguments():
    buf = replay.make_prioritized_buffer(8, 4, priority_exponent=0.5, importance_exponent=0.4, priority_epsilon=0.25)
    state = buf.add(buf.init(_item()), _batch([1, 2, 3]), jnp.array([0.0, -1.0, 3.0]))  # |δ| + ε
    np.testing.assert_allclose(np.asarray(state.weights)[:3], np.sqrt([0.25, 1.25, 3.25]), rtol=1e-6)
    drawn = buf.sample(state, jax.random.key(0))
    assert drawn.slots.shape == (4,) and bool(buf.can_sample(state)) is False
    state = buf.update(state, jnp.array([0]), jnp.array([0.75]))
    assert float(state.weights[0]) == pytest.approx(1.0)
    for kwargs, pattern in [
        (dict(capacity=0, batch_size=1), r"capacity=0"),
        (dict(capacity=4, batch_size=5), r"batch_size=5 .*capacity \(4\)"),
        (dict(capacity=4, batch_size=2, priority_exponent=-1.0), r"priority_exponent=-1.0"),
        (dict(capacity=4, batch_size=2, importance_exponent=1.5), r"importance_exponent=1.5"),
        (dict(capacity=4, batch_size=2, priority_epsilon=0.0), r"priority_epsilon=0.0"),
    ]:
        with pytest.raises(ConfigError, match=pattern):
            replay.make_prioritized_buffer(**kwargs)

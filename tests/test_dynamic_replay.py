"""RLx2's dynamic-capacity replay (rlx2.md §5): the reference code's 10 % shrink rule and the paper's
pop-until-below rule against NumPy simulations of a FIFO buffer, distances, argument checks, jit/vmap."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparqrl import replay
from sparqrl.config import ConfigError
from sparqrl.replay import dynamic

A = 2  # action dims


def _np_distance(policy, reference, kind):
    diff = policy - reference
    if kind == "half_mse":
        return 0.5 * np.mean(diff**2, axis=-1)
    return np.sqrt(np.sum(diff**2, axis=-1))


def test_action_distance_matches_numpy_and_the_code_metric():
    rng = np.random.default_rng(0)
    pi, ref = rng.uniform(-1, 1, (2, 50, 3, A)).astype(np.float32)
    for kind in ("half_mse", "l2"):
        got = jax.jit(lambda p, r: dynamic.action_distance(p, r, kind))(pi, ref)
        np.testing.assert_allclose(np.asarray(got), _np_distance(pi, ref, kind), rtol=1e-5)
    # The code's D is PyTorch's MSE over samples and dims, halved: 1/(2·K·|A|)·Σ‖π − ā‖².
    d = float(jnp.mean(dynamic.action_distance(pi[:, 0], ref[:, 0], "half_mse")))
    assert d == pytest.approx(np.sum((pi[:, 0] - ref[:, 0]) ** 2) / (2 * 50 * A), rel=1e-5)


def test_window_means_matches_numpy():
    rng = np.random.default_rng(1)
    values = rng.uniform(0, 1, 30).astype(np.float32)
    valid = np.arange(30) < 23
    for width in (1, 5, 10):
        got = np.asarray(dynamic.window_means(jnp.asarray(values), jnp.asarray(valid), width))
        want = []
        for p in range(30 - width + 1):
            sel = [values[i] for i in range(p, p + width) if valid[i]]
            want.append(np.mean(sel) if sel else 0.0)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


# ---- the shrink rules against a NumPy FIFO model ---------------------------------------------


class _World:
    """Items j = 0, 1, ... with S streams; transition (j, s) has observation feature x = j/100 + s and a
    fixed random reference action; the 'policy' at check c is tanh(θ_c · [x, 1]) for a random θ_c."""

    def __init__(self, seed, streams):
        self.rng = np.random.default_rng(seed)
        self.streams = streams
        self.reference = self.rng.uniform(-1, 1, (100_000, streams, A)).astype(np.float32)

    def item(self, j):
        obs = (j / 100.0 + np.arange(self.streams, dtype=np.float32))[:, None].astype(np.float32)
        return {"obs": obs, "ref": self.reference[j]}

    def policy_np(self, theta, obs):
        return np.tanh(obs * theta[0] + theta[1])

    def distances_np(self, theta, ids, kind):
        """Per-slot distance (mean over streams) of items `ids`."""
        obs = np.stack([self.item(j)["obs"] for j in ids])
        ref = self.reference[ids]
        return _np_distance(self.policy_np(theta, obs), ref, kind).mean(axis=-1)


def _np_code_rule(fifo, d_of, rule_args):
    """rlx2.md §5.2: D over the K oldest; if D > thr and size > min, drop int(0.1·size) oldest."""
    k, threshold, min_size = rule_args
    d = float(np.mean(d_of(fifo[:k])))
    if d > threshold and len(fifo) > min_size:
        fifo = fifo[int(0.1 * len(fifo)):]
    return fifo, d


def _np_paper_rule(fifo, d_of, rule_args, max_pops):
    """Paper §4.2.2: pop the oldest one at a time until D over the K oldest is <= thr (floor: min size)."""
    k, threshold, min_size = rule_args
    d0 = float(np.mean(d_of(fifo[:k])))
    pops = 0
    while pops < max_pops and len(fifo) - pops > min_size and float(np.mean(d_of(fifo[pops:pops + k]))) > threshold:
        pops += 1
    return fifo[pops:], d0


@pytest.mark.parametrize(
    "shrink,distance,capacity,min_size,k,threshold,streams",
    [
        ("tenth", "half_mse", 64, 20, 8, 0.25, 1),
        ("tenth", "half_mse", 40, 30, 6, 0.2, 1),  # wraps; min size often blocks the cut
        ("tenth", "l2", 64, 10, 5, 0.9, 1),
        ("tenth", "half_mse", 50, 24, 8, 0.25, 2),  # two envs per slot
        ("until_below", "half_mse", 64, 20, 8, 0.25, 1),
        ("until_below", "l2", 64, 12, 6, 0.9, 1),
        ("until_below", "half_mse", 12, 3, 8, 0.2, 1),  # capacity < 2K: fewer pop candidates
    ],
)
def test_shrink_rule_matches_numpy_fifo(shrink, distance, capacity, min_size, k, threshold, streams):
    world = _World(seed=capacity + k, streams=streams)
    rule = dynamic.make_dynamic_replay(
        capacity * streams, min_size * streams, k * streams, threshold, shrink, distance, streams=streams
    )
    assert (rule.capacity, rule.min_size, rule.num_oldest) == (capacity, min_size, k)
    example = jax.tree.map(jnp.asarray, world.item(0))
    state = replay.init(example, capacity)

    def actions_fn(items, theta):
        return jnp.tanh(items["obs"] * theta[0] + theta[1]), items["ref"]

    add = jax.jit(lambda s, item: replay.add(s, jax.tree.map(lambda x: x[None], item)))
    check = jax.jit(lambda s, theta: dynamic.adjust(s, rule, lambda items: actions_fn(items, theta)))
    fifo, interval, shrinks, kept = [], 7, 0, 0
    max_pops = min(2 * k, capacity) - k
    for j in range(400):
        state = add(state, jax.tree.map(jnp.asarray, world.item(j)))
        fifo = (fifo + [j])[-capacity:]
        if (j + 1) % interval:
            continue
        theta = world.rng.normal(size=2).astype(np.float32) * np.float32(0.8)
        d_of = lambda ids: world.distances_np(theta, ids, distance)  # noqa: E731
        if shrink == "tenth":
            fifo, d_want = _np_code_rule(fifo, d_of, (k, threshold, min_size))
        else:
            fifo, d_want = _np_paper_rule(fifo, d_of, (k, threshold, min_size), max_pops)
        before = int(state.size)
        state, info = check(state, jnp.asarray(theta))
        assert float(info.distance) == pytest.approx(d_want, rel=1e-4, abs=1e-6)
        assert int(state.size) == len(fifo), f"check at item {j}"
        assert int(info.dropped) == before - len(fifo)
        shrinks += int(info.dropped) > 0
        kept += int(info.dropped) == 0
        # The valid items are exactly the FIFO's, oldest first.
        oldest = (int(state.insert_pos) - int(state.size)) % capacity
        slots = (oldest + np.arange(int(state.size))) % capacity
        np.testing.assert_allclose(
            np.asarray(state.storage["obs"])[slots, 0, 0], np.array(fifo, np.float32) / 100.0, rtol=1e-6
        )
    assert shrinks > 0 and kept > 0  # both branches were exercised


def test_tenth_rule_scalar_cases():
    rule = dynamic.make_dynamic_replay(1000, 100, 10, 0.2)
    cases = [(500, 0.3, 450), (500, 0.2, 500), (500, 0.1, 500), (100, 0.9, 100), (101, 0.9, 91), (9, 0.9, 9)]
    for size, d, new_size in cases:
        rule_small = rule._replace(min_size=5) if size == 9 else rule
        dropped = dynamic.tenth_rule(jnp.int32(size), jnp.float32(d), rule_small)
        assert size - int(dropped) == new_size, (size, d)


def test_adjust_is_jittable_and_vmaps_over_seeds():
    rule = dynamic.make_dynamic_replay(32, 8, 4, 0.1)
    states, thetas = [], [0.0, 3.0]
    for seed in range(2):
        s = replay.init({"obs": jnp.zeros((1, 1)), "ref": jnp.zeros((1, A))}, 32)
        for j in range(20):
            s = replay.add(s, {"obs": jnp.full((1, 1, 1), j / 10.0), "ref": jnp.full((1, 1, A), -0.5 * seed)})
        states.append(s)
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *states)

    def one(s, theta):
        return dynamic.adjust(s, rule, lambda items: (jnp.tanh(theta * items["obs"]) * jnp.ones(A), items["ref"]))

    got_state, got_info = jax.jit(jax.vmap(one))(stacked, jnp.asarray(thetas))
    for i in range(2):
        want_state, want_info = one(states[i], jnp.float32(thetas[i]))
        assert int(got_state.size[i]) == int(want_state.size)
        assert float(got_info.distance[i]) == pytest.approx(float(want_info.distance), rel=1e-6)
    assert int(got_state.size[0]) == 20 and int(got_state.size[1]) == 18  # only seed 1 is off-policy


def test_check_due_counts_env_steps():
    due = [bool(dynamic.check_due(jnp.int32(t), jnp.int32(t + 1), 10)) for t in range(30)]
    assert [t for t, d in enumerate(due) if d] == [9, 19, 29]  # the code's (t + 1) % 10 == 0
    assert bool(dynamic.check_due(jnp.int32(8), jnp.int32(12), 10))  # several env steps per update


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        (dict(max_size=100, min_size=200, num_oldest=10), r"buffer_min_size=200 .*<= buffer_max_size \(100\)"),
        (dict(max_size=0, min_size=0, num_oldest=10), r"buffer_max_size=0 .*> 0"),
        (dict(max_size=100, min_size=10, num_oldest=0), r"buffer_num_oldest=0 .*> 0"),
        (dict(max_size=100, min_size=10, num_oldest=500), r"buffer_num_oldest=500 .*<= buffer_max_size"),
        (dict(max_size=100, min_size=10, num_oldest=10, threshold=0.0), r"buffer_threshold=0.0 .*> 0"),
        (dict(max_size=100, min_size=10, num_oldest=10, shrink="half"), r"buffer_shrink='half' .*tenth, until_below"),
        (dict(max_size=100, min_size=10, num_oldest=10, distance="l1"), r"buffer_distance='l1' .*half_mse, l2"),
        (dict(max_size=100, min_size=10, num_oldest=10, streams=200), r"buffer_max_size=100 .*num_envs \(200\)"),
        (dict(max_size=100.0, min_size=10, num_oldest=10), r"buffer_max_size=100.0 .*int"),
    ],
)
def test_bad_arguments_are_config_errors(kwargs, pattern):
    with pytest.raises(ConfigError, match=pattern):
        dynamic.make_dynamic_replay(**kwargs)

"""Tests of sparqrl.sparse against the RLx2 reference (Tan et al., ICLR 2023) and plain NumPy."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from sparqrl import sparse as sp
from sparqrl.config import ConfigError
from sparqrl.nets import ActorCritic, QNetwork

# gym-0.19 -v3 (obs, act) dimensions used by the paper (reference §3.10).
ENVS = {"HalfCheetah": (17, 6), "Hopper": (11, 3), "Walker2d": (17, 6), "Ant": (111, 8)}

# Reference §3.10: (alg, env, actor S, actor s_l, critic S, critic s_l per Q-network).
ER_TABLE = [
    ("TD3", "HalfCheetah", 0.90, (0.552, 0.944, 0.000), 0.85, (0.371, 0.896, 0.0)),
    ("TD3", "Hopper", 0.98, (0.874, 0.990, 0.551), 0.95, (0.690, 0.968, 0.0)),
    ("TD3", "Walker2d", 0.97, (0.872, 0.984, 0.651), 0.95, (0.801, 0.967, 0.0)),
    ("TD3", "Ant", 0.96, (0.957, 0.974, 0.567), 0.88, (0.843, 0.901, 0.0)),
    ("SAC", "HalfCheetah", 0.90, (0.565, 0.946, 0.396), 0.80, (0.157, 0.861, 0.0)),
    ("SAC", "Hopper", 0.98, (0.873, 0.990, 0.771), 0.95, (0.690, 0.968, 0.0)),
    ("SAC", "Walker2d", 0.90, (0.565, 0.946, 0.396), 0.90, (0.586, 0.932, 0.0)),
    ("SAC", "Ant", 0.90, (0.890, 0.933, 0.434), 0.75, (0.670, 0.790, 0.0)),
]

# Reference §7 (Table 2): alg, env -> (total size, FLOPs train, FLOPs test); §3.11 four-decimal sizes.
TABLE2 = {
    ("TD3", "HalfCheetah"): (0.133, 0.138, 0.100),
    ("TD3", "Hopper"): (0.040, 0.043, 0.020),
    ("TD3", "Walker2d"): (0.043, 0.045, 0.030),
    ("TD3", "Ant"): (0.093, 0.100, 0.040),
    ("SAC", "HalfCheetah"): (0.180, 0.197, 0.100),
    ("SAC", "Hopper"): (0.044, 0.048, 0.020),
    ("SAC", "Walker2d"): (0.100, 0.113, 0.100),
    ("SAC", "Ant"): (0.220, 0.239, 0.100),
}
# §3.11: TD3 actor+critic(+targets); SAC actor+critic, and + critic target. These were computed with
# the continuous densities; the floored zero counts int(s*N) keep up to one extra weight per layer
# (<= 4e-5 here), hence the 1e-4 tolerance below.
SIZE_4DP = {
    "TD3": (0.1334, 0.0400, 0.0433, 0.0934),
    "SAC": (0.1663, 0.0400, 0.1000, 0.1994),
    "SAC+target": (0.1797, 0.0440, 0.1000, 0.2196),
}


def layer_shapes(alg: str, env: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    obs, act = ENVS[env]
    out = act if alg == "TD3" else 2 * act
    return [(obs, 256), (256, 256), (256, out)], [(obs + act, 256), (256, 256), (256, 1)]


def mlp_tree(shapes, rng: np.random.Generator | None = None) -> dict:
    """A flax-style MLP tree; random U(-1/sqrt(I), 1/sqrt(I)) values (PyTorch default) or shape structs."""
    layers = {}
    for i, (n_in, n_out) in enumerate(shapes):
        if rng is None:
            k = jax.ShapeDtypeStruct((n_in, n_out), jnp.float32)
            b = jax.ShapeDtypeStruct((n_out,), jnp.float32)
        else:
            bound = 1.0 / math.sqrt(n_in)
            k = jnp.asarray(rng.uniform(-bound, bound, (n_in, n_out)), jnp.float32)
            b = jnp.asarray(rng.uniform(-bound, bound, (n_out,)), jnp.float32)
        layers[f"Dense_{i}"] = {"kernel": k, "bias": b}
    return layers


def random_tree(module, x, seed: int = 0):
    """The module's parameter tree with random values: shapes from ``jax.eval_shape`` (compiling
    flax's orthogonal init would dominate this file's runtime), N(0, 1/fan_in) kernels, zero rest."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(module.init, jax.random.key(0), x)
    return jax.tree.map(
        lambda s: jnp.asarray(rng.normal(size=s.shape) / math.sqrt(math.prod(s.shape[:-1])), jnp.float32)
        if len(s.shape) >= 2 else jnp.zeros(s.shape, jnp.float32),
        shapes,
    )


def np_counts(masks) -> dict[str, int]:
    """Active weights per sparse leaf, counted on the host (no per-shape compilations)."""
    return {sp.path_str(p): int(np.asarray(m).sum())
            for p, m in jax.tree_util.tree_flatten_with_path(masks)[0] if np.ndim(m)}


def networks(alg: str, env: str, rng=None) -> tuple[dict, dict]:
    """(actor, twin critic) trees; the critic holds Q1 and Q2 in one tree (one joint ER solve)."""
    actor, q = layer_shapes(alg, env)
    return {"params": mlp_tree(actor, rng)}, {"params": {"q1": mlp_tree(q, rng), "q2": mlp_tree(q, rng)}}


# ---------------------------------------------------------------- allocation


@pytest.mark.parametrize("row", ER_TABLE, ids=[f"{r[0]}-{r[1]}" for r in ER_TABLE])
def test_er_allocation_matches_reference_table(row):
    alg, env, s_actor, want_actor, s_critic, want_critic = row
    actor, critic = networks(alg, env)
    got_actor = [a.sparsity for a in sp.allocate(actor, s_actor, "er")]
    got_critic = {a.path: a.sparsity for a in sp.allocate(critic, s_critic, "er")}
    np.testing.assert_allclose(got_actor, want_actor, atol=5e-4 + 1e-9)
    for q in ("q1", "q2"):
        per_q = [got_critic[f"params/{q}/Dense_{i}/kernel"] for i in range(3)]
        np.testing.assert_allclose(per_q, want_critic, atol=5e-4 + 1e-9)
    assert got_critic["params/q1/Dense_2/kernel"] == 0.0  # critic output layers are dense


def test_er_budget_and_uniform():
    shapes = [(17, 256), (256, 256), (256, 6)]
    for s in (0.0, 0.5, 0.9, 0.99):
        dens = [1 - x for x in sp.er_sparsities(shapes, s)]
        assert all(0.0 <= d <= 1.0 + 1e-12 for d in dens)
        kept = sum(d * math.prod(sh) for d, sh in zip(dens, shapes))
        assert kept == pytest.approx((1 - s) * sum(math.prod(sh) for sh in shapes))
    allocs = sp.allocate({"params": mlp_tree(shapes)}, 0.9, "uniform")
    assert [a.sparsity for a in allocs] == [0.9] * 3
    assert [a.n_zeros for a in allocs] == [int(0.9 * 17 * 256), int(0.9 * 256 * 256), int(0.9 * 256 * 6)]


# ---------------------------------------------------------------- initial masks


@pytest.mark.parametrize("method", ["magnitude", "random"])
def test_init_masks_exact_per_layer(method):
    actor, _ = networks("TD3", "Hopper", np.random.default_rng(0))
    allocs = sp.allocate(actor, 0.98, "er")
    # params as an argument, not a closed-over constant: XLA would constant-fold the sort (slow)
    init = jax.jit(jax.vmap(lambda k, p: sp.init_masks(k, p, 0.98, method=method), in_axes=(0, None)))
    params, masks = init(jax.random.split(jax.random.key(1), 2), actor)
    for seed in range(2):
        p = jax.tree.map(lambda x: np.asarray(x[seed]), params)
        m = jax.tree.map(lambda x: np.asarray(x[seed]), masks)
        for a in allocs:
            layer = a.path.split("/")[1]
            w0 = np.asarray(actor["params"][layer]["kernel"])
            w, mk = p["params"][layer]["kernel"], m["params"][layer]["kernel"]
            assert mk.dtype == bool and mk.shape == a.shape
            assert mk.sum() == a.size - int(a.sparsity * a.size) == a.n_active
            assert np.all(w[~mk] == 0.0) and np.array_equal(w[mk], w0[mk])  # survivors keep their values
            if method == "magnitude":
                assert np.abs(w0[mk]).min() >= np.abs(w0[~mk]).max()
            assert m["params"][layer]["bias"].shape == ()  # biases dense
            assert np.array_equal(p["params"][layer]["bias"], np.asarray(actor["params"][layer]["bias"]))
    if method == "random":  # different keys, different masks
        assert not np.array_equal(masks["params"]["Dense_1"]["kernel"][0], masks["params"]["Dense_1"]["kernel"][1])
    counts = jax.jit(sp.layer_active_counts)(jax.tree.map(lambda x: x[0], masks))
    assert {k: int(v) for k, v in counts.items()} == {a.path: a.n_active for a in allocs}


# ---------------------------------------------------------------- drop / grow vs NumPy


def all_of(flags) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(f) for f in flags]))


def np_drop_grow(w, m, score, n_drop):
    """Plain NumPy drop/grow of reference §3.6 (ties to the lower flat index)."""
    shape = w.shape
    w, m, score = w.ravel(), m.ravel(), score.ravel()
    n_active = int(m.sum())
    keep = np.zeros(m.size, bool)
    keep[np.argsort(-np.where(m, np.abs(w), -np.inf), kind="stable")[: n_active - n_drop]] = True
    grow = np.zeros(m.size, bool)
    grow[np.argsort(-np.where(keep, -np.inf, score), kind="stable")[:n_drop]] = True
    new_m = keep | grow
    return np.where(new_m & m, w, 0.0).reshape(shape), new_m.reshape(shape), keep.reshape(shape), grow.reshape(shape)


def np_n_drop(n_active, zeta):
    return int(np.floor(np.float32(n_active) * np.float32(zeta)))


def test_drop_and_grow_matches_numpy():
    rng = np.random.default_rng(0)
    fn = jax.jit(sp.drop_and_grow)
    for trial in range(6):
        shape = (7, 5)
        m = np.zeros(35, bool)
        m[rng.choice(35, 14, replace=False)] = True
        m = m.reshape(shape)
        w = np.where(m, rng.normal(size=shape), 0.0).astype(np.float32)
        score = np.abs(rng.normal(size=shape)).astype(np.float32)
        if trial >= 3:  # ties: few weight magnitudes, many zero gradients
            w = np.where(m, np.round(w), 0.0).astype(np.float32)
            score = np.where(rng.random(shape) < 0.6, 0.0, np.round(score)).astype(np.float32)
        n_drop = [0, 3, 7, 14, 5, 9][trial]
        want_w, want_m, keep, grow = np_drop_grow(w, m, score, n_drop)
        got_w, got_m = fn(w, m, score, n_drop)
        np.testing.assert_array_equal(np.asarray(got_m), want_m)
        np.testing.assert_array_equal(np.asarray(got_w), want_w)
        assert want_m.sum() == m.sum()  # exact count
        assert keep.sum() == 14 - n_drop and not np.any(keep & ~m)  # drop only among active
        assert np.all(want_w[grow & ~m] == 0.0)  # new connections start at 0
        # with distinct magnitudes the dropped are exactly the n_drop smallest |w| among active
        if trial < 3 and n_drop:
            dropped = m & ~keep
            assert np.abs(w[dropped]).max() <= np.abs(w[keep]).min()


@pytest.mark.parametrize("method", ["rigl", "set"])
def test_update_topology_tree_matches_numpy(method):
    rng = np.random.default_rng(1)
    params = {"a": {"kernel": rng.normal(size=(6, 9)).astype(np.float32), "bias": np.ones(9, np.float32)},
              "b": {"kernel": rng.normal(size=(9, 4)).astype(np.float32), "bias": np.ones(4, np.float32)}}
    params, masks = jax.jit(lambda k, p: sp.init_masks(k, p, 0.6, allocation="uniform", method="random"))(
        jax.random.key(0), params)
    grads = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), params)
    key, zeta = jax.random.key(7), 0.37
    new_p, new_m = jax.jit(sp.update_topology, static_argnames="method")(key, params, masks, grads, zeta, method=method)
    # SET's documented scores: one uniform draw over all sparse leaves, cut in flatten order
    flat = np.asarray(jax.random.uniform(key, (6 * 9 + 9 * 4,)))
    random_scores = {"a": flat[:54].reshape(6, 9), "b": flat[54:].reshape(9, 4)}
    for layer in ("a", "b"):  # sparse leaves in flatten order: a/kernel, b/kernel
        w, m = np.asarray(params[layer]["kernel"]), np.asarray(masks[layer]["kernel"])
        score = np.abs(np.asarray(grads[layer]["kernel"])) if method == "rigl" else random_scores[layer]
        want_w, want_m, _, _ = np_drop_grow(w, m, score, np_n_drop(m.sum(), zeta))
        np.testing.assert_array_equal(np.asarray(new_m[layer]["kernel"]), want_m)
        np.testing.assert_array_equal(np.asarray(new_p[layer]["kernel"]), want_w)
        assert not np.array_equal(want_m, m)
        np.testing.assert_array_equal(np.asarray(new_p[layer]["bias"]), np.ones_like(params[layer]["bias"]))
    # the same under lax.cond with the schedule, for masks kept outside the optimizer
    schedule = sp.TopologySchedule(method=method, interval=10, t_end=1_000, zeta0=0.6)
    maybe = jax.jit(lambda t: sp.maybe_update_topology(key, t, params, masks, grads, schedule))
    p20, m20, up20 = maybe(20)
    want_p, want_m = jax.jit(sp.update_topology, static_argnames="method")(
        key, params, masks, grads, schedule.drop_fraction(20), method=method)
    def same(a, b) -> bool:
        return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))

    assert bool(up20) and same((p20, m20), (want_p, want_m))
    p21, m21, up21 = maybe(21)
    assert not bool(up21) and same((p21, m21), (params, masks))


# ---------------------------------------------------------------- schedule


def test_cosine_schedule_and_update_steps():
    zeta0, t_end = 0.5, 2_975_000
    steps = np.array([0, 1, 10_000, 1_000_000, 2_000_000, 2_970_000, 2_975_000])
    got = np.asarray(jax.jit(lambda t: sp.cosine_drop_fraction(t, zeta0, t_end))(steps))
    np.testing.assert_allclose(got, zeta0 / 2 * (1 + np.cos(np.pi * steps / t_end)), atol=1e-6)
    assert got[2] == pytest.approx(0.49999, abs=1e-5)  # reference §3.7 evaluated values
    assert got[3] == pytest.approx(0.373, abs=1e-3) and got[4] == pytest.approx(0.121, abs=1e-3)
    sched = sp.TopologySchedule()  # reference defaults
    assert sched.drop_fraction(10_000) == pytest.approx(0.49999, abs=1e-5)
    # update steps: step > 0, step % ΔT == 0, step < T_end; counts of reference §3.7
    for t_end, n in ((2_975_000, 297), (1_487_500, 148)):
        all_steps = np.arange(1, t_end + 1)
        assert int(((all_steps % 10_000 == 0) & (all_steps < t_end)).sum()) == n
    probe = np.array([0, 1, 9_999, 10_000, 20_000, 2_970_000, 2_975_000, 2_980_000])
    got = np.asarray(jax.jit(jax.vmap(sched.should_update))(probe))
    np.testing.assert_array_equal(got, (probe > 0) & (probe % 10_000 == 0) & (probe < 2_975_000))
    # usable as a lax.cond predicate under jit
    f = jax.jit(lambda t: jax.lax.cond(sched.should_update(t), lambda: 1, lambda: 0))
    assert int(f(20_000)) == 1 and int(f(20_001)) == 0
    assert not bool(sp.TopologySchedule(method="static").should_update(10_000))


# ---------------------------------------------------------------- long jitted run


@pytest.mark.parametrize("method,reset,skip", [("set", True, False), ("rigl", False, True)])
def test_pruned_weights_stay_zero_through_adam_and_topology_updates(method, reset, skip):
    net = QNetwork(action_dim=4, obs_shape=(6,), hidden=(32, 32))
    params0 = random_tree(net, jnp.zeros((6,)))
    params, masks = jax.jit(lambda p: sp.init_masks(None, p, 0.8))(params0)
    counts0 = sp.layer_active_counts(masks)
    schedule = sp.TopologySchedule(method=method, interval=20, t_end=5_000, zeta0=0.5,
                                   reset_moments_on_grow=reset, skip_step_on_update=skip)
    tx = sp.masked(optax.chain(optax.clip_by_global_norm(10.0), optax.adam(3e-3)), masks)
    x = jax.random.normal(jax.random.key(1), (64, 6))
    y = jnp.sin(x[:, :4] * 2.0) + x[:, 4:5]

    def loss(p):
        return jnp.mean((net.apply(p, x) - y) ** 2)

    def body(carry, i):
        params, opt_state, ok = carry
        old_masks = sp.get_masks(opt_state)
        value, grads = jax.value_and_grad(loss)(params)
        key = jax.random.fold_in(jax.random.key(2), i)
        new = sp.apply_gradients(key, i + 1, params, opt_state, grads, tx, schedule)
        masks = sp.get_masks(new.opt_state)
        counts = sp.layer_active_counts(masks)
        ok &= all_of(counts[k] == counts0[k] for k in counts0)  # exact per-layer counts
        ok &= all_of(jnp.where(m, True, p == 0.0)
                     for p, m in zip(jax.tree.leaves(new.params), jax.tree.leaves(masks)))  # pruned == 0
        if skip:  # update steps: no optimizer step, survivors unchanged, new connections at exactly 0
            leaves = zip(jax.tree.leaves(new.params), jax.tree.leaves(params), jax.tree.leaves(masks),
                         jax.tree.leaves(old_masks))
            same = all_of(jnp.where(m & o, q == p, jnp.where(m, q == 0.0, True)) for q, p, m, o in leaves)
            ok &= ~new.topology_updated | same
        changed = sum(jnp.sum(m != o) for m, o in zip(jax.tree.leaves(masks), jax.tree.leaves(old_masks)))
        return (new.params, new.opt_state, ok), (value, new.topology_updated, changed)

    # 1100 iterations: 55 topology updates (every 20th), >= 1000 Adam steps even when skipped on updates
    run = jax.jit(lambda p, s: jax.lax.scan(body, (p, s, jnp.array(True)), jnp.arange(1100)))
    (params, opt_state, ok), (losses, updated, changed) = run(params, tx.init(params))
    assert bool(ok)
    assert int(updated.sum()) == 55 and int((changed > 0).sum()) == 55  # every update moved the mask
    assert int(changed[~updated].sum()) == 0
    assert float(losses[-1]) < 0.5 * float(losses[0])  # it still learns
    masks = sp.get_masks(opt_state)
    for p, m in zip(jax.tree.leaves(params), jax.tree.leaves(masks)):
        p, m = np.asarray(p), np.asarray(m)
        if m.ndim:
            assert np.all(p[~m] == 0.0)
    adam_count = int(opt_state.inner[1][0].count)
    assert adam_count == (1045 if skip else 1100)


def test_set_masks_resets_changed_moments_only():
    params = {"d": {"kernel": jnp.ones((3, 4)), "bias": jnp.ones(4)}}
    params, masks = sp.init_masks(jax.random.key(0), params, 0.5, allocation="uniform", method="random")
    tx = sp.masked(optax.adam(0.1), masks)
    state = tx.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    for _ in range(3):
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    old = masks["d"]["kernel"]
    new_masks = {"d": {"kernel": jnp.roll(old, 1), "bias": masks["d"]["bias"]}}
    changed = np.asarray(old != new_masks["d"]["kernel"])
    kept = sp.set_masks(state, new_masks)
    reset = sp.set_masks(state, new_masks, reset_changed=True)
    assert sp.get_masks(reset) is new_masks
    for name in ("mu", "nu"):
        before = np.asarray(getattr(state.inner[0], name)["d"]["kernel"])
        after = np.asarray(getattr(reset.inner[0], name)["d"]["kernel"])
        assert np.all(after[changed] == 0) and np.array_equal(after[~changed], before[~changed])
        np.testing.assert_array_equal(getattr(kept.inner[0], name)["d"]["kernel"], before)  # default: untouched
        bias_before, bias_after = getattr(state.inner[0], name)["d"]["bias"], getattr(reset.inner[0], name)["d"]["bias"]
        np.testing.assert_array_equal(bias_after, bias_before)
    assert int(reset.inner[0].count) == 3


def test_target_networks_share_online_masks():
    rng = np.random.default_rng(3)
    online = {"params": mlp_tree([(5, 8), (8, 2)], rng)}
    online, masks = sp.init_masks(None, online, 0.7)
    target = {"params": mlp_tree([(5, 8), (8, 2)], rng)}  # dense, as a fresh copy would be
    masked_target = sp.apply_masks(target, masks)
    new = jax.jit(sp.masked_polyak)(online, target, 0.005, masks)
    for layer in ("Dense_0", "Dense_1"):
        m = np.asarray(masks["params"][layer]["kernel"])
        t, o = np.asarray(target["params"][layer]["kernel"]), np.asarray(online["params"][layer]["kernel"])
        np.testing.assert_array_equal(masked_target["params"][layer]["kernel"], np.where(m, t, 0))
        np.testing.assert_allclose(new["params"][layer]["kernel"], np.where(m, 0.005 * o + 0.995 * t, 0), rtol=1e-6)
        np.testing.assert_allclose(new["params"][layer]["bias"],
                                   0.005 * np.asarray(online["params"][layer]["bias"])
                                   + 0.995 * np.asarray(target["params"][layer]["bias"]), rtol=1e-6)


# ---------------------------------------------------------------- real network trees


def test_ppo_actor_critic_and_dqn_trees():
    ppo = ActorCritic(action_dim=3, discrete=False, obs_shape=(8,), hidden=(64, 64))
    dqn_mlp = QNetwork(action_dim=4, obs_shape=(8,), hidden=(64, 64))
    dqn_cnn = QNetwork(action_dim=4, obs_shape=(10, 10, 4), hidden=(32,))
    trees = {"ppo": random_tree(ppo, jnp.zeros((8,))), "dqn": random_tree(dqn_mlp, jnp.zeros((8,)))}
    cnn = jax.eval_shape(dqn_cnn.init, jax.random.key(2), jnp.zeros((10, 10, 4)))  # shapes suffice
    # PPO: actor (MLP_0 + head Dense_0) and critic (MLP_1 + head Dense_1) solved separately.
    groups = {r"^params/(MLP_0/|Dense_0/)": 0.9, r"^params/(MLP_1/|Dense_1/)": 0.5}
    schedule = sp.TopologySchedule(method="rigl", interval=1, t_end=100, skip_step_on_update=False)
    for name, params in trees.items():
        sparsity = groups if name == "ppo" else 0.9
        allocs = sp.allocate(params, sparsity)
        tx = sp.masked(optax.adam(1e-2), lambda p: sp.init_masks(None, p, sparsity)[1])

        @jax.jit
        def init_and_step(params):
            params, masks = sp.init_masks(None, params, sparsity)
            grads = jax.tree.map(lambda x: jnp.full_like(x, 0.3), params)
            step = sp.apply_gradients(jax.random.key(3), 1, params, tx.init(params), grads, tx, schedule)
            return params, masks, step

        params, masks, step = init_and_step(params)
        for (path, leaf), m in zip(jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(masks)):
            is_kernel = sp.path_str(path).endswith("kernel") and leaf.ndim == 2
            assert (m.ndim > 0) == is_kernel  # biases, log_std and the conv kernel stay dense
        want = {a.path: a.n_active for a in allocs}
        assert want == np_counts(masks)
        if name == "ppo":
            actor = [a for a in allocs if "MLP_0/" in a.path or a.path.startswith("params/Dense_0/")]
            frac = sum(a.n_active for a in actor) / sum(a.size for a in actor)
            assert frac == pytest.approx(0.1, abs=1e-3)
        assert bool(step.topology_updated)
        new_masks = sp.get_masks(step.opt_state)
        assert want == np_counts(new_masks)
        assert any(np.any(np.asarray(a) != np.asarray(b))
                   for a, b in zip(jax.tree.leaves(masks), jax.tree.leaves(new_masks)))
        for p, m in zip(jax.tree.leaves(step.params), jax.tree.leaves(new_masks)):
            p, m = np.asarray(p), np.asarray(m)
            assert m.ndim == 0 or np.all(p[~m] == 0.0)
    # conv kernels can be made sparse too (not the reference's choice), and layers opted out
    assert [a.path for a in sp.allocate(cnn, 0.9)] == [
        "params/Dense_0/kernel", "params/MinAtarCNN_0/MLP_0/Dense_0/kernel"]  # the conv kernel stays dense
    assert any(a.path.endswith("Conv_0/kernel") for a in sp.allocate(cnn, 0.5, rule=sp.is_any_kernel))
    kept = sp.allocate(trees["dqn"], 0.5, keep_dense=[r"^params/Dense_0/"])
    assert kept and all(not a.path.startswith("params/Dense_0/") for a in kept)


# ---------------------------------------------------------------- accounting


def table2_counts(alg, env):
    """(active, total) weights of actor and twin critic from the ER allocation alone (no biases)."""
    s_actor, s_critic = next((r[2], r[4]) for r in ER_TABLE if r[:2] == (alg, env))
    actor, critic = networks(alg, env)
    a, c = sp.allocate(actor, s_actor), sp.allocate(critic, s_critic)
    na, nc = sum(x.n_active for x in a), sum(x.n_active for x in c)
    ta, tc = sum(x.size for x in a), sum(x.size for x in c)
    return na, nc, ta, tc


@pytest.mark.parametrize("key", list(TABLE2), ids=[f"{a}-{e}" for a, e in TABLE2])
def test_size_and_flops_ratios_match_table2(key):
    alg, env = key
    na, nc, ta, tc = table2_counts(alg, env)
    size, train, test = TABLE2[key]
    i = list(ENVS).index(env)
    if alg == "TD3":  # actor, critic and both targets
        ratio = (2 * na + 2 * nc) / (2 * ta + 2 * tc)
        assert ratio == pytest.approx(SIZE_4DP["TD3"][i], abs=1e-4)
        assert (na * 1 + nc * 1.5) / (ta * 1 + tc * 1.5) == pytest.approx(train, abs=5e-4 + 1e-9)
    else:  # actor, critic and critic target (SAC has no actor target)
        assert (na + nc) / (ta + tc) == pytest.approx(SIZE_4DP["SAC"][i], abs=1e-4)
        ratio = (na + 2 * nc) / (ta + 2 * tc)
        assert ratio == pytest.approx(SIZE_4DP["SAC+target"][i], abs=1e-4)
    assert ratio == pytest.approx(size, abs=5e-4 + 1e-9)
    assert na / ta == pytest.approx(test, abs=5e-4 + 1e-9)  # inference = actor forward only


def test_accounting_functions_on_real_masks():
    rng = np.random.default_rng(0)
    for alg, env, s_a, s_c in (("TD3", "HalfCheetah", 0.90, 0.85), ("SAC", "HalfCheetah", 0.90, 0.80)):
        actor, critic = networks(alg, env, rng)
        actor, actor_masks = jax.jit(lambda p: sp.init_masks(None, p, s_a))(actor)
        critic, critic_masks = jax.jit(lambda p: sp.init_masks(None, p, s_c))(critic)
        counts = {"actor": sp.count_params(actor, actor_masks), "critic": sp.count_params(critic, critic_masks)}
        stored = ["actor", "critic", "actor", "critic"] if alg == "TD3" else ["actor", "critic", "critic"]
        out = sp.summary(counts, acting="actor", train_weights={"actor": 1.0, "critic": 1.5}, stored=stored)
        size, train, test = TABLE2[(alg, env)]
        assert out["size_ratio"] == pytest.approx(size, abs=5e-4)
        assert out["infer_flops_ratio"] == pytest.approx(test, abs=5e-4)
        assert out["actor_sparsity"] == pytest.approx(s_a, abs=1e-4)
        assert out["critic_sparsity"] == pytest.approx(s_c, abs=1e-4)
        if alg == "TD3":
            assert out["train_flops_ratio"] == pytest.approx(train, abs=5e-4)
        c = counts["actor"]
        obs, act = ENVS[env]
        n_out = act if alg == "TD3" else 2 * act
        assert c.total_weights == obs * 256 + 256 * 256 + 256 * n_out and c.other == 256 + 256 + n_out
        assert c.active == c.active_weights + c.other
        assert sp.size_ratio([c], include_other=True) == pytest.approx(c.active / c.total)
        assert sp.global_sparsity(actor_masks) == pytest.approx(out["actor_sparsity"], abs=1e-6)
        dense = sp.count_params(actor)
        assert sp.size_ratio([dense]) == 1.0 and sp.inference_flops_ratio(dense) == 1.0
    # conv layers: FLOPs weighted by uses per sample
    cnt = sp.ParamCount((sp.WeightCount("conv", 100, 100), sp.WeightCount("dense", 1000, 100)), 0)
    assert sp.inference_flops_ratio(cnt, uses={"conv": 64}) == pytest.approx((6400 + 100) / (6400 + 1000))


# ---------------------------------------------------------------- bad input


def test_bad_values_raise_config_errors():
    params = {"d": {"kernel": jnp.ones((4, 4)), "bias": jnp.ones(4)}}
    cases = [
        (lambda: sp.init_masks(None, params, 1.0), "sparsity=1.0", "[0, 1)"),
        (lambda: sp.init_masks(None, params, -0.1), "sparsity=-0.1", "[0, 1)"),
        (lambda: sp.init_masks(None, params, "0.5"), "sparsity='0.5'", "[0, 1)"),
        (lambda: sp.allocate(params, 0.5, "erk"), "allocation='erk'", "er, uniform"),
        (lambda: sp.init_masks(None, params, 0.5, method="lottery"), "method='lottery'", "magnitude, random"),
        (lambda: sp.init_masks(None, params, 0.5, method="random"), "key=None", "PRNG key"),
        (lambda: sp.allocate(params, {"^e/": 0.5}), "sparsity=", "no group pattern matches"),
        (lambda: sp.allocate(params, {"^d/": 1.5}), "sparsity['^d/']=1.5", "[0, 1)"),
        (lambda: sp.TopologySchedule(method="mest"), "method='mest'", "rigl, set, static"),
        (lambda: sp.TopologySchedule(interval=0), "interval=0", "> 0"),
        (lambda: sp.TopologySchedule(t_end=2.5), "t_end=2.5", "integer"),
        (lambda: sp.TopologySchedule(zeta0=1.5), "zeta0=1.5", "[0, 1]"),
        (lambda: sp.update_topology(jax.random.key(0), params, params, None, 0.1, "foo"), "method='foo'", "rigl"),
        (lambda: sp.er_sparsities([(3, 4)], 1.0), "sparsity=1.0", "[0, 1)"),
    ]
    for fn, field_value, allowed in cases:
        with pytest.raises(ConfigError) as err:
            fn()
        assert field_value in str(err.value) and allowed in str(err.value), str(err.value)
    # checked on the host before tracing: the error surfaces from inside jit unchanged
    with pytest.raises(ConfigError, match="sparsity=1.0"):
        jax.jit(lambda p: sp.init_masks(None, p, 1.0))(params)


@pytest.mark.parametrize("net", ["ppo", "dqn"])
def test_net_training_keeps_ppo_and_dqn_networks_sparse(net):
    """`NetTraining` (the entry point TD3/SAC use) trains PPO's actor-critic and DQN's Q-network as they
    are: RigL updates every 5 steps under vmap over 2 seeds, masks exact, pruned weights exactly 0."""
    x = jax.random.normal(jax.random.key(3), (32, 8))
    if net == "ppo":
        module = ActorCritic(action_dim=3, discrete=True, obs_shape=(8,), hidden=(32, 32))

        def loss(params):
            pi, value = module.apply(params, x)
            return -jnp.mean(pi.log_prob(jnp.zeros(32, jnp.int32))) + jnp.mean((value - 1.0) ** 2)
    else:
        module = QNetwork(action_dim=4, obs_shape=(8,), hidden=(32, 32))

        def loss(params):
            return jnp.mean((module.apply(params, x)[:, 1] - 1.0) ** 2)

    schedule = sp.TopologySchedule(method="rigl", interval=5, t_end=60)
    training = sp.NetTraining(optax.adam(1e-2), 0.8, schedule)
    params0 = random_tree(module, jnp.zeros(8))

    def run(key):
        params, opt_state = training.init(key, params0)
        initial = sp.get_masks(opt_state)

        def step(carry, i):
            params, opt_state = carry
            out = training.step(jax.random.fold_in(key, i), i + 1, params, opt_state, jax.grad(loss)(params))
            return (out.params, out.opt_state), out.topology_updated

        (params, opt_state), updated = jax.lax.scan(step, (params, opt_state), jnp.arange(60))
        return params, initial, sp.get_masks(opt_state), updated, loss(params)

    params, initial, masks, updated, final_loss = jax.jit(jax.vmap(run))(jax.random.split(jax.random.key(0), 2))
    assert int(updated[0].sum()) == 11  # steps 5, 10, ..., 55
    counts = {a.path: a.n_active for a in sp.allocate(params0, 0.8)}
    flat_p = dict((sp.path_str(k), v) for k, v in jax.tree_util.tree_flatten_with_path(params)[0])
    flat_m = dict((sp.path_str(k), v) for k, v in jax.tree_util.tree_flatten_with_path(masks)[0])
    flat_0 = dict((sp.path_str(k), v) for k, v in jax.tree_util.tree_flatten_with_path(initial)[0])
    assert counts and set(counts) <= set(flat_m)
    for path, n_active in counts.items():
        w, m = np.asarray(flat_p[path]), np.asarray(flat_m[path])
        assert np.all(w[~m] == 0.0), path
        assert np.all(m.reshape(2, -1).sum(axis=1) == n_active), path
    assert any(not np.array_equal(np.asarray(flat_m[p]), np.asarray(flat_0[p])) for p in counts)  # topology moved
    assert np.all(np.isfinite(np.asarray(final_loss)))


def test_rigl_grows_by_grow_grads_when_given():
    """`apply_gradients(..., grow_grads=g)` scores the grow step with g (the optimizer still uses grads)."""
    params = {"w": {"kernel": jnp.arange(1.0, 17.0).reshape(4, 4)}}
    masks = {"w": {"kernel": jnp.arange(16).reshape(4, 4) >= 8}}  # the 8 largest weights active
    tx = sp.masked(optax.sgd(0.0), masks)
    schedule = sp.TopologySchedule(method="rigl", interval=1, t_end=10**6, zeta0=0.5)
    grads = {"w": {"kernel": jnp.zeros((4, 4))}}
    grow = {"w": {"kernel": jnp.zeros((4, 4)).at[1].set(jnp.array([5.0, 4.0, 3.0, 2.0]))}}
    out = sp.apply_gradients(jax.random.key(0), 1, params, tx.init(params), grads, tx, schedule, grow_grads=grow)
    mask = np.asarray(sp.get_masks(out.opt_state)["w"]["kernel"])
    # 8 active * zeta(1) = 0.5 -> 4 dropped (row 2: the smallest active) and 4 grown where `grow` is
    # largest (row 1); scored by the zero `grads`, ties would have grown row 0 (lowest indices)
    np.testing.assert_array_equal(mask, np.array([[0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1]], bool))

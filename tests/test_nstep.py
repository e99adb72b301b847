"""RLx2's delayed multi-step TD target (rlx2.md §4.4-§4.6) against plain NumPy loops, and n-step window
sampling from the ring buffer (§4.2), jitted and vmapped."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparqrl import replay, returns
from sparqrl.replay import nstep

# ---- NumPy references, written from the spec's pseudo-code -----------------------------------


def _np_target(reward, terminated, truncated, gamma, n_active, q_boot_table, alpha=None, log_prob=None):
    """rlx2.md §4.4 (TD3; alpha None) and §4.5 (SAC) for ONE window, literally as the code's loop.

    q_boot_table[k] is min Q'(s'_k, a*_k), the bootstrap value if the bootstrap index is k.
    Returns (y, m, acc, nd).
    """
    acc, nd, nr, m = 0.0, 1.0, 1.0, 0
    for k in range(n_active):
        # terminated wins: a step that is both ends the episode (RLx2's code, quirk 14, bootstraps it)
        not_done = 1.0 - float(terminated[k])
        reset = float(truncated[k])
        acc += nr * nd * gamma**k * reward[k]
        nd *= max(not_done, 1.0 - nr)
        if alpha is not None:
            acc += nr * nd * gamma ** (k + 1) * (-alpha * log_prob[k])
        if k == n_active - 1:
            break
        nr *= 1.0 - reset
        m += int(nr)
    return acc + nd * gamma ** (m + 1) * q_boot_table[m], m, acc, nd


def _random_windows(rng, batch, n):
    """Windows with ordinary steps, terminals, truncations and both flags at once, mixed."""
    kind = rng.choice(4, size=(batch, n), p=[0.55, 0.2, 0.2, 0.05])  # 0 none, 1 term, 2 trunc, 3 both
    return dict(
        reward=rng.normal(size=(batch, n)).astype(np.float32),
        terminated=(kind == 1) | (kind == 3),
        truncated=(kind == 2) | (kind == 3),
        q=(5 * rng.normal(size=(batch, n))).astype(np.float32),
        log_prob=rng.normal(size=(batch, n)).astype(np.float32),
    )


def _jax_targets(reward, terminated, truncated, q, log_prob, gamma, n_active, alpha):
    terms = returns.nstep_terms(reward, terminated, truncated, gamma, n_active)
    q_boot = returns.at_index(q, terms.boot_index)
    td3 = returns.nstep_q_target(terms, q_boot)
    sac = returns.nstep_soft_q_target(terms, q_boot, alpha, log_prob)
    return td3, sac, terms


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_targets_match_numpy_loop_for_every_active_horizon(n):
    rng = np.random.default_rng(n)
    gamma, alpha, batch = 0.97, 0.3, 200
    fn = jax.jit(_jax_targets, static_argnames=())
    for n_active in range(1, n + 1):
        w = _random_windows(rng, batch, n)
        td3, sac, terms = fn(w["reward"], w["terminated"], w["truncated"], w["q"], w["log_prob"],
                             gamma, jnp.int32(n_active), alpha)  # n_active traced
        for b in range(batch):
            args = (w["reward"][b], w["terminated"][b], w["truncated"][b], gamma, n_active, w["q"][b])
            y, m, acc, nd = _np_target(*args)
            y_sac, *_ = _np_target(*args, alpha=alpha, log_prob=w["log_prob"][b])
            assert int(terms.boot_index[b]) == m
            assert float(terms.reward_sum[b]) == pytest.approx(acc, rel=1e-5, abs=1e-5)
            assert float(terms.boot_discount[b]) == pytest.approx(nd * gamma ** (m + 1), rel=1e-6, abs=1e-7)
            assert float(td3[b]) == pytest.approx(y, rel=1e-5, abs=1e-5)
            assert float(sac[b]) == pytest.approx(y_sac, rel=1e-5, abs=1e-5)


def test_a_step_both_terminated_and_truncated_counts_as_terminated():
    """Window [ordinary, both, ordinary]: the target keeps the first two rewards and does not bootstrap
    (a truncation alone would bootstrap from s'_1 with γ²); SAC's entropy bonus at s'_1 goes too."""
    reward = np.array([[1.0, 2.0, 4.0]], np.float32)
    both = np.array([[False, True, False]])
    q, log_prob = np.full((1, 3), 100.0, np.float32), np.ones((1, 3), np.float32)
    td3, sac, terms = _jax_targets(reward, both, both, q, log_prob, 0.5, 3, 1.0)
    assert float(terms.boot_discount[0]) == 0.0 and int(terms.boot_index[0]) == 1
    np.testing.assert_allclose(td3, [1.0 + 0.5 * 2.0])
    np.testing.assert_allclose(sac, [1.0 + 0.5 * 2.0 + 0.5 * -1.0])  # bonus at s'_0 only
    truncated_only = _jax_targets(reward, np.zeros_like(both), both, q, log_prob, 0.5, 3, 1.0)[0]
    np.testing.assert_allclose(truncated_only, [1.0 + 0.5 * 2.0 + 0.25 * 100.0])


def test_targets_vmapped_over_seeds_equal_numpy():
    rng = np.random.default_rng(7)
    n, gamma, alpha = 3, 0.99, 0.7
    ws = [_random_windows(rng, 64, n) for _ in range(4)]
    stacked = {k: np.stack([w[k] for w in ws]) for k in ws[0]}
    n_active = jnp.array([1, 2, 3, 3], jnp.int32)  # per seed, as after vmapping a training state
    fn = jax.jit(jax.vmap(lambda r, te, tr, q, lp, na: _jax_targets(r, te, tr, q, lp, gamma, na, alpha)[:2]))
    td3, sac = fn(stacked["reward"], stacked["terminated"], stacked["truncated"], stacked["q"],
                  stacked["log_prob"], n_active)
    for s, w in enumerate(ws):
        for b in range(64):
            args = (w["reward"][b], w["terminated"][b], w["truncated"][b], gamma, int(n_active[s]), w["q"][b])
            assert float(td3[s, b]) == pytest.approx(_np_target(*args)[0], rel=1e-5, abs=1e-5)
            want = _np_target(*args, alpha=alpha, log_prob=w["log_prob"][b])[0]
            assert float(sac[s, b]) == pytest.approx(want, rel=1e-5, abs=1e-5)


# §4.6 worked cases, n = 3. r = (1, 2, 4); Q'(s'_k) = 10·(k+1) so the bootstrap index is visible.
G = 0.9
R = np.array([1.0, 2.0, 4.0], np.float32)
Q = np.array([10.0, 20.0, 30.0], np.float32)
F, T = False, True
WORKED = [
    ("no episode end", [F, F, F], [F, F, F], R[0] + G * R[1] + G**2 * R[2] + G**3 * Q[2]),
    ("terminal at k=1", [F, T, F], [F, F, F], R[0] + G * R[1]),
    ("terminal at k=0", [T, F, F], [F, F, F], R[0]),
    ("truncation at k=0", [F, F, F], [T, F, F], R[0] + G * Q[0]),
    ("truncation at k=1", [F, F, F], [F, T, F], R[0] + G * R[1] + G**2 * Q[1]),
    ("truncation at k=2 (last element)", [F, F, F], [F, F, T], R[0] + G * R[1] + G**2 * R[2] + G**3 * Q[2]),
    ("terminal + time limit at k=1 = terminal", [F, T, F], [F, T, F], R[0] + G * R[1]),
    ("terminal after a truncation is ignored", [F, T, F], [T, F, F], R[0] + G * Q[0]),
    ("terminal at k=2 (last element)", [F, F, T], [F, F, F], R[0] + G * R[1] + G**2 * R[2]),
]


@pytest.mark.parametrize("name,terminated,truncated,want", WORKED, ids=[w[0] for w in WORKED])
def test_worked_cases_of_the_spec(name, terminated, truncated, want):
    td3, sac, _ = jax.jit(_jax_targets)(
        R[None], np.array([terminated]), np.array([truncated]), Q[None], np.zeros((1, 3), np.float32),
        G, 3, 0.5,
    )
    assert float(td3[0]) == pytest.approx(float(want), rel=1e-6)
    assert float(sac[0]) == pytest.approx(float(want), rel=1e-6)  # log π = 0: no entropy bonus


def test_sac_entropy_terms_of_a_worked_case():
    """Truncation at k=1: entropy bonuses at s'_0 (γ) and s'_1 (γ²), none at s'_2 (next episode)."""
    lp = np.array([[0.5, -1.0, 3.0]], np.float32)
    alpha = 0.2
    _, sac, _ = _jax_targets(R[None], np.array([[F, F, F]]), np.array([[F, T, F]]), Q[None], lp, G, 3, alpha)
    want = R[0] + G * R[1] + G**2 * Q[1] + G * (-alpha * 0.5) + G**2 * (-alpha * -1.0)
    assert float(sac[0]) == pytest.approx(float(want), rel=1e-6)
    # Terminal at k=1: the bonus at s'_0 counts, the one at s'_1 (a terminal state) does not.
    _, sac, _ = _jax_targets(R[None], np.array([[F, T, F]]), np.array([[F, F, F]]), Q[None], lp, G, 3, alpha)
    assert float(sac[0]) == pytest.approx(float(R[0] + G * R[1] + G * (-alpha * 0.5)), rel=1e-6)


def test_one_step_reduces_to_standard_td3_and_sac():
    rng = np.random.default_rng(3)
    w = _random_windows(rng, 100, 1)
    gamma, alpha = 0.99, 0.4
    td3, sac, _ = _jax_targets(w["reward"], w["terminated"], w["truncated"], w["q"], w["log_prob"], gamma, 1, alpha)
    not_done = 1.0 - w["terminated"][:, 0]  # a step both terminated and truncated does not bootstrap
    np.testing.assert_allclose(np.asarray(td3), w["reward"][:, 0] + gamma * not_done * w["q"][:, 0], rtol=1e-5, atol=1e-5)
    soft = w["q"][:, 0] - alpha * w["log_prob"][:, 0]
    np.testing.assert_allclose(np.asarray(sac), w["reward"][:, 0] + gamma * not_done * soft, rtol=1e-5, atol=1e-5)


def test_no_gradient_through_the_targets():
    def loss(q, lp, alpha):
        _, sac, _ = _jax_targets(R[None], np.array([[F, F, F]]), np.array([[F, F, F]]), q, lp, G, 3, alpha)
        return jnp.sum(sac)

    grads = jax.grad(loss, argnums=(0, 1, 2))(jnp.asarray(Q[None]), jnp.ones((1, 3)), jnp.float32(0.3))
    for g in grads:
        np.testing.assert_array_equal(np.asarray(g), 0.0)


# ---- window sampling ------------------------------------------------------------------------


def _id_buffer(capacity, num_items, streams=2):
    """A ring whose item j holds id j in stream 0 and 1000 + j in stream 1 (added one slot at a time)."""
    state = replay.init({"id": jnp.zeros((streams,), jnp.int32)}, capacity)
    add = jax.jit(replay.add)
    for j in range(num_items):
        state = add(state, {"id": jnp.asarray([[j + 1000 * s for s in range(streams)]], jnp.int32)})
    return state


@pytest.mark.parametrize("capacity,num_items,shrink", [(20, 13, 0), (20, 47, 0), (20, 47, 6), (16, 16, 3)])
def test_windows_are_consecutive_valid_and_cover_all_starts(capacity, num_items, shrink):
    n = 3
    state = _id_buffer(capacity, num_items)
    state = state.replace(size=state.size - shrink)  # what the dynamic buffer does
    size = int(state.size)
    oldest_id = num_items - size
    fn = jax.jit(lambda s, k, na: nstep.sample_windows(s, k, 4000, n, na))
    for n_active in (1, 2, 3):
        ids = np.asarray(fn(state, jax.random.key(n_active), jnp.int32(n_active))["id"])  # [B, n]
        assert ids.shape == (4000, n)
        stream = ids[:, 0] // 1000
        base = ids % 1000
        # The first n_active elements are consecutive stored items of one stream inside the valid
        # region (later ones may lie past the newest item and get zero weight in the target).
        assert np.all(ids[:, :n_active] // 1000 == stream[:, None])
        np.testing.assert_array_equal(base[:, :n_active], base[:, :1] + np.arange(n_active))
        assert base[:, 0].min() >= oldest_id and base[:, n_active - 1].max() <= num_items - 1
        # Every allowed start {0 .. size − n_active} and both streams occur.
        assert set(base[:, 0] - oldest_id) == set(range(size - n_active + 1))
        assert set(stream) == {0, 1}


def test_window_sampling_vmaps_over_seeds():
    states = [_id_buffer(12, 30), _id_buffer(12, 7)]
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *states)
    keys = jax.random.split(jax.random.key(0), 2)
    got = jax.jit(jax.vmap(lambda s, k: nstep.sample_windows(s, k, 64, 3)))(stacked, keys)
    for i, state in enumerate(states):
        want = nstep.sample_windows(state, keys[i], 64, 3)
        np.testing.assert_array_equal(np.asarray(got["id"][i]), np.asarray(want["id"]))


def test_oldest_items_in_age_order_with_validity():
    state = _id_buffer(10, 25, streams=1)  # holds ids 15..24, oldest at slot 5
    state = state.replace(size=state.size - 4)  # valid: 19..24
    items, valid = nstep.oldest_items(state, 8)
    np.testing.assert_array_equal(np.asarray(items["id"])[:6, 0], np.arange(19, 25))
    np.testing.assert_array_equal(np.asarray(valid), [True] * 6 + [False] * 2)
    assert int(nstep.oldest_slot(state)) == 9

"""IMPALA's V-trace (actorq_distributed.md §4) against plain NumPy loops of the reference's recursive
and summed forms, on fragments of auto-resetting envs with terminated and truncated steps, jitted and
vmapped; and its on-policy identities (n-step return, sparqrl's own GAE)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparqrl import returns
from sparqrl.algos.base import bootstrap_values
from sparqrl.algos.ppo.losses import gae

T, N = 12, 5

# ---- NumPy references --------------------------------------------------------------------------


def _np_vtrace(log_rho, r, v, next_v, term, trunc, gamma, rho_bar, c_bar, rho_bar_pg, lam):
    """The recursive form v_s = V(x_s) + δ_s + γ c_s (v_{s+1} − V(x_{s+1})), one env column at a time.

    Written with branches: a termination neither bootstraps nor continues; a truncation bootstraps from
    V(final obs) = next_v and does not continue; the fragment's last step bootstraps from next_v;
    elsewhere the next row continues the episode and V(x_{s+1}) = v[s + 1]. Ratios clipped in linear
    space; c = λ·min(c̄, ρ); the pg bootstrap is λ·v_{s+1} + (1 − λ)·V(x_{s+1}) (λ = 1: v_{s+1}).
    """
    vs, pg = np.zeros_like(v, np.float64), np.zeros_like(v, np.float64)
    for n in range(v.shape[1]):
        for s in reversed(range(v.shape[0])):
            ratio = np.exp(np.float64(log_rho[s, n]))
            rho, c, rho_pg = min(rho_bar, ratio), lam * min(c_bar, ratio), min(rho_bar_pg, ratio)
            if term[s, n]:
                delta = rho * (r[s, n] - v[s, n])
                vs[s, n] = v[s, n] + delta
                q = r[s, n]
            elif trunc[s, n] or s == v.shape[0] - 1:
                delta = rho * (r[s, n] + gamma * next_v[s, n] - v[s, n])
                vs[s, n] = v[s, n] + delta
                q = r[s, n] + gamma * next_v[s, n]
            else:
                delta = rho * (r[s, n] + gamma * v[s + 1, n] - v[s, n])
                vs[s, n] = v[s, n] + delta + gamma * c * (vs[s + 1, n] - v[s + 1, n])
                q = r[s, n] + gamma * (lam * vs[s + 1, n] + (1 - lam) * v[s + 1, n])
            pg[s, n] = rho_pg * (q - v[s, n])
    return vs, pg


def _np_vtrace_sum(log_rho, r, v, bootstrap, gamma, rho_bar, c_bar):
    """The paper's definition (§4.1) for one episode without ends, column by column:
    v_s = V(x_s) + Σ_{t=s}^{T−1} γ^{t−s} (Π_{i=s}^{t−1} c_i) δ_t, with V(x_T) = bootstrap."""
    ratio = np.exp(log_rho.astype(np.float64))
    rho, c = np.minimum(rho_bar, ratio), np.minimum(c_bar, ratio)
    v_next = np.concatenate([v[1:], bootstrap[None]], axis=0)
    delta = rho * (r + gamma * v_next - v)
    vs = np.array(v, np.float64)
    for s in range(v.shape[0]):
        for t in range(s, v.shape[0]):
            vs[s] += gamma ** (t - s) * np.prod(c[s:t], axis=0) * delta[t]
    return vs


def _fragment(seed, p_end=0.25, scale=1.5):
    """A random fragment [T, N] laid out as a learner gets it: next_v[t] = v[t + 1] where the episode
    goes on, an independent value of the pre-reset final observation at episode ends and at T − 1.
    Mixes ordinary steps, terminations, truncations and (rarely) both flags; log ratios span both
    sides of the clip thresholds."""
    rng = np.random.default_rng(seed)
    kind = rng.choice(4, size=(T, N), p=[1 - p_end, p_end * 0.45, p_end * 0.45, p_end * 0.1])
    term, trunc = (kind == 1) | (kind == 3), (kind == 2) | (kind == 3)
    v = rng.normal(size=(T, N)).astype(np.float32)
    final_v = rng.normal(size=(T, N)).astype(np.float32)
    following = np.concatenate([v[1:], final_v[-1:]], axis=0)
    next_v = np.where(term | trunc, final_v, following)
    return dict(
        log_rho=(scale * rng.normal(size=(T, N))).astype(np.float32),
        r=rng.normal(size=(T, N)).astype(np.float32),
        v=v,
        next_v=next_v.astype(np.float32),
        term=term,
        trunc=trunc,
    )


def _jax(d, gamma, rho_bar=1.0, c_bar=1.0, rho_bar_pg=None, lam=1.0):
    return returns.vtrace(d["log_rho"], d["r"], d["v"], d["next_v"], d["term"], d["trunc"], gamma,
                          rho_bar, c_bar, rho_bar_pg, lam)


# ---- against the recursive form -------------------------------------------------------------------

CLIPS = [  # (rho_bar, c_bar, rho_bar_pg, lambda_)
    (1.0, 1.0, None, 1.0),  # the defaults
    (1.5, 0.8, 1.0, 1.0),  # ρ̄ > c̄, separate pg clip
    (2.0, 1.0, 3.0, 0.9),  # λ < 1 scales the traces and mixes the pg bootstrap
    (np.inf, np.inf, np.inf, 0.7),  # no clipping at all (log(inf) path)
]


@pytest.mark.parametrize("rho_bar, c_bar, rho_bar_pg, lam", CLIPS)
def test_matches_recursive_form_with_episode_ends(rho_bar, c_bar, rho_bar_pg, lam):
    d = _fragment(0)
    assert (np.exp(d["log_rho"]) > 2.0).any() and (np.exp(d["log_rho"]) < 0.8).any()  # clips bite
    out = _jax(d, 0.95, rho_bar, c_bar, rho_bar_pg, lam)
    pg_bar = rho_bar if rho_bar_pg is None else rho_bar_pg
    vs, pg = _np_vtrace(d["log_rho"], d["r"], d["v"], d["next_v"], d["term"], d["trunc"], 0.95,
                        rho_bar, c_bar, pg_bar, lam)
    np.testing.assert_allclose(out.vs, vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages, pg, rtol=1e-5, atol=1e-5)


def test_episode_flags_all_occur_in_the_test_fragments():
    d = _fragment(0)
    assert d["term"].any() and d["trunc"].any()
    # a both-flags step (counted as terminated) and a truncation whose bootstrap differs from v[t+1]
    assert any((_fragment(s)["term"] & _fragment(s)["trunc"]).any() for s in range(8))
    t, n = np.argwhere(d["trunc"][:-1] & ~d["term"][:-1])[0]
    assert d["next_v"][t, n] != d["v"][t + 1, n]


def test_truncation_bootstraps_and_termination_does_not():
    """One env, T = 3: step 0 truncated, step 1 terminated, step 2 the fragment's end (on-policy)."""
    v, next_v, r = np.array([1.0, 2.0, 3.0]), np.array([10.0, 20.0, 30.0]), np.array([0.5, 0.25, 0.125])
    term, trunc = np.array([False, True, False]), np.array([True, False, False])
    out = returns.vtrace(np.zeros(3), r, v, next_v, term, trunc, 0.5)
    np.testing.assert_allclose(out.vs, [0.5 + 0.5 * 10.0, 0.25, 0.125 + 0.5 * 30.0])
    np.testing.assert_allclose(out.pg_advantages, np.asarray(out.vs) - v)


def test_jitted_and_vmapped_over_seeds_with_traced_hyperparameters():
    frags = [_fragment(seed) for seed in range(6)]
    batch = {k: np.stack([f[k] for f in frags]) for k in frags[0]}
    fn = jax.jit(jax.vmap(returns.vtrace, in_axes=(0, 0, 0, 0, 0, 0, None, None, None, None, None)))
    hp = dict(gamma=0.9, rho_bar=1.2, c_bar=0.9, rho_bar_pg=0.7, lambda_=0.8)
    out = fn(batch["log_rho"], batch["r"], batch["v"], batch["next_v"], batch["term"], batch["trunc"],
             *(jnp.float32(x) for x in hp.values()))
    assert out.vs.shape == out.pg_advantages.shape == (6, T, N)
    for i, d in enumerate(frags):
        vs, pg = _np_vtrace(d["log_rho"], d["r"], d["v"], d["next_v"], d["term"], d["trunc"], *hp.values())
        np.testing.assert_allclose(out.vs[i], vs, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out.pg_advantages[i], pg, rtol=1e-5, atol=1e-5)


# ---- against the paper's definition and on-policy identities ---------------------------------------


@pytest.mark.parametrize("rho_bar, c_bar", [(1.0, 1.0), (1.5, 0.7)])
def test_matches_summed_definition_without_episode_ends(rho_bar, c_bar):
    d = _fragment(1, p_end=0.0)
    out = _jax(d, 0.97, rho_bar, c_bar)
    vs = _np_vtrace_sum(d["log_rho"], d["r"], d["v"], d["next_v"][-1], 0.97, rho_bar, c_bar)
    np.testing.assert_allclose(out.vs, vs, rtol=1e-5, atol=1e-5)


def test_on_policy_without_ends_is_the_n_step_bootstrapped_return():
    d = _fragment(2, p_end=0.0)
    gamma = 0.9
    out = returns.vtrace(np.zeros((T, N)), d["r"], d["v"], d["next_v"], d["term"], d["trunc"], gamma)
    r = d["r"].astype(np.float64)
    expected = np.stack([
        sum(gamma**k * r[s + k] for k in range(T - s)) + gamma ** (T - s) * d["next_v"][-1]
        for s in range(T)
    ])
    np.testing.assert_allclose(out.vs, expected, rtol=1e-5, atol=1e-5)
    # ρ = 1 and pg bootstraps from v_{s+1}: r_s + γ v_{s+1} − V(x_s) = v_s − V(x_s)
    np.testing.assert_allclose(out.pg_advantages, expected - d["v"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lam", [0.0, 0.95, 1.0])
def test_on_policy_equals_sparqrls_gae_on_ppos_layout(lam):
    """PPO's layout: values, the value after the rollout, V(final obs) where truncated. next_values
    from `bootstrap_values` feed both; on-policy v − V and the pg advantage both equal GAE(λ)."""
    rng = np.random.default_rng(3)
    d = _fragment(3)
    last_value = rng.normal(size=N).astype(np.float32)
    truncated_value = np.where(d["trunc"], rng.normal(size=(T, N)), 0.0).astype(np.float32)
    next_values = bootstrap_values(jnp.asarray(d["v"]), jnp.asarray(last_value), jnp.asarray(d["trunc"]),
                                   jnp.asarray(truncated_value))
    advantages, targets = gae(jnp.asarray(d["r"]), jnp.asarray(d["v"]), next_values, d["term"],
                              d["term"] | d["trunc"], 0.99, lam)
    # log_rho = 0 everywhere; ρ̄ = c̄ = 1 are the defaults and do not bite at ρ = 1
    out = returns.vtrace(np.zeros((T, N)), d["r"], d["v"], next_values, d["term"], d["trunc"], 0.99,
                         lambda_=lam)
    np.testing.assert_allclose(out.vs, targets, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages, advantages, rtol=1e-5, atol=1e-5)


# ---- numerics and gradients ---------------------------------------------------------------------


def test_extreme_log_ratios_clip_to_the_thresholds():
    d = _fragment(4)
    d["log_rho"] = np.where(np.arange(T)[:, None] % 2 == 0, 200.0, -200.0).astype(np.float32) * np.ones((1, N))
    out = _jax(d, 0.95, 1.0, 1.0)
    assert np.isfinite(out.vs).all() and np.isfinite(out.pg_advantages).all()
    # exp(200) overflows float32; clipped it must be exactly ρ̄ = c̄ = 1, and exp(−200) must be 0
    vs, pg = _np_vtrace(np.where(d["log_rho"] > 0, 0.0, -np.inf), d["r"], d["v"], d["next_v"], d["term"],
                        d["trunc"], 0.95, 1.0, 1.0, 1.0, 1.0)
    np.testing.assert_allclose(out.vs, vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages, pg, rtol=1e-5, atol=1e-5)


def test_no_gradient_flows_through_the_targets():
    d = _fragment(5)

    def total(log_rho, r, v, next_v):
        out = returns.vtrace(log_rho, r, v, next_v, d["term"], d["trunc"], 0.95)
        return jnp.sum(out.vs) + jnp.sum(out.pg_advantages)

    grads = jax.grad(total, argnums=(0, 1, 2, 3))(*(jnp.asarray(d[k]) for k in ("log_rho", "r", "v", "next_v")))
    for g in grads:
        assert not np.asarray(g).any()


def test_mismatched_shapes_are_refused():
    d = _fragment(6)
    with pytest.raises(ValueError, match="next_values"):
        returns.vtrace(d["log_rho"], d["r"], d["v"], d["next_v"][:-1], d["term"], d["trunc"], 0.9)

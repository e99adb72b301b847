"""`lockstep_cond`: lax.cond that stays a real branch under vmap."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from sparqrl.lockstep import lockstep_cond


def test_lockstep_cond_equals_cond_and_skips_under_vmap():
    """Same values as lax.cond for batched, unbatched, mixed and nested-vmapped predicates."""
    def expensive(op):
        x, w = op
        return jnp.tanh(x @ w), jnp.sum(x)

    def cheap(op):
        x, _ = op
        return x, jnp.zeros((), x.dtype)

    def with_lockstep(p, x, w):
        return lockstep_cond(p, expensive, cheap, (x, w))

    def with_cond(p, x, w):
        return jax.lax.cond(p, expensive, cheap, (x, w))

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(2, 3, 4, 4)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(4, 4)), jnp.float32)
    for preds in ([True, True, True], [False, False, False], [True, False, True]):
        p = jnp.asarray(preds)
        got = jax.jit(jax.vmap(with_lockstep, in_axes=(0, 0, None)))(p, x[0], w)
        want = jax.vmap(with_cond, in_axes=(0, 0, None))(p, x[0], w)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6), got, want)
    p2 = jnp.asarray([[True, False, True], [False, False, False]])
    got = jax.jit(jax.vmap(jax.vmap(with_lockstep, in_axes=(0, 0, None)), in_axes=(0, 0, None)))(p2, x, w)
    want = jax.vmap(jax.vmap(with_cond, in_axes=(0, 0, None)), in_axes=(0, 0, None))(p2, x, w)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6), got, want)
    # Unbatched predicate under vmap, and no vmap at all.
    got = jax.jit(jax.vmap(with_lockstep, in_axes=(None, 0, None)))(jnp.bool_(True), x[0], w)
    np.testing.assert_allclose(np.asarray(got[0]), np.tanh(np.asarray(x[0]) @ np.asarray(w)), rtol=1e-5)
    assert float(jax.jit(with_lockstep)(jnp.bool_(False), x[0, 0], w)[1]) == 0.0
    # Under vmap the skipped branch is a real branch: the program holds a cond on any(pred).
    hlo = jax.jit(jax.vmap(with_lockstep, in_axes=(0, 0, None))).lower(jnp.asarray([True, False, True]), x[0], w).as_text()
    assert "reduce" in hlo and ("conditional" in hlo or "case" in hlo)

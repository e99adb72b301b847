"""PPO objectives: DPO against a NumPy reference, the PPO-clip start of LPO, the L2 start of the learned
value loss, and meta-parameter files."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparqrl.algos.ppo import losses
from sparqrl.algos.ppo import objectives as obj
from sparqrl.config import ConfigError

N = 512


def _batch(seed: int, spread: float = 0.5):
    """Log-probs under the current and the old policy, and normalised advantages, [N] each."""
    rng = np.random.default_rng(seed)
    old_log_prob = rng.normal(-1.0, 0.5, N).astype(np.float32)
    log_prob = (old_log_prob + rng.normal(0.0, spread, N)).astype(np.float32)
    advantages = rng.normal(0.0, 1.0, N).astype(np.float32)
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    return jnp.asarray(log_prob), jnp.asarray(old_log_prob), jnp.asarray(advantages)


def _dpo_numpy(r: np.ndarray, adv: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    out = np.empty_like(r, dtype=np.float64)
    for i, (ri, ai) in enumerate(zip(r.astype(np.float64), adv.astype(np.float64))):
        if ai >= 0:
            x = (ri - 1.0) * ai
            out[i] = max(0.0, x - alpha * math.tanh(x / alpha))
        else:
            x = math.log(ri) * ai
            out[i] = max(0.0, x - beta * math.tanh(x / beta))
    return out


# ---------------------------------------------------------------------------------------------- DPO


@pytest.mark.parametrize("alpha,beta", [(2.0, 0.6), (0.5, 1.5)])
def test_dpo_drift_matches_numpy(alpha, beta):
    log_prob, old_log_prob, adv = _batch(0, spread=1.0)
    adv = adv * 3.0  # large |(r - 1)·A| too, where the drift is a linear barrier
    r = jnp.exp(log_prob - old_log_prob)
    expected = _dpo_numpy(np.asarray(r), np.asarray(adv), alpha, beta)
    got = jax.jit(obj.dpo_drift)(r, adv, alpha, beta)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-5)
    assert np.mean(expected > 1e-3) > 0.2  # the test exercises the non-zero part of both branches
    assert np.any((expected > 1e-3) & (np.asarray(adv) < 0)) and np.any((expected > 1e-3) & (np.asarray(adv) > 0))


def test_dpo_drift_defaults_and_vmap_over_hyperparameters():
    log_prob, old_log_prob, adv = _batch(1)
    r = jnp.exp(log_prob - old_log_prob)
    np.testing.assert_array_equal(obj.dpo_drift(r, adv), obj.dpo_drift(r, adv, 2.0, 0.6))
    alphas, betas = jnp.array([2.0, 1.0]), jnp.array([0.6, 0.3])
    batched = jax.vmap(obj.dpo_drift, in_axes=(None, None, 0, 0))(r, adv, alphas, betas)
    for i in range(2):
        np.testing.assert_allclose(
            np.asarray(batched[i]), _dpo_numpy(np.asarray(r), np.asarray(adv), float(alphas[i]), float(betas[i])),
            rtol=1e-4, atol=1e-5,
        )
    # No drift at r = 1 (the old policy), and never negative.
    np.testing.assert_array_equal(obj.dpo_drift(jnp.ones(N), adv), 0.0)
    assert float(jnp.min(batched)) >= 0.0


# ------------------------------------------------------------------------------------------ PPO-clip


def _ppo_clip_loss(log_prob, old_log_prob, adv, eps):
    drift = lambda r, a: obj.ppo_clip_drift(r, a, eps)  # noqa: E731
    return losses.policy_loss(log_prob, old_log_prob, adv, eps, normalize=False, drift=drift)


def test_ppo_clip_drift_is_ppo_surrogate():
    log_prob, old_log_prob, adv = _batch(2)
    eps = 0.2
    r = np.asarray(jnp.exp(log_prob - old_log_prob))
    assert np.mean(np.abs(r - 1.0) > eps) > 0.2  # many ratios are clipped
    reference = lambda lp: losses.policy_loss(lp, old_log_prob, adv, eps, normalize=False)  # noqa: E731
    ours = lambda lp: _ppo_clip_loss(lp, old_log_prob, adv, eps)  # noqa: E731
    np.testing.assert_allclose(float(ours(log_prob)), float(reference(log_prob)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
        np.asarray(jax.grad(ours)(log_prob)), np.asarray(jax.grad(reference)(log_prob)), rtol=1e-5, atol=1e-7
    )
    drift = np.asarray(obj.ppo_clip_drift(jnp.asarray(r), adv, eps))
    expected = np.maximum((r - np.clip(r, 1 - eps, 1 + eps)) * np.asarray(adv), 0.0)
    np.testing.assert_allclose(drift, expected, rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------------------------------------- LPO


def test_lpo_shapes_and_features():
    params = obj.lpo_init(jax.random.key(0))
    assert params.hidden.shape == (8, 128) and params.out.shape == (128,)
    assert sum(x.size for x in jax.tree.leaves(params)) == 1152  # reference §5.2
    r = jnp.array([0.5, 1.0, 2.0])
    a = jnp.array([1.0, -2.0, 3.0])
    features = np.asarray(obj.lpo_features(r, a))
    for i in range(3):
        lr, omr = math.log(float(r[i])), 1.0 - float(r[i])
        delta = np.array([lr, lr**2, omr, omr**2])
        np.testing.assert_allclose(features[i], np.concatenate([delta, float(a[i]) * delta]), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("eps", [0.1, 0.2])
def test_zero_lpo_network_is_ppo_clip(eps):
    log_prob, old_log_prob, adv = _batch(3)
    params = obj.lpo_init(jax.random.key(0))
    r = jnp.exp(log_prob - old_log_prob)
    np.testing.assert_array_equal(np.asarray(obj.lpo_drift(params, r, adv, eps)), np.asarray(obj.ppo_clip_drift(r, adv, eps)))

    def lpo_loss(lp):
        drift = lambda r, a: obj.lpo_drift(params, r, a, eps)  # noqa: E731
        return losses.policy_loss(lp, old_log_prob, adv, eps, normalize=False, drift=drift)

    ppo_loss = lambda lp: _ppo_clip_loss(lp, old_log_prob, adv, eps)  # noqa: E731
    reference = lambda lp: losses.policy_loss(lp, old_log_prob, adv, eps, normalize=False)  # noqa: E731
    assert float(lpo_loss(log_prob)) == float(ppo_loss(log_prob))
    np.testing.assert_allclose(float(lpo_loss(log_prob)), float(reference(log_prob)), rtol=1e-6, atol=1e-6)
    grad_lpo = np.asarray(jax.jit(jax.grad(lpo_loss))(log_prob))
    np.testing.assert_array_equal(grad_lpo, np.asarray(jax.jit(jax.grad(ppo_loss))(log_prob)))
    np.testing.assert_allclose(grad_lpo, np.asarray(jax.grad(reference)(log_prob)), rtol=1e-5, atol=1e-7)
    assert np.count_nonzero(grad_lpo) > N // 4


def test_learned_lpo_drift_differs_but_keeps_mirror_learning_conditions():
    log_prob, old_log_prob, adv = _batch(4)
    r = jnp.exp(log_prob - old_log_prob)
    zero = obj.lpo_init()
    k1, k2 = jax.random.split(jax.random.key(5))
    params = obj.LPOParams(
        hidden=jax.random.normal(k1, zero.hidden.shape), out=jax.random.normal(k2, zero.out.shape) * 0.3
    )
    drift = obj.lpo_drift(params, r, adv, 0.2)
    assert float(jnp.min(drift)) >= 0.0
    assert float(jnp.max(jnp.abs(drift - obj.ppo_clip_drift(r, adv, 0.2)))) > 1e-2
    # At r = 1 every input is 0: drift 0 and gradient 0 w.r.t. r, for any weights.
    ones = jnp.ones(8)
    np.testing.assert_array_equal(np.asarray(obj.lpo_drift(params, ones, adv[:8], 0.2)), 0.0)
    grad_at_one = jax.vmap(jax.grad(lambda r, a: obj.lpo_drift(params, r, a, 0.2)))(ones, adv[:8])
    np.testing.assert_array_equal(np.asarray(grad_at_one), 0.0)
    # A population of meta-parameters is a leading axis.
    population = jax.tree.map(lambda x: jnp.stack([jnp.zeros_like(x), x]), params)
    drifts = jax.vmap(obj.lpo_drift, in_axes=(0, None, None, None))(population, r, adv, 0.2)
    np.testing.assert_array_equal(np.asarray(drifts[0]), np.asarray(obj.ppo_clip_drift(r, adv, 0.2)))
    np.testing.assert_allclose(np.asarray(drifts[1]), np.asarray(drift), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------- value loss


def _l2_value_loss(pred, target):
    """PPO's value_loss='l2': `losses.value_loss` unclipped (tested against NumPy in test_ppo.py)."""
    return losses.value_loss(pred, pred, target, 0.0, clip=False)


def test_learned_value_loss_starts_at_l2():
    params = obj.value_loss_init(jax.random.key(0))
    assert sum(x.size for x in jax.tree.leaves(params)) == 4353  # reference §6
    rng = np.random.default_rng(7)
    pred, target = (jnp.asarray(rng.normal(0, 2, N).astype(np.float32)) for _ in range(2))
    learned = lambda p: obj.learned_value_loss(params, p, target)  # noqa: E731
    l2 = lambda p: _l2_value_loss(p, target)  # noqa: E731
    np.testing.assert_allclose(float(learned(pred)), float(l2(pred)), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.grad(learned)(pred)), np.asarray(jax.grad(l2)(pred)), rtol=1e-6, atol=1e-9)
    # Non-zero meta-parameters change the loss.
    keys = jax.random.split(jax.random.key(8), 6)
    other = obj.ValueLossParams(*(0.3 * jax.random.normal(k, x.shape) for k, x in zip(keys, params)))
    assert abs(float(obj.learned_value_loss(other, pred, target)) - float(l2(pred))) > 1e-3


@pytest.mark.parametrize("rule", ["lpo", "value-loss"])
def test_learned_rule_start_gives_an_evolution_strategy_a_first_order_signal(rule):
    """A perturbation of the start and its mirror (antithetic sampling, OpenES's sigma 0.04) change the rule
    by opposite amounts: the start is not a saddle where both give the same network (all-zero weights)."""
    log_prob, old_log_prob, adv = _batch(5)
    r = jnp.exp(log_prob - old_log_prob)
    target = jnp.asarray(np.random.default_rng(3).normal(0, 2, N).astype(np.float32))
    if rule == "lpo":
        start = obj.lpo_init()
        rule_at = lambda p: obj.lpo_drift(p, r, adv, 0.2) - obj.ppo_clip_drift(r, adv, 0.2)  # noqa: E731
    else:
        start = obj.value_loss_init()
        rule_at = lambda p: jax.grad(obj.learned_value_loss, argnums=1)(p, r, target) - jax.grad(  # noqa: E731
            _l2_value_loss)(r, target)
    np.testing.assert_array_equal(np.asarray(rule_at(start)), 0.0)
    keys = jax.random.split(jax.random.key(11), len(jax.tree.leaves(start)))
    eps = jax.tree.unflatten(jax.tree.structure(start),
                             [0.04 * jax.random.normal(k, x.shape) for k, x in zip(keys, jax.tree.leaves(start))])
    plus = np.asarray(rule_at(jax.tree.map(jnp.add, start, eps)))
    minus = np.asarray(rule_at(jax.tree.map(jnp.subtract, start, eps)))
    assert np.abs(plus).max() > 1e-3 and np.abs(plus - minus).max() > 1e-3, (np.abs(plus).max(), np.abs(plus - minus).max())


# ---------------------------------------------------------------------------------------- npz files


def test_meta_params_round_trip(tmp_path):
    zero = obj.lpo_init()
    keys = jax.random.split(jax.random.key(9), 2)
    params = obj.LPOParams(*(jax.random.normal(k, x.shape) for k, x in zip(keys, zero)))
    path = obj.save_meta_params(tmp_path / "lpo.npz", params)
    loaded = obj.load_meta_params(path, zero)
    assert isinstance(loaded, obj.LPOParams)
    for a, b in zip(loaded, params):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # A meta run's folder holds best_meta_params.npz.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    value_params = obj.ValueLossParams(*(x + 1.0 for x in obj.value_loss_init()))
    assert obj.save_meta_params(run_dir, value_params).endswith(obj.META_PARAMS_FILE)
    loaded = obj.load_meta_params(run_dir, obj.value_loss_init())
    np.testing.assert_array_equal(np.asarray(loaded.w2), np.asarray(value_params.w2))


def test_meta_params_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="missing.npz not found"):
        obj.load_meta_params(tmp_path / "missing.npz", obj.lpo_init())
    path = obj.save_meta_params(tmp_path / "small.npz", obj.lpo_init(hidden=16))
    with pytest.raises(ConfigError) as error:
        obj.load_meta_params(path, obj.lpo_init())
    message = str(error.value)
    assert "\n" not in message and "small.npz" in message
    assert "hidden: (8, 128)" in message and "hidden: (8, 16)" in message  # expected and found
    with pytest.raises(ConfigError, match="expected"):
        obj.load_meta_params(path, obj.value_loss_init(hidden=16))  # other arrays altogether
    garbage = tmp_path / "garbage.npz"
    garbage.write_text("not a zip file")
    with pytest.raises(ConfigError, match="garbage.npz is not a readable"):
        obj.load_meta_params(garbage, obj.lpo_init())

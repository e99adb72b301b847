"""Tests of sparqrl.quant (ActorQ-style quantized acting) against plain NumPy references."""

from __future__ import annotations

import math
import pickle

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from sparqrl import quant
from sparqrl.config import ConfigError
from sparqrl.nets.modules import ActorCritic, HeadMLP, QNetwork

# --- NumPy references ----------------------------------------------------------------------------


def np_quantize(w: np.ndarray, granularity: str) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8: scale = max|w| / 127 per last-axis channel or per tensor."""
    w = w.astype(np.float64)
    scale = np.abs(w).max(axis=tuple(range(w.ndim - 1))) if granularity == "channel" else np.abs(w).max()
    scale = scale / 127.0
    values = np.where(scale > 0, np.round(w / np.where(scale > 0, scale, 1.0)), 0.0)
    return np.clip(values, -127, 127), scale


def np_dynamic_quant_forward(q: quant.QuantizedStack, obs: np.ndarray) -> np.ndarray:
    """Dynamic-quantization arithmetic (PyTorch dynamic PTQ / ORT DynamicQuantizeMatMul), written out:
    per layer, the input is quantized to uint8 with one scale and zero point per call from its range
    (widened to include 0), multiplied with the int8 weights in exact integers, rescaled by
    input_scale * weight_scale, plus the float bias."""
    x = obs.astype(np.float32)
    last = len(q.kernels) - 1
    for i, (values, scale, bias) in enumerate(zip(q.kernels, q.scales, q.biases)):
        lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
        a_scale = np.float32(1.0) if lo == hi else np.float32(np.float32(hi) - np.float32(lo)) / np.float32(255)
        zero = np.round(np.clip(-np.float32(lo) / a_scale, 0, 255))
        x_q = np.clip(np.round(x / a_scale) + zero, 0, 255)
        acc = (x_q.astype(np.int64) - int(zero)) @ values.astype(np.int64)  # exact integer GEMM
        x = acc.astype(np.float32) * (a_scale * scale).astype(np.float32) + bias
        if i < last:
            x = np.maximum(x, 0) if q.activation == "relu" else np.tanh(x)
    return x


def random_variables(module: nn.Module, obs: np.ndarray, seed: int = 0) -> dict:
    """The module's variables with random values: shapes from ``jax.eval_shape`` (no orthogonal-init
    compile), N(0, 1/fan_in) kernels, N(0, 0.1²) biases."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(module.init, jax.random.key(0), obs)

    def fill(s):
        if len(s.shape) >= 2:
            return jnp.asarray(rng.normal(size=s.shape) / math.sqrt(math.prod(s.shape[:-1])), jnp.float32)
        return jnp.asarray(0.1 * rng.normal(size=s.shape), jnp.float32)

    return jax.tree.map(fill, shapes)


def random_stack(dims: list[int], activation: str, seed: int = 0) -> quant.DenseStack:
    rng = np.random.default_rng(seed)
    kernels = tuple((rng.normal(size=(a, b)) / math.sqrt(a)).astype(np.float32) for a, b in zip(dims, dims[1:]))
    biases = tuple((0.1 * rng.normal(size=b)).astype(np.float32) for b in dims[1:])
    return quant.DenseStack(kernels, biases, activation)


def rel_err(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


def uneven_matrix(seed: int = 0) -> np.ndarray:
    """[64, 12] with column ranges spread over 4 decades and one all-zero column."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(64, 12)) * 10.0 ** rng.uniform(-3, 1, size=12)
    w[:, 5] = 0.0
    return w.astype(np.float32)


# --- quantize / dequantize -----------------------------------------------------------------------


@pytest.mark.parametrize("granularity", ["channel", "tensor"])
def test_quantize_tensor_matches_reference_and_error_bound(granularity):
    w = uneven_matrix()
    values, scale = quant.quantize_tensor(w, granularity)
    want_values, want_scale = np_quantize(w, granularity)
    assert values.dtype == np.int8 and scale.dtype == np.float32
    assert scale.shape == ((12,) if granularity == "channel" else ())
    np.testing.assert_allclose(scale, want_scale, rtol=1e-6)
    assert np.abs(values.astype(np.int64) - want_values).max() <= 1  # float32 vs float64 rounding ties
    assert values.min() >= -127 and values.max() <= 127
    deq = quant.dequantize_tensor(values, scale)
    assert deq.dtype == np.float32
    # round to nearest: at most half a step per element (+ float32 slack)
    assert np.all(np.abs(w - deq) <= np.broadcast_to(scale, w.shape) * (0.5 + 1e-5))
    assert np.all(values[:, 5] == 0) and np.all(deq[:, 5] == 0)  # the zero channel: no NaN, exact
    if granularity == "channel":
        assert scale[5] == 0
        nonzero = np.arange(12) != 5
        assert np.all(np.abs(values[:, nonzero]).max(axis=0) == 127)  # each channel uses the full range


def test_per_channel_error_below_per_tensor():
    w = uneven_matrix(1)
    err = {g: np.abs(w - quant.dequantize_tensor(*quant.quantize_tensor(w, g))) for g in ("channel", "tensor")}
    assert np.all(err["channel"].max(axis=0) <= err["tensor"].max(axis=0) + 1e-7)
    # relative to each column's range, per-tensor scales waste most of the 8 bits on small columns
    col_range = np.maximum(np.abs(w).max(axis=0), 1e-30)
    rel = {g: (e.max(axis=0) / col_range)[np.abs(w).max(axis=0) > 0] for g, e in err.items()}
    assert np.all(rel["channel"] <= 0.5 / 127 * (1 + 1e-5))
    assert rel["channel"].mean() < 0.1 * rel["tensor"].mean()


def test_all_zero_tensor():
    values, scale = quant.quantize_tensor(np.zeros((3, 4), np.float32), "tensor")
    assert np.all(values == 0) and scale == 0 and np.all(quant.dequantize_tensor(values, scale) == 0)


@pytest.mark.parametrize("precision,bound", [("fp16", 2.0**-11), ("bf16", 2.0**-8)])
def test_half_precision_relative_error(precision, bound):
    rng = np.random.default_rng(2)
    stack = quant.DenseStack((rng.normal(size=(32, 16)).astype(np.float32) * 10.0 ** rng.uniform(-3, 3, (32, 16)),),
                             (rng.normal(size=16).astype(np.float32),), "relu")
    q = quant.quantize(stack, precision)
    assert q.kernels[0].dtype == (np.float16 if precision == "fp16" else ml_dtypes.bfloat16)
    assert q.biases[0].dtype == np.float32 and q.scales == (None,)
    back = quant.dequantize(q)
    rel = np.abs(back.kernels[0] - stack.kernels[0]) / np.abs(stack.kernels[0])
    assert rel.max() <= bound
    np.testing.assert_array_equal(back.biases[0], stack.biases[0])


def test_quantize_stack_roundtrip_and_pickle():
    stack = random_stack([10, 32, 32, 4], "tanh")
    for granularity in ("channel", "tensor"):
        q = quant.quantize(stack, "int8", granularity)
        back = quant.dequantize(q)
        for w, w_hat, s in zip(stack.kernels, back.kernels, q.scales):
            assert np.all(np.abs(w - w_hat) <= np.broadcast_to(s, w.shape) * (0.5 + 1e-5))
    for precision in ("int8", "bf16", "fp16"):
        q = quant.quantize(stack, precision)
        loaded = pickle.loads(pickle.dumps(q))  # what Ray's object store does with it
        assert loaded.precision == precision and loaded.activation == "tanh"
        for a, b in zip(loaded.kernels + loaded.biases, q.kernels + q.biases):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a.astype(np.float32), b.astype(np.float32))


def test_nbytes_exact_counts():
    dims = [17, 256, 256, 256, 6]
    stack = random_stack(dims, "relu")
    weights = sum(a * b for a, b in zip(dims, dims[1:]))
    outs = sum(dims[1:])
    layers = len(dims) - 1
    expected = {
        ("fp32", "channel"): 4 * weights + 4 * outs,
        ("fp16", "channel"): 2 * weights + 4 * outs,
        ("bf16", "channel"): 2 * weights + 4 * outs,
        ("int8", "channel"): weights + 4 * outs + 4 * outs,  # values, scale per output, fp32 biases
        ("int8", "tensor"): weights + 4 * layers + 4 * outs,
    }
    for (precision, granularity), n in expected.items():
        assert quant.nbytes(quant.quantize(stack, precision, granularity)) == n
    ratio = expected[("int8", "channel")] / expected[("fp32", "channel")]
    assert 0.25 < ratio < 0.26


def test_quantize_tree():
    rng = np.random.default_rng(3)
    params = {"Conv_0": {"kernel": rng.normal(size=(3, 3, 4, 8)).astype(np.float32),
                         "bias": rng.normal(size=8).astype(np.float32)},
              "Dense_0": {"kernel": jnp.asarray(rng.normal(size=(8, 5)), jnp.float32),
                          "bias": jnp.zeros(5)},
              "log_std": np.zeros(5, np.float32), "step": np.array(7, np.int32)}
    q8 = quant.quantize_tree(params, "int8", "channel")
    assert isinstance(q8["Conv_0"]["kernel"], quant.QuantizedLeaf)
    assert q8["Conv_0"]["kernel"].scale.shape == (8,) and q8["Conv_0"]["bias"].dtype == np.float32
    assert q8["log_std"].dtype == np.float32 and q8["step"].dtype == np.int32
    assert quant.nbytes(q8) == (3 * 3 * 4 * 8 + 4 * 8 + 4 * 8) + (8 * 5 + 4 * 5 + 4 * 5) + 4 * 5 + 4
    back = quant.dequantize_tree(q8)
    assert jax.tree.structure(back) == jax.tree.structure(jax.tree.map(np.asarray, params))
    for w, w_hat, s in [(params["Conv_0"]["kernel"], back["Conv_0"]["kernel"], q8["Conv_0"]["kernel"].scale),
                        (np.asarray(params["Dense_0"]["kernel"]), back["Dense_0"]["kernel"],
                         q8["Dense_0"]["kernel"].scale)]:
        assert w_hat.dtype == np.float32
        assert np.all(np.abs(w - w_hat) <= np.broadcast_to(s, w.shape) * (0.5 + 1e-5))
    q16 = quant.quantize_tree(params, "bf16", "tensor")
    assert q16["Dense_0"]["bias"].dtype == ml_dtypes.bfloat16 and q16["step"].dtype == np.int32
    assert quant.dequantize_tree(q16)["Conv_0"]["kernel"].dtype == np.float32


def test_bad_values_raise_config_error():
    stack = random_stack([4, 8, 2], "relu")
    with pytest.raises(ConfigError, match="precision='int4'"):
        quant.quantize(stack, "int4")
    with pytest.raises(ConfigError, match="granularity='row'"):
        quant.quantize_tensor(stack.kernels[0], "row")
    with pytest.raises(ConfigError, match="backend='jax'"):
        quant.make_forward(quant.quantize(stack, "int8"), backend="jax")
    with pytest.raises(ConfigError, match="threads=0"):
        quant.make_forward(quant.quantize(stack, "fp32"), threads=0)


# --- stack extraction ----------------------------------------------------------------------------

PPO_ACTOR = (("params", "MLP_0", "Dense_0"), ("params", "MLP_0", "Dense_1"), ("params", "Dense_0"))


class TanhActor(nn.Module):
    """TD3's actor layout: tanh after the chain."""

    @nn.compact
    def __call__(self, x):
        return jnp.tanh(HeadMLP((32, 32), 3, "relu", "torch")(x))


class Skip(nn.Module):
    activation: str = "relu"

    @nn.compact
    def __call__(self, x):
        h = nn.relu(nn.Dense(16)(x))
        h = nn.relu(nn.Dense(16)(h)) + h
        return nn.Dense(3)(h)


class Normed(nn.Module):
    activation: str = "tanh"

    @nn.compact
    def __call__(self, x):
        return nn.Dense(3)(nn.tanh(nn.LayerNorm()(nn.Dense(16)(x))))


def test_stack_paths_finds_chains():
    obs = np.zeros((2, 5), np.float32)
    net = QNetwork(4, (5,), (32, 32))
    assert quant.stack_paths(net, random_variables(net, obs), obs) == PPO_ACTOR
    head = HeadMLP((32,), 3, "tanh", "orthogonal")
    assert quant.stack_paths(head, random_variables(head, obs), obs) == (("params", "Dense_0"), ("params", "Dense_1"))


def test_stack_paths_explicit_paths_inside_bigger_modules():
    obs = np.zeros((2, 5), np.float32)
    ac = ActorCritic(3, False, (5,), (32, 32))
    variables = random_variables(ac, obs)
    with pytest.raises(ConfigError, match="network='ActorCritic'.*outside its Dense layers: params/log_std"):
        quant.stack_paths(ac, variables, obs)
    discrete = ActorCritic(3, True, (5,), (32, 32))
    discrete_variables = random_variables(discrete, obs)
    with pytest.raises(ConfigError, match="network='ActorCritic'.*MLP_1/Dense_0 does not take.*pass `paths`"):
        quant.stack_paths(discrete, discrete_variables, obs)
    assert quant.stack_paths(ac, variables, obs, paths=PPO_ACTOR) == PPO_ACTOR
    assert quant.stack_paths(discrete, discrete_variables, obs, paths=PPO_ACTOR) == PPO_ACTOR
    with pytest.raises(ConfigError, match="MLP_1/Dense_0 does not take tanh"):  # a critic layer after the head
        quant.stack_paths(ac, variables, obs, paths=PPO_ACTOR[:2] + (("params", "MLP_1", "Dense_0"),))
    with pytest.raises(ConfigError, match="paths='params/Nope'"):
        quant.stack_paths(ac, variables, obs, paths=[("params", "Nope")])

    td3 = TanhActor()
    variables = random_variables(td3, obs)
    with pytest.raises(ConfigError, match="not the output of its last Dense"):
        quant.stack_paths(td3, variables, obs, "relu")
    head_paths = tuple(("params", "HeadMLP_0", f"Dense_{i}") for i in range(3))
    assert quant.stack_paths(td3, variables, obs, "relu", paths=head_paths) == head_paths


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_algorithm_actors_via_head_paths(algo):
    """TD3's actor is tanh(HeadMLP), SAC's splits HeadMLP's output into (mean, bounded log-std): the
    chain is the HeadMLP, selected by path; the actor applies its own post-processing."""
    from sparqrl.algos.sac.train import Actor as SACActor
    from sparqrl.algos.td3.train import Actor as TD3Actor

    actor = (TD3Actor if algo == "td3" else SACActor)(3, (32, 32), "relu")
    obs = np.random.default_rng(11).normal(size=(4, 5)).astype(np.float32)
    variables = random_variables(actor, obs)
    with pytest.raises(ConfigError, match="pass `paths`"):
        quant.stack_paths(actor, variables, obs)
    head = tuple(("params", "HeadMLP_0", f"Dense_{i}") for i in range(3))
    stack = quant.dense_stack(variables, quant.stack_paths(actor, variables, obs, paths=head), "relu")
    raw = quant.make_forward(quant.quantize(stack, "fp32"))(obs)
    out = actor.apply(variables, obs)
    if algo == "td3":
        np.testing.assert_allclose(np.tanh(raw), out, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_allclose(raw[:, :3], out[0], rtol=1e-5, atol=1e-6)


def test_stack_paths_rejects_non_chains():
    cnn = QNetwork(3, (10, 10, 4), (32,))
    obs = np.zeros((2, 10, 10, 4), np.float32)
    with pytest.raises(ConfigError, match="actor_network='QNetwork'.*Dense chains only.*Conv_0"):
        quant.stack_paths(cnn, random_variables(cnn, obs), obs, field="actor_network")
    obs = np.zeros((2, 5), np.float32)
    with pytest.raises(ConfigError, match="network='Skip'.*Dense_2 does not take relu"):
        quant.stack_paths(Skip(), random_variables(Skip(), obs), obs)
    with pytest.raises(ConfigError, match="network='Normed'.*LayerNorm_0"):
        quant.stack_paths(Normed(), random_variables(Normed(), obs), obs)
    # the wrong activation breaks the chain too
    net = QNetwork(4, (5,), (32, 32))
    with pytest.raises(ConfigError, match="does not take tanh"):
        quant.stack_paths(net, random_variables(net, obs), obs, "tanh")


def test_dense_stack_checks_paths():
    obs = np.zeros((1, 5), np.float32)
    net = QNetwork(4, (5,), (32, 32))
    variables = random_variables(net, obs)
    with pytest.raises(ConfigError, match="paths="):
        quant.dense_stack(variables, [PPO_ACTOR[0], PPO_ACTOR[0]], "relu")  # 32 outputs into a 5-input layer
    with pytest.raises(ConfigError, match="activation='gelu'"):
        quant.dense_stack(variables, PPO_ACTOR, "gelu")


# --- forward passes ------------------------------------------------------------------------------

OBS_DIM = 11
HIDDEN = (256, 256, 256)


def network_cases():
    """(name, module, activation, paths, reference output from a [B, d] batch)."""
    ac = ActorCritic(4, False, (OBS_DIM,), HIDDEN, "tanh")
    ppo_actor = tuple(("params", "MLP_0", f"Dense_{i}") for i in range(len(HIDDEN))) + (("params", "Dense_0"),)
    return {
        "dqn_relu": (QNetwork(5, (OBS_DIM,), HIDDEN, "relu"), None, lambda m, v, x: m.apply(v, x)),
        "head_tanh": (HeadMLP(HIDDEN, 6, "tanh", "orthogonal"), None, lambda m, v, x: m.apply(v, x)),
        "head_relu": (HeadMLP(HIDDEN, 3, "relu", "torch"), None, lambda m, v, x: m.apply(v, x)),
        "ppo_actor": (ac, ppo_actor, lambda m, v, x: m.apply(v, x)[0].mode()),  # the Gaussian's mean
    }


# Bounds on ||y - y_fp32|| / ||y_fp32|| for a 4-layer, 256-wide net. Each layer's relative weight error
# is at most 2^-11 (fp16) / 2^-8 (bf16) per element, random-signed, so the output error grows ~ sqrt(L)
# of that (well below the 4·2^-11 ≈ 2e-3 and 4·2^-8 ≈ 1.6e-2 worst cases used). int8: weights off by up
# to scale/2 (~0.4 % of a column's max) and activations by up to half an 8-bit step, per layer;
# ActorQ-style PTQ keeps this at a few percent: the bound is 0.05.
BOUNDS = {"fp32": 1e-5, "fp16": 4 * 2.0**-11, "bf16": 4 * 2.0**-8, "int8": 0.05}


@pytest.mark.parametrize("case", ["dqn_relu", "head_tanh", "head_relu", "ppo_actor"])
def test_forward_close_to_fp32_module(case):
    module, paths, reference = network_cases()[case]
    obs = np.random.default_rng(4).normal(size=(32, OBS_DIM)).astype(np.float32)
    variables = random_variables(module, obs, seed=5)
    activation = module.activation
    found = quant.stack_paths(module, variables, obs[:2], paths=paths)
    stack = quant.dense_stack(variables, found, activation)
    want = np.asarray(reference(module, variables, obs))
    for precision, granularity in [("fp32", "channel"), ("fp16", "channel"), ("bf16", "channel"),
                                   ("int8", "channel"), ("int8", "tensor")]:
        y = quant.make_forward(quant.quantize(stack, precision, granularity))(obs)
        assert y.dtype == np.float32 and y.shape == want.shape
        assert rel_err(y, want) < BOUNDS[precision], (precision, granularity, rel_err(y, want))


@pytest.mark.parametrize("granularity", ["channel", "tensor"])
@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_int8_forward_matches_numpy_dynamic_quantization(granularity, activation):
    stack = random_stack([OBS_DIM, 128, 128, 5], activation, seed=6)
    q = quant.quantize(stack, "int8", granularity)
    forward = quant.make_forward(q)
    for batch in (1, 7, 64):
        obs = np.random.default_rng(batch).normal(size=(batch, OBS_DIM)).astype(np.float32)
        y = forward(obs)
        want = np_dynamic_quant_forward(q, obs)
        # the same arithmetic (float32 rounding of the rescale aside; activation ties could land one
        # step apart, but have not on these inputs)
        assert rel_err(y, want) < 1e-6
        assert y.dtype == np.float32 and y.shape == (batch, 5)


def test_int8_exact_where_int16_pair_sums_would_saturate():
    """Inputs quantized to 255 against weights of ±127: pair sums of 64770 overflow int16, which MLAS's
    u8s8 kernel saturates on CPUs without VNNI. The forward must stay exact on any CPU."""
    k, n = 64, 6
    values = np.full((k, n), 127, np.int8)
    values[:, 1::2] = -127
    values[::2, 2] = -127  # a column whose pair sums cancel
    scale = np.full(n, 0.01, np.float32)
    q = quant.QuantizedStack("int8", "relu", (values,), (scale,), (np.zeros(n, np.float32),))
    obs = np.ones((3, k), np.float32)
    np.testing.assert_allclose(quant.make_forward(q)(obs), obs @ (values * scale), rtol=1e-5)


@pytest.mark.parametrize("precision,backend", [("fp32", "auto"), ("fp32", "jax"), ("fp16", "auto"),
                                               ("bf16", "jax"), ("int8", "auto")])
def test_forward_any_batch(precision, backend):
    stack = random_stack([OBS_DIM, 64, 64, 3], "tanh", seed=7)
    forward = quant.make_forward(quant.quantize(stack, precision), threads=1, backend=backend)
    obs = np.random.default_rng(8).normal(size=(16, OBS_DIM)).astype(np.float32)
    full = forward(obs)
    rows = np.concatenate([forward(obs[i:i + 1]) for i in range(len(obs))])
    assert full.dtype == rows.dtype == np.float32 and full.shape == rows.shape == (16, 3)
    if precision == "int8":
        # activations are quantized per call over the whole batch (per-tensor, as PyTorch's dynamic
        # PTQ): a row's result depends slightly on its batch, within quantization error
        assert rel_err(rows, full) < 0.05
    else:
        np.testing.assert_allclose(rows, full, rtol=1e-5, atol=1e-6)
    # float64 observations are accepted and cast
    np.testing.assert_allclose(forward(obs.astype(np.float64)), full, rtol=1e-6)


def test_jax_backend_for_float_precisions():
    stack = random_stack([OBS_DIM, 64, 64, 3], "relu", seed=9)
    obs = np.random.default_rng(10).normal(size=(5, OBS_DIM)).astype(np.float32)
    want = quant.apply_stack(stack, obs)
    for precision in ("fp32", "fp16", "bf16"):
        q = quant.quantize(stack, precision)
        y_jax = quant.make_forward(q, backend="jax")(obs)
        assert rel_err(y_jax, want) < BOUNDS[precision]
        np.testing.assert_allclose(y_jax, quant.make_forward(q)(obs), rtol=1e-5, atol=1e-6)  # same weights


# --- recurrent policies: the flax network with every matmul in int8 (quant.recurrent) ------------


@pytest.mark.parametrize("granularity", ["channel", "tensor"])
def test_int8_matmul_is_onnx_runtimes_dynamic_quantize_matmul(granularity):
    """The JAX int8 matmul the recurrent actors run computes what the feed-forward actors' ORT kernel does."""
    stack = random_stack([OBS_DIM, 48], "relu", seed=11)
    q = quant.quantize(stack, "int8", granularity)
    leaf = quant.QuantizedLeaf(q.kernels[0], q.scales[0])
    for batch in (1, 7, 64):
        obs = np.random.default_rng(batch).normal(size=(batch, OBS_DIM)).astype(np.float32)
        y = np.asarray(jax.jit(quant.int8_matmul)(jnp.asarray(obs), leaf)) + q.biases[0]
        assert rel_err(y, quant.make_forward(q)(obs)) < 1e-6
        assert rel_err(y, np_dynamic_quant_forward(q, obs)) < 1e-6


@pytest.mark.parametrize("memory", ["lstm", "gru"])
def test_int8_recurrent_network_stays_close_to_fp32_over_steps(memory):
    """`int8_apply` of a recurrent actor-critic (its torso, cell, heads), the state carried for 8 steps, against
    the fp32 network on the same (int8-rounded) weights: within the int8 Dense chains' bound, and not equal
    (the int8 path ran). A wrong gate order or a missed matmul is far outside it."""
    from sparqrl.nets.memory import RecurrentActorCritic

    net = RecurrentActorCritic(action_dim=4, discrete=True, obs_shape=(OBS_DIM,), memory=memory, memory_size=32,
                               hidden=(64,), activation="relu")
    obs = np.random.default_rng(12).normal(size=(8, 16, OBS_DIM)).astype(np.float32)
    qvariables = quant.quantize_tree(random_variables(net, obs[0], seed=13), "int8")
    assert quant.is_int8(qvariables) and not quant.is_int8(quant.dequantize_tree(qvariables))
    fp32 = jax.jit(lambda v, o, c: net.apply(v, o, c))
    int8 = jax.jit(lambda v, o, c: quant.int8_apply(net, v, o, c))
    carry32 = carry8 = None
    for t in range(obs.shape[0]):
        raw32, value32, carry32 = fp32(quant.dequantize_tree(qvariables), obs[t], carry32)
        raw8, value8, carry8 = int8(qvariables, obs[t], carry8)
        for got, want in [(raw8, raw32), (value8, value32), *zip(jax.tree.leaves(carry8), jax.tree.leaves(carry32))]:
            assert got.dtype == jnp.float32 and 0 < rel_err(np.asarray(got), np.asarray(want)) < BOUNDS["int8"]

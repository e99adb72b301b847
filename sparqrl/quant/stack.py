"""Policy networks as plain Dense chains: finding the chain in a flax module, extracting it as numpy,
quantizing it for broadcast.

A *Dense chain* computes ``y = W_L·σ(… σ(W_1·x + b_1) …) + b_L`` on a flat observation ``x`` [B, d]:
flax ``nn.Dense`` layers with one activation σ ('relu' or 'tanh') between them and none after the
last. Every policy network that sparqrl's actors run is one: DQN's `QNetwork` with an MLP torso, the
`HeadMLP` of TD3's actor (before its tanh) and of SAC's actor ([mean, raw log-std]), and PPO's
`ActorCritic` actor branch ('MLP_0' then the head 'Dense_0'). A CNN torso's convolutions run before the
chain, in fp32 (`stack_paths(features=...)`): PyTorch's dynamic quantization, which ActorQ's actors used,
quantizes Linear layers only, and the Nature CNN's Dense layers hold 1.6M of its 1.7M actor parameters.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import flax.linen as nn
import jax
import numpy as np

from sparqrl.config import fail, one_of, require
from sparqrl.nets.activations import ACTIVATIONS
from sparqrl.quant.tensor import (
    FLOAT_DTYPES,
    Granularity,
    Precision,
    check_granularity,
    check_precision,
    dequantize_tensor,
    quantize_tensor,
)
from sparqrl.sparse.paths import path_str

Path = tuple[str, ...]


class DenseStack(NamedTuple):
    """A Dense chain as float32 numpy arrays (picklable; what `quantize` starts from)."""

    kernels: tuple[np.ndarray, ...]  # [in, out] each
    biases: tuple[np.ndarray, ...]  # [out] each
    activation: str  # between layers, none after the last


class QuantizedStack(NamedTuple):
    """A Dense chain in a broadcast precision (numpy only, picklable: sent once per policy version).

    Dequantized weights are ``kernels[i] · scales[i]`` for int8 (scale per output column, or one per
    tensor), ``kernels[i]`` as float32 otherwise. Biases stay float32 at every precision, as ActorQ's.
    """

    precision: str  # 'fp32' | 'bf16' | 'fp16' | 'int8'
    activation: str
    kernels: tuple[np.ndarray, ...]  # int8 / float16 / bfloat16 (ml_dtypes) / float32, [in, out]
    scales: tuple[np.ndarray | None, ...]  # int8: float32 [out] (channel) or [] (tensor); else None
    biases: tuple[np.ndarray, ...]  # float32 [out]


def apply_stack(stack: DenseStack, obs: np.ndarray) -> np.ndarray:
    """NumPy forward pass: obs [B, d] -> [B, out], in float64 (a reference, not a fast path)."""
    x = np.asarray(obs, np.float64)
    last = len(stack.kernels) - 1
    for i, (kernel, bias) in enumerate(zip(stack.kernels, stack.biases)):
        x = x @ kernel.astype(np.float64) + bias
        if i < last:
            x = ACTIVATIONS[stack.activation].numpy(x)
    return x


def _subtree(variables: Any, path: Path) -> Any:
    node = variables
    for name in path:
        if not hasattr(node, "keys") or name not in node:
            fail("paths", "/".join(path), f"no such layer in the variables (at {name!r})")
        node = node[name]
    return node


def dense_stack(variables: Any, paths: Sequence[Path], activation: str) -> DenseStack:
    """The Dense layers at `paths` (e.g. ``('params', 'MLP_0', 'Dense_0')``) of a flax variable tree,
    as float32 numpy arrays. Cheap (a host copy of the weights): meant to run per published version.
    A layer without a bias gets a zero bias."""
    one_of("activation", activation, ACTIVATIONS)
    require(len(paths) > 0, "paths", paths, "must name at least one Dense layer")
    kernels, biases = [], []
    for path in paths:
        layer = _subtree(variables, tuple(path))
        require("kernel" in layer, "paths", "/".join(path), "must name a Dense layer (with a 'kernel')")
        kernel = np.asarray(layer["kernel"], np.float32)
        require(kernel.ndim == 2, "paths", "/".join(path), f"must name a Dense layer (kernel [in, out], "
                f"got shape {kernel.shape})")
        bias = np.asarray(layer["bias"], np.float32) if "bias" in layer else np.zeros(kernel.shape[1], np.float32)
        if kernels:
            require(kernels[-1].shape[1] == kernel.shape[0], "paths", "/".join(path),
                    f"must take the previous layer's {kernels[-1].shape[1]} outputs (kernel {kernel.shape})")
        kernels.append(kernel)
        biases.append(bias)
    return DenseStack(tuple(kernels), tuple(biases), activation)


class _DenseCall(NamedTuple):
    path: Path  # ('params', ...names)
    x: np.ndarray
    y: np.ndarray


def _record_dense_calls(module: nn.Module, variables: Any, obs: np.ndarray
                        ) -> tuple[list[_DenseCall], set[Path], Any]:
    """The Dense calls of `module.apply(variables, obs)` in order, the paths of the Conv layers it called,
    and its output."""
    calls: list[_DenseCall] = []
    convs: set[Path] = set()

    def interceptor(next_fun, args, kwargs, context):
        out = next_fun(*args, **kwargs)
        if context.method_name == "__call__" and isinstance(context.module, (nn.Dense, nn.Conv)):
            path = ("params",) + tuple(context.module.path)
            if isinstance(context.module, nn.Conv):
                convs.add(path)
            else:
                x = args[0] if args else next(iter(kwargs.values()))
                calls.append(_DenseCall(path, np.asarray(x), np.asarray(out)))
        return out

    with nn.intercept_methods(interceptor):
        out = module.apply(variables, obs)
    return calls, convs, out


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    if np.shape(a) != np.shape(b):
        return False
    scale = max(1.0, float(np.max(np.abs(b)))) if np.size(b) else 1.0
    return bool(np.allclose(a, b, rtol=1e-4, atol=1e-5 * scale))


def _stray_params(variables: Any, paths: Sequence[Path], allowed: Sequence[Path]) -> list[str]:
    """The layers owning parameters of `variables` that are neither among the Dense `paths` nor `allowed`
    (a features network's Conv layers), sorted. 'params/log_std' is its own owner."""
    params = variables["params"] if "params" in variables else {}
    owners = {path_str(("params",) + p[:-1]) if len(p) > 1 else path_str(("params",) + p)
              for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]}
    return sorted(owners - {path_str(p) for p in (*paths, *allowed)})


def _chosen_paths(paths: Sequence[Path], called: list[Path], name: str) -> tuple[Path, ...]:
    """Explicit `paths` as tuples, checked: each a Dense layer that module `name` calls, in call order."""
    paths = tuple(tuple(p) for p in paths)
    missing = [path_str(p) for p in paths if p not in called]
    require(not missing, "paths", ", ".join(missing),
            f"must name Dense layers that {name} calls: {', '.join(path_str(p) for p in called)}")
    order = [called.index(p) for p in paths]
    require(order == sorted(order), "paths", [path_str(p) for p in paths], "must be in call order")
    return paths


def stack_paths(
    module: nn.Module,
    variables: Any,
    example_obs: Any,
    activation: str | None = None,
    paths: Sequence[Path] | None = None,
    *,
    field: str = "network",
    features: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[Path, ...]:
    """Paths of the Dense layers that `module.apply(variables, obs)` runs as a Dense chain.

    `paths=None`: every ``nn.Dense`` the module calls, in call order (found with
    ``flax.linen.intercept_methods``); the module's output must be the last layer's output and the
    module may own no parameters outside those layers. Explicit `paths` select a chain inside a bigger
    module (PPO's actor branch; TD3's HeadMLP before its tanh): only the chain itself is checked.

    The check runs the module on random normals shaped like `example_obs` (``[B, *obs_shape]``;
    random so that zeros cannot hide a skip connection) and requires: the first layer takes the
    flattened observation, each next layer takes σ(previous layer's output), each layer is called
    once, and `dense_stack` of the paths recomputes the last layer's output. `activation` defaults to
    ``module.activation``. Anything else (a Conv torso, a skip connection, a LayerNorm, an activation
    after the last layer) raises `ConfigError` naming `field`.

    `features`: a network whose convolutions come first (`nets.Features`; actors run them in fp32):
    `features(obs [B, d]) -> [B, F]` computes what the chain's first layer must take instead of the
    flattened observation, and the module's Conv layers are allowed parameters outside the chain.
    """
    name = type(module).__name__
    if activation is None:
        activation = getattr(module, "activation", None)
        require(activation is not None, "activation", None,
                f"{name} has no 'activation' field; pass one of {', '.join(ACTIVATIONS)}")
    one_of("activation", activation, ACTIVATIONS)
    rule = (f"quantized acting runs plain Dense chains only (flat obs -> Dense -> {activation} -> ... -> "
            "Dense, nothing after the last layer)")
    hint = "; pass `paths` to select a chain inside a bigger module" if paths is None else ""

    obs = np.random.default_rng(0).normal(size=np.shape(example_obs)).astype(np.float32)
    calls, convs, out = _record_dense_calls(module, variables, obs)
    chain_input = obs.reshape(obs.shape[0], -1) if features is None else np.asarray(features(obs), np.float32)
    called = [c.path for c in calls]
    require(len(set(called)) == len(called), field, name, f"{rule}; a Dense layer is called more than once")

    auto = paths is None
    if auto:
        require(bool(calls), field, name, f"{rule}; it calls no Dense layer")
        paths = tuple(called)
        stray = _stray_params(variables, paths, convs if features is not None else ())
        require(not stray, field, name, f"{rule}; it has parameters outside its Dense layers: {', '.join(stray)}")
    else:
        paths = _chosen_paths(paths, called, name)
    selected = [calls[called.index(p)] for p in paths]

    first = selected[0]
    require(first.x.size == chain_input.size and _close(first.x.reshape(-1), chain_input.reshape(-1)), field, name,
            f"{rule}; its first Dense layer {path_str(first.path)} does not take the flattened "
            + ("observation" if features is None else "output of its convolutions"))
    for prev, layer in zip(selected, selected[1:]):
        require(_close(layer.x, ACTIVATIONS[activation].numpy(prev.y)), field, name,
                f"{rule}; {path_str(layer.path)} does not take {activation}({path_str(prev.path)}){hint}")
    last = selected[-1]
    if auto:
        require(isinstance(out, (np.ndarray, jax.Array)) and _close(np.asarray(out), last.y), field, name,
                f"{rule}; its output is not the output of its last Dense layer {path_str(last.path)}{hint}")
    stack = dense_stack(variables, paths, activation)
    recomputed = apply_stack(stack, chain_input).astype(np.float32)
    require(_close(recomputed, last.y.reshape(recomputed.shape)), field, name,
            f"{rule}; its Dense layers do not compute x @ kernel + bias from the variables")
    return paths


def quantize(stack: DenseStack, precision: Precision, granularity: Granularity = "channel") -> QuantizedStack:
    """`stack` in a broadcast precision (post-training, no calibration data: ActorQ's recipe, run
    afresh per published version). int8: symmetric weights per output channel or per tensor (see
    `quantize_tensor`); fp16 / bf16: weights cast; biases float32 at every precision."""
    check_precision(precision)
    check_granularity(granularity)
    if precision == "int8":
        pairs = [quantize_tensor(k, granularity) for k in stack.kernels]
        kernels, scales = tuple(v for v, _ in pairs), tuple(s for _, s in pairs)
    else:
        kernels = tuple(np.asarray(k).astype(FLOAT_DTYPES[precision], copy=False) for k in stack.kernels)
        scales = (None,) * len(kernels)
    biases = tuple(np.asarray(b, np.float32) for b in stack.biases)
    return QuantizedStack(precision, stack.activation, kernels, scales, biases)


def dequantize(q: QuantizedStack) -> DenseStack:
    """The float32 weights a `QuantizedStack` stands for (what every precision computes with, up to the
    int8 path's dynamic activation quantization)."""
    if q.precision == "int8":
        kernels = tuple(dequantize_tensor(k, s) for k, s in zip(q.kernels, q.scales))
    else:
        kernels = tuple(np.asarray(k, np.float32) for k in q.kernels)  # no copy for fp32
    return DenseStack(kernels, tuple(np.asarray(b, np.float32) for b in q.biases), q.activation)

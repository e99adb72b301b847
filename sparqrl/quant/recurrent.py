"""int8 acting for recurrent policies (`--set memory=lstm|gru` with `--actor-precision int8`): the whole network's
matmuls, the cell's included, in int8 with ONNX Runtime's dynamic-quantization arithmetic, in JAX.

A recurrent policy is not a Dense chain (`stack`): its torso feeds a cell whose state comes back every step, so the
actor runs the flax network itself (`runners.actors.recurrent_step`). For int8 it runs it through `int8_apply`,
which replaces every matmul of the network with `int8_matmul`:

* each ``nn.Dense`` (torso, heads, critic, and the GRU cell's six gate layers): ``int8_matmul(x, kernel) + bias``;
* ``nn.OptimizedLSTMCell`` (which multiplies with ``jnp.dot`` on its concatenated kernels, not through Dense):
  the same gates recomputed from its parameters, each of the 8 matmuls (4 on the input, 4 on the state) an
  `int8_matmul`: ``i, f, o = σ(x·W_i· + h·W_h· + b_h·)``, ``g = tanh(...)``, ``c' = f·c + i·g``,
  ``h' = o·tanh(c')``.

`int8_matmul` is the arithmetic of ONNX Runtime's ``DynamicQuantizeMatMul`` that the feed-forward int8 actors run
(`forward`, ActorQ's PyTorch dynamic PTQ): the input quantized per call to uint8 over the whole batch (ONNX's
``DynamicQuantizeLinear``: one scale ``(max(x, 0) - min(x, 0)) / 255`` and zero point), the weights as broadcast
(symmetric int8 per output channel or per tensor, `tensor.quantize_tensor`), exact int32 accumulation, rescaled
by ``x_scale · w_scale``, the float bias added. Convolutions (a MinAtar / Atari torso) run in fp32 on the
broadcast int8 weights widened, as the feed-forward actors keep theirs in fp32. Gate nonlinearities and the
state stay float32 (PyTorch's dynamic quantized LSTM does the same).

Speed is not the point here: XLA's integer dot on this CPU is no faster than its fp32 dot (`forward`); what the
actor gains is the quarter-size broadcast, and it acts with the int8 network it was sent.

API::

    int8_matmul(x float32 [..., in], leaf QuantizedLeaf(values int8 [in, out], scale)) -> float32 [..., out]
    int8_apply(module, qvariables, *args) -> module.apply's result    # qvariables: `quantize_tree(v, "int8")`
    is_int8(tree) -> bool                                             # a tree holding QuantizedLeaf leaves
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from sparqrl.quant.tensor import QuantizedLeaf

U8_MAX = 255.0


def _quantized(leaf: Any) -> bool:
    return isinstance(leaf, QuantizedLeaf)


def is_int8(tree: Any) -> bool:
    """Whether `tree` holds int8-quantized leaves (`quantize_tree(..., "int8")`)."""
    return any(_quantized(x) for x in jax.tree.leaves(tree, is_leaf=_quantized))


def dynamic_quantize(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """ONNX's DynamicQuantizeLinear on all of `x`: (uint8 values as int32, scale, zero point as int32). The range
    is widened to include 0; rounding to nearest even, as ONNX Runtime's.

    Multiplied by the reciprocal of the scale, not divided by it: with the division, one actor step's quantization
    differed between two programs (jitted alone and op by op: a zero point of 127.49999 against 127.5 on a state
    symmetric about 0, one quantum apart after rounding); with the reciprocal they agree."""
    lo, hi = jnp.minimum(jnp.min(x), 0.0), jnp.maximum(jnp.max(x), 0.0)
    scale = (hi - lo) / U8_MAX
    inverse = 1.0 / jnp.where(scale > 0, scale, 1.0)  # an all-zero input: every value quantizes to the zero point
    zero = jnp.clip(jnp.round(-lo * inverse), 0.0, U8_MAX)
    values = jnp.clip(jnp.round(x * inverse) + zero, 0.0, U8_MAX)
    return values.astype(jnp.int32), scale, zero.astype(jnp.int32)


def int8_matmul(x: jax.Array, leaf: QuantizedLeaf) -> jax.Array:
    """``x @ W`` as ONNX Runtime's DynamicQuantizeMatMul computes it (module docstring), W = leaf's int8 values
    times its scale; no bias."""
    values, scale, zero = dynamic_quantize(x)
    acc = jax.lax.dot_general(values - zero, leaf.values.astype(jnp.int32), (((x.ndim - 1,), (0,)), ((), ())),
                              preferred_element_type=jnp.int32)
    return acc.astype(jnp.float32) * (scale * leaf.scale)


def _widened(tree: Any) -> Any:
    """The float32 variables `tree` stands for (int8 leaves times their scales), for flax's own bookkeeping and
    the convolutions."""
    return jax.tree.map(lambda x: x.values.astype(jnp.float32) * x.scale if _quantized(x) else x, tree,
                        is_leaf=_quantized)


def _layer(qparams: Any, module: nn.Module) -> Any:
    node = qparams
    for name in module.path:
        node = node[name]
    return node


def _dense(layer: Any, x: jax.Array) -> jax.Array:
    y = int8_matmul(x, layer["kernel"])
    return y + layer["bias"] if "bias" in layer else y


def _lstm(cell: nn.OptimizedLSTMCell, layer: Any, carry: tuple[jax.Array, jax.Array], x: jax.Array
          ) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
    c, h = carry
    gate = {k: int8_matmul(x, layer[f"i{k}"]["kernel"]) + _dense(layer[f"h{k}"], h) for k in "ifgo"}
    i, f, o = (cell.gate_fn(gate[k]) for k in "ifo")
    new_c = f * c + i * cell.activation_fn(gate["g"])
    new_h = o * cell.activation_fn(new_c)
    return (new_c, new_h), new_h


def int8_apply(module: nn.Module, qvariables: Any, *args: Any) -> Any:
    """``module.apply(variables, *args)`` with every Dense layer's and LSTM cell's matmul in int8 (module
    docstring); `qvariables` as `quantize_tree(variables, "int8", granularity)` makes it (jax arrays or numpy,
    batched under vmap alike). A Dense layer or cell whose kernel is not quantized is an error, not fp32."""
    qparams = qvariables["params"]

    def interceptor(next_fun, call_args, kwargs, context):
        module_, method = context.module, context.method_name
        if method == "__call__" and isinstance(module_, nn.Dense):
            return _dense(_layer(qparams, module_), call_args[0])
        if method == "__call__" and isinstance(module_, nn.OptimizedLSTMCell):
            return _lstm(module_, _layer(qparams, module_), *call_args)
        return next_fun(*call_args, **kwargs)

    with nn.intercept_methods(interceptor):
        return module.apply(_widened(qvariables), *args)

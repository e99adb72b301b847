"""A `Policy` as one self-contained ONNX graph: ``obs float32 [batch, *obs_shape] -> action``; a recurrent
policy's also takes its state and returns the next (``state_h`` [batch, size], and the LSTM's ``state_c``, ->
``next_state_h``, ``next_state_c``: float32, zeros at an episode's start; see `sparqrl.export`).

    build_model(policy, precision, sparse=False, metadata=None) -> (onnx.ModelProto, compact tensors)

Precisions (the pre- and post-processing always run in float32, so inputs and outputs are float32 /
int32 whatever the precision):

* fp32: ``Gemm`` per Dense layer (a recurrent cell: one for its input's gates, one for its state's).
* fp16: weights, biases and compute in float16 (``Cast`` in after the observation normalisation and
  out before the head), Conv torso included.
* int8: per output channel symmetric int8 weights (`sparqrl.quant.quantize_tensor`, ActorQ's recipe),
  activations quantized per call (one scale and zero point per call, from the whole batch):
  ``DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul(x_scale · w_scale) -> Add(bias)``, standard ONNX
  ops (any runtime), the pattern ONNX Runtime fuses into its ``DynamicQuantizeMatMul`` kernel at load,
  which `sparqrl.quant` measured 2-5x faster than fp32 at batch 1.
  The weights are stored as uint8 ``q + 128`` with zero point 128: ORT's int8 GEMM (MLAS) computes
  uint8 x uint8 exactly on every x86 CPU, while uint8 x int8 saturates on CPUs without VNNI
  (`sparqrl.quant.forward`), and a file must be right on whatever CPU runs it. A Conv torso runs in float32.

Compact (sparse) weights: a pruned kernel is stored as a bitmap of its kept entries (1 bit per
weight, ``np.packbits``) and the kept values, and rebuilt inside the graph from constants only
(``BitShift``, ``Mod``, ``CumSum``, ``Gather``), which ONNX Runtime constant-folds once when it loads the
session: inference runs the same dense kernels, the file is smaller. Why not ONNX's
``sparse_initializer``: the ONNX checker requires int64 indices, 8 bytes per kept weight, so it only
pays below 33 % density in fp32 and 11 % in int8, where the bitmap costs 1/8 byte per weight (pays
below 97 % and 88 %). Each kernel is stored whichever way is smaller, so a dense network is unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sparqrl.export.policy import GATES, STATE, Cell, Policy
from sparqrl.nets.activations import ACTIVATIONS
from sparqrl.quant import quantize_tensor

# onnx 1.23 stamps IR 14 on new models, which ORT 1.31 refuses (it reads IR <= 13); IR 9 / opset 17
# has every op used here (as `sparqrl.quant.forward`).
IR_VERSION = 9
OPSET = 17
INPUT, OUTPUT = "obs", "action"
U8_ZERO = 128  # zero point of the uint8 weight encoding (see the module docstring)


class _Graph:
    """Nodes and initializers of the graph being built, with unique value names."""

    def __init__(self, sparse: bool) -> None:
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.sparse = sparse
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self.compact = 0  # tensors stored as bitmap + values
        self._count = 0

    def name(self, base: str) -> str:
        self._count += 1
        return f"{base}_{self._count}"

    def const(self, base: str, array: np.ndarray) -> str:
        name = self.name(base)
        # np.asarray keeps a 0-d array 0-d (np.ascontiguousarray would make it [1]: Clip, CumSum need scalars)
        self.initializers.append(self.numpy_helper.from_array(np.asarray(array, order="C"), name))
        return name

    def op(self, op_type: str, inputs: list[str], base: str | None = None, outputs: int = 1, **attrs: Any) -> Any:
        names = [self.name(base or op_type.lower()) for _ in range(outputs)]
        self.nodes.append(self.helper.make_node(op_type, inputs, names, **attrs))
        return names[0] if outputs == 1 else names

    def weight(self, base: str, array: np.ndarray, fill: float | int = 0) -> str:
        """A weight constant; with `sparse`, stored as bitmap + kept values where that is smaller, and
        rebuilt in the graph (entries equal to `fill` are the pruned ones)."""
        flat = np.ascontiguousarray(array).reshape(-1)
        keep = flat != np.asarray(fill, flat.dtype)
        kept = int(keep.sum())
        compact_bytes = (flat.size + 7) // 8 + (kept + 1) * flat.dtype.itemsize
        if not self.sparse or compact_bytes >= flat.nbytes:
            return self.const(base, array)
        self.compact += 1
        from onnx import TensorProto

        bits = self.const(f"{base}_bitmap", np.packbits(keep, bitorder="little"))  # bit j of byte i: entry 8i + j
        # values[0] is the fill: entry e reads values[keep[e] · (number of kept entries up to e)]
        values = self.const(f"{base}_values", np.concatenate([np.asarray([fill], flat.dtype), flat[keep]]))
        column = self.op("Unsqueeze", [bits, self.const("axis1", np.asarray([1], np.int64))])
        shifted = self.op("BitShift", [column, self.const("shifts", np.arange(8, dtype=np.uint8))], direction="RIGHT")
        bit = self.op("Mod", [shifted, self.const("two", np.asarray(2, np.uint8))])
        bit = self.op("Cast", [bit], to=TensorProto.INT64)
        bit = self.op("Reshape", [bit, self.const("flat", np.asarray([-1], np.int64))])
        bit = self.op("Slice", [bit, self.const("start", np.asarray([0], np.int64)),
                                self.const("stop", np.asarray([flat.size], np.int64))])
        index = self.op("Mul", [self.op("CumSum", [bit, self.const("axis0", np.asarray(0, np.int64))]), bit])
        dense = self.op("Gather", [values, index], axis=0)
        return self.op("Reshape", [dense, self.const("shape", np.asarray(array.shape, np.int64))], base=base)


def _activation(g: _Graph, activation: str, x: str) -> str:
    return g.op(ACTIVATIONS[activation].onnx, [x])


def _conv(g: _Graph, policy: Policy, x: str, dtype: Any) -> str:
    """NHWC observation [B, H, W, C] -> the flattened (H, W, C-ordered, as flax) Conv features [B, H·W·O]."""
    conv = policy.conv
    kh, kw = conv.kernel.shape[:2]
    # XLA's 'SAME' for stride 1: kernel - 1 padding, the smaller half before
    pads = [(kh - 1) // 2, (kw - 1) // 2, kh - 1 - (kh - 1) // 2, kw - 1 - (kw - 1) // 2]
    kernel = g.weight("conv_w", np.transpose(conv.kernel, (3, 2, 0, 1)).astype(dtype))  # HWIO -> OIHW
    y = g.op("Transpose", [x], perm=[0, 3, 1, 2])
    y = g.op("Conv", [y, kernel, g.const("conv_b", conv.bias.astype(dtype))], kernel_shape=[kh, kw], pads=pads)
    y = _activation(g, conv.activation, y)
    y = g.op("Transpose", [y], perm=[0, 2, 3, 1])
    return g.op("Flatten", [y], axis=1)


def _dense_float(g: _Graph, x: str, kernel: np.ndarray, bias: np.ndarray, dtype: Any, i: int) -> str:
    return g.op("Gemm", [x, g.weight(f"w{i}", kernel.astype(dtype)), g.const(f"b{i}", bias.astype(dtype))])


def _dense_int8(g: _Graph, x: str, kernel: np.ndarray, bias: np.ndarray, i: int) -> str:
    from onnx import TensorProto

    values, scale = quantize_tensor(kernel, "channel")
    weights = values.view(np.uint8) ^ np.uint8(0x80)  # two's complement q -> q + 128 in [1, 255]
    x_q, x_scale, x_zero = g.op("DynamicQuantizeLinear", [x], outputs=3)
    w = g.weight(f"w{i}", weights, fill=U8_ZERO)
    acc = g.op("MatMulInteger", [x_q, w, x_zero, g.const(f"w{i}_zero", np.asarray(U8_ZERO, np.uint8))])
    y = g.op("Cast", [acc], to=TensorProto.FLOAT)
    y = g.op("Mul", [y, g.op("Mul", [x_scale, g.const(f"w{i}_scale", scale.astype(np.float32))])])
    return g.op("Add", [y, g.const(f"b{i}", bias.astype(np.float32))])


def _matmul(g: _Graph, x: str, kernel: np.ndarray, bias: np.ndarray, precision: str, i: Any) -> str:
    """x @ kernel + bias at `precision` (x already in its dtype: float16 for fp16, else float32)."""
    if precision == "int8":
        return _dense_int8(g, x, kernel, bias, i)
    return _dense_float(g, x, kernel, bias, np.float16 if precision == "fp16" else np.float32, i)


def _cell(g: _Graph, cell: Cell, x: str, state: dict[str, str], precision: str) -> dict[str, str]:
    """The next state {name: value} of `cell` (`policy.Cell`'s equations) on input x and `state` (values in the
    graph's dtype); the head takes its 'h'."""
    gates = len(GATES[cell.kind])
    split = g.const("gate_sizes", np.full(gates, cell.size, np.int64))
    from_x = _matmul(g, x, cell.x_kernel, cell.x_bias, precision, "cell_x")
    from_h = _matmul(g, state["h"], cell.h_kernel, cell.h_bias, precision, "cell_h")
    if cell.kind == "lstm":
        i, f, c_in, o = g.op("Split", [g.op("Add", [from_x, from_h]), split], outputs=4, axis=1)
        c = g.op("Add", [g.op("Mul", [g.op("Sigmoid", [f]), state["c"]]),
                         g.op("Mul", [g.op("Sigmoid", [i]), g.op("Tanh", [c_in])])])
        return {"c": c, "h": g.op("Mul", [g.op("Sigmoid", [o]), g.op("Tanh", [c])])}
    x_r, x_z, x_n = g.op("Split", [from_x, split], outputs=3, axis=1)
    h_r, h_z, h_n = g.op("Split", [from_h, split], outputs=3, axis=1)
    r = g.op("Sigmoid", [g.op("Add", [x_r, h_r])])
    z = g.op("Sigmoid", [g.op("Add", [x_z, h_z])])
    n = g.op("Tanh", [g.op("Add", [x_n, g.op("Mul", [r, h_n])])])
    one = g.const("one", np.asarray(1, np.float16 if precision == "fp16" else np.float32))
    return {"h": g.op("Add", [g.op("Mul", [g.op("Sub", [one, z]), n]), g.op("Mul", [z, state["h"]])])}


def _head(g: _Graph, policy: Policy, raw: str) -> str:
    from onnx import TensorProto

    head = policy.head
    if head.discrete:  # first maximum, as jnp.argmax
        return g.op("Cast", [g.op("ArgMax", [raw], axis=1, keepdims=0, select_last_index=0)], to=TensorProto.INT32)
    a = raw
    if head.take < policy.stack.kernels[-1].shape[1]:
        starts, stops = g.const("start", np.asarray([0], np.int64)), g.const("stop", np.asarray([head.take], np.int64))
        a = g.op("Slice", [a, starts, stops, g.const("axis1", np.asarray([1], np.int64))])
    if head.tanh:
        a = g.op("Tanh", [a])
    if head.center is not None:
        a = g.op("Add", [g.const("center", head.center), g.op("Mul", [g.const("half_range", head.half_range), a])])
    if head.low is not None:
        a = g.op("Min", [g.op("Max", [a, g.const("low", head.low)]), g.const("high", head.high)])
    return a


def state_names(policy: Policy) -> tuple[tuple[str, str], ...]:
    """(input, output) names of a recurrent policy's state in flax's carry order (`policy.STATE`); () if none."""
    if policy.cell is None:
        return ()
    return tuple((f"state_{name}", f"next_state_{name}") for name in STATE[policy.cell.kind])


def output_info(policy: Policy) -> dict[str, Any]:
    """{name: {"dtype", "shape"}} of the graph's inputs and outputs (what the export reports)."""
    obs = {"dtype": "float32", "shape": ["batch", *policy.obs_shape]}
    if policy.head.discrete:
        action = {"dtype": "int32", "shape": ["batch"]}
    else:
        action = {"dtype": "float32", "shape": ["batch", policy.head.take]}
    state = {"dtype": "float32", "shape": ["batch", policy.cell.size]} if policy.cell is not None else None
    names = state_names(policy)
    return {"inputs": {INPUT: obs, **{name: state for name, _ in names}},
            "outputs": {OUTPUT: action, **{name: state for _, name in names}}}


def build_model(policy: Policy, precision: str, sparse: bool = False,
                metadata: dict[str, Any] | None = None) -> tuple[Any, int]:
    """The ONNX model of `policy` at `precision` ('fp32' | 'fp16' | 'int8'); `sparse`: store pruned
    kernels compactly (see the module docstring); `metadata`: the model's metadata_props. Returns
    (model, number of compactly stored tensors)."""
    from onnx import TensorProto, checker, helper

    g = _Graph(sparse)
    x = INPUT
    if policy.obs_norm is not None:
        norm = policy.obs_norm
        x = g.op("Div", [g.op("Sub", [x, g.const("obs_mean", norm.mean)]), g.const("obs_std", norm.std)])
        x = g.op("Clip", [x, g.const("clip_low", np.asarray(-norm.clip, np.float32)),
                          g.const("clip_high", np.asarray(norm.clip, np.float32))])
    half = precision == "fp16"
    if half:  # from here on float16 (the normalisation above runs in float32, as the library)
        x = g.op("Cast", [x], to=TensorProto.FLOAT16)
    if policy.conv is not None:  # an int8 export keeps the Conv in float32
        x = _conv(g, policy, x, np.float16 if half else np.float32)
    elif len(policy.obs_shape) != 1:
        x = g.op("Flatten", [x], axis=1)

    stack = policy.stack
    last = len(stack.kernels) - 1
    names = state_names(policy)
    state = {}
    for (name, _), key in zip(names, STATE[policy.cell.kind] if names else ()):  # in the graph's dtype
        state[key] = g.op("Cast", [name], to=TensorProto.FLOAT16) if half else name
    for i, (kernel, bias) in enumerate(zip(stack.kernels, stack.biases)):
        if i == last and policy.cell is not None:  # the cell between the torso and the head
            state = _cell(g, policy.cell, x, state, precision)
            x = state["h"]
        if precision == "int8":
            x = _dense_int8(g, x, kernel, bias, i)
        else:
            x = _dense_float(g, x, kernel, bias, np.float16 if half else np.float32, i)
        if i < last:
            x = _activation(g, stack.activation, x)
    if half:
        x = g.op("Cast", [x], to=TensorProto.FLOAT)
    action = _head(g, policy, x)
    g.nodes.append(helper.make_node("Identity", [action], [OUTPUT]))
    for (_, name), key in zip(names, STATE[policy.cell.kind] if names else ()):
        value = g.op("Cast", [state[key]], to=TensorProto.FLOAT) if half else state[key]
        g.nodes.append(helper.make_node("Identity", [value], [name]))

    info = output_info(policy)
    out_dtype = TensorProto.INT32 if policy.head.discrete else TensorProto.FLOAT

    def typed(side: str) -> list[Any]:  # the state and obs are float32, the action int32 or float32
        return [helper.make_tensor_value_info(name, out_dtype if name == OUTPUT else TensorProto.FLOAT, v["shape"])
                for name, v in info[side].items()]

    graph = helper.make_graph(g.nodes, "sparqrl_policy", typed("inputs"), typed("outputs"), g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="sparqrl")
    model.ir_version = IR_VERSION
    if metadata:
        helper.set_model_props(model, {k: str(v) for k, v in metadata.items()})
    checker.check_model(model)
    return model, g.compact

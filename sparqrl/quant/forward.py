"""Running a `QuantizedStack`: the actor's forward pass, built once per received policy version.

Kernels, chosen by measurement on the CPUs sparqrl's actors run on (AMD EPYC, AVX2, no VNNI; one
thread), not by assumption:

* **int8: ONNX Runtime's ``com.microsoft::DynamicQuantizeMatMul``** (MLAS integer GEMM). XLA's int8
  ``dot_general`` with int32 accumulation was *not* faster than its fp32 dot (0.07x at batch 1, about
  1x at 64-256), while ORT's op ran a 64->2048->2048->2048 MLP at batch 1/16/64/256 in
  0.30/2.1/6.6/25.9 ms vs 1.1/6.2/8.4/29.9 ms for the jitted fp32 JAX forward and 1.8/4.9/13.4/51 ms
  for ORT's own fp32 Gemm (`benchmarks/actorq_kernel.py` reproduces the comparison).
  Per layer the op quantizes its input dynamically on every call (uint8, asymmetric, one scale and
  zero-point per call from the input's min/max, range widened to include 0), multiplies with int32
  accumulation and rescales by ``input_scale · weight_scale[column]``, then adds the float bias: the
  arithmetic of PyTorch's dynamic post-training quantization that ActorQ's actors used (reference
  §2.8), with per-channel or per-tensor weight scales.
* **fp16 / bf16: weight-only.** Weights travel and are stored in 16 bits and are widened to float32
  once when the version is loaded; the forward pass is the fp32 one. This CPU has no fast
  half-precision GEMM, and ActorQ's fp16 actors (PyTorch dynamic quantization with dtype float16)
  are weight-only too.
* **fp32: the jitted JAX forward** (faster than ORT's fp32 Gemm at every measured batch).

The int8 weight encoding handed to MLAS. On x86 CPUs without VNNI, MLAS multiplies uint8 activations
by int8 weights with ``vpmaddubsw``, which adds pairs of products in *saturating int16*: a pair of
255·127 products (64770) clips to 32767, and a layer's output can come out halved. ORT's own
quantization tool works around it by 7-bit weights (``reduce_range``), which doubles the weight error.
Instead, where a one-off probe (`int8_kernel`) shows saturation, the int8 weights are shifted once per
version to uint8 with zero-point 128 (``q + 128``: same values, exact int32 accumulation in MLAS's
u8u8 kernel, about 25 % slower than the saturating u8s8 kernel on this CPU and still 2-4x faster than
fp32); where the probe is exact (VNNI, ``vpdpbusd``) the int8 weights are used as they are.

The ONNX graph is built in memory (no files), once per version: session build for a 3x2048 stack
costs about 20 ms (measured, `benchmarks/actorq_kernel.py` prints it), against ~100 ms between
versions at the least in any actor-learner run.
"""

from __future__ import annotations

import functools
from typing import Callable, Literal

import jax
import numpy as np

from sparqrl.config import fail, one_of, positive
from sparqrl.nets.modules import ACTIVATIONS
from sparqrl.quant.stack import QuantizedStack, dequantize
from sparqrl.quant.tensor import check_precision

Forward = Callable[[np.ndarray], np.ndarray]
Backend = Literal["auto", "jax", "ort"]
Int8Kernel = Literal["auto", "u8s8", "u8u8"]

# onnx 1.23 stamps IR 14 on new models, which ORT 1.31 refuses (it reads IR <= 13); IR 9 / opset 17
# is all this graph needs (Relu, Tanh, Gemm and the contrib op).
_IR_VERSION = 9
_OPSETS = (("", 17), ("com.microsoft", 1))
_ONNX_ACTIVATIONS = {"relu": "Relu", "tanh": "Tanh"}


def _onnx_model(q: QuantizedStack, kernel: str) -> bytes:
    """Serialized ONNX graph ``obs [B, d] -> out [B, n]`` of the stack: DynamicQuantizeMatMul per
    layer for int8 (weights as `kernel` says), else Gemm on the float32 weights."""
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits = [], []
    x = "obs"
    layers = dequantize(q) if q.precision != "int8" else None
    last = len(q.kernels) - 1
    for i in range(len(q.kernels)):
        y = f"dense_{i}"
        if q.precision == "int8":
            values, scale = q.kernels[i], np.asarray(q.scales[i], np.float32)
            if kernel == "u8u8":
                weights = values.view(np.uint8) ^ np.uint8(0x80)  # two's complement + 128: q + 128 in [1, 255]
                zero = np.full(scale.shape, 128, np.uint8)
            else:
                weights, zero = values, np.zeros(scale.shape, np.int8)
            inits += [numpy_helper.from_array(weights, f"w{i}"), numpy_helper.from_array(scale, f"s{i}"),
                      numpy_helper.from_array(zero, f"z{i}"), numpy_helper.from_array(q.biases[i], f"b{i}")]
            nodes.append(helper.make_node("DynamicQuantizeMatMul", [x, f"w{i}", f"s{i}", f"z{i}", f"b{i}"], [y],
                                          domain="com.microsoft"))
        else:
            inits += [numpy_helper.from_array(layers.kernels[i], f"w{i}"),
                      numpy_helper.from_array(layers.biases[i], f"b{i}")]
            nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [y]))
        x = y
        if i < last:
            nodes.append(helper.make_node(_ONNX_ACTIVATIONS[q.activation], [x], [f"act_{i}"]))
            x = f"act_{i}"
    d_in, d_out = q.kernels[0].shape[0], q.kernels[-1].shape[1]
    graph = helper.make_graph(
        nodes, "dense_stack",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["B", d_in])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["B", d_out])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in _OPSETS])
    model.ir_version = _IR_VERSION
    return model.SerializeToString()


def _session(model: bytes, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # basic (constant folding, redundant-node removal) is all this graph can use; the extended
    # levels find nothing to fuse here and made session build slower (measured)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    # actors share cores with environment stepping: idle pool threads must sleep, not spin
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


@functools.cache
def int8_kernel() -> str:
    """'u8s8' if this CPU's int8 GEMM (MLAS) multiplies uint8 activations by int8 weights exactly,
    'u8u8' if it saturates (x86 without VNNI: see the module docstring). Probed once per process on
    the worst case: inputs that quantize to 255 against weights of +/-127."""
    k, n = 256, 16
    values = np.full((k, n), 127, np.int8)
    values[:, 1::2] = -127
    q = QuantizedStack("int8", "relu", (values,), (np.ones(n, np.float32),), (np.zeros(n, np.float32),))
    session = _session(_onnx_model(q, "u8s8"), 1)
    for batch in (1, 4):
        obs = np.ones((batch, k), np.float32)  # scale 1/255: every input quantizes to 255
        want = obs @ values.astype(np.float32)  # the float scales (1/255 and 1) multiply back exactly
        if not np.allclose(session.run(None, {"obs": obs})[0], want, rtol=1e-5):
            return "u8u8"
    return "u8s8"


@functools.partial(jax.jit, static_argnames="activation")
def _jax_forward(kernels: tuple[jax.Array, ...], biases: tuple[jax.Array, ...], obs: jax.Array,
                 activation: str) -> jax.Array:
    x = obs
    for i, (kernel, bias) in enumerate(zip(kernels, biases)):
        x = x @ kernel + bias
        if i < len(kernels) - 1:
            x = ACTIVATIONS[activation](x)
    return x


def make_forward(q: QuantizedStack, threads: int = 1, *, backend: Backend = "auto",
                 kernel: Int8Kernel = "auto") -> Forward:
    """``forward(obs float32 [B, d]) -> float32 [B, out]`` (raw outputs: Q-values, pre-tanh actions,
    logits...) for any B. Build it once per received version; call it every step.

    backend 'auto': ONNX Runtime for int8, JAX for the rest; 'ort' runs float precisions through ORT's
    fp32 Gemm (a kernel-level control for benchmarks); 'jax' cannot run int8.
    `threads`: ORT intra-op threads (actors pin 1). The JAX forward runs on the CPU device with
    whatever threads XLA was given at import (``XLA_FLAGS``: see `benchmarks/actorq_kernel.py`).
    `kernel` (int8): 'auto' = `int8_kernel()`; 'u8s8' forces MLAS's int8-weight kernel, which
    saturates on CPUs without VNNI (benchmarks only).
    """
    check_precision(q.precision, "q.precision")
    positive("threads", threads)
    one_of("backend", backend, ("auto", "jax", "ort"))
    one_of("kernel", kernel, ("auto", "u8s8", "u8u8"))
    one_of("q.activation", q.activation, ACTIVATIONS)
    if q.precision == "int8" and backend == "jax":
        fail("backend", backend, "int8 runs on ONNX Runtime ('auto' or 'ort'): XLA's int8 dot is no faster than fp32 on CPU")

    if q.precision == "int8" or backend == "ort":
        chosen = (int8_kernel() if kernel == "auto" else kernel) if q.precision == "int8" else "fp32"
        session = _session(_onnx_model(q, chosen), int(threads))
        run = session.run

        def forward(obs: np.ndarray) -> np.ndarray:
            return run(None, {"obs": np.asarray(obs, np.float32)})[0]

        return forward

    # weight-only 16-bit (or fp32): widen once per version, compute in float32 on the CPU device
    layers = dequantize(q)
    cpu = jax.devices("cpu")[0]
    kernels = tuple(jax.device_put(k, cpu) for k in layers.kernels)
    biases = tuple(jax.device_put(b, cpu) for b in layers.biases)
    activation = q.activation

    def forward(obs: np.ndarray) -> np.ndarray:
        x = jax.device_put(np.asarray(obs, np.float32), cpu)
        return np.asarray(_jax_forward(kernels, biases, x, activation))

    return forward

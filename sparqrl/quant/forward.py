"""Running a `QuantizedStack`: the actor's forward pass, built once per received policy version.

Kernels, chosen by measurement on the CPUs sparqrl's actors run on (AMD EPYC, AVX2, no VNNI; one
thread), not by assumption (`benchmarks/actorq_kernel.py` reproduces every comparison):

* **int8: ONNX Runtime's ``com.microsoft::DynamicQuantizeMatMul``** (MLAS integer GEMM). XLA's int8
  ``dot_general`` with int32 accumulation was *not* faster than its fp32 dot (an earlier measurement:
  0.07x the speed at batch 1, about 1x at 64-256), while ORT's op ran a 17->2048->2048->2048->6 MLP at batch 1/4/16/64/256 in
  0.30/0.58/2.1/8.2/33 ms vs 1.5/2.0/4.1/12.7/49 ms for ORT's fp32 Gemm and 2.3/7.7/9.5/10.4/53 ms
  for the jitted fp32 JAX forward (one run on the shared machine; the ratios held over runs, the
  absolute times did not).
  Per layer the op quantizes its input dynamically on every call (uint8, asymmetric, one scale and
  zero-point per call from the whole batch's min/max, range widened to include 0), multiplies with
  int32 accumulation and rescales by ``input_scale · weight_scale[column]``, then adds the float
  bias: the arithmetic of PyTorch's dynamic post-training quantization that ActorQ's actors used
  (reference §2.8), with per-channel or per-tensor weight scales. Because the input scale is per call,
  one row's output depends slightly (within quantization error) on the other rows of its batch.
* **fp16 / bf16: weight-only.** Weights travel and are stored in 16 bits and are widened to float32
  once when the version is loaded; the forward pass is the fp32 one. This CPU has no fast
  half-precision GEMM, and ActorQ's fp16 actors (PyTorch dynamic quantization with dtype float16)
  are weight-only too.
* **fp32: ORT's fp32 Gemm** by default: on one thread it was 1.5-4x faster than the jitted JAX forward
  at batch 1-16 (XLA's CPU dot is weakest at batch 4-16), the actor's usual regime, and within noise
  of it at 64-256 (either ahead, run to run). An earlier measurement (64->3x2048 tanh MLP, XLA not
  pinned to one thread) had JAX ahead at batch 1, 64 and 256, so ``backend='jax'`` keeps the jitted
  JAX forward one argument away. Its version load is cheaper (~2-4 ms vs ORT's ~25 ms, mostly
  MLAS packing 34 MB of fp32 weights), which matters only if versions arrive every few steps.

The int8 weight encoding handed to MLAS. On x86 CPUs without VNNI, MLAS multiplies uint8 activations
by int8 weights with ``vpmaddubsw``, which adds pairs of products in *saturating int16*: a pair of
255·127 products (64770) clips to 32767, and a layer's output can come out halved (on the benchmark's
PyTorch-initialised relu network: 8.4 % output error against fp32, vs 1.3 % when exact). ORT's own
quantization tool works around it by 7-bit weights (``reduce_range``), which doubles the weight error.
Instead, where a one-off probe (`int8_kernel`) shows saturation, the int8 weights are shifted once per
version to uint8 with zero-point 128 (``q + 128``: same values, exact int32 accumulation in MLAS's
u8u8 kernel, 20-35 % slower than the saturating u8s8 kernel on this CPU and still 1.5-5x faster than
ORT's fp32 Gemm); where the probe is exact (VNNI, ``vpdpbusd``) the int8 weights are used as they are.

Session build, once per received version on every actor: the ONNX graph is built in memory (no
files) once per architecture *without* its weights (every initializer declared external), and each
version's arrays are handed to ORT as OrtValues (``SessionOptions.add_external_initializers``). For a
17->3x2048->6 stack `make_forward` measured 7-18 ms on the shared, loaded 2-core machine, against
18-60 ms when each version's 8.5 MB of weights were encoded into the protobuf and parsed back. Most of
what is left is MLAS packing the weights for its GEMM (session build with packing disabled: ~2 ms),
which pays for itself on the first calls. `benchmarks/actorq_kernel.py` prints it.
"""

from __future__ import annotations

import functools
from typing import Callable, Literal

import jax
import numpy as np

from sparqrl.config import fail, one_of, positive
from sparqrl.extras import available, need
from sparqrl.nets.activations import ACTIVATIONS
from sparqrl.quant.stack import QuantizedStack, dequantize
from sparqrl.quant.tensor import check_precision

Forward = Callable[[np.ndarray], np.ndarray]
Backend = Literal["auto", "jax", "ort"]
Int8Kernel = Literal["auto", "u8s8", "u8u8"]

# onnx 1.23 stamps IR 14 on new models, which ORT 1.31 refuses (it reads IR <= 13); IR 9 / opset 17
# is all this graph needs (Relu, Tanh, Gemm and the contrib op).
_IR_VERSION = 9
_OPSETS = (("", 17), ("com.microsoft", 1))


def _initializers(q: QuantizedStack, encoding: str) -> tuple[tuple[str, np.ndarray], ...]:
    """The per-version arrays of the ORT graph, by initializer name, in layer order. int8: weights in
    `encoding` ('u8s8': int8 values as they are; 'u8u8': uint8 values + 128 with zero-point 128),
    scales, zero points, biases; float precisions (ORT's fp32 Gemm control): float32 weights, biases."""
    out: list[tuple[str, np.ndarray]] = []
    if q.precision == "int8":
        for i, (values, scale, bias) in enumerate(zip(q.kernels, q.scales, q.biases)):
            scale = np.asarray(scale, np.float32)
            if encoding == "u8u8":
                weights = values.view(np.uint8) ^ np.uint8(0x80)  # two's complement + 128: q + 128 in [1, 255]
                zero = np.full(scale.shape, 128, np.uint8)
            else:
                weights, zero = values, np.zeros(scale.shape, np.int8)
            out += [(f"w{i}", weights), (f"s{i}", scale), (f"z{i}", zero), (f"b{i}", np.asarray(bias, np.float32))]
    else:
        layers = dequantize(q)
        for i, (kernel, bias) in enumerate(zip(layers.kernels, layers.biases)):
            out += [(f"w{i}", kernel), (f"b{i}", bias)]
    return tuple((name, np.ascontiguousarray(a)) for name, a in out)


Spec = tuple[tuple[str, str, tuple[int, ...]], ...]  # (name, numpy dtype str, shape) per initializer


@functools.lru_cache(maxsize=32)
def _graph(int8: bool, activation: str, spec: Spec) -> bytes:
    """Serialized ONNX graph ``obs [B, d] -> out [B, n]`` for one architecture, *without* weights: every
    initializer is declared external and supplied as an array at session build (`_session`). Built once
    per architecture, so a new version costs no protobuf encoding or parsing of its megabytes.
    Per layer: DynamicQuantizeMatMul(x, w, s, z, b) for int8, else Gemm(x, w, b); the activation between."""
    onnx = need("onnx", "ONNX Runtime actors")
    TensorProto, helper = onnx.TensorProto, onnx.helper

    initializers = []
    for name, dtype, shape in spec:
        tensor = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), dims=shape,
                             data_location=TensorProto.EXTERNAL)
        for key, value in (("location", "supplied-at-session-build"), ("offset", "0"),
                           ("length", str(np.dtype(dtype).itemsize * int(np.prod(shape))))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        initializers.append(tensor)
    shapes = {name: shape for name, _, shape in spec}
    n_layers = sum(name.startswith("w") for name, _, _ in spec)
    nodes, x = [], "obs"
    for i in range(n_layers):
        y = f"dense_{i}"
        if int8:
            nodes.append(helper.make_node("DynamicQuantizeMatMul", [x, f"w{i}", f"s{i}", f"z{i}", f"b{i}"], [y],
                                          domain="com.microsoft"))
        else:
            nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [y]))
        x = y
        if i < n_layers - 1:
            nodes.append(helper.make_node(ACTIVATIONS[activation].onnx, [x], [f"act_{i}"]))
            x = f"act_{i}"
    graph = helper.make_graph(
        nodes, "dense_stack",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["B", shapes["w0"][0]])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["B", shapes[f"w{n_layers - 1}"][1]])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in _OPSETS])
    model.ir_version = _IR_VERSION
    return model.SerializeToString()


def _session(q: QuantizedStack, encoding: str, threads: int):
    """An ORT session running `q` on `threads` intra-op threads. Returns (session, the OrtValues it
    reads): ORT may keep using the supplied buffers, so they must live as long as the session."""
    ort = need("onnxruntime", "ONNX Runtime actors")
    arrays = _initializers(q, encoding)
    spec = tuple((name, a.dtype.str, a.shape) for name, a in arrays)
    values = [ort.OrtValue.ortvalue_from_numpy(a) for _, a in arrays]
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # basic (constant folding, redundant-node removal) is all this graph can use; the extended
    # levels find nothing to fuse here
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    # actors share cores with environment stepping: idle pool threads must sleep, not spin
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    options.add_external_initializers([name for name, _ in arrays], values)
    graph = _graph(q.precision == "int8", q.activation, spec)
    return ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"]), values


@functools.cache
def int8_kernel() -> str:
    """'u8s8' if this CPU's int8 GEMM (MLAS) multiplies uint8 activations by int8 weights exactly,
    'u8u8' if it saturates (x86 without VNNI: see the module docstring). Probed once per process on
    the worst case: inputs that quantize to 255 against weights of +/-127."""
    k, n = 256, 16
    values = np.full((k, n), 127, np.int8)
    values[:, 1::2] = -127
    q = QuantizedStack("int8", "relu", (values,), (np.ones(n, np.float32),), (np.zeros(n, np.float32),))
    session, _values = _session(q, "u8s8", 1)
    for batch in (1, 4):
        obs = np.ones((batch, k), np.float32)  # scale 1/255: every input quantizes to 255
        want = obs @ values.astype(np.float32)  # the float scales (1/255 and 1) multiply back exactly
        if not np.allclose(session.run(None, {"obs": obs})[0], want, rtol=1e-5):
            return "u8u8"
    return "u8s8"


class _OrtForward:
    """``obs [B, d] -> [B, out]`` through an ORT session; holds the arrays the session reads."""

    def __init__(self, session, values) -> None:
        self._run = session.run
        self._values = values

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        return self._run(None, {"obs": np.asarray(obs, np.float32)})[0]


@functools.partial(jax.jit, static_argnames="activation")
def _jax_forward(kernels: tuple[jax.Array, ...], biases: tuple[jax.Array, ...], obs: jax.Array,
                 activation: str) -> jax.Array:
    x = obs
    for i, (kernel, bias) in enumerate(zip(kernels, biases)):
        x = x @ kernel + bias
        if i < len(kernels) - 1:
            x = ACTIVATIONS[activation].jax(x)
    return x


def make_forward(q: QuantizedStack, threads: int = 1, *, backend: Backend = "auto",
                 kernel: Int8Kernel = "auto") -> Forward:
    """``forward(obs float32 [B, d]) -> float32 [B, out]`` (raw outputs: Q-values, pre-tanh actions,
    logits...) for any B. Build it once per received version; call it every step.

    backend 'ort': ONNX Runtime (DynamicQuantizeMatMul for int8, fp32 Gemm on the widened weights for the
    rest); 'jax': the jitted JAX forward on the CPU device (float precisions only); 'auto': 'ort' where ONNX
    Runtime is installed (the `export` extra) or for int8, else 'jax'.
    `threads`: ORT intra-op threads (actors pin 1). The JAX forward uses whatever threads XLA was
    given at import (``XLA_FLAGS``: see `benchmarks/actorq_kernel.py`).
    `kernel` (int8): 'auto' = `int8_kernel()`; 'u8s8' forces MLAS's int8-weight kernel, which
    saturates on CPUs without VNNI (benchmarks only).
    """
    check_precision(q.precision, "q.precision")
    positive("threads", threads)
    one_of("backend", backend, ("auto", "jax", "ort"))
    one_of("kernel", kernel, ("auto", "u8s8", "u8u8"))
    one_of("q.activation", q.activation, ACTIVATIONS)
    if q.precision == "int8" and backend == "jax":
        fail("backend", backend,
             "int8 runs on ONNX Runtime ('auto' or 'ort'): XLA's int8 dot is no faster than fp32 on CPU")

    if backend == "auto" and q.precision != "int8" and not (available("onnxruntime") and available("onnx")):
        backend = "jax"  # the core install: float actors need no ONNX Runtime
    if backend != "jax":
        encoding = (int8_kernel() if kernel == "auto" else kernel) if q.precision == "int8" else "fp32"
        return _OrtForward(*_session(q, encoding, int(threads)))

    # weight-only 16-bit (or fp32): widen once per version, compute in float32 on the CPU device (the
    # jit cache is keyed on shapes, so a new version of the same network compiles nothing)
    layers = dequantize(q)
    cpu = jax.devices("cpu")[0]
    kernels = tuple(jax.device_put(k, cpu) for k in layers.kernels)
    biases = tuple(jax.device_put(b, cpu) for b in layers.biases)
    activation = q.activation

    def forward(obs: np.ndarray) -> np.ndarray:
        x = jax.device_put(np.asarray(obs, np.float32), cpu)
        return np.asarray(_jax_forward(kernels, biases, x, activation))

    return forward

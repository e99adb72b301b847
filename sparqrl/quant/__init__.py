"""Quantized acting, ActorQ-style (Krishnan et al., TMLR 2022; reference §2.8, §2.10): the learner
trains in fp32; per published version it extracts the policy's Dense chain, quantizes it post-training
(no calibration data) and broadcasts the numpy arrays; each actor builds a forward pass from them
once per version and acts with it.

API::

    Precision = Literal["fp32", "bf16", "fp16", "int8"]
    Granularity = Literal["channel", "tensor"]

    # learner side, once per network: which Dense layers form the policy chain (checked; ConfigError
    # naming `field` for anything else, e.g. a Conv torso or a skip connection)
    stack_paths(module, variables, example_obs, activation=None, paths=None, *, field="network")
        -> tuple[tuple[str, ...], ...]          # e.g. (('params','MLP_0','Dense_0'), ..., ('params','Dense_0'))

    # learner side, per published version (numpy, cheap)
    dense_stack(variables, paths, activation) -> DenseStack       # float32 kernels [in, out], biases [out]
    quantize(stack, precision, granularity="channel") -> QuantizedStack   # what is broadcast
    nbytes(q) -> int                                               # bytes a broadcast carries

    # actor side, per received version
    make_forward(q, threads=1, *, backend="auto", kernel="auto")
        -> forward(obs float32 [B, d]) -> float32 [B, out]          # raw outputs, any B
        # backend "auto" = "ort": ONNX Runtime for every precision; "jax": jitted JAX (float only)
        # kernel (int8 weight encoding): "auto" = int8_kernel(); "u8s8" forced is for benchmarks only

    class DenseStack(NamedTuple):       # numpy, picklable
        kernels: tuple[np.ndarray, ...]; biases: tuple[np.ndarray, ...]; activation: str
    class QuantizedStack(NamedTuple):   # numpy, picklable
        precision: str; activation: str
        kernels: tuple[np.ndarray, ...]           # int8 / float16 / bfloat16 (ml_dtypes) / float32
        scales: tuple[np.ndarray | None, ...]     # int8: float32 [out] (channel) or [] (tensor); else None
        biases: tuple[np.ndarray, ...]            # float32 always

    dequantize(q) -> DenseStack; apply_stack(stack, obs) -> [B, out]  (float64 NumPy reference)
    quantize_tensor(w, granularity) -> (int8 values, float32 scale); dequantize_tensor(values, scale)
    quantize_tree(params, precision, granularity) / dequantize_tree(tree)   # any parameter tree
    int8_kernel() -> 'u8s8' | 'u8u8'   # the int8 weight encoding this CPU computes exactly with

    # recurrent policies (not Dense chains): the flax network itself, every matmul in int8 (`recurrent`)
    int8_apply(module, quantize_tree(variables, "int8"), *args) -> module.apply's result
    int8_matmul(x, QuantizedLeaf) -> x @ W as DynamicQuantizeMatMul computes it; is_int8(tree) -> bool

Networks (each a chain ``obs -> Dense -> σ -> ... -> Dense``; obs flattened to [B, d])::

    DQN   QNetwork (MLP torso)       stack_paths(net, variables, obs)
    TD3   Actor = tanh(HeadMLP)      paths=[('params','HeadMLP_0',f'Dense_{i}') ...]; apply tanh after
    SAC   Actor -> HeadMLP [mean, raw log-std]: as TD3
    PPO   ActorCritic actor branch   paths=[('params','MLP_0','Dense_0'), ..., ('params','Dense_0')]

Kernels, chosen by measurement (see `forward`): int8 runs ONNX Runtime's DynamicQuantizeMatMul
(dynamic per-call activation quantization, as ActorQ's PyTorch dynamic PTQ), which beat XLA's int8
dot and both fp32 forwards on this CPU, with an int8 weight encoding that is exact on CPUs whose
u8s8 kernel saturates (no VNNI); fp16/bf16 are weight-only (16-bit transport, fp32 compute, as
ActorQ's fp16); fp32 runs ORT's fp32 Gemm, which beat the jitted JAX forward on one thread at batch
1-16 and was even with it at 64-256 (``backend='jax'`` selects the latter).
"""

from sparqrl.quant.forward import Forward, int8_kernel, make_forward
from sparqrl.quant.recurrent import int8_apply, int8_matmul, is_int8
from sparqrl.quant.stack import (
    DenseStack,
    QuantizedStack,
    apply_stack,
    dense_stack,
    dequantize,
    quantize,
    stack_paths,
)
from sparqrl.quant.tensor import (
    GRANULARITIES,
    PRECISIONS,
    Granularity,
    Precision,
    QuantizedLeaf,
    check_granularity,
    check_precision,
    dequantize_tensor,
    dequantize_tree,
    nbytes,
    quantize_tensor,
    quantize_tree,
)

__all__ = [
    "GRANULARITIES",
    "PRECISIONS",
    "DenseStack",
    "Forward",
    "Granularity",
    "Precision",
    "QuantizedLeaf",
    "QuantizedStack",
    "apply_stack",
    "check_granularity",
    "check_precision",
    "dense_stack",
    "dequantize",
    "dequantize_tensor",
    "dequantize_tree",
    "int8_apply",
    "int8_kernel",
    "int8_matmul",
    "is_int8",
    "make_forward",
    "nbytes",
    "quantize",
    "quantize_tensor",
    "quantize_tree",
    "stack_paths",
]

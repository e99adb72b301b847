"""Quantizing single arrays and whole parameter trees (numpy, on the host).

int8 is symmetric with zero-point 0, as PyTorch's default dynamic-quantization weight observer that
ActorQ used (reference §2.8): ``scale = max|w| / 127`` per output channel (the last axis: ``[in, out]``
Dense kernels, ``[h, w, in, out]`` conv kernels) or per tensor, ``q = clip(rint(w / scale), -127, 127)``,
``ŵ = q · scale``. Rounding is to nearest (ties to even), so ``|w − ŵ| <= scale / 2`` element-wise.
The range is [−127, 127], not [−128, 127]: symmetric, and QuaRL's ``Q_compress`` overflow at +128 cannot
happen (reference §2.8, inferred note).

fp16 / bf16 are plain casts (round to nearest even): relative error at most 2^-11 (fp16, inside its
normal range) and 2^-8 (bf16).
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import jax
import ml_dtypes
import numpy as np

from sparqrl.config import one_of

Precision = Literal["fp32", "bf16", "fp16", "int8"]
Granularity = Literal["channel", "tensor"]
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16", "int8")
GRANULARITIES: tuple[str, ...] = ("channel", "tensor")

INT8_MAX = 127
FLOAT_DTYPES: dict[str, Any] = {"fp32": np.float32, "fp16": np.float16, "bf16": ml_dtypes.bfloat16}


def check_precision(precision: str, field: str = "precision") -> None:
    one_of(field, precision, PRECISIONS)


def check_granularity(granularity: str, field: str = "granularity") -> None:
    one_of(field, granularity, GRANULARITIES)


def quantize_tensor(w: Any, granularity: Granularity = "channel") -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 quantization of an array with ndim >= 1.

    Returns (values int8, same shape as `w`, in [−127, 127]; scale float32 [w.shape[-1]] for
    ``"channel"``, [] for ``"tensor"``). A channel (or tensor) that is all zeros gets scale 0 and
    values 0, which dequantize exactly.
    """
    check_granularity(granularity)
    w = np.asarray(w, np.float32)
    axes = tuple(range(w.ndim - 1)) if granularity == "channel" else None
    # max|w| without an |w| temporary, and in-place rounding: half the time on a 2048x2048 kernel
    scale = (np.maximum(w.max(axis=axes), -w.min(axis=axes)) / np.float32(INT8_MAX)).astype(np.float32)
    # dividing by 1 where the scale is 0 (an all-zero channel) gives the correct values 0
    safe = np.where(scale > 0, scale, np.float32(1.0))
    values = np.divide(w, safe)
    np.rint(values, out=values)
    np.clip(values, -INT8_MAX, INT8_MAX, out=values)
    return values.astype(np.int8), np.asarray(scale, np.float32)


def dequantize_tensor(values: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``values · scale`` in float32 (`scale` broadcasts over the last axis, or is a scalar)."""
    return values.astype(np.float32) * scale


class QuantizedLeaf(NamedTuple):
    """An int8-quantized leaf of a parameter tree (see `quantize_tensor`)."""

    values: np.ndarray  # int8, the leaf's shape
    scale: np.ndarray  # float32 [out] (channel) or [] (tensor)


def _is_float(leaf: Any) -> bool:
    return np.issubdtype(np.asarray(leaf).dtype, np.floating) or np.asarray(leaf).dtype == ml_dtypes.bfloat16


def quantize_tree(params: Any, precision: Precision, granularity: Granularity = "channel") -> Any:
    """A parameter tree as numpy arrays in `precision` (what a broadcast of the tree carries).

    int8: every float leaf with ndim >= 2 becomes a `QuantizedLeaf`; vectors and scalars (biases,
    log-stds) stay float32, as ActorQ keeps biases in float. fp16 / bf16: every float leaf is cast.
    fp32: every float leaf as float32. Non-float leaves are kept as numpy arrays of their dtype.
    """
    check_precision(precision)
    check_granularity(granularity)

    def leaf(x: Any) -> Any:
        x = np.asarray(x)
        if not _is_float(x):
            return x
        if precision == "int8":
            return QuantizedLeaf(*quantize_tensor(x, granularity)) if x.ndim >= 2 else x.astype(np.float32)
        return x.astype(FLOAT_DTYPES[precision])

    return jax.tree.map(leaf, params)


def dequantize_tree(tree: Any) -> Any:
    """The inverse of `quantize_tree`: float leaves as float32 numpy arrays."""

    def leaf(x: Any) -> Any:
        if isinstance(x, QuantizedLeaf):
            return dequantize_tensor(x.values, x.scale)
        x = np.asarray(x)
        return x.astype(np.float32) if _is_float(x) else x

    return jax.tree.map(leaf, tree, is_leaf=lambda x: isinstance(x, QuantizedLeaf))


def nbytes(tree: Any) -> int:
    """Bytes of all arrays in `tree` (a `QuantizedStack`, `DenseStack`, quantized or plain parameter
    tree): what a broadcast of it carries, pickling overhead aside. Strings (names) and ``None`` count 0."""
    return int(sum(x.nbytes for x in jax.tree.leaves(tree) if isinstance(x, (np.ndarray, np.generic, jax.Array))))

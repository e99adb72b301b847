"""The activations a network may use (every config's `activation` field), one row per name holding each form
the library computes it in: JAX (flax modules, the jitted actor forward), NumPy (reference forward passes) and
the ONNX operator (exported graphs, ONNX Runtime actors). One table, so that every part accepts the same names
and an activation is added in one place."""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class Activation(NamedTuple):
    """One activation in every form the library computes it in."""

    jax: Callable[[jax.Array], jax.Array]
    numpy: Callable[[np.ndarray], np.ndarray]
    onnx: str  # the ONNX operator (opset 17)


def _relu_np(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0)


ACTIVATIONS: dict[str, Activation] = {
    "tanh": Activation(jnp.tanh, np.tanh, "Tanh"),
    "relu": Activation(jax.nn.relu, _relu_np, "Relu"),
}
"""name -> `Activation`; the names (in this order) are what error messages list."""

"""Optional parts of sparqrl and the `pip install` that adds each.

The core install (JAX, flax, optax, gymnax, Gymnasium, ...) trains PPO, DQN, TD3 and SAC on device and
on Gymnasium's own environments. Everything else is an extra (pyproject.toml): `need` imports a module of
one and, when it is missing, raises a one-line `ConfigError` naming the extra, instead of an ImportError
traceback. Every optional import in sparqrl goes through `need`.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from sparqrl.config import ConfigError

EXTRAS: dict[str, str] = {
    "ray": "ray",
    "brax": "brax",
    "mujoco": "mujoco",
    "ale_py": "atari",
    "onnx": "export",
    "onnxruntime": "export",
    "codecarbon": "energy",
    "evosax": "meta",
    "imageio_ffmpeg": "video",
    "pygame": "video",
    "cv2": "atari",  # opencv-python-headless: AtariPreprocessing's resize
    "envpool": "envpool",  # --env-backend envpool (Atari)
    "rliable": "rliable",  # sparqrl compare --stats
    "wandb": "wandb",  # --wandb PROJECT (Weights & Biases)
}
"""Top-level module -> the extra that installs it."""


def install_hint(module: str) -> str:
    extra = EXTRAS[module.split(".")[0]]
    return f"pip install 'sparqrl[{extra}]'"


def available(module: str) -> bool:
    """Whether `module` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def need_installed(module: str, what: str) -> None:
    """`need`'s check without the import (which can take seconds, e.g. Ray's): for checks before a run starts."""
    if not available(module):
        raise _missing(module, what)


def _missing(module: str, what: str) -> ConfigError:
    top = module.split(".")[0]
    return ConfigError(f"{what} needs {top}, which is not installed: {install_hint(top)} (or 'sparqrl[all]')")


def need(module: str, what: str) -> ModuleType:
    """Import `module` (a top-level module of an extra, or one of its submodules) for `what` (e.g.
    "sparqrl export"); when it is not installed, a one-line `ConfigError` naming the pip install."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        top = module.split(".")[0]
        if error.name is not None and error.name.split(".")[0] != top:
            raise  # the extra is there but broken: its own error is the useful one
        raise _missing(module, what) from None

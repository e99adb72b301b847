"""Algorithms, one folder each (config.py, losses.py, train.py), registered by name."""

from __future__ import annotations

import lazy_loader

# The base (JAX) loads on first use, so that `sparqrl train ALGO --help` reads the registry without JAX.
__getattr__, __dir__, _lazy = lazy_loader.attach(__name__, submod_attrs={"base": ["Algorithm", "evaluate", "make_train_fn"]})
__all__ = ["ALGORITHMS", "get_algorithm", *_lazy]

# name -> module path; each module has `Config` (frozen dataclass) and `make_algorithm(config, env)`.
ALGORITHMS = {"ppo": "sparqrl.algos.ppo", "dqn": "sparqrl.algos.dqn", "td3": "sparqrl.algos.td3", "sac": "sparqrl.algos.sac",
              "impala": "sparqrl.algos.impala", "a2c": "sparqrl.algos.a2c",
              "a3c": "sparqrl.algos.a3c"}


def get_algorithm(name: str):
    """The algorithm package `name` (it exposes `Config`, `make_algorithm`, `make_train`)."""
    import importlib

    from sparqrl.config import close_matches, fail

    if name not in ALGORITHMS:
        fail("algo", name, f"must be one of {', '.join(ALGORITHMS)}{close_matches(name, ALGORITHMS)}")
    return importlib.import_module(ALGORITHMS[name])

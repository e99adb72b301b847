"""Algorithms, one folder each (config.py, losses.py, train.py), registered by name."""

from __future__ import annotations

from sparqrl.algos.base import Algorithm, evaluate, make_train_fn

__all__ = ["ALGORITHMS", "Algorithm", "evaluate", "get_algorithm", "make_train_fn"]

# name -> module path; each module has `Config` (frozen dataclass) and `make_algorithm(config, env)`.
ALGORITHMS = {"ppo": "sparqrl.algos.ppo", "dqn": "sparqrl.algos.dqn", "td3": "sparqrl.algos.td3", "sac": "sparqrl.algos.sac",
              "impala": "sparqrl.algos.impala", "a2c": "sparqrl.algos.a2c"}


def get_algorithm(name: str):
    """The algorithm package `name` (it exposes `Config`, `make_algorithm`, `make_train`)."""
    import importlib

    from sparqrl.config import close_matches, fail

    if name not in ALGORITHMS:
        fail("algo", name, f"must be one of {', '.join(ALGORITHMS)}{close_matches(name, ALGORITHMS)}")
    return importlib.import_module(ALGORITHMS[name])

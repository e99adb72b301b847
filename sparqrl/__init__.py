"""sparqrl: fast, cheap deep reinforcement learning in JAX.

    import sparqrl
    run = sparqrl.train("ppo", "CartPole-v1", steps=100_000, seeds=4)
    agent = sparqrl.load(run.path)
    action = agent.act(observation)

`sparqrl.api` documents these; `import sparqrl` itself loads nothing heavy (JAX comes with the first call).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Agent", "Run", "load", "train", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("Agent", "Run", "load", "train"):
        from sparqrl import api

        return getattr(api, name)
    raise AttributeError(f"module 'sparqrl' has no attribute {name!r}")

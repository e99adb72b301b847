"""Meta-evolution: evolution strategies (evosax 0.3) over vmapped inner trainings.

`strategies` holds the strategies by name, their presets and fitness shaping; `tasks` the meta tasks
(value-loss, lpo, hparams: pure `init(key)` and `fitness(genome, key)`); `run` the outer loop of
`sparqrl meta` (one compiled program per generation, checkpoints, exact resume); `cli` the command;
`plots` fitness.png and learned.png. Nothing is imported here: `strategies` (evosax) is loaded on first use
of a name below, so `sparqrl.meta.act` (which registers the `act:DIR` env) is importable without evosax.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "DEFAULT_STRATEGY", "GenerationOutput", "PRESETS", "STRATEGIES", "Strategy", "TellMetrics",
    "centered_ranks", "make_strategy", "member_keys", "pair_ranks", "z_score",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from sparqrl.meta import strategies

        return getattr(strategies, name)
    raise AttributeError(f"module 'sparqrl.meta' has no attribute {name!r}")

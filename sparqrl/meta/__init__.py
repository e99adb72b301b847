"""Meta-evolution: evolution strategies (evosax 0.3) over vmapped inner trainings.

`strategies` holds the strategies by name, their presets and fitness shaping; the meta tasks and the
outer loop of `sparqrl meta` build on it.
"""

from sparqrl.meta.strategies import (
    DEFAULT_STRATEGY,
    PRESETS,
    STRATEGIES,
    GenerationOutput,
    Strategy,
    TellMetrics,
    centered_ranks,
    make_strategy,
    member_keys,
    pair_ranks,
    z_score,
)

__all__ = [
    "DEFAULT_STRATEGY", "GenerationOutput", "PRESETS", "STRATEGIES", "Strategy", "TellMetrics",
    "centered_ranks", "make_strategy", "member_keys", "pair_ranks", "z_score",
]

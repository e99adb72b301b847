"""Meta-evolution: evolution strategies (evosax 0.3) over vmapped inner trainings.

`strategies` holds the strategies by name, their presets and fitness shaping; `tasks` the meta tasks
(value-loss, lpo, hparams: pure `init(key)` and `fitness(genome, key)`); `run` the outer loop of
`sparqrl meta` (one compiled program per generation, checkpoints, exact resume); `cli` the command;
`plots` fitness.png and learned.png. Only `strategies` is imported here (the rest imports the algorithms).
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

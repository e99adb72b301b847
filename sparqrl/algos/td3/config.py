"""TD3 configuration. Defaults are RLx2's TD3 (Tan et al., ICLR 2023; `rlx2.md` §6-§7): Fujimoto et al.'s
TD3 hyperparameters; `--sparse rlx2` adds the delayed 3-step target, the dynamic-capacity buffer and
RigL topology evolution at the paper's per-environment sparsities. The shared fields, the sparse
methods and how a config is resolved are documented in `sparqrl.algos.offpolicy.config`.

The TD3 actor's topology scheduler counts actor updates (RLx2 quirk 10): its T_end is the run's
gradient steps / policy_delay, and its ΔT is `topology_interval` actor updates.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from sparqrl.algos.offpolicy.config import OffPolicyConfig, Preset
from sparqrl.config import require
from sparqrl.envs.core import require_continuous


@dataclasses.dataclass(frozen=True)
class Config(OffPolicyConfig):
    """Twin Delayed DDPG (Fujimoto et al. 2018), dense or sparse (RLx2, Tan et al. 2023)."""

    TRACED: ClassVar[tuple[str, ...]] = ("actor_lr", "critic_lr", "gamma", "tau", "exploration_noise", "target_noise",
                                         "target_noise_clip")
    """Fields the compiled program takes as traced inputs (`algos.base`): a sweep or an evolved
    population varies them inside one program. Every other field is static."""
    PRESETS: ClassVar[dict[str, Preset]] = {
        "halfcheetah": (0.90, 0.85), "hopper": (0.98, 0.95), "walker2d": (0.97, 0.95), "ant": (0.96, 0.88),
    }
    """RLx2 Table 2, TD3 rows: (actor, critic) sparsity."""

    buffer_max_size: int = 1_000_000
    """Replay capacity in transitions (RLx2 TD3: 1e6); never more than total_timesteps is allocated."""

    buffer_min_size: int = 100_000
    """The dynamic buffer never shrinks a buffer of this many transitions or fewer (RLx2 TD3: 1e5)."""

    policy_delay: int = 2
    """Gradient steps per actor and target-network update (TD3's delayed policy update)."""

    exploration_noise: float = 0.1
    """Std of the Gaussian action noise while collecting data, as a fraction of the action half-range."""

    target_noise: float = 0.2
    """Std of the target-policy smoothing noise, as a fraction of the action half-range."""

    target_noise_clip: float = 0.5
    """The smoothing noise is clipped to ± this fraction of the action half-range."""

    def _positive_ints(self) -> tuple[str, ...]:
        return super()._positive_ints() + ("policy_delay",)

    def validate(self, env) -> "Config":
        """Raise a `ConfigError` naming the field, its value and what is allowed; return the config
        resolved for `env` (nstep, dynamic_buffer and the sparsities filled in)."""
        resolved = self.validate_common(env.name)
        for name in ("exploration_noise", "target_noise", "target_noise_clip"):
            require(getattr(self, name) >= 0, name, getattr(self, name), "must be >= 0")
        require_continuous(env, "td3")
        return resolved

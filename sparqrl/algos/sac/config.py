"""SAC configuration. Defaults are RLx2's SAC (Tan et al., ICLR 2023; `rlx2.md` §6-§7): pytorch_sac's
hyperparameters with a learned temperature; `--sparse rlx2` adds the delayed 3-step soft target, the
dynamic-capacity buffer and RigL topology evolution at the paper's per-environment sparsities. The
shared fields, the sparse methods and how a config is resolved are documented in
`sparqrl.algos.offpolicy.config`.

Behaviour policy. RLx2's SAC collects data with the deterministic mean action tanh(μ(s)) (`rlx2.md`
§10 quirk 1); `behaviour="sample"` samples a ~ π(·|s) as pytorch_sac and the SAC paper do.

The SAC actor's topology scheduler counts actor updates (every `actor_update_interval` gradient steps;
RLx2: every step, T_end = the run's gradient steps).
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, Literal, get_args

from sparqrl.algos.offpolicy.config import OffPolicyConfig, Preset
from sparqrl.config import one_of, require
from sparqrl.envs.core import require_continuous

Behaviour = Literal["mean", "sample"]
GrowScore = Literal["with_actor_grad", "critic_loss"]


@dataclasses.dataclass(frozen=True)
class Config(OffPolicyConfig):
    """Soft Actor-Critic (Haarnoja et al. 2018, automatic entropy tuning), dense or sparse (RLx2)."""

    TRACED: ClassVar[tuple[str, ...]] = ("actor_lr", "critic_lr", "alpha_lr", "gamma", "tau", "init_alpha",
                                         "target_entropy_per_dim")
    """Fields the compiled program takes as traced inputs (`algos.base`): a sweep or an evolved
    population varies them inside one program. Every other field is static."""
    PRESETS: ClassVar[dict[str, Preset]] = {
        "halfcheetah": (0.90, 0.80), "hopper": (0.98, 0.95), "walker2d": (0.90, 0.90), "ant": (0.90, 0.75),
    }
    """RLx2 Table 2, SAC rows: (actor, critic) sparsity."""

    buffer_max_size: int = 3_000_000
    """Replay capacity in transitions (RLx2 SAC: 3e6); never more than total_timesteps is allocated."""

    buffer_min_size: int = 200_000
    """The dynamic buffer never shrinks a buffer of this many transitions or fewer (RLx2 SAC: 2e5)."""

    alpha_lr: float = 3e-4
    """Adam learning rate of log α, the temperature."""

    actor_update_interval: int = 1
    """Gradient steps per actor and temperature update (RLx2: every step)."""

    target_update_interval: int = 1
    """Gradient steps per Polyak update of the target critic (RLx2: every step)."""

    init_alpha: float = 1.0
    """Initial temperature α (RLx2: 1.0, i.e. log α = 0)."""

    learn_alpha: bool = True
    """Tune α automatically towards the target entropy; False keeps α = init_alpha."""

    target_entropy_per_dim: float = -1.0
    """Target entropy per action dimension: H_target = this · |A| (the SAC paper's −|A|)."""

    log_std_min: float = -5.0
    """Lower bound of the policy's log σ (soft, via tanh rescaling)."""

    log_std_max: float = 2.0
    """Upper bound of the policy's log σ."""

    behaviour: Behaviour = "mean"
    """Action used to collect data after warm-up: mean = tanh(μ(s)) (RLx2's code), sample = a ~ π(·|s)."""

    critic_grow_score: GrowScore = "with_actor_grad"
    """RigL grow score of the critic: with_actor_grad adds the previous iteration's actor-loss gradient
    w.r.t. the critic weights to the critic-loss gradient, as RLx2's code does (quirk 6); critic_loss
    uses the critic loss alone."""

    def target_entropy(self, num_actions: int) -> float:
        """H_target for |A| = num_actions."""
        return self.target_entropy_per_dim * num_actions

    def _positive_ints(self) -> tuple[str, ...]:
        return super()._positive_ints() + ("actor_update_interval", "target_update_interval")

    def _positive_numbers(self) -> tuple[str, ...]:
        return super()._positive_numbers() + ("alpha_lr", "init_alpha")

    def validate(self, env) -> "Config":
        """Raise a `ConfigError` naming the field, its value and what is allowed; return the config
        resolved for `env` (nstep, dynamic_buffer and the sparsities filled in)."""
        resolved = self.validate_common(env.name)
        require(
            self.log_std_min < self.log_std_max, "log_std_min", self.log_std_min,
            f"must be < log_std_max ({self.log_std_max})",
        )
        require(
            math.isfinite(self.target_entropy_per_dim), "target_entropy_per_dim", self.target_entropy_per_dim,
            "must be a finite number",
        )
        one_of("behaviour", self.behaviour, get_args(Behaviour))
        one_of("critic_grow_score", self.critic_grow_score, get_args(GrowScore))
        require_continuous(env, "sac")
        return resolved

"""SAC configuration. Defaults are RLx2's SAC (Tan et al., ICLR 2023; `rlx2.md` §6): pytorch_sac's
hyperparameters with a learned temperature, plus the delayed 3-step target and dynamic-capacity buffer
of RLx2's run commands.

Counting. Env steps are summed over the `num_envs` parallel environments. Each env step after
`learning_starts` is followed by one gradient step (RLx2: one training iteration per env step). As in
the reference code, the n-step delay and the actor/target update intervals count gradient steps
(training iterations); the buffer check interval counts env steps.

Behaviour policy. RLx2's SAC collects data with the deterministic mean action tanh(μ(s)) (`rlx2.md`
§10 quirk 1); `behaviour="sample"` samples a ~ π(·|s) as pytorch_sac and the SAC paper do.

Sparse training is configured here but not wired yet: the sparsity fields must stay 0 until
`sparqrl.sparse` lands; `train.py` builds the networks and the optimizer in one function each
(`make_networks`, `make_optimizer`), where masks will be added.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal, get_args

from sparqrl.config import fail, in_unit_interval, one_of, positive, require
from sparqrl.envs import Env
from sparqrl.envs.core import require_continuous
from sparqrl.replay.dynamic import validate_replay

# Literals kept here, not imported from sparqrl.nets / sparqrl.replay, so that reading a config (the
# CLI's help) does not import JAX. They match `ACTIVATIONS`, `dynamic.ShrinkRule`, `dynamic.Distance`.
Activation = Literal["relu", "tanh"]
ShrinkRule = Literal["tenth", "until_below"]
Distance = Literal["half_mse", "l2"]
Topology = Literal["static", "set", "rigl"]
Behaviour = Literal["mean", "sample"]


@dataclasses.dataclass(frozen=True)
class Config:
    """Soft Actor-Critic (Haarnoja et al. 2018, automatic entropy tuning) with RLx2's delayed multi-step
    target and dynamic-capacity buffer."""

    total_timesteps: int = 3_000_000
    """Environment steps to train for, summed over all parallel environments (RLx2: 3e6)."""

    num_envs: int = 1
    """Parallel environments; each update steps every one of them once (RLx2: 1)."""

    learning_starts: int = 25_000
    """Env steps of uniform random actions before the policy acts and learning starts (RLx2: 25,000)."""

    batch_size: int = 256
    """Transitions (n-step windows) per gradient step."""

    actor_lr: float = 3e-4
    """Adam learning rate of the actor."""

    critic_lr: float = 3e-4
    """Adam learning rate of the twin critic."""

    alpha_lr: float = 3e-4
    """Adam learning rate of log α, the temperature."""

    gamma: float = 0.99
    """Discount factor."""

    tau: float = 0.005
    """Polyak rate of the target critic."""

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

    hidden: tuple[int, ...] = (256, 256)
    """Widths of the hidden layers of the actor and of each critic."""

    activation: Activation = "relu"
    """Hidden-layer activation."""

    nstep: int = 3
    """Horizon n of the multi-step soft TD target once it is switched on (1: always one-step SAC)."""

    nstep_delay_fraction: float = 0.1
    """One-step targets for the first fraction·total_timesteps gradient steps, n-step after (RLx2: 300,000
    of a 3e6-step run, counted in training iterations as its code does); scales with the budget."""

    buffer_max_size: int = 3_000_000
    """Replay capacity in transitions (RLx2 SAC: 3e6); never more than total_timesteps is allocated."""

    dynamic_buffer: bool = True
    """RLx2's dynamic capacity: drop the oldest data when the policy no longer matches its actions."""

    buffer_min_size: int = 200_000
    """The dynamic buffer never shrinks a buffer of this many transitions or fewer (RLx2 SAC: 2e5)."""

    buffer_check_interval: int = 10_000
    """Env steps between dynamic-buffer checks (RLx2: 10,000; the paper's rule checks at every update: 1)."""

    buffer_num_oldest: int = 0
    """K, the oldest transitions the policy distance is measured on; 0 means 8·batch_size (RLx2: 2048)."""

    buffer_threshold: float = 0.2
    """Policy-distance threshold above which old data are dropped (RLx2: 0.2, for the half_mse distance)."""

    buffer_shrink: ShrinkRule = "tenth"
    """tenth: drop the oldest 10 % once per check (reference code); until_below: drop until D <= threshold (paper)."""

    buffer_distance: Distance = "half_mse"
    """half_mse: ½·mean squared action error (reference code); l2: mean L2 norm (paper, Eq. 6; own threshold)."""

    actor_sparsity: float = 0.0
    """Fraction of actor weights pruned (RLx2 topology evolution); 0 = dense. Not wired yet: must be 0."""

    critic_sparsity: float = 0.0
    """Fraction of critic weights pruned; 0 = dense. Not wired yet: must be 0."""

    topology: Topology = "rigl"
    """Sparse topology scheme once sparsity > 0: static (SS), set (random grow) or rigl (gradient grow)."""

    topology_interval: int = 10_000
    """Scheduler calls between topology updates (RLx2: 10,000)."""

    drop_fraction: float = 0.5
    """Initial fraction ζ₀ of active weights dropped and regrown per topology update (cosine-decayed)."""

    # ---- derived values -------------------------------------------------------------------

    @property
    def env_steps_per_update(self) -> int:
        """One update steps every environment once."""
        return self.num_envs

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.num_envs

    @property
    def gradient_steps_per_update(self) -> int:
        """One gradient step per env step (once learning has started)."""
        return self.num_envs

    @property
    def learning_start_step(self) -> int:
        """Env steps after which the policy acts and learns: learning_starts, at least a batch and a window per env."""
        return max(self.learning_starts, self.batch_size, self.nstep * self.num_envs)

    @property
    def nstep_delay(self) -> int:
        """Gradient steps taken with one-step targets before the n-step target switches on."""
        return int(self.nstep_delay_fraction * self.total_timesteps)

    @property
    def buffer_capacity(self) -> int:
        """Transitions actually allocated: buffer_max_size, but no more than the run produces."""
        return min(self.buffer_max_size, max(self.total_timesteps, self.num_envs))

    @property
    def num_oldest(self) -> int:
        """K of the dynamic buffer's policy distance."""
        return self.buffer_num_oldest or 8 * self.batch_size

    def target_entropy(self, num_actions: int) -> float:
        """H_target for |A| = num_actions."""
        return self.target_entropy_per_dim * num_actions

    @property
    def sparse(self) -> bool:
        return self.actor_sparsity > 0 or self.critic_sparsity > 0

    # ---- checks ---------------------------------------------------------------------------

    def validate(self, env: Env | None = None) -> "Config":
        """Raise a `ConfigError` naming the field, its value and what is allowed; return self."""
        for name in (
            "total_timesteps", "num_envs", "batch_size", "actor_update_interval", "target_update_interval",
            "nstep", "buffer_max_size", "buffer_min_size", "buffer_check_interval", "topology_interval",
        ):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool), name, value, "must be an int")
            positive(name, value)
        for name in ("actor_lr", "critic_lr", "alpha_lr", "init_alpha", "buffer_threshold"):
            require(isinstance(getattr(self, name), (int, float)), name, getattr(self, name), "must be a number")
            positive(name, getattr(self, name))
        require(self.learning_starts >= 0, "learning_starts", self.learning_starts, "must be >= 0")
        require(
            self.learning_start_step < self.total_timesteps, "learning_starts", self.learning_starts,
            f"must leave env steps to learn in: below total_timesteps ({self.total_timesteps}), "
            f"counting at least batch_size and nstep·num_envs",
        )
        require(
            self.total_timesteps >= self.num_envs, "total_timesteps", self.total_timesteps,
            f"must be >= num_envs ({self.num_envs}) for at least one update",
        )
        validate_replay(self)
        in_unit_interval("gamma", self.gamma)
        require(0.0 < self.tau <= 1.0, "tau", self.tau, "must be in (0, 1]")
        in_unit_interval("nstep_delay_fraction", self.nstep_delay_fraction)
        require(
            self.log_std_min < self.log_std_max, "log_std_min", self.log_std_min,
            f"must be < log_std_max ({self.log_std_max})",
        )
        require(
            math.isfinite(self.target_entropy_per_dim), "target_entropy_per_dim", self.target_entropy_per_dim,
            "must be a finite number",
        )
        require(
            len(self.hidden) > 0 and all(isinstance(w, int) and w > 0 for w in self.hidden),
            "hidden", self.hidden, "must be a non-empty tuple of positive ints",
        )
        one_of("activation", self.activation, get_args(Activation))
        one_of("behaviour", self.behaviour, get_args(Behaviour))
        one_of("buffer_shrink", self.buffer_shrink, get_args(ShrinkRule))
        one_of("buffer_distance", self.buffer_distance, get_args(Distance))
        one_of("topology", self.topology, get_args(Topology))
        in_unit_interval("actor_sparsity", self.actor_sparsity, closed_right=False)
        in_unit_interval("critic_sparsity", self.critic_sparsity, closed_right=False)
        in_unit_interval("drop_fraction", self.drop_fraction)
        for name in ("actor_sparsity", "critic_sparsity"):
            require(
                getattr(self, name) == 0.0, name, getattr(self, name),
                "must be 0.0 for now: sparse SAC is not wired to sparqrl.sparse yet",
            )
        if env is not None:
            require_continuous(env, "sac")
        return self

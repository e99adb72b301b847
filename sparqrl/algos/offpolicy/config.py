"""The configuration fields TD3 and SAC share, the sparse-training methods, and RLx2's presets.

Counting. Env steps are summed over the `num_envs` parallel environments. Each env step after
`learning_starts` is followed by one gradient step (RLx2: one training iteration per env step). As in
the reference code, the n-step delay, the actor/target update intervals and the topology schedule count
gradient steps (training iterations); the buffer check interval counts env steps.

Sparse methods (`sparse`, RLx2 Table 2; `rlx2.md` §7-§8):

    dense  the full network, one-step targets, plain FIFO buffer (the baseline every ratio is against)
    tiny   a dense network with the parameter count of the sparse one (same depth, narrower)
    ss     static sparse: the initial ER/magnitude mask never changes
    set    sparse with SET topology updates (drop by |w|, grow at random)
    rigl   sparse with RigL topology updates (drop by |w|, grow by |dense gradient|)
    rlx2   RigL + the delayed multi-step target + the dynamic-capacity buffer

`nstep` and `dynamic_buffer` left at None follow the method (3 and on for rlx2, 1 and off for the
others, as in the paper's Table 2); set them to run e.g. Table 3's "SET+" (set, nstep 3, dynamic
buffer). Sparsities left at None take the paper's value for the environment (`PRESETS` of each
algorithm; HalfCheetah, Hopper, Walker2d and Ant under any prefix or version, e.g. gym:Hopper-v5 or
brax:hopper); for any other environment they must be given. `validate(env)` returns the config with
all of these resolved, which is what a run records in config.json.
"""

from __future__ import annotations

import dataclasses
import re
from typing import ClassVar, Literal, get_args

from sparqrl.algos.config import TOPOLOGY, AlgoConfig, Allocation, InitMask, SparseMethod
from sparqrl.config import auto, fail, in_unit_interval, is_number, one_of, positive, positive_int, require

__all__ = ["TOPOLOGY", "Allocation", "InitMask", "OffPolicyConfig", "SparseMethod", "paper_env"]

# The choices as Literals, so tyro's help and `--set` parsing list them; they match `dynamic.ShrinkRule` and
# `dynamic.Distance` (a test checks that they stay in step). The sparse ones are shared (`algos.config`).
ShrinkRule = Literal["tenth", "until_below"]
Distance = Literal["half_mse", "l2"]

Preset = tuple[float, float]
"""(actor sparsity, critic sparsity)."""


def paper_env(name: str) -> str:
    """The environment family of a name, for preset lookup: gym:HalfCheetah-v5, brax:halfcheetah and
    HalfCheetah-v3 are all 'halfcheetah'."""
    base = re.sub(r"-v\d+$", "", name.split(":", 1)[-1])
    return re.sub(r"[^a-z0-9]", "", base.lower())


@dataclasses.dataclass(frozen=True)
class OffPolicyConfig(AlgoConfig):
    """Fields common to TD3 and SAC; each algorithm's Config adds its own and its defaults."""

    PRESETS: ClassVar[dict[str, Preset]] = {}
    SPARSE_METHODS: ClassVar[tuple[str, ...]] = get_args(SparseMethod)

    # Shared fields (`sparqrl.algos.config`) with RLx2's defaults: 3e6 env steps, 1 env, 256 x 256.
    total_timesteps: int = 3_000_000
    hidden: tuple[int, ...] = (256, 256)

    learning_starts: int | None = None
    """Env steps of uniform random actions before the policy acts and learning starts; None: 25,000 (RLx2's),
    at most 10 % of total_timesteps, so `--steps 5000` just works."""

    batch_size: int = 256
    """Transitions (n-step windows) per gradient step."""

    actor_lr: float = 3e-4
    """Adam learning rate of the actor."""

    critic_lr: float = 3e-4
    """Adam learning rate of the twin critic."""

    tau: float = 0.005
    """Polyak rate of the target networks."""

    nstep: int | None = None
    """Horizon n of the multi-step TD target once it is switched on; None: 3 with sparse=rlx2, else 1."""

    nstep_delay_fraction: float = 0.1
    """One-step targets for the first fraction·total_timesteps gradient steps, n-step after (RLx2: 300,000
    of a 3e6-step run, counted in training iterations as its code does); scales with the budget."""

    buffer_max_size: int = 1_000_000
    """Replay capacity in transitions; never more than total_timesteps is allocated."""

    dynamic_buffer: bool | None = None
    """RLx2's dynamic capacity (drop the oldest data when the policy no longer matches its actions);
    None: on with sparse=rlx2, else off."""

    buffer_min_size: int = 100_000
    """The dynamic buffer never shrinks a buffer of this many transitions or fewer."""

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

    # Shared sparse field (`sparqrl.algos.config`) with RLx2's default ΔT of 10,000 training iterations.
    topology_interval: int = 10_000

    # ---- derived values (of a resolved config: see `validate`) --------------------------------

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
    def horizon(self) -> int:
        """The n of the n-step target (nstep, or the method's default)."""
        return self.nstep if self.nstep is not None else (3 if self.sparse == "rlx2" else 1)

    @property
    def use_dynamic_buffer(self) -> bool:
        return self.dynamic_buffer if self.dynamic_buffer is not None else self.sparse == "rlx2"

    @property
    def learning_start_step(self) -> int:
        """Env steps after which the policy acts and learns: learning_starts, at least a batch and a window per env."""
        return max(auto(self.learning_starts, 25_000, 0.1 * self.total_timesteps), self.batch_size,
                   self.horizon * self.num_envs)

    @property
    def nstep_delay(self) -> int:
        """Gradient steps taken with one-step targets before the n-step target switches on."""
        return int(self.nstep_delay_fraction * self.total_timesteps)

    @property
    def total_gradient_steps(self) -> int:
        """Gradient steps of the whole run: T_end of the topology schedule (RLx2: 3e6 − 25k)."""
        return max(self.total_timesteps - self.learning_start_step, 1)

    @property
    def buffer_capacity(self) -> int:
        """Transitions actually allocated: buffer_max_size, but no more than the run produces."""
        return min(self.buffer_max_size, max(self.total_timesteps, self.num_envs))

    @property
    def num_oldest(self) -> int:
        """K of the dynamic buffer's policy distance."""
        return self.buffer_num_oldest or 8 * self.batch_size

    # ---- checks ---------------------------------------------------------------------------

    def _positive_ints(self) -> tuple[str, ...]:
        return ("batch_size", "buffer_max_size", "buffer_min_size", "buffer_check_interval")

    def _positive_numbers(self) -> tuple[str, ...]:
        return ("actor_lr", "critic_lr", "buffer_threshold")

    def resolve_sparsity(self, env_name: str) -> Preset:
        """(actor, critic) sparsities: the given ones (`network_sparsity`), the preset's for `env_name`, or a
        ConfigError (`check_sparse` has checked the given ones)."""
        if self.sparse == "dense":
            return 0.0, 0.0
        preset = self.PRESETS.get(paper_env(env_name))
        values = []
        for i, name in enumerate(("actor_sparsity", "critic_sparsity")):
            value = self.network_sparsity(name.split("_")[0])
            if value is None:
                if preset is None:
                    fail(name, None, f"must be given for env {env_name!r}: the paper's presets cover only "
                         f"{', '.join(sorted(self.PRESETS))} (any prefix/version); pass --{name.replace('_', '-')}")
                value = preset[i]
            require(is_number(value), name, value, "must be a number")
            in_unit_interval(name, value, closed_right=False)
            values.append(float(value))
        return values[0], values[1]

    def validate_common(self, env_name: str) -> "OffPolicyConfig":
        """Check the shared fields (ConfigError naming field, value and what is allowed); return the
        config with nstep, dynamic_buffer and the sparsities resolved."""
        self.check_fields()
        for name in self._positive_ints():
            positive_int(name, getattr(self, name))
        for name in self._positive_numbers():
            require(isinstance(getattr(self, name), (int, float)), name, getattr(self, name), "must be a number")
            positive(name, getattr(self, name))
        actor_sparsity, critic_sparsity = self.resolve_sparsity(env_name)
        if self.nstep is not None:
            require(self.nstep >= 1, "nstep", self.nstep, "must be an int >= 1 (or None: by the sparse method)")
        require(self.learning_starts is None or self.learning_starts >= 0, "learning_starts", self.learning_starts,
                "must be >= 0 (or None: 25,000 capped at 10 % of total_timesteps)")
        require(
            self.learning_start_step < self.total_timesteps, "learning_starts", self.learning_starts,
            f"must leave env steps to learn in: below total_timesteps ({self.total_timesteps}), "
            f"counting at least batch_size and nstep·num_envs",
        )
        require(
            self.total_timesteps >= self.num_envs, "total_timesteps", self.total_timesteps,
            f"must be >= num_envs ({self.num_envs}) for at least one update",
        )
        resolved = dataclasses.replace(
            self, nstep=self.horizon, dynamic_buffer=self.use_dynamic_buffer,
            actor_sparsity=actor_sparsity, critic_sparsity=critic_sparsity,
        )
        validate_replay(resolved)
        require(0.0 < self.tau <= 1.0, "tau", self.tau, "must be in (0, 1]")
        in_unit_interval("nstep_delay_fraction", self.nstep_delay_fraction)
        one_of("buffer_shrink", self.buffer_shrink, get_args(ShrinkRule))
        one_of("buffer_distance", self.buffer_distance, get_args(Distance))
        return resolved


def validate_replay(config: OffPolicyConfig) -> None:
    """The replay's checks (n-step windows, the dynamic buffer) on a config whose nstep and dynamic_buffer are
    resolved. Raises `ConfigError` naming the field, value and what is allowed."""
    require(
        config.buffer_min_size <= config.buffer_max_size, "buffer_min_size", config.buffer_min_size,
        f"must be <= buffer_max_size ({config.buffer_max_size})",
    )
    require(
        config.buffer_max_size >= config.nstep * config.num_envs, "buffer_max_size", config.buffer_max_size,
        f"must hold at least one n-step window per env (nstep·num_envs = {config.nstep * config.num_envs})",
    )
    floor = max(config.batch_size, 2 * config.nstep * config.num_envs)
    require(
        config.buffer_min_size >= floor or not config.dynamic_buffer, "buffer_min_size", config.buffer_min_size,
        f"must be >= max(batch_size, 2·nstep·num_envs) = {floor}, so a shrunk buffer still holds full windows",
    )
    require(config.buffer_num_oldest >= 0, "buffer_num_oldest", config.buffer_num_oldest, "must be >= 0 (0 = 8·batch_size)")
    require(
        config.num_oldest <= config.buffer_max_size, "buffer_num_oldest", config.buffer_num_oldest,
        f"must give K <= buffer_max_size ({config.buffer_max_size}); K = {config.num_oldest}",
    )

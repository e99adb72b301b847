"""DQN configuration. Defaults are PureJaxRL's `dqn.py` (CartPole-v1), with its quirks removed, except five that
`Config.for_runner` resolves per runner: on device n = 3, Adam 5e-4 annealed to 0, a 100,000-transition replay and
Double DQN (PureJaxRL's one-step DQN, 2.5e-4 and 10,000 missed 400 on CartPole-v1 on 7 of 96 seeds; the first four
settings on 1 of 96, benchmarks/history.md "DQN: n-step with an annealed rate, and a larger replay, tried"; with
Double DQN too, on none of 288, "DQN's device tail: Double DQN"); on the actor-learner runner and with sparse=rlx2
n = 3 with PureJaxRL's rate, replay and single Q-learning target.

Every interval and threshold counts *environment steps* summed over all parallel environments, and
means what it says: `train_interval=10` is one gradient step per 10 env steps whatever `num_envs` is
(PureJaxRL's test `timesteps % TRAINING_INTERVAL == 0` was always true with NUM_ENVS=10).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal, get_args

from sparqrl.algos.config import AdamConfig
from sparqrl.config import auto, fail, in_unit_interval, is_number, one_of, positive, positive_int, require
from sparqrl.envs import Env, is_atari, is_discrete, is_host_env

Exploration = Literal["auto", "schedule", "apex"]


@dataclasses.dataclass(frozen=True)
class Config(AdamConfig):
    """Deep Q-Network (Mnih et al. 2015), optionally Double DQN (van Hasselt et al. 2016)."""

    # Fields the compiled program takes as traced inputs (`algos.base`): a sweep or an evolved
    # population varies them inside one program. Every other field is static.
    TRACED: ClassVar[tuple[str, ...]] = ("lr", "epsilon_start", "epsilon_finish", "tau", "gamma")
    # Sparse training of the one Q-network (`--sparsity`). rlx2 for DQN is its RigL topology at that sparsity with
    # RLx2's delayed multi-step target (`nstep`, `nstep_delay_fraction`); RLx2's dynamic buffer measures a continuous
    # policy's action distance to the stored reference actions: td3/sac only.
    SPARSE_METHODS: ClassVar[tuple[str, ...]] = ("dense", "ss", "set", "rigl", "rlx2")
    SPARSE_REFUSED: ClassVar[str] = "tiny is td3/sac's baseline"
    SPARSE_NETWORKS: ClassVar[tuple[str, ...]] = ()

    # Shared fields (`sparqrl.algos.config`) with DQN's defaults; one update steps every env once.
    num_envs: int = 10
    # None (`for_runner`): 5e-4 annealed to 0 on device, PureJaxRL's 2.5e-4 constant on the actor-learner runner
    # and with sparse=rlx2 (the module docstring says why)
    lr: float | None = None
    anneal_lr: bool | None = None

    hidden: tuple[int, ...] = (120, 84)

    buffer_size: int | None = None
    """Replay buffer capacity in transitions (oldest overwritten first). None (`for_runner`): 100,000 on device,
    10,000 (PureJaxRL's) on the actor-learner runner and with sparse=rlx2."""

    batch_size: int = 128
    """Transitions per gradient step, drawn uniformly with replacement from the buffer."""

    epsilon_start: float = 1.0
    """Exploration probability at the first env step (epsilon-greedy)."""

    epsilon_finish: float = 0.05
    """Exploration probability after `epsilon_anneal_time` env steps."""

    epsilon_anneal_time: int | None = None
    """Env steps over which epsilon goes linearly from `epsilon_start` to `epsilon_finish`; None: 250,000
    (PureJaxRL's), at most half of total_timesteps, so a short run also exploits."""

    target_update_interval: int = 500
    """Env steps between target-network updates (counted only once learning has started)."""

    tau: float = 1.0
    """Target update rate: 1 copies the online network (hard update), < 1 is Polyak averaging."""

    learning_starts: int | None = None
    """Env steps collected before the first gradient step (at least `batch_size` are always waited for);
    None: 10,000 (PureJaxRL's), at most 10 % of total_timesteps, so `--steps 5000` just works."""

    train_interval: int = 10
    """Env steps between gradient steps (10 with 10 envs: one gradient step per update)."""

    double_dqn: bool | None = None
    """Double DQN (van Hasselt et al. 2016): the online network picks the next action, the target network values it.
    None (`for_runner`): on device without sparse=rlx2 (with the device's n = 3, annealed rate and 100,000 replay,
    the single target left 1 of 96 CartPole-v1 seeds below 400 at 500k, sliding off after 420k at 500;
    Double DQN none of 288, benchmarks/history.md "DQN's device tail: Double DQN"), else off (PureJaxRL's and
    Ape-X's settings as measured on the actor-learner runner)."""

    nstep: int | None = None
    """n of the n-step Q-learning target y = Σ_{k<n} γ^k r_k + γ^n Q'(s_n, a*) (Mnih et al. 2016; Hessel et al.
    2018's Rainbow and Horgan et al. 2018's Ape-X: n = 3), on windows of n consecutive steps of one env drawn from
    the replay (prioritized: by the priority of the window's start); a termination inside the window cuts the rest
    and the bootstrap, a truncation stops the sum there and bootstraps from that step's final observation
    (`sparqrl.returns.nstep_terms`); on the actor-learner runner so does the end of each actor's fragment. 1: the
    one-step target. n > 1 is not available with Atari's stacked frames. None (`for_runner`): 3 with sparse=rlx2
    (RLx2's delayed multi-step target, rlx2.md §4), on the actor-learner runner (Ape-X's n: 2 of 20 seeds
    below 400 on gym:CartPole-v1 against 5 of 20 with n = 1, BENCHMARKS.md "DQN n-step on the actor-learner
    runner") and on device (with lr 5e-4 annealed and a 100,000 replay: with the one-step target the overestimation
    bump settles too slowly, with n = 3 and PureJaxRL's 10,000 replay the policy collapses after convergence,
    benchmarks/history.md "DQN: n-step with an annealed rate, and a larger replay, tried"); 1 with Atari's stacked
    frames."""

    nstep_delay_fraction: float | None = None
    """RLx2's delayed multi-step target: one-step targets for the first fraction of the run's gradient steps, the
    n-step target after (RLx2: 300,000 of 3e6 training iterations; td3/sac's field of the same name). None: 0.1 with
    sparse=rlx2 (as td3/sac), else 0 (n-step from the first gradient step)."""

    max_grad_norm: float = 10.0
    """Clip gradients to this global norm; 0 turns clipping off."""

    huber_delta: float | None = None
    """TD loss: None is the mean squared TD error (PureJaxRL's, CleanRL's); a value δ > 0 is the Huber loss
    (½e² for |e| ≤ δ, δ(|e| − ½δ) beyond: Dopamine's and SB3's δ = 1), whose gradient is bounded by δ.
    Measured on CartPole-v1 at the defaults (BENCHMARKS.md, "DQN: Huber loss"): δ = 1 diverges on every seed
    (mean Q beyond 10^4 by 100k env steps) and δ = 10 with anneal_lr misses 31 of 32 seeds; the large errors
    of terminal transitions, which hold Q down, weigh no more than a δ-sized one. So None stays the default."""

    # ---- replay and exploration: Ape-X's on the actor-learner runner, PureJaxRL's on device ----
    # (Horgan et al. 2018, arXiv 1803.00933). Both runners train the same learner; these pick its parts.

    prioritized: bool | None = None
    """Proportional prioritized replay with the actors' initial priorities (Ape-X); False: uniform replay.
    None: prioritized on the actor-learner runner, uniform on device (PureJaxRL's)."""

    exploration: Exploration = "auto"
    """"schedule": every env acts epsilon-greedily with the linear schedule epsilon_start -> epsilon_finish;
    "apex": Ape-X's fixed epsilon per env slot (apex_epsilon, apex_alpha); "auto": apex on the
    actor-learner runner, schedule on device."""

    priority_exponent: float = 0.6
    """Prioritized replay's alpha: items are sampled with probability proportional to priority**alpha."""

    importance_exponent: float = 0.4
    """Prioritized replay's beta: importance weights (n * P(i))**-beta, normalised by the batch maximum."""

    priority_epsilon: float = 1e-6
    """Added to |TD error| to give an item's priority, so that every item keeps a chance to be replayed."""

    apex_epsilon: float = 0.4
    """Ape-X exploration: env slot j of M (over all actors' envs) acts epsilon-greedily with
    apex_epsilon ** (1 + apex_alpha * j / (M - 1))."""

    apex_alpha: float = 7.0
    """Ape-X exploration exponent (see apex_epsilon): slot epsilons span apex_epsilon to
    apex_epsilon ** (1 + apex_alpha)."""

    # ---- derived values -------------------------------------------------------------------

    def for_runner(self, on_device: bool, stacked: bool = False) -> "Config":
        """The fields left to the runner resolved: uniform replay and the epsilon schedule on device (PureJaxRL's
        DQN), Ape-X's prioritized replay and per-slot epsilons on the actor-learner runner; n = 3 on either, with
        RLx2's delay for sparse=rlx2, n = 1 with Atari's stacked frames (`stacked`), whose replay holds one-step
        items; lr, anneal_lr, buffer_size and double_dqn: the device's own (5e-4 annealed, 100,000, Double DQN)
        on device without sparse=rlx2, PureJaxRL's (2.5e-4, constant, 10,000, the single target) elsewhere. Values
        already set are kept (a user's, a preset's, a config already resolved)."""
        rlx2 = self.sparse == "rlx2"
        own = on_device and not rlx2  # the device default measured on CartPole-v1 (module docstring)
        return dataclasses.replace(
            self,
            lr=_unset_or(self.lr, 5e-4 if own else 2.5e-4),
            anneal_lr=_unset_or(self.anneal_lr, own),
            buffer_size=_unset_or(self.buffer_size, 100_000 if own else 10_000),
            double_dqn=_unset_or(self.double_dqn, own),
            prioritized=_unset_or(self.prioritized, not on_device),
            exploration=("schedule" if on_device else "apex") if self.exploration == "auto" else self.exploration,
            nstep=_unset_or(self.nstep, 1 if stacked else 3),
            nstep_delay_fraction=_unset_or(self.nstep_delay_fraction, 0.1 if rlx2 else 0.0),
        )

    def as_saved_run(self, env: str) -> "Config":
        """`AlgoConfig.as_saved_run`: a folder written before config.json recorded the per-runner values has
        `nstep` None, which on device without sparse=rlx2 then meant the one-step target (now 3); the run resumes,
        evaluates and exports with n = 1. Its other unset fields (prioritized, exploration, nstep_delay_fraction)
        resolve now as they did then, and lr, anneal_lr, buffer_size and double_dqn were recorded."""
        one_step = self.nstep is None and not is_host_env(env) and self.sparse != "rlx2"
        return dataclasses.replace(self, nstep=1) if one_step else self

    @property
    def replay_capacity(self) -> int:
        """Transitions the replay holds: buffer_size, but never more than the run stores."""
        return min(self.buffer_size, self.num_updates * self.num_envs)

    @property
    def env_steps_per_update(self) -> int:
        """One update steps every environment once."""
        return self.num_envs

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.num_envs

    @property
    def learning_start_step(self) -> int:
        """Env steps after which gradient steps begin (learning_starts resolved; the buffer must hold a batch and
        an n-step window of every env: nstep·num_envs, which one update's num_envs env steps always reach at 1;
        nstep not yet resolved (`for_runner`) counts 1)."""
        return max(auto(self.learning_starts, 10_000, 0.1 * self.total_timesteps), self.batch_size,
                   (self.nstep or 1) * self.num_envs)

    @property
    def epsilon_steps(self) -> int:
        """Env steps of the epsilon schedule (epsilon_anneal_time resolved)."""
        return max(auto(self.epsilon_anneal_time, 250_000, 0.5 * self.total_timesteps), 1)

    @property
    def max_gradient_steps_per_update(self) -> int:
        """At most this many gradient steps fall into one update of `num_envs` env steps."""
        return -(-self.num_envs // self.train_interval)

    @property
    def num_gradient_steps(self) -> int:
        """Gradient steps over the whole run (exact; used for learning-rate annealing).

        Update u (0-based) ends at env step (u+1)·N and takes (u+1)·N // I − u·N // I gradient steps
        once (u+1)·N ≥ learning_start_step; the sum over updates telescopes.
        """
        n, interval = self.num_envs, self.train_interval
        first = max(-(-self.learning_start_step // n) - 1, 0)  # first update that learns
        if first >= self.num_updates:
            return 0
        return (self.num_updates * n) // interval - (first * n) // interval

    @property
    def nstep_delay(self) -> int:
        """d, nstep_delay_fraction of the run's gradient steps (of a resolved config, `for_runner`): gradient steps
        1 .. d − 1 use one-step targets, step d on the n-step target (RLx2's code: n once its 1-based training
        iteration count reaches the delay, as td3/sac); 0: n-step from the first."""
        return int(self.nstep_delay_fraction * self.num_gradient_steps)

    # ---- checks ---------------------------------------------------------------------------

    def validate(self, env: Env | None = None) -> "Config":
        """Raise a `ConfigError` naming the field, its value and what is allowed; return the config resolved for
        the runner `env` runs on (`for_runner`: a gym: env's actor-learner runner, any other env's device; None:
        the device), so that a sweep, PBT or meta run reads the runner's lr before tracing it and config.json
        records the values the run used."""
        name = "" if env is None else env.name
        return self.for_runner(on_device=not is_host_env(name), stacked=is_atari(name))._check(env)

    def _check(self, env: Env | None) -> "Config":
        """`validate`'s checks of a resolved config; returns it."""
        self.check_fields()
        for name in ("buffer_size", "batch_size", "target_update_interval", "train_interval", "nstep") + (
                ("epsilon_anneal_time",) if self.epsilon_anneal_time is not None else ()):
            positive_int(name, getattr(self, name))
        require(self.learning_starts is None or self.learning_starts >= 0, "learning_starts", self.learning_starts,
                "must be >= 0 (or None: 10,000 capped at 10 % of total_timesteps)")
        require(
            self.total_timesteps >= self.num_envs, "total_timesteps", self.total_timesteps,
            f"must be >= num_envs ({self.num_envs}) for at least one update",
        )
        require(
            self.batch_size <= self.buffer_size, "batch_size", self.batch_size,
            f"must be <= buffer_size ({self.buffer_size})",
        )
        require(
            self.num_envs <= self.buffer_size, "num_envs", self.num_envs,
            f"must be <= buffer_size ({self.buffer_size}): one update adds num_envs transitions",
        )
        require(
            self.nstep * self.num_envs <= self.buffer_size, "nstep", self.nstep,
            f"must be <= buffer_size // num_envs ({self.buffer_size // self.num_envs}): the replay holds an "
            f"n-step window of every env",
        )
        require(
            self.nstep * self.num_envs <= self.total_timesteps, "nstep", self.nstep,
            f"must be <= total_timesteps // num_envs ({self.total_timesteps // self.num_envs}): the run fills an "
            f"n-step window of every env",
        )
        require(is_number(self.nstep_delay_fraction), "nstep_delay_fraction", self.nstep_delay_fraction,
                "must be a number in [0, 1] (or None: 0.1 with sparse=rlx2, else 0)")
        in_unit_interval("nstep_delay_fraction", self.nstep_delay_fraction)
        require(
            self.learning_start_step <= self.total_timesteps, "learning_starts", self.learning_starts,
            f"must be <= total_timesteps ({self.total_timesteps})",
        )
        in_unit_interval("epsilon_start", self.epsilon_start)
        in_unit_interval("epsilon_finish", self.epsilon_finish)
        require(0.0 < self.tau <= 1.0, "tau", self.tau, "must be in (0, 1]")
        require(self.max_grad_norm >= 0, "max_grad_norm", self.max_grad_norm, "must be >= 0 (0 = no clipping)")
        require(self.huber_delta is None or self.huber_delta > 0, "huber_delta", self.huber_delta,
                "must be > 0 (or None: squared TD error)")
        require(isinstance(self.prioritized, bool), "prioritized", self.prioritized,
                "must be true, false or None (prioritized on the actor-learner runner, uniform on device)")
        one_of("exploration", self.exploration, get_args(Exploration))
        require(
            self.priority_exponent >= 0, "priority_exponent", self.priority_exponent, "must be >= 0 (0 = uniform)"
        )
        in_unit_interval("importance_exponent", self.importance_exponent)
        positive("priority_epsilon", self.priority_epsilon)
        in_unit_interval("apex_epsilon", self.apex_epsilon)
        require(self.apex_alpha >= 0, "apex_alpha", self.apex_alpha, "must be >= 0")
        if env is not None and not is_discrete(env):
            fail(
                "env", env.name,
                f"dqn needs a discrete action space; env {env.name} has "
                f"{type(env.action_space).__name__} actions",
            )
        return self


def _unset_or(value: Any, default: Any) -> Any:
    """`value`, or `default` where it is None (a field left to the runner, `Config.for_runner`)."""
    return default if value is None else value

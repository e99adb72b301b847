"""The fields every algorithm's Config shares, declared, documented and checked once.

`AlgoConfig` holds what every algorithm has; `AdamConfig` adds the one Adam of DQN, PPO and IMPALA;
`ActorCriticConfig` adds the block PPO and IMPALA share. An algorithm's Config subclasses one of them, adds
its own fields and redeclares a shared field only to give it its own default (the docstring and the checks
stay here; tyro finds the docstring up the class hierarchy). Its `validate` calls `check_fields()` first.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, ClassVar, Literal, get_args

import tyro

from sparqrl.config import (
    check_ints, check_reference, fail, in_range, in_unit_interval, is_int, is_number, one_of, positive, positive_int,
    require,
)
from sparqrl.envs import Box, Discrete

# Kept as a Literal here (not imported from sparqrl.nets) so that reading a config, e.g. for the CLI's
# help, does not import flax. The names are keys of `sparqrl.nets.modules.ACTIVATIONS` (a test checks).
Activation = Literal["relu", "tanh"]
Torso = Literal["auto", "mlp"]
Optimizer = Literal["rmsprop", "adam"]
MemoryCell = Literal["none", "lstm", "gru"]  # "none" and the keys of `sparqrl.nets.memory.CELLS` (a test checks)

# The sparse choices as Literals, so tyro's help and `--set` parsing list them; they match `sparse.ALLOCATIONS`
# and `sparse.INIT_METHODS` (a test checks that they stay in step).
SparseMethod = Literal["dense", "tiny", "ss", "set", "rigl", "rlx2"]
Allocation = Literal["er", "uniform"]
InitMask = Literal["magnitude", "random"]

TOPOLOGY = {"ss": "static", "set": "set", "rigl": "rigl", "rlx2": "rigl"}
"""The `sparse.TopologySchedule` method of each masked sparse method."""


@dataclasses.dataclass(frozen=True)
class AlgoConfig:
    """Fields every algorithm has."""

    total_timesteps: int = 500_000
    """Environment steps in the whole run, summed over the parallel environments of one seed."""

    num_envs: int = 1
    """Parallel environments per seed (vmapped on device; stepped by each actor on the host)."""

    gamma: float = 0.99
    """Discount factor."""

    hidden: tuple[int, ...] = (64, 64)
    """Hidden-layer widths of each network: the Q-network, or the actor and the critic(s), which are separate
    networks (sparse=tiny narrows them)."""

    activation: Activation = "relu"
    """Hidden-layer activation."""

    # ---- your own network (`sparqrl.nets.torso`) ------------------------------------------------
    network: Annotated[str | None, tyro.conf.arg(aliases=("--network",))] = None
    """Your own torso instead of the built-in MLP/CNN: MODULE:ATTR, a zero-argument callable at the top level of
    an importable module (e.g. a flax Module class) returning a flax linen Module that maps observations
    [batch, *obs_shape] to features [batch, F]. The algorithm adds its heads: ppo, impala, dqn one Dense layer
    (hidden and torso are then unused); td3, sac their MLPs of `hidden` (the critic's on features and action).
    A run records the name: a folder naming it is opened only with --import MODULE (trust_imports=True)."""

    actor_network: str | None = None
    """The actor's own torso (MODULE:ATTR, as `network`); None: `network`."""

    critic_network: str | None = None
    """The critic's own torso (MODULE:ATTR, as `network`); None: `network`."""

    # ---- sparse training (`sparqrl.sparse`; RLx2, Tan et al. 2023; SET; RigL) ----------------------
    # Which methods an algorithm offers, and why it refuses the others (one line of the ConfigError).
    SPARSE_METHODS: ClassVar[tuple[str, ...]] = ("dense", "ss", "set", "rigl")
    SPARSE_REFUSED: ClassVar[str] = "rlx2 needs a replay buffer (dqn, td3, sac) and tiny is td3/sac's baseline"
    # The networks with their own sparsity field; () for one shared network, which takes `sparsity` alone.
    SPARSE_NETWORKS: ClassVar[tuple[str, ...]] = ("actor", "critic")

    sparse: Annotated[SparseMethod, tyro.conf.arg(aliases=("--sparse",))] = "dense"
    """Network training method: dense; ss (static sparse: the initial ER/magnitude mask never changes); set
    (drop by |w|, grow at random); rigl (drop by |w|, grow by |dense gradient|); rlx2 (RigL + RLx2's delayed
    multi-step target, + its dynamic-capacity buffer for td3/sac); tiny (td3/sac: a dense network with the
    sparse one's weight count)."""

    sparsity: Annotated[float | None, tyro.conf.arg(aliases=("--sparsity",))] = None
    """Fraction of weights pruned, in [0, 1), of every network whose own sparsity is unset (of the Q-network
    for dqn). Must be None or 0 with sparse=dense."""

    actor_sparsity: Annotated[float | None, tyro.conf.arg(aliases=("--actor-sparsity",))] = None
    """Fraction of actor weights pruned, in [0, 1) (tiny: the budget it matches); None: `sparsity`, else
    (td3/sac) the paper's value for the environment. Must be None or 0 with sparse=dense."""

    critic_sparsity: Annotated[float | None, tyro.conf.arg(aliases=("--critic-sparsity",))] = None
    """Fraction of critic weights pruned (both twins for td3/sac), in [0, 1); None: as actor_sparsity."""

    topology_interval: int = 1_000
    """ΔT: a network's optimizer steps (its scheduler calls) between topology updates."""

    drop_fraction: float = 0.5
    """ζ₀: fraction of active weights dropped and regrown per topology update, cosine-decayed to 0 at the
    end of the run (RLx2: 0.5)."""

    sparse_allocation: Allocation = "er"
    """Per-layer allocation of each network's sparsity: er (Erdős–Rényi, RLx2) or uniform."""

    init_mask: InitMask = "magnitude"
    """Initial mask: magnitude (largest |w| of the dense init, RLx2's code) or random."""

    reset_moments_on_grow: bool = False
    """Zero Adam's moments where a topology update changed the mask (the reference leaves them)."""

    skip_step_on_topology_update: bool = True
    """Skip a network's optimizer step on its topology-update iterations, as the reference code does."""

    def network_of(self, network: str = "") -> str | None:
        """The torso named for `network` ('actor', 'critic'; '' for a shared network): its own field, else
        `network`; None: the built-in one."""
        own = getattr(self, f"{network}_network") if network else None
        return own if own is not None else self.network

    def as_saved_run(self, env: str) -> "AlgoConfig":
        """This config as a run folder's config.json records it, for a run on `env` (`rundir.open_run_dir`): an
        algorithm whose meaning of an unset field changed since an older sparqrl wrote such a folder gives the
        value the run was made with (`dqn.Config`); the others return it as it is."""
        return self

    def network_references(self) -> tuple[tuple[str, str], ...]:
        """(field, MODULE:ATTR) of each torso the config names: code a run folder names (`sparqrl.trust`)."""
        fields = ("network", "actor_network", "critic_network")
        return tuple((name, getattr(self, name)) for name in fields if getattr(self, name) is not None)

    @property
    def masked(self) -> bool:
        """Whether the networks carry masks (ss, set, rigl, rlx2)."""
        return self.sparse in TOPOLOGY

    def network_sparsity(self, network: str) -> float | None:
        """The sparsity given for `network` ('actor', 'critic'; '' for a shared network): its own field, else
        `sparsity`; None if neither is set."""
        own = getattr(self, f"{network}_sparsity") if network else None
        return own if own is not None else self.sparsity

    def required_sparsity(self, network: str = "") -> float:
        """`network_sparsity`, which a masked method needs (ConfigError naming the flags if unset); 0 if dense."""
        value = self.network_sparsity(network)
        if not self.masked:
            return 0.0
        if value is None:
            field = f"{network}_sparsity" if network else "sparsity"
            fail(field, None, f"must be given with sparse={self.sparse}: pass --sparsity"
                 + (f" or --{network}-sparsity" if network else ""))
        return float(value)

    def check_sparse(self) -> None:
        """The sparse fields: a method this algorithm offers, sparsities in [0, 1) (0 or unset when dense)
        and only for networks it has, and the topology schedule's values."""
        require(self.sparse in self.SPARSE_METHODS, "sparse", self.sparse,
                f"must be one of {', '.join(self.SPARSE_METHODS)} for this algorithm ({self.SPARSE_REFUSED})")
        for name in ("sparsity",) + tuple(f"{n}_sparsity" for n in ("actor", "critic")):
            value = getattr(self, name)
            if value is None:
                continue
            require(is_number(value), name, value, "must be a number in [0, 1)")
            in_unit_interval(name, value, closed_right=False)
            require(self.sparse != "dense" or value == 0, name, value,
                    f"must be unset or 0 with sparse=dense; choose --sparse {' or '.join(self.SPARSE_METHODS[1:])}")
            require(name == "sparsity" or name.split("_")[0] in self.SPARSE_NETWORKS, name, value,
                    "this algorithm has one network: set its sparsity with --sparsity")
        positive_int("topology_interval", self.topology_interval)
        in_unit_interval("drop_fraction", self.drop_fraction)
        one_of("sparse_allocation", self.sparse_allocation, get_args(Allocation))
        one_of("init_mask", self.init_mask, get_args(InitMask))

    def check_fields(self) -> None:
        """Raise a `ConfigError` for a bad shared field, and for any int field (the subclass's too) that
        holds no integer: the checks every algorithm's `validate` starts with."""
        check_ints(self)
        positive_int("total_timesteps", self.total_timesteps)
        positive_int("num_envs", self.num_envs)
        in_unit_interval("gamma", self.gamma)
        require(len(self.hidden) > 0 and all(is_int(w) and w > 0 for w in self.hidden),
                "hidden", self.hidden, "must be a non-empty tuple of positive ints")
        one_of("activation", self.activation, get_args(Activation))
        self.check_sparse()
        for name in ("network", "actor_network", "critic_network"):
            check_reference(name, getattr(self, name))
        for name in ("actor_network", "critic_network"):
            require(getattr(self, name) is None or bool(self.SPARSE_NETWORKS), name, getattr(self, name),
                    "this algorithm has one network: name its torso with --network")


@dataclasses.dataclass(frozen=True)
class AdamConfig(AlgoConfig):
    """An algorithm whose networks learn with one Adam (DQN, PPO, IMPALA)."""

    lr: float = 2.5e-4
    """Learning rate of the optimizer, Adam (A2C: its `optimizer`) (the start value when anneal_lr is on)."""

    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over the run's gradient steps."""

    def check_fields(self) -> None:
        super().check_fields()
        positive("lr", self.lr)


@dataclasses.dataclass(frozen=True)
class ActorCriticConfig(AdamConfig):
    """The block PPO and IMPALA share: an actor and a critic (separate torsos) that learn from fragments of
    num_steps env steps of each environment, with an entropy bonus and a value loss."""

    num_steps: int = 128
    """Env steps each environment takes per update (PPO's rollout, IMPALA's unroll); one update learns from
    num_envs * num_steps transitions."""

    ent_coef: float = 0.01
    """Weight of the entropy bonus in the loss."""

    vf_coef: float = 0.5
    """Weight of the value loss in the loss."""

    max_grad_norm: float = 0.5
    """Gradients are clipped to this global norm before the optimizer step."""

    activation: Activation = "tanh"
    torso: Torso = "auto"
    """auto: a CNN before the hidden layers for [H, W, C] observations (`nets.cnn_kind`: one Conv(16, 3x3) on
    grids such as MinAtar's, the Nature CNN's three convolutions on images such as Atari's 84x84), none for
    others; mlp: every observation flattened into the hidden layers (PureJaxRL's PPO; much cheaper than the
    Conv on a CPU)."""

    memory: MemoryCell = "none"
    """A recurrent policy (`sparqrl.nets.memory`): none (feed-forward), lstm or gru, a cell of memory_size units
    after the actor's torso that the actor and critic heads share. Its state is reset at episode starts and carried
    across fragments; the learner re-runs each fragment from the state it was acted from (truncated BPTT over the
    fragment: num_steps), PPO's minibatches taking whole environments. Both runners (host actors carry their envs'
    states and send each fragment's first); not with int8 actors (`sparqrl.quant`) nor a3c."""

    memory_size: int = 128
    """Units of the recurrent cell (memory=lstm|gru)."""

    @property
    def batch_size(self) -> int:
        """Transitions per update."""
        return self.num_envs * self.num_steps

    @property
    def num_updates(self) -> int:
        """Updates in the run (leftover steps below one batch are not run)."""
        return self.total_timesteps // self.batch_size

    def check_fields(self) -> None:
        super().check_fields()
        positive_int("num_steps", self.num_steps)
        require(self.total_timesteps >= self.batch_size, "total_timesteps", self.total_timesteps,
                f"must be at least one batch, num_envs * num_steps = {self.batch_size}")
        for name in ("ent_coef", "vf_coef"):
            in_range(name, getattr(self, name), 0)
        positive("max_grad_norm", self.max_grad_norm)
        one_of("torso", self.torso, get_args(Torso))
        one_of("memory", self.memory, get_args(MemoryCell))
        positive_int("memory_size", self.memory_size)
        require(self.memory == "none" or self.sparse == "dense", "memory", self.memory,
                "cannot be combined with sparse training (the cell's layers have no sparsity allocation): "
                "leave --sparse dense")

    def check_actions(self, env: Any, algo: str) -> None:
        """The env's actions are Discrete or Box, the two the actor-critic heads handle."""
        require(isinstance(env.action_space, (Discrete, Box)), "env", getattr(env, "name", env),
                f"{algo} needs a Discrete or Box action space")


@dataclasses.dataclass(frozen=True)
class RMSPropActorCriticConfig(ActorCriticConfig):
    """An actor-critic whose optimizer is TF1's RMSProp by default (A2C and IMPALA, as their papers train), or Adam
    (`base.actor_critic_optimizer`)."""

    optimizer: Optimizer = "rmsprop"
    """rmsprop (TF1's RMSProp, the papers' and Baselines': see rmsprop_alpha / rmsprop_eps) or adam (eps 1e-5,
    as PPO's), after the global-norm clip to max_grad_norm."""

    rmsprop_alpha: float = 0.99
    """RMSProp's decay of its running mean of squared gradients (optimizer=rmsprop)."""

    rmsprop_eps: float = 1e-5
    """RMSProp's epsilon, added inside the square root as TF1's RMSProp does: step = lr * g / sqrt(ms + eps), with
    ms starting at 1 as TF1's (optimizer=rmsprop)."""

    def check_fields(self) -> None:
        super().check_fields()
        one_of("optimizer", self.optimizer, get_args(Optimizer))
        in_unit_interval("rmsprop_alpha", self.rmsprop_alpha, closed_right=False)
        positive("rmsprop_eps", self.rmsprop_eps)

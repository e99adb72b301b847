"""The fields every algorithm's Config shares, declared, documented and checked once.

`AlgoConfig` holds what every algorithm has; `AdamConfig` adds the one Adam of DQN, PPO and IMPALA;
`ActorCriticConfig` adds the block PPO and IMPALA share. An algorithm's Config subclasses one of them, adds
its own fields and redeclares a shared field only to give it its own default (the docstring and the checks
stay here; tyro finds the docstring up the class hierarchy). Its `validate` calls `check_fields()` first.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, get_args

from sparqrl.config import check_ints, in_range, in_unit_interval, is_int, one_of, positive, positive_int, require
from sparqrl.envs import Box, Discrete

# Kept as a Literal here (not imported from sparqrl.nets) so that reading a config, e.g. for the CLI's
# help, does not import flax. The names are keys of `sparqrl.nets.modules.ACTIVATIONS` (a test checks).
Activation = Literal["relu", "tanh"]
Torso = Literal["auto", "mlp"]


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


@dataclasses.dataclass(frozen=True)
class AdamConfig(AlgoConfig):
    """An algorithm whose networks learn with one Adam (DQN, PPO, IMPALA)."""

    lr: float = 2.5e-4
    """Adam learning rate (the start value when anneal_lr is on)."""

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
    """Gradients are clipped to this global norm before Adam."""

    activation: Activation = "tanh"
    torso: Torso = "auto"
    """auto: a CNN before the hidden layers for [H, W, C] observations (`nets.cnn_kind`: one Conv(16, 3x3) on
    grids such as MinAtar's, the Nature CNN's three convolutions on images such as Atari's 84x84), none for
    others; mlp: every observation flattened into the hidden layers (PureJaxRL's PPO; much cheaper than the
    Conv on a CPU)."""

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

    def check_actions(self, env: Any, algo: str) -> None:
        """The env's actions are Discrete or Box, the two the actor-critic heads handle."""
        require(isinstance(env.action_space, (Discrete, Box)), "env", getattr(env, "name", env),
                f"{algo} needs a Discrete or Box action space")

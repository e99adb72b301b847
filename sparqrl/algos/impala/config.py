"""IMPALA configuration. Defaults for classic control: 8 envs x 20-step fragments (the paper's unroll), Adam
2e-3 annealed, entropy 0.01 (lr and entropy chosen by `sparqrl sweep impala --env CartPole-v1` at 8 x 5; 8 x 20
reaches 500 on 6 of 6 seeds at 500k steps, BENCHMARKS.md "IMPALA"), one gradient step per fragment."""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, ClassVar, Literal

from sparqrl.config import one_of, positive, require
from sparqrl.envs import Box, Discrete


@dataclasses.dataclass(frozen=True)
class Config:
    """IMPALA (Espeholt et al. 2018, arXiv 1802.01561): an actor-critic that learns from actors' fragments
    with V-trace's off-policy correction (`sparqrl.returns.vtrace`)."""

    # Traced inputs of the compiled program (`algos.base`): a sweep or population varies them in one program.
    TRACED: ClassVar[tuple[str, ...]] = ("lr", "gamma", "vtrace_lambda", "rho_bar", "c_bar", "ent_coef", "vf_coef",
                                         "max_grad_norm")

    total_timesteps: int = 500_000
    """Environment steps in the whole run, summed over the parallel environments of one seed."""

    num_envs: int = 8
    """Environments per seed (per actor on the host)."""

    num_steps: int = 20
    """Unroll length: env steps of each environment in one fragment; one gradient step per fragment (20: the
    IMPALA paper's; on the host, longer fragments mean fewer policy versions for the actors to load)."""

    lr: float = 2e-3
    """Adam learning rate (the start value when anneal_lr is on)."""

    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over the run's gradient steps."""

    gamma: float = 0.99
    """Discount factor."""

    vtrace_lambda: float = 1.0
    """V-trace's lambda: scales the traces c_t (1: the paper's V-trace; lower trades variance for bias)."""

    rho_bar: float = 1.0
    """Clip of the importance weights rho_t in the V-trace targets and the policy-gradient advantages."""

    c_bar: float = 1.0
    """Clip of the trace coefficients c_t (the paper assumes rho_bar >= c_bar)."""

    ent_coef: float = 0.01
    """Weight of the entropy bonus."""

    vf_coef: float = 0.5
    """Weight of the value loss 0.5 (v_s - V(x_s))^2."""

    max_grad_norm: float = 0.5
    """Global gradient-norm clip before Adam."""

    hidden: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the actor and of the critic (separate torsos)."""

    activation: Literal["tanh", "relu"] = "tanh"
    """Hidden activation."""

    torso: Literal["auto", "mlp"] = "auto"
    """auto: a CNN for [H, W, C] observations (`nets.cnn_kind`: MinAtar's one Conv on small grids, the Nature
    CNN on images such as Atari's), else an MLP; mlp: an MLP on the flattened observation."""

    @property
    def batch_size(self) -> int:
        """Transitions per fragment (per gradient step)."""
        return self.num_envs * self.num_steps

    @property
    def env_steps_per_update(self) -> int:
        return self.batch_size

    @property
    def num_updates(self) -> int:
        """Fragments learned from in the run (one gradient step each)."""
        return self.total_timesteps // self.batch_size

    def validate(self, env: Any) -> "Config":
        """Raise `ConfigError` for a bad value; runs on the host, before anything is traced."""
        for name in ("total_timesteps", "num_envs", "num_steps"):
            value = getattr(self, name)
            require(isinstance(value, numbers.Integral) and not isinstance(value, bool), name, value, "must be an integer")
            positive(name, value)
        require(self.total_timesteps >= self.batch_size, "total_timesteps", self.total_timesteps,
                f"must be at least one fragment, num_envs * num_steps = {self.batch_size}")
        positive("lr", self.lr)
        require(0.0 <= self.gamma <= 1.0, "gamma", self.gamma, "must be in [0, 1]")
        require(0.0 <= self.vtrace_lambda <= 1.0, "vtrace_lambda", self.vtrace_lambda, "must be in [0, 1]")
        positive("rho_bar", self.rho_bar)
        positive("c_bar", self.c_bar)
        for name in ("ent_coef", "vf_coef"):
            require(getattr(self, name) >= 0.0, name, getattr(self, name), "must be >= 0")
        positive("max_grad_norm", self.max_grad_norm)
        require(len(self.hidden) > 0 and all(isinstance(w, int) and w > 0 for w in self.hidden), "hidden",
                self.hidden, "must be a non-empty tuple of positive layer widths")
        one_of("activation", self.activation, ("tanh", "relu"))
        one_of("torso", self.torso, ("auto", "mlp"))
        require(isinstance(env.action_space, (Discrete, Box)), "env", getattr(env, "name", env),
                "IMPALA needs a Discrete or Box action space")
        return self

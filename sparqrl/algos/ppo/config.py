"""PPO configuration. Defaults are PureJaxRL's CartPole-v1 settings (`ppo.py`)."""

from __future__ import annotations

import dataclasses
import numbers
from typing import Annotated, Any, ClassVar, Literal, Mapping

import tyro

from sparqrl.config import one_of, positive, require
from sparqrl.envs import Box, Discrete


@dataclasses.dataclass(frozen=True)
class Config:
    """Proximal Policy Optimization (Schulman et al. 2017, arXiv 1707.06347), PureJaxRL style."""

    # Fields the compiled program takes as traced inputs (`algos.base`): a sweep or an evolved
    # population varies them inside one program. Every other field is static.
    TRACED: ClassVar[tuple[str, ...]] = ("lr", "gamma", "gae_lambda", "clip_eps", "dpo_alpha", "dpo_beta", "ent_coef",
                                         "vf_coef", "max_grad_norm")

    total_timesteps: int = 500_000
    """Environment steps in the whole run, summed over the parallel environments of one seed."""

    num_envs: int = 4
    """Parallel environments per seed (vmapped on device)."""

    num_steps: int = 128
    """Steps each environment takes per rollout; one update learns from num_envs * num_steps transitions."""

    lr: float = 2.5e-4
    """Adam learning rate (the start value when anneal_lr is on)."""

    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over all optimizer steps of the run."""

    update_epochs: int = 4
    """Passes over each rollout batch."""

    num_minibatches: int = 4
    """Minibatches per epoch; the rollout batch is shuffled and split into this many parts."""

    gamma: float = 0.99
    """Discount factor."""

    gae_lambda: float = 0.95
    """GAE lambda (0: one-step TD advantage, 1: Monte Carlo advantage)."""

    clip_eps: float = 0.2
    """Clipping range of the probability ratio (and of the value change when value_loss is 'clipped')."""

    objective: Annotated[str, tyro.conf.arg(aliases=("--objective",), metavar="{ppo-clip,dpo,lpo:PATH}")] = "ppo-clip"
    """Policy objective: 'ppo-clip' (PPO's clipped surrogate), 'dpo' (Discovered Policy Optimisation, Lu et
    al. 2022, arXiv 2210.05639: the surrogate r*A minus DPO's drift, with no ratio clipping) or 'lpo:PATH' (a
    drift network evolved by `sparqrl meta lpo`; PATH is that run's folder or its best_meta_params.npz)."""

    dpo_alpha: float = 2.0
    """DPO's alpha: how far the ratio may move for a positive advantage before the drift grows (objective=dpo)."""

    dpo_beta: float = 0.6
    """DPO's beta: the same for a negative advantage, on log(ratio) (objective=dpo)."""

    value_loss: Annotated[str, tyro.conf.arg(aliases=("--value-loss",), metavar="{l2,clipped,learned:PATH}")] = "clipped"
    """Value loss: 'clipped' (0.5 * max((v - t)^2, (v_old + clip(v - v_old, +-clip_eps) - t)^2)), 'l2'
    (0.5 * (v - t)^2) or 'learned:PATH' (a loss evolved by `sparqrl meta value-loss`; PATH is that run's
    folder or its best_meta_params.npz)."""

    ent_coef: float = 0.01
    """Weight of the entropy bonus in the loss."""

    vf_coef: float = 0.5
    """Weight of the value loss in the loss."""

    max_grad_norm: float = 0.5
    """Gradients are clipped to this global norm before Adam."""

    hidden: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the actor and of the critic (separate networks)."""

    activation: Literal["tanh", "relu"] = "tanh"
    """Hidden-layer activation."""

    torso: Literal["auto", "mlp"] = "auto"
    """auto: a CNN before the hidden layers for [H, W, C] observations (`nets.cnn_kind`: one Conv(16, 3x3) on
    grids such as MinAtar's, the Nature CNN's three convolutions on images such as Atari's 84x84), none for
    others; mlp: every observation flattened into the hidden layers (PureJaxRL's PPO; much cheaper than the
    Conv on a CPU)."""

    normalize_obs: bool = False
    """Normalise observations by running mean and variance (kept in the agent state, saved with the policy)."""

    normalize_reward: bool = False
    """Divide rewards by the running standard deviation of the discounted return (mean not subtracted)."""

    OBJECTIVES: ClassVar[tuple[str, ...]] = ("ppo-clip", "dpo", "lpo:PATH")
    VALUE_LOSSES: ClassVar[tuple[str, ...]] = ("l2", "clipped", "learned:PATH")

    @classmethod
    def upgrade_dict(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        """A saved config.json of an older sparqrl in today's fields (`config.from_dict`): the bool
        `clip_value` became `value_loss` ('clipped' for true, 'l2' for false)."""
        data = dict(data)
        if "clip_value" in data:
            clip = data.pop("clip_value")
            data.setdefault("value_loss", "clipped" if clip else "l2")
        return data

    @property
    def batch_size(self) -> int:
        """Transitions per update."""
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def num_updates(self) -> int:
        """Rollout-and-learn iterations in the run (leftover steps below one batch are not run)."""
        return self.total_timesteps // self.batch_size

    @property
    def num_optimizer_steps(self) -> int:
        return self.num_updates * self.update_epochs * self.num_minibatches

    def validate(self, env: Any) -> "Config":
        """Raise `ConfigError` for a bad value; runs on the host, before anything is traced. Returns the
        config as the run records it: a learned objective or value loss ('lpo:PATH', 'learned:PATH')
        resolved to its file with the hash of its content ('lpo:/abs/best_meta_params.npz#sha256=...'),
        so a program compiled for one file's weights is never reused for another's, and a resumed run
        fails if the file changed."""
        from sparqrl.algos.ppo import objectives  # jax: imported when a config is checked, not defined

        for name in ("total_timesteps", "num_envs", "num_steps", "update_epochs", "num_minibatches"):
            value = getattr(self, name)
            require(isinstance(value, numbers.Integral) and not isinstance(value, bool), name, value, "must be an integer")
            positive(name, value)
        positive("lr", self.lr)
        require(
            self.total_timesteps >= self.batch_size,
            "total_timesteps",
            self.total_timesteps,
            f"must be at least one batch, num_envs * num_steps = {self.batch_size}",
        )
        require(
            self.batch_size % self.num_minibatches == 0,
            "num_minibatches",
            self.num_minibatches,
            f"must divide the batch size num_envs * num_steps = {self.batch_size}",
        )
        require(0.0 <= self.gamma <= 1.0, "gamma", self.gamma, "must be in [0, 1]")
        require(0.0 <= self.gae_lambda <= 1.0, "gae_lambda", self.gae_lambda, "must be in [0, 1]")
        positive("clip_eps", self.clip_eps)
        objective = objectives.resolve_rule("objective", self.objective)
        value_loss = objectives.resolve_rule("value_loss", self.value_loss)
        positive("dpo_alpha", self.dpo_alpha)
        positive("dpo_beta", self.dpo_beta)
        for name in ("ent_coef", "vf_coef"):
            require(getattr(self, name) >= 0.0, name, getattr(self, name), "must be >= 0")
        positive("max_grad_norm", self.max_grad_norm)
        require(
            len(self.hidden) > 0 and all(isinstance(w, int) and w > 0 for w in self.hidden),
            "hidden",
            self.hidden,
            "must be a non-empty tuple of positive layer widths",
        )
        one_of("activation", self.activation, ("tanh", "relu"))
        one_of("torso", self.torso, ("auto", "mlp"))
        require(
            isinstance(env.action_space, (Discrete, Box)),
            "env",
            getattr(env, "name", env),
            "PPO needs a Discrete or Box action space",
        )
        return dataclasses.replace(self, objective=objective, value_loss=value_loss)

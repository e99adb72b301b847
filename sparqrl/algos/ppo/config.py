"""PPO configuration. Defaults are PureJaxRL's CartPole-v1 settings (`ppo.py`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, ClassVar, Mapping

import tyro

from sparqrl.algos.config import ActorCriticConfig
from sparqrl.config import in_unit_interval, positive, positive_int, require


@dataclasses.dataclass(frozen=True)
class Config(ActorCriticConfig):
    """Proximal Policy Optimization (Schulman et al. 2017, arXiv 1707.06347), PureJaxRL style."""

    # Fields the compiled program takes as traced inputs (`algos.base`): a sweep or an evolved
    # population varies them inside one program. Every other field is static.
    TRACED: ClassVar[tuple[str, ...]] = ("lr", "gamma", "gae_lambda", "clip_eps", "dpo_alpha", "dpo_beta", "ent_coef",
                                         "vf_coef", "max_grad_norm")

    num_envs: int = 4

    update_epochs: int = 4
    """Passes over each rollout batch."""

    num_minibatches: int = 4
    """Minibatches per epoch; the rollout batch is shuffled and split into this many parts."""

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
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

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

        self.check_fields()
        for name in ("update_epochs", "num_minibatches"):
            positive_int(name, getattr(self, name))
        require(
            self.batch_size % self.num_minibatches == 0,
            "num_minibatches",
            self.num_minibatches,
            f"must divide the batch size num_envs * num_steps = {self.batch_size}",
        )
        require(self.memory == "none" or self.num_envs % self.num_minibatches == 0, "num_minibatches",
                self.num_minibatches, f"must divide num_envs = {self.num_envs} with memory={self.memory} (a "
                "recurrent policy's minibatches take whole environments' sequences)")
        in_unit_interval("gae_lambda", self.gae_lambda)
        positive("clip_eps", self.clip_eps)
        objective = objectives.resolve_rule("objective", self.objective)
        value_loss = objectives.resolve_rule("value_loss", self.value_loss)
        positive("dpo_alpha", self.dpo_alpha)
        positive("dpo_beta", self.dpo_beta)
        self.check_actions(env, "PPO")
        return dataclasses.replace(self, objective=objective, value_loss=value_loss)

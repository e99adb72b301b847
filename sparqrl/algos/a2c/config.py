"""A2C configuration. Defaults: OpenAI Baselines' A2C (5-step fragments, RMSProp alpha 0.99 eps 1e-5 at 7e-4
annealed linearly to 0, value coefficient 0.5 of its mean squared error, which is vf_coef 1 of the library's
½·(V - R)², gradient clip 0.5) with the SB3 zoo's CartPole layout (8 envs, no entropy bonus): they are the
CartPole-v1 setting, measured in BENCHMARKS.md, "A2C (issue 36, item 1)"."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from sparqrl.algos.config import RMSPropActorCriticConfig
from sparqrl.config import in_unit_interval


@dataclasses.dataclass(frozen=True)
class Config(RMSPropActorCriticConfig):
    """Advantage actor-critic, the synchronous form of A3C (Mnih et al. 2016, arXiv 1602.01783) as OpenAI
    Baselines popularised it: num_envs environments step in lockstep, and each fragment of num_steps steps of
    each is one gradient step on n-step returns bootstrapped from V of the last observation (GAE with
    gae_lambda < 1). It is PPO's learner (`ppo.train.make_actor_learner`) with one pass of one minibatch and
    the vanilla policy-gradient loss (`a2c.losses.a2c_loss`)."""

    # Traced inputs of the compiled program (`algos.base`): a sweep or population varies them in one program.
    TRACED: ClassVar[tuple[str, ...]] = ("lr", "gamma", "gae_lambda", "ent_coef", "vf_coef", "max_grad_norm",
                                         "rmsprop_alpha", "rmsprop_eps")
    # One gradient step per fragment, in the terms of the learner A2C shares with PPO (`make_learn_batch`).
    update_epochs: ClassVar[int] = 1
    num_minibatches: ClassVar[int] = 1

    num_envs: int = 8
    num_steps: int = 5
    lr: float = 7e-4
    ent_coef: float = 0.0
    vf_coef: float = 1.0  # of ½·mean((V - R)²): Baselines' 0.5 of mean((V - R)²)

    gae_lambda: float = 1.0
    """GAE lambda of the advantages: 1 gives the paper's n-step return, sum of gamma^k r + gamma^n V(s_n) - V(s_t)
    within the fragment (cut at episode ends, a time-limit truncation bootstrapping from its final observation);
    lower values trade variance for bias."""

    normalize_obs: bool = False
    """Scale observations by a running mean and variance, held by the learner and saved with the policy."""

    normalize_reward: bool = False
    """Scale rewards by the running standard deviation of the discounted return (its mean is kept)."""

    @property
    def minibatch_size(self) -> int:
        return self.batch_size

    def validate(self, env: Any) -> "Config":
        """Raise `ConfigError` for a bad value; runs on the host, before anything is traced."""
        self.check_fields()
        in_unit_interval("gae_lambda", self.gae_lambda)
        self.check_actions(env, "A2C")
        return self

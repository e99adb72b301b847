"""PPO (Schulman et al. 2017) with truncation-aware GAE, for discrete and continuous actions."""

from sparqrl.algos.ppo.config import Config
from sparqrl.algos.ppo.losses import LossInfo, gae, normalize_advantages, policy_loss, ppo_loss, value_loss
from sparqrl.algos.ppo.train import LearnerState, PolicyParams, make_actor_learner, make_algorithm, make_train

__all__ = [
    "Config", "LearnerState", "LossInfo", "PolicyParams", "gae", "make_actor_learner", "make_algorithm",
    "make_train",
    "normalize_advantages", "policy_loss", "ppo_loss", "value_loss",
]

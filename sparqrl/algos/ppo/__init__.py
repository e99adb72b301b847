"""PPO (Schulman et al. 2017) with truncation-aware GAE, for discrete and continuous actions."""

from __future__ import annotations

import lazy_loader

from sparqrl.algos.ppo.config import Config

# The learner (JAX) loads on first use: the command's help and checks read the Config alone.
__getattr__, __dir__, _lazy = lazy_loader.attach(__name__, submod_attrs={
    "losses": ["LossInfo", "gae", "normalize_advantages", "policy_loss", "ppo_loss", "value_loss"],
    "train": ["LearnerState", "PolicyParams", "make_actor_learner", "make_algorithm", "make_train"],
})
__all__ = ["Config", *_lazy]

"""TD3 (Fujimoto et al. 2018), dense or sparse, with RLx2's delayed multi-step target and dynamic-capacity
replay (Tan et al. 2023)."""

from __future__ import annotations

import lazy_loader

from sparqrl.algos.td3.config import Config

# The learner (JAX) loads on first use: the command's help and checks read the Config alone.
__getattr__, __dir__, _lazy = lazy_loader.attach(__name__, submod_attrs={
    "losses": ["actor_loss", "critic_loss", "exploration_action", "smoothed_target_action"],
    "train": ["Transition", "Actor", "Networks", "TD3Agent", "TwinCritic", "make_agent", "make_algorithm",
              "make_networks", "make_actor_learner", "make_train"],
})
__all__ = ["Config", *_lazy]

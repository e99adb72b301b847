"""SAC (Haarnoja et al. 2018, learned temperature), dense or sparse, with RLx2's delayed multi-step target
and dynamic-capacity replay (Tan et al. 2023)."""

from __future__ import annotations

import lazy_loader

from sparqrl.algos.sac.config import Config

# The learner (JAX) loads on first use: the command's help and checks read the Config alone.
__getattr__, __dir__, _lazy = lazy_loader.attach(__name__, submod_attrs={
    "losses": ["actor_loss", "bounded_log_std", "critic_loss", "temperature_loss"],
    "train": ["Transition", "Actor", "Networks", "SACAgent", "TwinCritic", "make_agent", "make_algorithm",
              "make_networks", "make_actor_learner", "make_train"],
})
__all__ = ["Config", *_lazy]

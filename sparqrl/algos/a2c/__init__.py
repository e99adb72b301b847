"""A2C (Mnih et al. 2016, synchronous form): PPO's learner with one RMSProp step per fragment on the vanilla
policy-gradient loss, on both runners."""

from __future__ import annotations

import lazy_loader

from sparqrl.algos.a2c.config import Config

# The learner (JAX) loads on first use: the command's help and checks read the Config alone.
__getattr__, __dir__, _lazy = lazy_loader.attach(__name__, submod_attrs={
    "losses": ["a2c_loss"],
    "train": ["a2c_rule", "make_actor_learner", "make_algorithm", "make_train"],
})
__all__ = ["Config", *_lazy]

"""IMPALA (Espeholt et al. 2018): actor-critic with V-trace targets, on both runners."""

from __future__ import annotations

import lazy_loader

from sparqrl.algos.impala.config import Config

# The learner (JAX) loads on first use: the command's help and checks read the Config alone.
__getattr__, __dir__, _lazy = lazy_loader.attach(__name__, submod_attrs={
    "train": ["Learner", "impala_loss", "make_actor_learner", "make_algorithm", "make_train"],
})
__all__ = ["Config", *_lazy]

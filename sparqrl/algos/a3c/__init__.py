"""A3C (Mnih et al. 2016, asynchronous form): actors compute A2C's gradient on their own fragments and send it;
the learner applies each as it arrives (`sparqrl.runners.gradients`). Host environments only: on a JAX
environment its synchronous form is `a2c`."""

from __future__ import annotations

import lazy_loader

from sparqrl.algos.a3c.config import Config

# The learner (JAX) loads on first use: the command's help and checks read the Config alone.
__getattr__, __dir__, _lazy = lazy_loader.attach(__name__, submod_attrs={
    "train": ["GradientLearner", "keep_gradient", "make_actor_learner", "make_algorithm", "make_gradient_learner",
              "make_train"],
})
__all__ = ["Config", *_lazy]

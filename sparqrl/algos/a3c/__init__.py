"""A3C (Mnih et al. 2016, asynchronous form): actors compute A2C's gradient on their own fragments and send it;
the learner applies each as it arrives (`sparqrl.runners.gradients`). Host environments only: on a JAX
environment its synchronous form is `a2c`."""

from sparqrl.algos.a3c.config import Config
from sparqrl.algos.a3c.train import (GradientLearner, keep_gradient, make_actor_learner, make_algorithm,
                                     make_gradient_learner, make_train)

__all__ = ["Config", "GradientLearner", "keep_gradient", "make_actor_learner", "make_algorithm",
           "make_gradient_learner", "make_train"]

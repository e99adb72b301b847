"""A2C (Mnih et al. 2016, synchronous form): PPO's learner with one RMSProp step per fragment on the vanilla
policy-gradient loss, on both runners."""

from sparqrl.algos.a2c.config import Config
from sparqrl.algos.a2c.losses import a2c_loss
from sparqrl.algos.a2c.train import a2c_rule, make_actor_learner, make_algorithm, make_optimizer, make_train

__all__ = ["Config", "a2c_loss", "a2c_rule", "make_actor_learner", "make_algorithm", "make_optimizer", "make_train"]

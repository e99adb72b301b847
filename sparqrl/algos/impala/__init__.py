"""IMPALA (Espeholt et al. 2018): actor-critic with V-trace targets, on both runners."""

from sparqrl.algos.impala.config import Config
from sparqrl.algos.impala.train import Learner, impala_loss, make_actor_learner, make_algorithm, make_train

__all__ = ["Config", "Learner", "impala_loss", "make_actor_learner", "make_algorithm", "make_train"]

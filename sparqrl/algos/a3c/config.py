"""A3C configuration: A2C's fields and defaults (`a2c.Config`), since each A3C actor computes A2C's gradient on
A2C's fragment (num_steps steps of its num_envs environments); what differs is who steps the optimizer, when."""

from __future__ import annotations

import dataclasses
from typing import Any

from sparqrl.algos.a2c import Config as A2CConfig
from sparqrl.config import require


@dataclasses.dataclass(frozen=True)
class Config(A2CConfig):
    """Asynchronous advantage actor-critic (Mnih et al. 2016, arXiv 1602.01783, Algorithm S3) on the
    actor-learner runner: every actor keeps its own copy of the network, rolls out a fragment of num_steps steps
    of its num_envs environments, computes A2C's gradient on it (`a2c.a2c_loss`: n-step or GAE advantages,
    entropy bonus) and sends it tagged with the parameter version it used; the learner applies the gradients
    as they arrive with one optimizer whose statistics every actor's gradients share (RMSProp, as the paper;
    Adam as an option) and drops those computed on parameters more than `--max-lag` versions old."""

    def validate(self, env: Any) -> "Config":
        """A2C's checks, and none of what an actor cannot compute its gradient with: the learner's running
        observation and return statistics, or a masked sparse network's topology."""
        super().validate(env)
        for name in ("normalize_obs", "normalize_reward"):
            require(not getattr(self, name), name, getattr(self, name), "must be false for a3c: its actors compute "
                    "gradients without the learner's running statistics (a2c has them)")
        require(not self.masked, "sparse", self.sparse, "must be dense for a3c: its actors compute dense gradients "
                "without the learner's masks (a2c trains sparse)")
        require(self.memory == "none", "memory", self.memory, "must be none for a3c: its actors compute feed-forward "
                "gradients (a2c, ppo and impala run recurrent policies)")
        return self

"""SAC (Haarnoja et al. 2018, learned temperature), dense or sparse, with RLx2's delayed multi-step target
and dynamic-capacity replay (Tan et al. 2023)."""

from __future__ import annotations

from sparqrl.algos.offpolicy.loop import Transition
from sparqrl.algos.sac.config import Config
from sparqrl.algos.sac.losses import actor_loss, bounded_log_std, critic_loss, temperature_loss
from sparqrl.algos.sac.train import (
    Actor, Networks, SACAgent, TwinCritic, make_agent, make_algorithm, make_networks, make_actor_learner, make_train,
)

__all__ = [
    "Actor", "Config", "Networks", "SACAgent", "Transition", "TwinCritic", "actor_loss", "bounded_log_std",
    "critic_loss", "make_agent", "make_algorithm", "make_networks", "make_actor_learner", "make_train",
    "temperature_loss",
]

"""TD3 (Fujimoto et al. 2018), dense or sparse, with RLx2's delayed multi-step target and dynamic-capacity
replay (Tan et al. 2023)."""

from __future__ import annotations

from sparqrl.algos.offpolicy.loop import Transition
from sparqrl.algos.td3.config import Config
from sparqrl.algos.td3.losses import actor_loss, critic_loss, exploration_action, smoothed_target_action
from sparqrl.algos.td3.train import (
    Actor, Networks, TD3Agent, TwinCritic, make_agent, make_algorithm, make_networks, make_actor_learner, make_train,
)

__all__ = [
    "Actor", "Config", "Networks", "TD3Agent", "Transition", "TwinCritic", "actor_loss", "critic_loss",
    "exploration_action", "make_agent", "make_algorithm", "make_networks", "make_actor_learner", "make_train",
    "smoothed_target_action",
]

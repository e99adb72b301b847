"""TD3 (Fujimoto et al. 2018) with RLx2's delayed multi-step target and dynamic-capacity replay (Tan et al. 2023)."""

from __future__ import annotations

from sparqrl.algos.td3.config import Config
from sparqrl.algos.td3.losses import actor_loss, critic_loss, exploration_action, smoothed_target_action
from sparqrl.algos.td3.train import (
    Actor, Networks, TD3State, Transition, TwinCritic, make_algorithm, make_networks, make_optimizer, make_train,
)

__all__ = [
    "Actor", "Config", "Networks", "TD3State", "Transition", "TwinCritic", "actor_loss", "critic_loss",
    "exploration_action", "make_algorithm", "make_networks", "make_optimizer", "make_train",
    "smoothed_target_action",
]

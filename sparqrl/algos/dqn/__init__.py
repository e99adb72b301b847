"""DQN and Double DQN (Mnih et al. 2015; van Hasselt et al. 2016) with an on-device uniform replay buffer."""

from __future__ import annotations

from sparqrl.algos.dqn.config import Config
from sparqrl.algos.dqn.losses import chosen_q, q_target, td_loss
from sparqrl.algos.dqn.train import DQNState, Transition, epsilon_schedule, make_algorithm, make_train

__all__ = [
    "Config", "DQNState", "Transition", "chosen_q", "epsilon_schedule", "make_algorithm", "make_train",
    "q_target", "td_loss",
]

"""DQN and Double DQN (Mnih et al. 2015; van Hasselt et al. 2016): one learner for both runners, by default
with uniform replay and an epsilon schedule on device and Ape-X style on the actor-learner runner (Horgan et
al. 2018: per-slot epsilon, actor priorities, PER)."""

from __future__ import annotations

import lazy_loader

from sparqrl.algos.dqn.config import Config

# The learner (JAX) loads on first use: the command's help and checks read the Config alone.
__getattr__, __dir__, _lazy = lazy_loader.attach(__name__, submod_attrs={
    "losses": ["apex_priority", "chosen_q", "q_target", "td_loss", "weighted_td_loss"],
    "train": ["LearnerState", "Transition", "apex_epsilons", "epsilon_greedy", "epsilon_schedule", "make_acting",
              "make_actor_learner", "make_algorithm", "make_train"],
})
__all__ = ["Config", *_lazy]

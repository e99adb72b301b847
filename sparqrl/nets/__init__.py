"""Flax networks shared by the algorithms: MLP and MinAtar CNN torsos, policy and value heads."""

from sparqrl.nets.modules import MLP, ActorBranch, ActorCritic, actor_branch_params, MinAtarCNN, QNetwork, make_torso, sequential_under_vmap

__all__ = ["MLP", "ActorBranch", "ActorCritic", "actor_branch_params", "MinAtarCNN", "QNetwork", "make_torso", "sequential_under_vmap"]

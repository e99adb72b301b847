"""Flax networks shared by the algorithms: MLP and MinAtar CNN torsos, policy and value heads."""

from sparqrl.nets.modules import MLP, ActorBranch, ActorCritic, actor_branch_params, MinAtarCNN, NatureCNN, QNetwork, make_torso, sequential_under_vmap, Features, cnn_kind, torso_features

__all__ = ["MLP", "ActorBranch", "ActorCritic", "actor_branch_params", "MinAtarCNN", "NatureCNN", "QNetwork", "Features", "cnn_kind", "torso_features", "make_torso", "sequential_under_vmap"]

"""A config's sparse fields (`algos.config.AlgoConfig`) turned into `sparse.NetTraining`s and summary.json's
sparse accounting, the same for every algorithm.

TD3 and SAC train each network with its own `NetTraining` (`net_training`). PPO and IMPALA train one
ActorCritic tree and DQN one Q-network with one optax optimizer: `learner_training` gives that tree's
`NetTraining` (actor and critic layers solved as separate groups), which `sparse.transform` /
`sparse.init_transform` turn into the learner's optimizer and its initial state, and `learner_summary`
its accounting.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jax
import optax

from sparqrl import sparse
from sparqrl.algos.config import TOPOLOGY, AlgoConfig

ACTOR_CRITIC_GROUPS = {"actor": r"^params/[A-Za-z]+_0/", "critic": r"^params/[A-Za-z]+_1/"}
"""The layers of each network in an `nets.ActorCritic` tree: the actor's torso and head are the modules
numbered 0 (MLP_0, Dense_0), the critic's those numbered 1 (`nets.actor_branch_params`)."""


def net_training(config: AlgoConfig, inner: optax.GradientTransformation, sparsity: Any, t_end: int
                 ) -> sparse.NetTraining:
    """`inner` for one network (or tree of `sparsity` groups), masked and scheduled as `config.sparse` says
    (dense and tiny: plain); `t_end`: the network's optimizer steps in the run (the schedule's T_end)."""
    if not config.masked or not sparse.NetTraining(optax.identity(), sparsity).is_sparse:
        return sparse.NetTraining(inner)
    schedule = sparse.TopologySchedule(
        method=TOPOLOGY[config.sparse], interval=config.topology_interval, t_end=max(t_end, 1),
        zeta0=config.drop_fraction, reset_moments_on_grow=config.reset_moments_on_grow,
        skip_step_on_update=config.skip_step_on_topology_update,
    )
    return sparse.NetTraining(inner, sparsity, schedule, config.sparse_allocation, config.init_mask)


def learner_groups(config: AlgoConfig) -> dict[str, tuple[str, float]]:
    """{network name: (path regex, sparsity)} of the one tree a learner trains: the ActorCritic's actor and
    critic, or (no SPARSE_NETWORKS) the whole tree as 'q' at `sparsity`."""
    if not config.SPARSE_NETWORKS:
        return {"q": (r".", config.required_sparsity())}
    return {name: (ACTOR_CRITIC_GROUPS[name], config.required_sparsity(name)) for name in config.SPARSE_NETWORKS}


def learner_training(config: AlgoConfig, inner: optax.GradientTransformation, t_end: int) -> sparse.NetTraining:
    """The `NetTraining` of a learner's one parameter tree (module docstring)."""
    return net_training(config, inner, tuple(learner_groups(config).values()), t_end)


def learner_summary(config: AlgoConfig, training: sparse.NetTraining, init: Callable[[], Any],
                    stored: tuple[str, ...] = ()) -> dict[str, Any]:
    """The sparse fields of summary.json for a learner's tree (`sparse.summary`; none for a dense run):
    per network its sparsity, and the size, training- and inference-FLOPs ratios against the dense tree.
    `init()`: the tree's initial parameters, traced for their shapes only for a sparse run (a dense run's
    summary costs no trace of the network's init: 0.24 s of CPU per program trace); stored: extra copies in
    the size ratio (DQN's target network). Every network's forward and backward pass weighs 1; the actor (or
    the Q-network) acts."""
    if not config.masked:
        return {}
    abstract_params = jax.eval_shape(init)
    groups = learner_groups(config)
    counts, dense = (_split(c, groups) for c in (training.param_count(abstract_params),
                                                 sparse.count_params(abstract_params)))
    names = list(groups)
    return {"sparse": config.sparse, **sparse.summary(counts, acting=names[0], train_weights=dict.fromkeys(names, 1.0),
                                                      stored=names + list(stored), dense=dense)}


def _split(count: sparse.ParamCount, groups: dict[str, tuple[str, float]]) -> dict[str, sparse.ParamCount]:
    """A tree's count split into its networks' (the first group whose pattern matches a weight takes it)."""
    owner = {w.path: next(n for n, (p, _) in groups.items() if re.search(p, w.path)) for w in count.weights}
    return {n: sparse.ParamCount(tuple(w for w in count.weights if owner[w.path] == n), 0) for n in groups}

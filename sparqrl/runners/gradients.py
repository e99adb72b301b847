"""The actor-learner runner's gradient mode, for an algorithm whose actors compute the gradients (A3C: Mnih et al.
2016, arXiv 1602.01783): the algorithm module has `make_gradient_learner(config, spec) -> GradientLearner`
(`gradient(policy_params, steps) -> (grads, metrics)`, `apply(learner, grads) -> learner`).

    actors   (`GradientActor`) each keep their own fp32 copy of the whole network (published alone with every
             version, `PolicyCopy.params`), make their acting copy from it in `--actor-precision` (as the learner
             makes other actors'), step their environments as every actor does (`Actor.collect`), compute the
             gradient on that fragment with the fp32 copy, and send the gradient and its loss terms tagged with
             the version, instead of the fragment;
    learner  (`GradientDriver`) applies each gradient as it arrives, without waiting for the other actors, and
             publishes the new parameters; a gradient computed on parameters more than `--max-lag` versions
             old is dropped and counted (`stale_gradients_dropped`), never applied.

Everything else is the runner's (`sebulba.SebulbaDriver`): pools (inline, Ray), requests in flight, versions,
checkpoints, resume, progress, evaluation and summary.json; a gradient travels where a fragment would.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import jax
import numpy as np

from sparqrl.algos import get_algorithm
from sparqrl.config import require
from sparqrl.envs import host_spec
from sparqrl.runners import sebulba
from sparqrl.runners.actors import Actor, Fragment, PolicyCopy, network_paths, quantized_copy
from sparqrl.runners.run_config import RunConfig
from sparqrl.runners.session import ChunkHook


class Gradients(NamedTuple):
    """What a gradient actor sends in a `Fragment`'s place of its steps: per seed, the gradient of the loss on its
    fragment and the loss terms (leaves [seeds, ...], numpy)."""

    grads: Any
    metrics: dict[str, np.ndarray]


def sends_gradients(algo_name: str) -> bool:
    """Whether `algo_name`'s actors compute its gradients (it has `make_gradient_learner`): this module runs it."""
    return hasattr(get_algorithm(algo_name), "make_gradient_learner")


def make_gradient_learner(spec: Any) -> Any:
    """The `GradientLearner` of an `ActorSpec`'s (or `Prepared`'s) algorithm and config on its host env."""
    return get_algorithm(spec.algo).make_gradient_learner(spec.config, host_spec(spec.env))


class GradientActor(Actor):
    """An `Actor` that sends, for each fragment it steps, the gradient its own copy of the network computes on it
    (`Gradients`, in the `Fragment`'s `steps`). The copy is the newest version it has loaded, the one it acted
    with: the fragment's version is the gradient's."""

    def __init__(self, spec: Any, actor_id: int, incarnation: int, reseed: int = 0, central: Any = None):
        super().__init__(spec, actor_id, incarnation, reseed, central)
        self._gradient = jax.jit(jax.vmap(make_gradient_learner(spec).gradient))  # over seeds
        self.params = None
        self._paths = None  # the policy network's Dense layers (`actors.network_paths`), found at the first copy

    def collect(self, copy: PolicyCopy) -> Fragment:
        if copy.version > self.version:  # (the version `Actor.collect` then acts with)
            self.params = copy.params
            copy = self._acting_copy(copy)
        fragment = super().collect(copy)
        start = time.perf_counter()
        steps = jax.tree.map(lambda x: np.swapaxes(x, 0, 1), fragment.steps)  # [seeds, T, N, ...]
        grads, metrics = jax.device_get(self._gradient(self.params, steps))
        return fragment._replace(steps=Gradients(grads, metrics), busy_s=fragment.busy_s + time.perf_counter() - start)

    def _acting_copy(self, copy: PolicyCopy) -> PolicyCopy:
        """The copy to act with, made from the fp32 params `copy` carries alone, as the learner makes it for other
        actors (`actors.quantized_copy` in the run's precision and granularity)."""
        spec = self.spec
        if self._paths is None:
            self._paths = network_paths(self.acting, copy.params, host_spec(spec.env).observation_shape)
        return quantized_copy(copy.version, copy.params, self.acting, self._paths, spec.precision, spec.granularity,
                              copy.env_steps)


def apply_gradients(gradient_learner: Any) -> Any:
    """(learner [S], `Gradients` [S]) -> (learner after one optimizer step per seed, the actor's loss terms [S]):
    the driver's fragment learner in gradient mode."""

    def learn(learner: Any, message: Gradients) -> tuple[Any, dict]:
        return jax.vmap(gradient_learner.apply)(learner, message.grads), message.metrics

    return learn


class GradientDriver(sebulba.SebulbaDriver):
    """`SebulbaDriver` with gradient actors: it learns from each `Gradients` as it arrives (one jitted, donated
    optimizer step, vmapped over seeds), drops those older than `--max-lag` versions, and publishes the whole
    fp32 network with every version."""

    actor_class = GradientActor
    publishes_params = True

    def __init__(self, p: sebulba.Prepared, algo_name: str, run: RunConfig):
        super().__init__(p, algo_name, run)
        self.learn_fragment = apply_gradients(make_gradient_learner(self.spec))
        self.max_lag = run.resolved_max_lag  # every gradient is on-policy data's

    def dropped(self) -> int:
        return self.prior["dropped"] + self.counts["dropped"]

    def run_chunk(self, chunk: int) -> tuple[Any, dict[str, np.ndarray]]:
        learner, per_seed = super().run_chunk(chunk)
        per_seed["stale_gradients_dropped"] = np.full(self.run.seeds, float(self.dropped()))
        return learner, per_seed

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "stale_gradients_dropped": self.dropped()}


def check_run(algo_name: str, run: RunConfig) -> None:
    """What gradient actors need of the run, before anything is written: their own copy of the network."""
    require(run.inference == "actor", "inference", run.inference, f"must be actor for {algo_name}: each actor "
            "computes its gradient with its own copy of the network")


def train(algo_name: str, algo_config: Any, run: RunConfig, *, on_chunk: ChunkHook | None = None) -> dict:
    """`sebulba.train` with gradient actors."""
    check_run(algo_name, run)
    return sebulba.train(algo_name, algo_config, run, on_chunk=on_chunk, driver=GradientDriver)


def resume(rundir: Any, algo_name: str, algo_config: Any, run: RunConfig, *, on_chunk: ChunkHook | None = None
           ) -> dict:
    """`sebulba.resume` with gradient actors."""
    check_run(algo_name, run)
    return sebulba.resume(rundir, algo_name, algo_config, run, on_chunk=on_chunk, driver=GradientDriver)


evaluate_saved = sebulba.evaluate_saved  # the learner and its policy are the algorithm's ordinary ones

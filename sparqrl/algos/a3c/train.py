"""A3C's learner (Mnih et al. 2016, arXiv 1602.01783, Algorithm S3) in two halves, for the actor-learner runner's
gradient mode (`sparqrl.runners.gradients`):

    actor    `GradientLearner.gradient`: A2C's learner (`a2c.make_actor_learner`: values, truncation-aware
             n-step / GAE advantages, `a2c.a2c_loss`) on the actor's own fragment, run with `keep_gradient` as
             its optimizer: the gradient A2C's RMSProp would step on, computed on the actor's copy of the network;
    learner  `GradientLearner.apply`: A2C's optimizer (RMSProp after the global-norm clip, or Adam) steps on each
             gradient as it arrives, one statistics for every actor's gradients (the paper's shared RMSProp).

The learner's state, its policy, the actors' acting, evaluation, checkpoints and export are A2C's
(`make_actor_learner`). Everything here is for ONE seed; the runner vmaps over seeds.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from sparqrl import sparse
from sparqrl.algos import a2c
from sparqrl.algos.a3c.config import Config
from sparqrl.algos.actor_critic import PolicyParams
from sparqrl.algos.base import ActorLearner, Algorithm, Step
from sparqrl.algos.ppo import train as ppo_train
from sparqrl.config import fail

GRADIENT_KEY = jax.random.PRNGKey(0)
"""The key of the learner the actors run: it only orders the batch (one minibatch of the whole fragment), which
changes the gradient by float rounding at most."""


class GradientLearner(NamedTuple):
    """A learner whose actors compute the gradients (A3C); the runner vmaps each function over seeds.

    gradient(policy_params, steps [T, N]) -> (grads, metrics)
                                                the gradient of the loss on one fragment under the policy the
                                                learner publishes (`ActorLearner.policy`: the whole network),
                                                and its loss terms
    apply(learner, grads) -> learner            one optimizer step on a gradient (and the counters)
    """

    gradient: Callable[[Any, Step], tuple[Any, dict[str, jax.Array]]]
    apply: Callable[[Any, Any], Any]


def keep_gradient() -> optax.GradientTransformation:
    """An optimizer that takes no step and keeps the gradient it was given as its state: the learner that runs it
    computes its gradient by its own code path and leaves its parameters as they were."""

    def init(params: Any) -> Any:
        return jax.tree.map(jnp.zeros_like, params)

    def update(grads: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        del state, params
        return jax.tree.map(jnp.zeros_like, grads), grads

    return optax.GradientTransformation(init, update)


def make_actor_learner(config: Config, env: Any) -> ActorLearner:
    """A2C's learner (state, policy, acting): what the learner holds, saves and publishes, and what actors act with."""
    return a2c.make_actor_learner(config, env)


def make_gradient_learner(config: Config, env: Any) -> GradientLearner:
    """A3C's two halves (module docstring) for a host env spec: the gradient of A2C's learner on a fragment, and
    A2C's optimizer (`base.actor_critic_optimizer`) applying it to the learner of `make_actor_learner`."""
    config = config.validate(env)
    computing = ppo_train.make_actor_learner(config, env, unroll=True,
                                             rule=ppo_train.Rule(sparse.NetTraining(keep_gradient()),
                                                                 a2c.a2c_rule(config).loss))
    optimizer = sparse.transform(a2c.a2c_rule(config).training)

    def gradient(policy_params: PolicyParams, steps: Step) -> tuple[Any, dict[str, jax.Array]]:
        params, zero = policy_params.params, jnp.zeros((), jnp.int32)
        state = ppo_train.LearnerState(params, keep_gradient().init(params), None, None, GRADIENT_KEY, zero, zero)
        computed, metrics = computing.learn(state, steps)
        return computed.opt_state, metrics

    def apply(learner: ppo_train.LearnerState, grads: Any) -> ppo_train.LearnerState:
        updates, opt_state = optimizer.update(grads, learner.opt_state, learner.params)
        return learner._replace(params=optax.apply_updates(learner.params, updates), opt_state=opt_state,
                                env_steps=learner.env_steps + config.batch_size,
                                gradient_steps=learner.gradient_steps + 1)

    return GradientLearner(gradient, apply)


def make_algorithm(config: Config, env: Any) -> Algorithm:
    """Refused: A3C's asynchrony is actors that send gradients, which a JAX environment's one program has none of;
    its synchronous form on device is A2C."""
    name = getattr(env, "name", env)
    fail("env", name, "a3c runs on host environments (gym:NAME --actors N), whose actors send gradients; on a JAX "
         f"environment use its synchronous form: sparqrl train a2c --env {name}")


def make_train(config: Config, env: Any) -> Callable[..., Any]:
    """Refused as `make_algorithm` (no on-device program)."""
    return make_algorithm(config, env)

"""A2C's learner: PPO's fragment learner (`ppo.train.make_actor_learner`: the values, the truncation-aware GAE
and bootstrap, the batch plumbing, the normalisers, the actors' acting) with A2C's `Rule`: one RMSProp (or Adam)
step per fragment on `a2c_loss`. Both runners drive it, as they drive PPO's: on device `base.on_device` rolls out
num_steps steps of num_envs JAX environments with the current policy, on the host actors send fragments.

Everything here is for ONE seed; `jax.vmap(make_train(config, env))(keys)` runs many.
"""

from __future__ import annotations

from typing import Any, Callable

import jax

from sparqrl.algos import sparsify
from sparqrl.algos.a2c.config import Config
from sparqrl.algos.a2c.losses import a2c_loss
from sparqrl.algos.base import (
    ActorLearner, Algorithm, actor_critic_optimizer, has_tracers, make_hparams_train_fn, on_device,
)
from sparqrl.algos.ppo import train as ppo_train
from sparqrl.envs import Env


def a2c_rule(config: Config) -> ppo_train.Rule:
    """A2C's `Rule` for PPO's learner: `base.actor_critic_optimizer` (masked and scheduled when `config.sparse` is)
    and `a2c_loss` on the fragment's advantages and returns."""

    def loss(log_prob: jax.Array, values: jax.Array, entropy: jax.Array, batch: ppo_train.Batch
             ) -> tuple[jax.Array, dict[str, jax.Array]]:
        return a2c_loss(log_prob, values, entropy, batch.advantages, batch.targets, vf_coef=config.vf_coef,
                        ent_coef=config.ent_coef)

    return ppo_train.Rule(sparsify.learner_training(config, actor_critic_optimizer(config), config.num_updates), loss)


def make_actor_learner(config: Config, env: Any) -> ActorLearner:
    """A2C's learner for a JAX env (`make_algorithm`) or a host env spec (`HostSpec`): PPO's, taking each
    fragment [T = num_steps, N = num_envs] as one batch, learned in one step of `a2c_rule` (straight-line code:
    one pass of one minibatch needs no loop)."""
    if not has_tracers(config):
        config = config.validate(env)
    return ppo_train.make_actor_learner(config, env, unroll=True, rule=a2c_rule(config))


def make_algorithm(config: Config, env: Env) -> Algorithm:
    """A2C on device: fragments of num_steps steps of num_envs JAX environments acted by the learner's current
    policy (`base.on_device`), one update each. Raises `ConfigError` before tracing on a bad config."""
    if not has_tracers(config):
        config = config.validate(env)
    return on_device(make_actor_learner(config, env), env, config.num_steps, config.num_updates)


def make_train(config: Config, env: Env) -> Callable[..., tuple[Any, dict[str, jax.Array]]]:
    """The whole run as `train(key, hparams=None) -> (state, metrics [num_updates])` (`base.make_hparams_train_fn`)."""
    return make_hparams_train_fn(make_algorithm, config.validate(env), env)

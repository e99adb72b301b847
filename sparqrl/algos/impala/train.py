"""IMPALA's learner on fragments, used by both runners.

`make_actor_learner(config, env)` is the one learner: `learn(learner, steps [T, N])` computes the
current network's log-probabilities and values on the fragment, V-trace targets and policy-gradient
advantages against the behaviour log-probabilities the fragment carries (`Step.extra`), and takes one
Adam step on

    L = -mean(ρ^pg_t A_t · log π(a_t|x_t)) + vf_coef · mean(½ (v_t − V(x_t))²) − ent_coef · mean(H[π(·|x_t)])

(reference `actorq_distributed.md` §4). The actor-learner runner feeds it actors' fragments, which may
lag the learner by a few versions (V-trace corrects them, so none is dropped); the on-device runner
(`base.on_device`) rolls fragments out in JAX environments with the current policy (log ρ = 0: V-trace is
then the λ-return and IMPALA is A2C).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from sparqrl import sparse
from sparqrl.algos import sparsify
from sparqrl.algos.actor_critic import PolicyParams, make_acting, make_network
from sparqrl.algos.base import (
    ActorLearner, Algorithm, Step, actor_critic_optimizer, has_tracers, make_hparams_train_fn, on_device,
)
from sparqrl.algos.impala.config import Config
from sparqrl.algos.recurrent import fragment_outputs
from sparqrl.envs import Env
from sparqrl.nets.torso import check_torsos
from sparqrl.returns import vtrace


class Learner(NamedTuple):
    """The learner of one seed."""

    params: Any
    opt_state: optax.OptState
    key: jax.Array
    env_steps: jax.Array  # int32 [], env steps learned from
    gradient_steps: jax.Array  # int32 []


def impala_loss(log_prob: jax.Array, behaviour_log_prob: jax.Array, values: jax.Array, next_values: jax.Array,
                entropy: jax.Array, steps: Step, config: Config) -> tuple[jax.Array, dict[str, jax.Array]]:
    """IMPALA's loss on one fragment (all [T, N]): `log_prob` and `values` carry the gradient; the V-trace
    targets and advantages are constants (`vtrace` stops their gradient)."""
    log_rho = log_prob - behaviour_log_prob
    out = vtrace(jax.lax.stop_gradient(log_rho), steps.reward, jax.lax.stop_gradient(values), next_values,
                 steps.terminated, steps.truncated, config.gamma, config.rho_bar, config.c_bar,
                 lambda_=config.vtrace_lambda)
    policy_loss = -jnp.mean(out.pg_advantages * log_prob)
    value_loss = 0.5 * jnp.mean(jnp.square(out.vs - values))
    entropy = jnp.mean(entropy)
    loss = policy_loss + config.vf_coef * value_loss - config.ent_coef * entropy
    rho = jnp.exp(jax.lax.stop_gradient(log_rho))
    return loss, {"total_loss": loss, "policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy,
                  "rho_mean": jnp.mean(rho), "rho_clipped_fraction": jnp.mean((rho > config.rho_bar).astype(jnp.float32))}


def make_actor_learner(config: Config, env: Any) -> ActorLearner:
    """IMPALA for a JAX env or a host env spec (both have `observation_shape` and `action_space`)."""
    if not has_tracers(config):
        config = config.validate(env)
    obs_shape = tuple(env.observation_shape)
    check_torsos(config, obs_shape, ("actor", "critic"))
    network = make_network(config, env)
    training = sparsify.learner_training(config, actor_critic_optimizer(config), config.num_updates)
    optimizer = sparse.transform(training)
    def init_params(key: jax.Array) -> Any:
        return network.init(key, jnp.zeros((1, *obs_shape), jnp.float32))

    def init(key: jax.Array) -> Learner:
        key, params_key = jax.random.split(key)
        params, opt_state = sparse.init_transform(training, params_key, init_params(params_key))
        return Learner(params, opt_state, key, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))

    def loss_fn(params: Any, steps: Step) -> tuple[jax.Array, dict[str, jax.Array]]:
        obs, next_obs = jnp.asarray(steps.obs, jnp.float32), jnp.asarray(steps.next_obs, jnp.float32)
        if steps.memory is not None:  # a recurrent network re-run over the fragment from its initial state
            dist, values, next_values = fragment_outputs(network, params, obs, next_obs, steps)
        else:
            dist, values = network.apply(params, obs)
            _, next_values = network.apply(params, next_obs)
        return impala_loss(dist.log_prob(steps.action), steps.extra, values, jax.lax.stop_gradient(next_values),
                           dist.entropy(), steps, config)

    def learn(learner: Learner, steps: Step) -> tuple[Learner, dict[str, jax.Array]]:
        """One Adam step on one fragment (`Step` leaves [T, N, ...]; `steps.extra`: behaviour log-probs)."""
        steps = steps._replace(reward=jnp.asarray(steps.reward, jnp.float32))
        grads, metrics = jax.grad(loss_fn, has_aux=True)(learner.params, steps)
        updates, opt_state = optimizer.update(grads, learner.opt_state, learner.params)
        return Learner(optax.apply_updates(learner.params, updates), opt_state, learner.key,
                       learner.env_steps + config.batch_size, learner.gradient_steps + 1), metrics

    def policy(learner: Learner) -> PolicyParams:
        return PolicyParams(learner.params, None)

    return ActorLearner(init=init, learn=learn, policy=policy, acting=make_acting(network, env, False, None),
                        num_envs=config.num_envs, steps_per_env=config.num_updates * config.num_steps,
                        fragment_steps=config.num_steps,
                        summary=sparsify.learner_summary(config, training, lambda: init_params(jax.random.key(0))))


def make_algorithm(config: Config, env: Env) -> Algorithm:
    """IMPALA on device: fragments rolled out in the JAX environments (`base.on_device`)."""
    if not has_tracers(config):
        config = config.validate(env)
    return on_device(make_actor_learner(config, env), env, config.num_steps, config.num_updates)


def make_train(config: Config, env: Env) -> Callable[..., tuple[Any, dict[str, jax.Array]]]:
    """The whole run as `train(key, hparams=None) -> (state, metrics [num_updates])` (`base.make_hparams_train_fn`)."""
    return make_hparams_train_fn(make_algorithm, config.validate(env), env)

"""DQN as an `Algorithm`: epsilon-greedy acting in `num_envs` environments, uniform replay, TD learning.

One `update` steps every environment once (`env_steps_per_update = num_envs`), adds the
`num_envs` transitions to the replay buffer, then takes the gradient steps and target update whose
env-step intervals end within this update:

    gradient steps  = (env_steps_t // train_interval − env_steps_tm1 // train_interval)  once learning
    target update   if env_steps_t // target_update_interval > env_steps_tm1 // target_update_interval

so every interval is in env steps and means what it says for any `num_envs`. Learning starts at
`max(learning_starts, batch_size)` env steps. Both gates are `lax.cond`s (under vmap over seeds
they become selects, which is still correct).

Unlike PureJaxRL's `dqn.py`, the key given to `init` is threaded through everything (network init,
resets, exploration, environment steps, replay sampling), so vmapped seeds really differ.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from sparqrl import replay
from sparqrl.algos.base import Algorithm, episode_metrics, make_train_fn
from sparqrl.algos.dqn.config import Config
from sparqrl.algos.dqn.losses import chosen_q, q_target, td_loss
from sparqrl.envs import Env, action_dim
from sparqrl.nets.modules import QNetwork


class Transition(NamedTuple):
    """One replayed transition (shapes of one item; the buffer adds a leading [capacity])."""

    obs: jax.Array  # [*obs_shape]
    action: jax.Array  # int32 []
    reward: jax.Array  # float32 []
    next_obs: jax.Array  # [*obs_shape], the env's final_obs: pre-reset, so truncation can bootstrap
    terminated: jax.Array  # bool []; truncation is not stored: it does not cut the bootstrap


class DQNState(NamedTuple):
    """The full training state of one seed."""

    params: Any  # online Q-network
    target_params: Any  # target Q-network
    opt_state: optax.OptState
    buffer: replay.BufferState  # of Transition
    env_state: Any  # [num_envs]
    obs: jax.Array  # [num_envs, *obs_shape], the observations the next actions are taken on
    key: jax.Array
    env_steps: jax.Array  # int32 [], env steps so far, summed over environments
    gradient_steps: jax.Array  # int32 []


class _Learner(NamedTuple):
    params: Any
    opt_state: optax.OptState
    loss_sum: jax.Array
    q_sum: jax.Array


def epsilon_schedule(config: Config) -> Callable[[jax.Array], jax.Array]:
    """Epsilon at a given env step: linear from `epsilon_start` to `epsilon_finish`, then flat."""

    def epsilon(env_steps: jax.Array) -> jax.Array:
        frac = jnp.clip(env_steps / config.epsilon_anneal_time, 0.0, 1.0)
        return config.epsilon_start + frac * (config.epsilon_finish - config.epsilon_start)

    return epsilon


def make_optimizer(config: Config) -> optax.GradientTransformation:
    lr: float | optax.Schedule = config.lr
    if config.anneal_lr:
        lr = optax.linear_schedule(config.lr, 0.0, max(config.num_gradient_steps, 1))
    adam = optax.adam(lr)
    if config.max_grad_norm > 0:
        return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), adam)
    return adam


def make_algorithm(config: Config, env: Env) -> Algorithm:
    """DQN for `env` (discrete actions). The config is checked here, on the host, before any tracing."""
    config.validate(env)
    num_envs = config.num_envs
    num_actions = action_dim(env)
    network = QNetwork(num_actions, tuple(env.observation_shape), tuple(config.hidden), config.activation)
    optimizer = make_optimizer(config)
    epsilon = epsilon_schedule(config)
    grad_slots = config.max_gradient_steps_per_update

    def init(key: jax.Array) -> DQNState:
        key, net_key, reset_key = jax.random.split(key, 3)
        example_obs = jnp.zeros(env.observation_shape, jnp.float32)
        params = network.init(net_key, example_obs)
        obs, env_state = jax.vmap(env.reset)(jax.random.split(reset_key, num_envs))
        example = Transition(
            obs=example_obs,
            action=jnp.zeros((), jnp.int32),
            reward=jnp.zeros((), jnp.float32),
            next_obs=example_obs,
            terminated=jnp.zeros((), jnp.bool_),
        )
        return DQNState(
            params=params,
            target_params=params,
            opt_state=optimizer.init(params),
            buffer=replay.init(example, config.buffer_size),
            env_state=env_state,
            obs=obs,
            key=key,
            env_steps=jnp.zeros((), jnp.int32),
            gradient_steps=jnp.zeros((), jnp.int32),
        )

    def loss_fn(params: Any, target_params: Any, batch: Transition) -> tuple[jax.Array, jax.Array]:
        next_q_target = network.apply(target_params, batch.next_obs)
        next_q_online = network.apply(params, batch.next_obs) if config.double_dqn else next_q_target
        target = q_target(
            batch.reward, batch.terminated, next_q_target, next_q_online, config.gamma, config.double_dqn
        )
        q_sa = chosen_q(network.apply(params, batch.obs), batch.action)
        return td_loss(q_sa, target), jnp.mean(q_sa)

    def gradient_step(learner: _Learner, target_params: Any, buffer: replay.BufferState, key: jax.Array) -> _Learner:
        batch = replay.sample(buffer, key, config.batch_size)
        (loss, q_mean), grads = jax.value_and_grad(loss_fn, has_aux=True)(learner.params, target_params, batch)
        updates, opt_state = optimizer.update(grads, learner.opt_state, learner.params)
        params = optax.apply_updates(learner.params, updates)
        return _Learner(params, opt_state, learner.loss_sum + loss, learner.q_sum + q_mean)

    def update(state: DQNState) -> tuple[DQNState, dict[str, jax.Array]]:
        key, explore_key, random_key, step_key, learn_key = jax.random.split(state.key, 5)

        # Act: epsilon-greedy on the current observations of every environment.
        eps = epsilon(state.env_steps)
        greedy = jnp.argmax(network.apply(state.params, state.obs), axis=-1).astype(jnp.int32)
        random_action = jax.random.randint(random_key, (num_envs,), 0, num_actions, dtype=jnp.int32)
        explore = jax.random.uniform(explore_key, (num_envs,)) < eps
        action = jnp.where(explore, random_action, greedy)
        out = jax.vmap(env.step)(jax.random.split(step_key, num_envs), state.env_state, action)
        buffer = replay.add(
            state.buffer, Transition(state.obs, action, out.reward, out.final_obs, out.terminated)
        )
        env_steps_tm1, env_steps_t = state.env_steps, state.env_steps + num_envs

        # Learn: the gradient steps whose train_interval ends within this update.
        learning = env_steps_t >= config.learning_start_step
        num_grad = jnp.where(
            learning, env_steps_t // config.train_interval - env_steps_tm1 // config.train_interval, 0
        )

        def maybe_step(learner: _Learner, slot_and_key: tuple[jax.Array, jax.Array]) -> tuple[_Learner, None]:
            slot, step_key = slot_and_key
            learner = jax.lax.cond(
                slot < num_grad,
                lambda l: gradient_step(l, state.target_params, buffer, step_key),
                lambda l: l,
                learner,
            )
            return learner, None

        learner0 = _Learner(state.params, state.opt_state, jnp.zeros(()), jnp.zeros(()))
        slots = (jnp.arange(grad_slots), jax.random.split(learn_key, grad_slots))
        learner, _ = jax.lax.scan(maybe_step, learner0, slots)

        # Target network: hard copy (tau = 1) or Polyak average, once per target_update_interval.
        do_target = learning & (
            env_steps_t // config.target_update_interval > env_steps_tm1 // config.target_update_interval
        )
        target_params = jax.lax.cond(
            do_target,
            lambda: optax.incremental_update(learner.params, state.target_params, config.tau),
            lambda: state.target_params,
        )

        denom = jnp.maximum(num_grad, 1).astype(jnp.float32)
        metrics = {
            **episode_metrics(out.info),
            "loss": learner.loss_sum / denom,  # mean over this update's gradient steps; 0 if none
            "q_mean": learner.q_sum / denom,  # mean Q(s, a) of the replayed batches; 0 if none
            "epsilon": jnp.asarray(eps, jnp.float32),
        }
        new_state = DQNState(
            params=learner.params,
            target_params=target_params,
            opt_state=learner.opt_state,
            buffer=buffer,
            env_state=out.state,
            obs=out.obs,
            key=key,
            env_steps=env_steps_t,
            gradient_steps=state.gradient_steps + num_grad,
        )
        return new_state, metrics

    def policy(state: DQNState) -> Any:
        return state.params

    def act(policy_params: Any, obs: jax.Array, key: jax.Array) -> jax.Array:
        """Greedy action for ONE observation [*obs_shape] (the key is unused)."""
        del key
        return jnp.argmax(network.apply(policy_params, obs), axis=-1).astype(jnp.int32)

    return Algorithm(
        init=init,
        update=update,
        policy=policy,
        act=act,
        env_steps_per_update=config.env_steps_per_update,
        num_updates=config.num_updates,
    )


def make_train(config: Config, env: Env) -> Callable[[jax.Array], tuple[DQNState, dict[str, jax.Array]]]:
    """The whole run as `train(key) -> (state, metrics [num_updates])`, jittable and vmappable over keys."""
    return make_train_fn(make_algorithm(config, env))

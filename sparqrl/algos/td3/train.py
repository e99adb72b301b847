"""TD3 as an `Algorithm`: Gaussian exploration in `num_envs` environments, n-step replay windows, twin critics.

Fujimoto et al. 2018 (TD3) with RLx2's settings (Tan et al., ICLR 2023; `rlx2.md` §4-§6). One `update`:

1. acts in every environment: uniform random actions for the first `learning_start_step` env steps,
   then clip(π(s) + N(0, 0.1²), −1, 1) in the normalised box, mapped to the env's [low, high];
2. stores one ring slot holding the step of all environments (obs, action, reward, the pre-reset
   final_obs, terminated, truncated, and the noise-free reference action ā for the dynamic buffer);
3. if a `buffer_check_interval` of env steps ended, checks the dynamic-capacity buffer (`replay.dynamic`);
4. takes one gradient step per env step past `learning_start_step`: critic on the (delayed) n-step
   target of a sampled window; every `policy_delay` gradient steps the actor (−Q1(s, π(s))) and a
   Polyak update of both target networks.

Gradient step j (1-based, the reference's `total_it`) uses the n-step target once j >= nstep_delay and
updates the actor when j % policy_delay == 0. The gates are `replay.dynamic.lockstep_cond`s: under vmap
over seeds (whose counters move in lockstep) a skipped branch still costs nothing.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from sparqrl import replay, returns
from sparqrl.algos.base import Algorithm, episode_metrics, make_train_fn
from sparqrl.algos.td3.config import Config
from sparqrl.algos.td3.losses import actor_loss, critic_loss, exploration_action, smoothed_target_action
from sparqrl.envs import Env, action_dim
from sparqrl.nets.modules import ACTIVATIONS
from sparqrl.replay import dynamic, nstep


class Transition(NamedTuple):
    """One ring slot: one env step of all S = num_envs environments (every field has a leading [S])."""

    obs: jax.Array  # [S, *obs_shape]
    action: jax.Array  # [S, |A|], normalised to [-1, 1]
    reward: jax.Array  # [S]
    next_obs: jax.Array  # [S, *obs_shape], the env's final_obs: pre-reset, so truncation can bootstrap
    terminated: jax.Array  # bool [S]: cuts the bootstrap
    truncated: jax.Array  # bool [S]: time limit; the n-step return stops here and bootstraps
    reference_action: jax.Array  # [S, |A|]: π(s) before noise (the random action in warm-up), RLx2's ā


class TD3State(NamedTuple):
    """The full training state of one seed."""

    actor_params: Any
    critic_params: Any
    actor_target_params: Any
    critic_target_params: Any
    actor_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    buffer: replay.BufferState  # of Transition
    env_state: Any  # [num_envs]
    obs: jax.Array  # [num_envs, *obs_shape]
    key: jax.Array
    env_steps: jax.Array  # int32 [], summed over environments
    gradient_steps: jax.Array  # int32 [] (training iterations)
    buffer_distance: jax.Array  # float32 [], the dynamic buffer's D at its latest check


# ---- networks ------------------------------------------------------------------------------


def _torch_dense(features: int, fan_in: int) -> nn.Dense:
    """PyTorch's default Linear init (RLx2's TD3): weights and biases U(−1/√fan_in, 1/√fan_in)."""
    bound = 1.0 / float(np.sqrt(fan_in))

    def bias_init(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return nn.Dense(features, kernel_init=nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform"),
                    bias_init=bias_init)


def _flatten_obs(obs: jax.Array, obs_ndim: int) -> jax.Array:
    return obs.reshape(obs.shape[: obs.ndim - obs_ndim] + (-1,))


class _MLP(nn.Module):
    hidden: tuple[int, ...]
    out: int
    activation: str

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for width in self.hidden:
            x = ACTIVATIONS[self.activation](_torch_dense(width, x.shape[-1])(x))
        return _torch_dense(self.out, x.shape[-1])(x)


class Actor(nn.Module):
    """Deterministic policy obs → tanh(MLP) ∈ [-1, 1]^|A| ([..., |A|])."""

    action_dim: int
    hidden: tuple[int, ...]
    activation: str = "relu"
    obs_ndim: int = 1

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        return jnp.tanh(_MLP(self.hidden, self.action_dim, self.activation)(_flatten_obs(obs, self.obs_ndim)))


class TwinCritic(nn.Module):
    """Two Q-networks (obs, action) → (Q1 [...], Q2 [...]) in one module (one parameter tree, as RLx2's
    critic, whose 6 weight matrices share one sparsity allocation)."""

    hidden: tuple[int, ...]
    activation: str = "relu"
    obs_ndim: int = 1

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = jnp.concatenate([_flatten_obs(obs, self.obs_ndim), action], axis=-1)
        q1 = _MLP(self.hidden, 1, self.activation, name="q1")(x)[..., 0]
        q2 = _MLP(self.hidden, 1, self.activation, name="q2")(x)[..., 0]
        return q1, q2


class Networks(NamedTuple):
    actor: Actor
    critic: TwinCritic


def make_networks(config: Config, env: Env) -> Networks:
    """The actor and twin critic for `env` (dense now; RLx2's sparse masks are to be added here by config)."""
    obs_ndim = len(env.observation_shape)
    hidden = tuple(config.hidden)
    return Networks(
        actor=Actor(action_dim(env), hidden, config.activation, obs_ndim),
        critic=TwinCritic(hidden, config.activation, obs_ndim),
    )


def make_optimizer(config: Config, lr: float) -> optax.GradientTransformation:
    """Adam (RLx2: 3e-4 for actor and critic). Sparse training will chain its mask transform here."""
    del config
    return optax.adam(lr)


def action_scaling(env: Env) -> tuple[np.ndarray, np.ndarray]:
    """(center, half_range) [|A|]: env action = center + half_range · a for a in [-1, 1]."""
    low = np.asarray(env.action_space.low, np.float32)
    high = np.asarray(env.action_space.high, np.float32)
    return (high + low) / 2.0, (high - low) / 2.0


# ---- the algorithm -------------------------------------------------------------------------


class _Learner(NamedTuple):
    actor_params: Any
    critic_params: Any
    actor_target_params: Any
    critic_target_params: Any
    actor_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    gradient_steps: jax.Array
    critic_loss_sum: jax.Array
    actor_loss_sum: jax.Array
    actor_updates: jax.Array
    q_sum: jax.Array
    nstep_sum: jax.Array


def make_algorithm(config: Config, env: Env) -> Algorithm:
    """TD3 for `env` (continuous actions). The config is checked here, on the host, before any tracing."""
    config.validate(env)
    num_envs = config.num_envs
    num_actions = action_dim(env)
    nets = make_networks(config, env)
    actor_opt = make_optimizer(config, config.actor_lr)
    critic_opt = make_optimizer(config, config.critic_lr)
    center, half_range = action_scaling(env)
    capacity = config.buffer_capacity // num_envs  # ring slots, each one env step of every env
    rule = dynamic.make_dynamic_replay(
        max_size=config.buffer_capacity,
        min_size=min(config.buffer_min_size, config.buffer_capacity),
        num_oldest=min(config.num_oldest, config.buffer_capacity),
        threshold=config.buffer_threshold,
        shrink=config.buffer_shrink,
        distance=config.buffer_distance,
        streams=num_envs,
    )
    start = config.learning_start_step

    def to_env(action: jax.Array) -> jax.Array:
        return center + half_range * action

    def init(key: jax.Array) -> TD3State:
        key, actor_key, critic_key, reset_key = jax.random.split(key, 4)
        example_obs = jnp.zeros(env.observation_shape, jnp.float32)
        example_action = jnp.zeros((num_actions,), jnp.float32)
        actor_params = nets.actor.init(actor_key, example_obs)
        critic_params = nets.critic.init(critic_key, example_obs, example_action)
        obs, env_state = jax.vmap(env.reset)(jax.random.split(reset_key, num_envs))
        row = Transition(
            obs=example_obs, action=example_action, reward=jnp.zeros(()), next_obs=example_obs,
            terminated=jnp.zeros((), jnp.bool_), truncated=jnp.zeros((), jnp.bool_),
            reference_action=example_action,
        )
        row = jax.tree.map(lambda x: jnp.broadcast_to(x, (num_envs,) + x.shape), row)
        return TD3State(
            actor_params=actor_params,
            critic_params=critic_params,
            actor_target_params=actor_params,
            critic_target_params=critic_params,
            actor_opt_state=actor_opt.init(actor_params),
            critic_opt_state=critic_opt.init(critic_params),
            buffer=replay.init(row, capacity),
            env_state=env_state,
            obs=obs.astype(jnp.float32),
            key=key,
            env_steps=jnp.zeros((), jnp.int32),
            gradient_steps=jnp.zeros((), jnp.int32),
            buffer_distance=jnp.zeros((), jnp.float32),
        )

    # The gated branches below are `lockstep_cond`s (cheap under vmap when skipped), so they take every
    # traced value as an argument and close over none.

    def actor_and_targets(operand: tuple[_Learner, Any, jax.Array]) -> tuple[Any, Any, Any, Any, jax.Array]:
        """The delayed part of a gradient step: actor on −Q1(s, π(s)), then Polyak updates of both targets."""
        learner, critic_params, obs = operand

        def actor_objective(params: Any) -> jax.Array:
            q1, _ = nets.critic.apply(critic_params, obs, nets.actor.apply(params, obs))
            return actor_loss(q1)

        a_loss, grads = jax.value_and_grad(actor_objective)(learner.actor_params)
        updates, opt_state = actor_opt.update(grads, learner.actor_opt_state, learner.actor_params)
        actor_params = optax.apply_updates(learner.actor_params, updates)
        actor_target = optax.incremental_update(actor_params, learner.actor_target_params, config.tau)
        critic_target = optax.incremental_update(critic_params, learner.critic_target_params, config.tau)
        return actor_params, opt_state, actor_target, critic_target, a_loss

    def skip_actor(operand: tuple[_Learner, Any, jax.Array]) -> tuple[Any, Any, Any, Any, jax.Array]:
        learner = operand[0]
        return (learner.actor_params, learner.actor_opt_state, learner.actor_target_params,
                learner.critic_target_params, jnp.zeros((), jnp.float32))

    def gradient_step(learner: _Learner, buffer: replay.BufferState, key: jax.Array) -> _Learner:
        sample_key, noise_key = jax.random.split(key)
        iteration = learner.gradient_steps + 1
        n_active = jnp.where(iteration >= config.nstep_delay, config.nstep, 1).astype(jnp.int32)
        batch: Transition = nstep.sample_windows(buffer, sample_key, config.batch_size, config.nstep, n_active)
        terms = returns.nstep_terms(batch.reward, batch.terminated, batch.truncated, config.gamma, n_active)

        # Target: smoothed target action at the bootstrap state s'_m only.
        boot_obs = returns.at_index(batch.next_obs, terms.boot_index)
        boot_action = smoothed_target_action(
            nets.actor.apply(learner.actor_target_params, boot_obs), noise_key,
            config.target_noise, config.target_noise_clip,
        )
        q1_t, q2_t = nets.critic.apply(learner.critic_target_params, boot_obs, boot_action)
        target = returns.nstep_q_target(terms, jnp.minimum(q1_t, q2_t))

        obs, action = batch.obs[:, 0], batch.action[:, 0]

        def critic_objective(params: Any) -> tuple[jax.Array, jax.Array]:
            q1, q2 = nets.critic.apply(params, obs, action)
            return critic_loss(q1, q2, target), jnp.mean(q1)

        (c_loss, q_mean), grads = jax.value_and_grad(critic_objective, has_aux=True)(learner.critic_params)
        updates, critic_opt_state = critic_opt.update(grads, learner.critic_opt_state, learner.critic_params)
        critic_params = optax.apply_updates(learner.critic_params, updates)

        do_actor = iteration % config.policy_delay == 0
        actor_params, actor_opt_state, actor_target, critic_target, a_loss = dynamic.lockstep_cond(
            do_actor, actor_and_targets, skip_actor, (learner, critic_params, obs)
        )
        return _Learner(
            actor_params=actor_params,
            critic_params=critic_params,
            actor_target_params=actor_target,
            critic_target_params=critic_target,
            actor_opt_state=actor_opt_state,
            critic_opt_state=critic_opt_state,
            gradient_steps=iteration,
            critic_loss_sum=learner.critic_loss_sum + c_loss,
            actor_loss_sum=learner.actor_loss_sum + a_loss,
            actor_updates=learner.actor_updates + do_actor.astype(jnp.float32),
            q_sum=learner.q_sum + q_mean,
            nstep_sum=learner.nstep_sum + n_active.astype(jnp.float32),
        )

    def policy_and_reference(actor_params: Any, items: Transition) -> tuple[jax.Array, jax.Array]:
        """The dynamic buffer's (π(s), ā) on stored items [R, S, ...]."""
        return nets.actor.apply(actor_params, items.obs), items.reference_action

    def update(state: TD3State) -> tuple[TD3State, dict[str, jax.Array]]:
        key, noise_key, random_key, step_key, learn_key = jax.random.split(state.key, 5)

        # Act: uniform random actions during warm-up, then the policy plus Gaussian noise.
        policy_action = nets.actor.apply(state.actor_params, state.obs)  # [N, |A|]
        noisy_action = exploration_action(policy_action, noise_key, config.exploration_noise)
        random_action = jax.random.uniform(random_key, (num_envs, num_actions), minval=-1.0, maxval=1.0)
        warmup = (state.env_steps + jnp.arange(num_envs)) < start  # per env step index
        action = jnp.where(warmup[:, None], random_action, noisy_action)
        reference_action = jnp.where(warmup[:, None], random_action, policy_action)
        out = jax.vmap(env.step)(jax.random.split(step_key, num_envs), state.env_state, to_env(action))
        row = Transition(state.obs, action, out.reward, out.final_obs, out.terminated, out.truncated,
                         reference_action)
        buffer = replay.add(state.buffer, jax.tree.map(lambda x: x[None], row))
        env_steps_tm1, env_steps_t = state.env_steps, state.env_steps + num_envs

        # Dynamic capacity: check the policy distance over the oldest data, drop them if it is too large.
        buffer_distance = state.buffer_distance
        if config.dynamic_buffer:
            due = dynamic.check_due(env_steps_tm1, env_steps_t, config.buffer_check_interval)
            buffer, info = dynamic.maybe_adjust(due, buffer, rule, policy_and_reference, state.actor_params)
            buffer_distance = jnp.where(due, info.distance, state.buffer_distance)

        # Learn: one gradient step per env step past the learning start.
        num_grad = jnp.clip(env_steps_t - jnp.maximum(env_steps_tm1, start), 0, num_envs)

        def maybe_step(learner: _Learner, slot_and_key: tuple[jax.Array, jax.Array]) -> tuple[_Learner, None]:
            slot, slot_key = slot_and_key
            learner = dynamic.lockstep_cond(
                slot < num_grad, lambda op: gradient_step(*op), lambda op: op[0], (learner, buffer, slot_key)
            )
            return learner, None

        zero = jnp.zeros((), jnp.float32)
        learner0 = _Learner(
            state.actor_params, state.critic_params, state.actor_target_params, state.critic_target_params,
            state.actor_opt_state, state.critic_opt_state, state.gradient_steps, zero, zero, zero, zero, zero,
        )
        slots = (jnp.arange(config.gradient_steps_per_update), jax.random.split(learn_key, config.gradient_steps_per_update))
        learner, _ = jax.lax.scan(maybe_step, learner0, slots)

        steps = jnp.maximum(num_grad, 1).astype(jnp.float32)
        metrics = {
            **episode_metrics(out.info),
            "critic_loss": learner.critic_loss_sum / steps,  # means over this update's steps; 0 if none
            "actor_loss": learner.actor_loss_sum / jnp.maximum(learner.actor_updates, 1.0),
            "q_mean": learner.q_sum / steps,
            "nstep": learner.nstep_sum / steps,  # the target horizon in use (1 before the delay)
            "buffer_size": (buffer.size * num_envs).astype(jnp.float32),  # valid transitions
            "buffer_distance": buffer_distance,
        }
        new_state = TD3State(
            actor_params=learner.actor_params,
            critic_params=learner.critic_params,
            actor_target_params=learner.actor_target_params,
            critic_target_params=learner.critic_target_params,
            actor_opt_state=learner.actor_opt_state,
            critic_opt_state=learner.critic_opt_state,
            buffer=buffer,
            env_state=out.state,
            obs=out.obs.astype(jnp.float32),
            key=key,
            env_steps=env_steps_t,
            gradient_steps=learner.gradient_steps,
            buffer_distance=buffer_distance,
        )
        return new_state, metrics

    def policy(state: TD3State) -> Any:
        return state.actor_params

    def act(policy_params: Any, obs: jax.Array, key: jax.Array) -> jax.Array:
        """Deterministic action for ONE observation [*obs_shape], in env units [|A|] (the key is unused)."""
        del key
        return to_env(nets.actor.apply(policy_params, obs))

    return Algorithm(
        init=init,
        update=update,
        policy=policy,
        act=act,
        env_steps_per_update=config.env_steps_per_update,
        num_updates=config.num_updates,
    )


def make_train(config: Config, env: Env) -> Callable[[jax.Array], tuple[TD3State, dict[str, jax.Array]]]:
    """The whole run as `train(key) -> (state, metrics [num_updates])`, jittable and vmappable over keys."""
    return make_train_fn(make_algorithm(config, env))

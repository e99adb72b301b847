"""PPO as an `Algorithm`: one update = a rollout of `num_steps` in `num_envs` envs, GAE, minibatch SGD.

The layout follows PureJaxRL's `ppo.py` (separate actor and critic MLPs, Adam with eps 1e-5 after
global-norm clipping, advantages normalised per minibatch), with two corrections: time-limit
truncation bootstraps from V(final_obs) instead of being treated as termination, and observation /
reward normalisation live in the agent state rather than in environment wrappers, so the saved
policy (`policy(state)`) carries the observation statistics it was trained with.

Everything here is for ONE seed; `jax.vmap(make_train(config, env))(keys)` runs many.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sparqrl import sparse
from sparqrl.algos import sparsify
from sparqrl.algos.actor_critic import PolicyParams, make_acting, sample_with_noise, sampling_noise
from sparqrl.algos.base import (
    ActorLearner, Algorithm, Step, clipped_adam, episode_metrics, has_tracers, make_hparams_train_fn,
)
from sparqrl.algos.ppo.config import Config
from sparqrl.algos.ppo.losses import LossInfo, bootstrap_values, gae, policy_loss, ppo_loss
from sparqrl.algos.ppo.objectives import (
    MetaParams,
    dpo_drift,
    learned_value_loss,
    lpo_drift,
    meta_params_for,
    rule_kind,
)
from sparqrl.envs import (
    Env,
    RunningStats,
    action_dim,
    is_discrete,
    normalize,
    running_stats_init,
    running_stats_update,
)
from sparqrl.nets import ActorCritic, cnn_kind


class PPOState(NamedTuple):
    """Training state of one seed. The normaliser fields are None when that normalisation is off."""

    params: Any
    opt_state: optax.OptState
    env_state: Any  # [num_envs] pytree
    obs: jax.Array  # [num_envs, *obs_shape], raw (unnormalised) observations the envs are in
    key: jax.Array
    obs_stats: RunningStats | None  # running mean/var of observations
    return_stats: RunningStats | None  # running mean/var of the discounted return (reward scaling)
    discounted_return: jax.Array | None  # [num_envs] discounted return of the running episodes


class Transition(NamedTuple):
    """One rollout step of every env; after the scan each field has leading axes [T, B]."""

    obs: jax.Array  # normalised observation the action was taken in
    action: jax.Array  # the raw sample (continuous: before clipping to the action bounds)
    log_prob: jax.Array
    value: jax.Array
    reward: jax.Array  # scaled reward when normalize_reward
    terminated: jax.Array
    truncated: jax.Array  # a time limit ended the episode (it bootstraps from truncated_value)
    done: jax.Array  # terminated | truncated
    truncated_value: jax.Array  # V(observation reached before the auto-reset) where truncated, else 0
    info: dict[str, jax.Array]


class Batch(NamedTuple):
    """The learning batch; [N, ...] after flattening time and envs."""

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    advantages: jax.Array
    targets: jax.Array


class Learner(NamedTuple):
    """The part of the state that SGD changes."""

    params: Any
    opt_state: optax.OptState


def policy_objective_for(config: Config, meta_params: MetaParams | None = None
                         ) -> Callable[[jax.Array, jax.Array, jax.Array], jax.Array] | None:
    """The policy loss of `config.objective` for `ppo_loss`: None for PPO-clip (its own surrogate), else
    -mean(r * A - drift(r, A)) over minibatch-normalised advantages (`policy_loss` with a drift), with DPO's
    drift or the LPO network of `meta_params.lpo` (PPO-clip's drift plus the network's output). meta_params:
    as `meta_params_for` resolved them (needed for 'lpo' only)."""
    kind = rule_kind(config.objective)
    if kind == "ppo-clip":
        return None
    if kind == "lpo":
        drift = lambda r, a: lpo_drift(meta_params.lpo, r, a, config.clip_eps)  # noqa: E731
    else:
        drift = lambda r, a: dpo_drift(r, a, config.dpo_alpha, config.dpo_beta)  # noqa: E731

    def objective(log_prob: jax.Array, old_log_prob: jax.Array, advantages: jax.Array) -> jax.Array:
        return policy_loss(log_prob, old_log_prob, advantages, config.clip_eps, drift=drift)

    return objective


def value_objective_for(config: Config, meta_params: MetaParams | None = None
                        ) -> Callable[[jax.Array, jax.Array, jax.Array], jax.Array] | None:
    """The value loss of `config.value_loss` for `ppo_loss`: None for 'l2' and 'clipped' (`ppo_loss`'s
    own, with clip_value), else the learned loss mean(0.5 d^2 + net(d)), d = v - t, of
    `meta_params.value_loss` (resolved by `meta_params_for`)."""
    if rule_kind(config.value_loss) != "learned":
        return None
    return lambda values, old_values, targets: learned_value_loss(meta_params.value_loss, values, targets)


def make_optimizer(config: Config) -> optax.GradientTransformation:
    """Adam (eps 1e-5) after global-norm clipping, its rate annealed linearly to 0 over the run if asked."""
    learning_rate = (
        optax.linear_schedule(config.lr, 0.0, config.num_optimizer_steps) if config.anneal_lr else config.lr
    )
    return clipped_adam(learning_rate, config.max_grad_norm, eps=1e-5)


def make_training(config: Config) -> sparse.NetTraining:
    """`make_optimizer`, masked and scheduled when `config.sparse` is: `sparse.transform` of it is the
    learner's optimizer, `sparse.init_transform` its first parameters and state."""
    return sparsify.learner_training(config, make_optimizer(config), config.num_optimizer_steps)


def make_learn_batch(config: Config, network: ActorCritic, optimizer: optax.GradientTransformation,
                     meta_params: MetaParams | None = None, *, unroll: bool = False
                     ) -> Callable[[Learner, Batch, jax.Array], tuple[Learner, dict[str, jax.Array]]]:
    """PPO's learning step on one batch [T, B] (both runners): `update_epochs` passes, each over the batch
    shuffled and split into `num_minibatches` minibatches, one Adam step per minibatch. Returns the
    learner and the loss terms' means over every minibatch.

    unroll: the epochs and minibatches as straight-line code instead of loops. For a CNN learned outside any
    loop (the host learner): XLA's CPU back-end runs a convolution's gradient inside a loop body about 10x
    slower than outside one (jax-ml/jax#12868; Nature CNN, batch 32: 0.23 s vs 0.023 s per gradient here)."""

    policy_objective = policy_objective_for(config, meta_params)
    value_objective = value_objective_for(config, meta_params)

    def loss_fn(params: Any, batch: Batch) -> tuple[jax.Array, LossInfo]:
        dist, values = network.apply(params, batch.obs)
        return ppo_loss(
            dist.log_prob(batch.action),
            batch.log_prob,
            batch.advantages,
            values,
            batch.value,
            batch.targets,
            dist.entropy(),
            clip_eps=config.clip_eps,
            clip_value=config.value_loss == "clipped",
            vf_coef=config.vf_coef,
            ent_coef=config.ent_coef,
            policy_objective=policy_objective,
            value_objective=value_objective,
        )

    def sgd_step(carry: tuple[Learner, LossInfo], minibatch: Batch) -> tuple[tuple[Learner, LossInfo], None]:
        learner, info_sum = carry
        grads, info = jax.grad(loss_fn, has_aux=True)(learner.params, minibatch)
        updates, opt_state = optimizer.update(grads, learner.opt_state, learner.params)
        learner = Learner(optax.apply_updates(learner.params, updates), opt_state)
        return (learner, jax.tree.map(jnp.add, info_sum, info)), None

    def learn_batch(learner: Learner, batch: Batch, key: jax.Array) -> tuple[Learner, dict[str, jax.Array]]:
        batch = jax.tree.map(lambda x: x.reshape((config.batch_size, *x.shape[2:])), batch)

        def epoch(carry: tuple[Learner, LossInfo], key: jax.Array) -> tuple[tuple[Learner, LossInfo], None]:
            permutation = jax.random.permutation(key, config.batch_size)
            minibatches = jax.tree.map(
                lambda x: x[permutation].reshape((config.num_minibatches, config.minibatch_size, *x.shape[1:])),
                batch,
            )
            return jax.lax.scan(sgd_step, carry, minibatches, unroll=unroll)

        # the loss terms summed in the loop's carry (not stacked per minibatch: fewer kernels per step)
        zeros = LossInfo(*(jnp.zeros((), jnp.float32) for _ in LossInfo._fields))
        keys = jax.random.split(key, config.update_epochs)
        (learner, info_sum), _ = jax.lax.scan(epoch, (learner, zeros), keys, unroll=unroll)
        count = config.update_epochs * config.num_minibatches
        return learner, {name: value / count for name, value in info_sum._asdict().items()}

    return learn_batch


def make_algorithm(config: Config, env: Env, meta_params: MetaParams | dict | None = None) -> Algorithm:
    """PPO over `env` (Discrete or Box actions). Raises `ConfigError` before tracing on a bad config.

    meta_params: the weights of a learned objective ('lpo') or value loss ('learned') as inputs, so that a
    population of them vmaps (`sparqrl.meta`): a `MetaParams` or a dict with keys 'lpo' / 'value_loss'.
    None: read from the files the config names ('lpo:PATH', 'learned:PATH'), on the host.
    """
    if not has_tracers(config):
        config.validate(env)
    meta_params = meta_params_for(config.objective, config.value_loss, meta_params)
    discrete = is_discrete(env)
    network = ActorCritic(
        action_dim=action_dim(env),
        discrete=discrete,
        obs_shape=tuple(env.observation_shape),
        hidden=tuple(config.hidden),
        activation=config.activation,
        torso=config.torso,
    )
    training = make_training(config)
    optimizer = sparse.transform(training)
    if not discrete:
        action_low = np.asarray(env.action_space.low, np.float32)
        action_high = np.asarray(env.action_space.high, np.float32)

    def init_params(key: jax.Array) -> Any:
        return network.init(key, jnp.zeros((1, *env.observation_shape), jnp.float32))

    def observe(obs_stats: RunningStats | None, obs: jax.Array) -> jax.Array:
        return obs if obs_stats is None else normalize(obs_stats, obs)

    def env_action(action: jax.Array) -> jax.Array:
        # The Gaussian sample is kept raw for the log-probability; only the env sees it clipped.
        return action if discrete else jnp.clip(action, action_low, action_high)

    def init(key: jax.Array) -> PPOState:
        key, params_key, reset_key = jax.random.split(key, 3)
        obs, env_state = jax.vmap(env.reset)(jax.random.split(reset_key, config.num_envs))
        obs = obs.astype(jnp.float32)
        params, opt_state = sparse.init_transform(training, params_key, init_params(params_key))
        obs_stats = None
        if config.normalize_obs:
            obs_stats = running_stats_update(running_stats_init(tuple(env.observation_shape)), obs)
        return_stats = discounted_return = None
        if config.normalize_reward:
            return_stats = running_stats_init(())
            discounted_return = jnp.zeros((config.num_envs,), jnp.float32)
        return PPOState(
            params=params,
            opt_state=opt_state,
            env_state=env_state,
            obs=obs,
            key=key,
            obs_stats=obs_stats,
            return_stats=return_stats,
            discounted_return=discounted_return,
        )

    def rollout_step(state: PPOState, inputs: tuple[jax.Array, jax.Array]) -> tuple[PPOState, Transition]:
        env_keys, noise = inputs  # drawn for the whole rollout in `update`
        obs = observe(state.obs_stats, state.obs)
        dist, value = network.apply(state.params, obs)
        action = sample_with_noise(dist, noise)
        log_prob = dist.log_prob(action)
        out = jax.vmap(env.step)(env_keys, state.env_state, env_action(action))
        done = jnp.logical_or(out.terminated, out.truncated)
        next_obs = out.obs.astype(jnp.float32)

        obs_stats = state.obs_stats
        if obs_stats is not None:
            obs_stats = running_stats_update(obs_stats, next_obs)
        reward = out.reward.astype(jnp.float32)
        return_stats, discounted_return = state.return_stats, state.discounted_return
        if return_stats is not None:
            # Scale by the std of the discounted return G <- gamma * G + r (no mean subtracted, so the
            # sign of rewards is kept); G restarts after each episode end.
            discounted_return = config.gamma * discounted_return + reward
            return_stats = running_stats_update(return_stats, discounted_return)
            reward = reward / jnp.sqrt(return_stats.var + 1e-8)
            discounted_return = jnp.where(done, 0.0, discounted_return)

        # V(final observation) bootstraps only a time-limit truncation (a termination does not, and an
        # episode that goes on uses the next step's value), so it is computed only at steps where some env
        # was truncated: always computing it cost ~8 % of a 1-seed CartPole run.
        truncated_value = jax.lax.cond(
            jnp.any(out.truncated),
            lambda final_obs: network.apply(state.params, observe(obs_stats, final_obs))[1],
            lambda final_obs: jnp.zeros_like(value),
            out.final_obs.astype(jnp.float32),
        )
        transition = Transition(
            obs=obs,
            action=action,
            log_prob=log_prob,
            value=value,
            reward=reward,
            terminated=out.terminated,
            truncated=out.truncated,
            done=done,
            truncated_value=truncated_value,
            info=out.info,
        )
        state = state._replace(
            env_state=out.state,
            obs=next_obs,
            obs_stats=obs_stats,
            return_stats=return_stats,
            discounted_return=discounted_return,
        )
        return state, transition

    learn_batch = make_learn_batch(config, network, optimizer, meta_params)

    def update(state: PPOState) -> tuple[PPOState, dict[str, jax.Array]]:
        key, env_key, noise_key, epoch_key = jax.random.split(state.key, 4)
        # every step's env keys and sampling noise at once: a random-number program per update, not per step
        env_keys = jax.random.split(env_key, (config.num_steps, config.num_envs))
        noise = sampling_noise(noise_key, (config.num_steps, config.num_envs, action_dim(env)), discrete)
        state, traj = jax.lax.scan(rollout_step, state._replace(key=key), (env_keys, noise))
        _, last_value = network.apply(state.params, observe(state.obs_stats, state.obs))
        next_values = bootstrap_values(traj.value, last_value, traj.truncated, traj.truncated_value)
        advantages, targets = gae(
            traj.reward, traj.value, next_values, traj.terminated, traj.done, config.gamma, config.gae_lambda
        )
        batch = Batch(traj.obs, traj.action, traj.log_prob, traj.value, advantages, targets)
        learner, losses = learn_batch(Learner(state.params, state.opt_state), batch, epoch_key)
        state = state._replace(params=learner.params, opt_state=learner.opt_state)
        return state, {**episode_metrics(traj.info), **losses}

    def policy(state: PPOState) -> PolicyParams:
        return PolicyParams(state.params, state.obs_stats)

    def act(policy_params: PolicyParams, obs: jax.Array, key: jax.Array) -> jax.Array:
        """Deterministic action for ONE observation: argmax of the logits, or the clipped mean."""
        del key  # deterministic
        dist, _ = network.apply(policy_params.params, observe(policy_params.obs_stats, obs.astype(jnp.float32)))
        if discrete:
            return jnp.argmax(dist.logits, axis=-1).astype(jnp.int32)
        return env_action(dist.mean())

    def sample(policy_params: PolicyParams, obs: jax.Array, key: jax.Array) -> jax.Array:
        """An action drawn from the policy for ONE observation, as the rollouts draw it."""
        dist, _ = network.apply(policy_params.params, observe(policy_params.obs_stats, obs.astype(jnp.float32)))
        action = dist.sample(seed=key)
        return action.astype(jnp.int32) if discrete else env_action(action)

    return Algorithm(
        init=init,
        update=update,
        policy=policy,
        act=act,
        env_steps_per_update=config.batch_size,
        num_updates=config.num_updates,
        sample=sample,
        summary=sparsify.learner_summary(config, training, jax.eval_shape(init_params, jax.random.key(0))),
    )


def make_train(config: Config, env: Env):
    """The whole run as `train(key, hparams=None) -> (PPOState, metrics [num_updates])` (`base.make_hparams_train_fn`)."""
    return make_hparams_train_fn(make_algorithm, config.validate(env), env)


# ---- actor-learner runner (host environments) ------------------------------------------------------


class HostLearner(NamedTuple):
    """The actor-learner runner's learner of one seed: PPO's networks and optimizer, and the normalisers
    the actors act with (published with each version in `Acting.aux`)."""

    params: Any
    opt_state: optax.OptState
    obs_stats: RunningStats | None
    return_stats: RunningStats | None
    key: jax.Array
    env_steps: jax.Array  # int32 [], env steps learned from (all fragments of this seed)
    gradient_steps: jax.Array  # int32 [], Adam steps taken


def fragment_advantages(config: Config, values: jax.Array, next_values: jax.Array, steps: Step,
                        reward: jax.Array) -> tuple[jax.Array, jax.Array]:
    """GAE (advantages, targets) [T, N] of a fragment: `next_values[t]` = V(steps.next_obs[t]), the
    observation step t reached before any auto-reset, so a truncated episode bootstraps from its final
    observation and a going-on one from the next step's (the same observation); `gae` cuts at every end."""
    done = jnp.logical_or(steps.terminated, steps.truncated)
    return gae(reward, values, next_values, steps.terminated, done, config.gamma, config.gae_lambda)


def make_actor_learner(config: Config, spec: Any) -> ActorLearner:
    """PPO for the actor-learner runner on a host env `spec` (`HostSpec`). Actors sample from the policy
    copy they were handed and send the behaviour log-probabilities; the learner takes one fragment [T =
    num_steps, N = num_envs] as PureJaxRL's update takes one rollout: values and GAE under its current
    network (at lag 0 the rollout's), then the same epochs of minibatch SGD as on device (`make_learn_batch`).
    Fragments of an older policy are PPO's ratio to the behaviour policy (APPO); the runner drops those more
    than `--max-lag` updates old. Normalisers live in the learner: observations are normalised with the
    statistics of the version the actors hold (those before the fragment), then the fragment updates them;
    rewards are scaled by the std of the discounted return the actors report (`Acting.return_gamma`)."""
    config = config.validate(spec)
    obs_shape = tuple(spec.observation_shape)
    discrete = is_discrete(spec)
    network = ActorCritic(action_dim=action_dim(spec), discrete=discrete, obs_shape=obs_shape,
                          hidden=tuple(config.hidden), activation=config.activation, torso=config.torso)
    training = make_training(config)
    learn_batch = make_learn_batch(config, network, sparse.transform(training), meta_params_for(config.objective, config.value_loss),
                                   unroll=cnn_kind(obs_shape, config.torso) is not None)

    def observe(obs_stats: RunningStats | None, obs: jax.Array) -> jax.Array:
        obs = jnp.asarray(obs, jnp.float32)
        return obs if obs_stats is None else normalize(obs_stats, obs)

    def init_params(key: jax.Array) -> Any:
        return network.init(key, jnp.zeros((1, *obs_shape), jnp.float32))

    def init(key: jax.Array) -> HostLearner:
        key, params_key = jax.random.split(key)
        params, opt_state = sparse.init_transform(training, params_key, init_params(params_key))
        return HostLearner(
            params=params,
            opt_state=opt_state,
            obs_stats=running_stats_init(obs_shape) if config.normalize_obs else None,
            return_stats=running_stats_init(()) if config.normalize_reward else None,
            key=key,
            env_steps=jnp.zeros((), jnp.int32),
            gradient_steps=jnp.zeros((), jnp.int32),
        )

    def learn(learner: HostLearner, steps: Step) -> tuple[HostLearner, dict[str, jax.Array]]:
        """One PPO update on a fragment (`Step` leaves [T, N, ...]; `steps.extra`: behaviour log-probs)."""
        key, epoch_key = jax.random.split(learner.key)
        flat = lambda x: x.reshape((-1, *x.shape[2:]))  # noqa: E731  [T, N, ...] -> [T * N, ...]
        obs, next_obs = observe(learner.obs_stats, steps.obs), observe(learner.obs_stats, steps.next_obs)
        obs_stats = learner.obs_stats
        if obs_stats is not None:
            obs_stats = running_stats_update(obs_stats, flat(jnp.asarray(steps.next_obs, jnp.float32)))
        reward, return_stats = jnp.asarray(steps.reward, jnp.float32), learner.return_stats
        if return_stats is not None:
            return_stats = running_stats_update(return_stats, flat(steps.discounted_return))
            reward = reward / jnp.sqrt(return_stats.var + 1e-8)
        _, values = network.apply(learner.params, obs)
        _, next_values = network.apply(learner.params, next_obs)
        advantages, targets = fragment_advantages(config, values, next_values, steps, reward)
        batch = Batch(obs, steps.action, steps.extra, values, advantages, targets)
        trained, metrics = learn_batch(Learner(learner.params, learner.opt_state), batch, epoch_key)
        return HostLearner(
            params=trained.params,
            opt_state=trained.opt_state,
            obs_stats=obs_stats,
            return_stats=return_stats,
            key=key,
            env_steps=learner.env_steps + config.batch_size,
            gradient_steps=learner.gradient_steps + config.update_epochs * config.num_minibatches,
        ), metrics

    def policy(learner: HostLearner) -> PolicyParams:
        return PolicyParams(learner.params, learner.obs_stats)

    return ActorLearner(
        init=init, learn=learn, policy=policy,
        acting=make_acting(network, spec, config.normalize_obs, config.gamma if config.normalize_reward else None),
        num_envs=config.num_envs, steps_per_env=config.num_updates * config.num_steps,
        fragment_steps=config.num_steps, on_policy=True,
        summary=sparsify.learner_summary(config, training, jax.eval_shape(init_params, jax.random.key(0))),
    )

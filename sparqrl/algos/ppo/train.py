"""PPO's one learner (`make_actor_learner`), driven by both runners: one update = a fragment of `num_steps`
steps of `num_envs` envs (rolled out on device by `base.on_device`, or sent by host actors), GAE, minibatch SGD.

The layout follows PureJaxRL's `ppo.py` (separate actor and critic MLPs, Adam with eps 1e-5 after
global-norm clipping, advantages normalised per minibatch), with two corrections: time-limit
truncation bootstraps from V(final_obs) instead of being treated as termination, and observation /
reward normalisation live in the learner rather than in environment wrappers, so the saved
policy (`policy(state)`) carries the observation statistics it was trained with.

Everything here is for ONE seed; `jax.vmap(make_train(config, env))(keys)` runs many.
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
    ActorLearner, Algorithm, Step, clipped_adam, has_tracers, make_hparams_train_fn, on_device,
)
from sparqrl.algos.ppo.config import Config
from sparqrl.algos.ppo.losses import gae, policy_loss, ppo_loss
from sparqrl.algos.ppo.objectives import (
    MetaParams,
    dpo_drift,
    learned_value_loss,
    lpo_drift,
    meta_params_for,
    rule_kind,
)
from sparqrl.algos.recurrent import env_minibatches, fragment_outputs, sequence_outputs
from sparqrl.envs import Env, RunningStats, normalize, running_stats_init, running_stats_update
from sparqrl.nets import ActorCritic, cnn_kind
from sparqrl.nets.memory import RecurrentActorCritic, sequence_resets
from sparqrl.nets.torso import check_torsos


class Batch(NamedTuple):
    """The learning batch; [N, ...] after flattening time and envs."""

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    advantages: jax.Array
    targets: jax.Array
    memory: Any = None  # a recurrent policy's per-step states [T, N, ...] (`Step.memory`); None: feed-forward
    reset: Any = None  # [T, N]: where an episode starts inside the fragment (with memory)


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


BatchLoss = Callable[[jax.Array, jax.Array, jax.Array, Batch], tuple[jax.Array, dict[str, jax.Array]]]
"""loss(log π(a|s), V(s), entropy, minibatch) -> (scalar loss, its terms by name): the first three [N] under the
parameters being learned, the minibatch's fields [N, ...] from the fragment."""


class Rule(NamedTuple):
    """What the learner learns with: the optimizer (`training`: masked and scheduled when sparse, as
    `make_training`) and the loss of a minibatch. PPO's is `ppo_rule`; A2C's (`sparqrl.algos.a2c`) is RMSProp on
    the vanilla policy-gradient loss, learned in one pass of one minibatch."""

    training: sparse.NetTraining
    loss: BatchLoss


def ppo_rule(config: Config, meta_params: MetaParams | dict | None = None) -> Rule:
    """PPO's `Rule`: `make_training`'s Adam and `ppo_loss` with the config's objective and value loss, their
    meta-parameters resolved by `meta_params_for` (as `make_actor_learner` takes them)."""
    meta_params = meta_params_for(config.objective, config.value_loss, meta_params)
    policy_objective = policy_objective_for(config, meta_params)
    value_objective = value_objective_for(config, meta_params)

    def loss(log_prob: jax.Array, values: jax.Array, entropy: jax.Array, batch: Batch
             ) -> tuple[jax.Array, dict[str, jax.Array]]:
        total, info = ppo_loss(log_prob, batch.log_prob, batch.advantages, values, batch.value, batch.targets, entropy,
                               clip_eps=config.clip_eps, clip_value=config.value_loss == "clipped",
                               vf_coef=config.vf_coef, ent_coef=config.ent_coef,
                               policy_objective=policy_objective, value_objective=value_objective)
        return total, info._asdict()

    return Rule(make_training(config), loss)


def make_learn_batch(config: Config, network: ActorCritic, optimizer: optax.GradientTransformation,
                     loss: BatchLoss, *, unroll: bool = False
                     ) -> Callable[[Learner, Batch, jax.Array], tuple[Learner, dict[str, jax.Array]]]:
    """The learning step on one batch [T, B] (both runners): `update_epochs` passes, each over the batch
    shuffled and split into `num_minibatches` minibatches, one optimizer step on `loss` per minibatch.
    Returns the learner and the loss terms' means over every minibatch.

    unroll: the epochs and minibatches as straight-line code instead of loops. For a CNN learned outside any
    loop (the host learner): XLA's CPU back-end runs a convolution's gradient inside a loop body about 10x
    slower than outside one (jax-ml/jax#12868; Nature CNN, batch 32: 0.23 s vs 0.023 s per gradient here)."""

    recurrent = config.memory != "none"  # then a batch stays [T, N] and minibatches take whole environments

    def loss_fn(params: Any, batch: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
        if recurrent:
            dist, values, _ = sequence_outputs(network, params, batch.memory, batch.obs, batch.reset)
        else:
            dist, values = network.apply(params, batch.obs)
        return loss(dist.log_prob(batch.action), values, dist.entropy(), batch)

    def sgd_step(carry: tuple[Learner, dict], minibatch: Batch) -> tuple[tuple[Learner, dict], None]:
        learner, info_sum = carry
        grads, info = jax.grad(loss_fn, has_aux=True)(learner.params, minibatch)
        updates, opt_state = optimizer.update(grads, learner.opt_state, learner.params)
        learner = Learner(optax.apply_updates(learner.params, updates), opt_state)
        return (learner, jax.tree.map(jnp.add, info_sum, info)), None

    def learn_batch(learner: Learner, batch: Batch, keys: jax.Array) -> tuple[Learner, dict[str, jax.Array]]:
        """keys: [update_epochs], one per epoch's shuffle."""
        if not recurrent:
            batch = jax.tree.map(lambda x: x.reshape((config.batch_size, *x.shape[2:])), batch)

        def minibatches_of(key: jax.Array) -> Batch:
            if recurrent:
                return env_minibatches(batch, key, config.num_minibatches)
            permutation = jax.random.permutation(key, config.batch_size)
            return jax.tree.map(
                lambda x: x[permutation].reshape((config.num_minibatches, config.minibatch_size, *x.shape[1:])),
                batch,
            )

        def epoch(carry: tuple[Learner, dict], key: jax.Array) -> tuple[tuple[Learner, dict], None]:
            return jax.lax.scan(sgd_step, carry, minibatches_of(key), unroll=unroll)

        # the loss terms summed in the loop's carry (not stacked per minibatch: fewer kernels per step)
        terms = jax.eval_shape(lambda params, key: loss_fn(params, jax.tree.map(lambda x: x[0], minibatches_of(key))),
                               learner.params, keys[0])[1]
        zeros = jax.tree.map(lambda term: jnp.zeros(term.shape, term.dtype), terms)
        (learner, info_sum), _ = jax.lax.scan(epoch, (learner, zeros), keys, unroll=unroll)
        count = config.update_epochs * config.num_minibatches
        return learner, {name: value / count for name, value in info_sum.items()}

    return learn_batch


class LearnerState(NamedTuple):
    """PPO's learner of one seed (both runners): its networks and optimizer, and the normalisers the actors
    act with (published with each version in `Acting.aux`)."""

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


def fragment_values(network: ActorCritic | RecurrentActorCritic, learner: LearnerState, obs: jax.Array, steps: Step
                    ) -> tuple[jax.Array, jax.Array]:
    """(V(obs), V(next_obs)) [T, N] under the learner's network: those the runner computed while acting where
    it acted with this very network (`Step.value`, on device), else computed here on the normalised `obs`
    and the fragment's next observations (actors' copies may be older; a recurrent network re-run over the
    fragment, `recurrent.fragment_outputs`)."""
    if steps.value is not None:
        return steps.value, steps.next_value
    next_obs = jnp.asarray(steps.next_obs, jnp.float32)
    if learner.obs_stats is not None:
        next_obs = normalize(learner.obs_stats, next_obs)
    if steps.memory is not None:
        return fragment_outputs(network, learner.params, obs, next_obs, steps)[1:]
    return network.apply(learner.params, obs)[1], network.apply(learner.params, next_obs)[1]


def scaled_rewards(learner: LearnerState, steps: Step) -> tuple[jax.Array, RunningStats | None]:
    """The fragment's rewards [T, N] divided by the std of the discounted return (no mean subtracted, so their
    sign is kept), its statistics first updated with the returns the actors report; unscaled without them."""
    reward = jnp.asarray(steps.reward, jnp.float32)
    if learner.return_stats is None:
        return reward, None
    flat = steps.discounted_return.reshape(-1)
    return_stats = running_stats_update(learner.return_stats, flat)
    return reward / jnp.sqrt(return_stats.var + 1e-8), return_stats


def make_actor_learner(config: Config, env: Any, meta_params: MetaParams | dict | None = None, *,
                       unroll: bool | None = None, rule: Rule | None = None) -> ActorLearner:
    """PPO's learner for a JAX env (`make_algorithm`) or a host env spec (`HostSpec`). Actors sample from the
    policy copy they were handed and send the behaviour log-probabilities; the learner takes one fragment [T =
    num_steps, N = num_envs] as PureJaxRL's update takes one rollout: values and GAE under its current
    network (at lag 0 the rollout's: on device those computed while acting), then epochs of minibatch SGD
    (`make_learn_batch`). Fragments of an older policy are PPO's ratio to the behaviour policy (APPO); the
    actor-learner runner drops those more than `--max-lag` updates old. Normalisers live in the learner:
    observations are normalised with the statistics of the version the actors hold (those before the
    fragment), then the fragment updates them; rewards are scaled by the std of the discounted return the
    actors report (`Acting.return_gamma`).

    meta_params: the weights of a learned objective ('lpo') or value loss ('learned') as inputs, so that a
    population of them vmaps (`sparqrl.meta`): a `MetaParams` or a dict with keys 'lpo' / 'value_loss'.
    None: read from the files the config names ('lpo:PATH', 'learned:PATH'), on the host.
    unroll: epochs and minibatches as straight-line code (`make_learn_batch`); None: for a CNN torso, which
    the actor-learner runner learns outside any loop (on device the learner runs inside the update loop).
    rule: the optimizer and loss (`Rule`); None: PPO's (`ppo_rule`). A2C passes its own, with its config."""
    if not has_tracers(config):
        config = config.validate(env)
    obs_shape = tuple(env.observation_shape)
    check_torsos(config, obs_shape, ("actor", "critic"))
    network = make_network(config, env)
    rule = ppo_rule(config, meta_params) if rule is None else rule
    training = rule.training
    learn_batch = make_learn_batch(config, network, sparse.transform(training), rule.loss,
                                   unroll=cnn_kind(obs_shape, config.torso) is not None if unroll is None else unroll)

    def init_params(key: jax.Array) -> Any:
        return network.init(key, jnp.zeros((1, *obs_shape), jnp.float32))

    def init(key: jax.Array) -> LearnerState:
        key, params_key = jax.random.split(key)
        params, opt_state = sparse.init_transform(training, params_key, init_params(params_key))
        return LearnerState(params=params, opt_state=opt_state,
                            obs_stats=running_stats_init(obs_shape) if config.normalize_obs else None,
                            return_stats=running_stats_init(()) if config.normalize_reward else None,
                            key=key, env_steps=jnp.zeros((), jnp.int32), gradient_steps=jnp.zeros((), jnp.int32))

    def learn(learner: LearnerState, steps: Step) -> tuple[LearnerState, dict[str, jax.Array]]:
        """One PPO update on a fragment (`Step` leaves [T, N, ...]; `steps.extra`: behaviour log-probs)."""
        keys = jax.random.split(learner.key, 1 + config.update_epochs)  # the next key and each epoch's
        obs = jnp.asarray(steps.obs, jnp.float32)
        obs_stats = learner.obs_stats
        if obs_stats is not None:
            obs = normalize(obs_stats, obs)
            next_obs = jnp.asarray(steps.next_obs, jnp.float32)
            obs_stats = running_stats_update(obs_stats, next_obs.reshape((-1, *obs_shape)))
        values, next_values = fragment_values(network, learner, obs, steps)
        reward, return_stats = scaled_rewards(learner, steps)
        advantages, targets = fragment_advantages(config, values, next_values, steps, reward)
        batch = Batch(obs, steps.action, steps.extra, values, advantages, targets)
        if steps.memory is not None:
            batch = batch._replace(memory=steps.memory, reset=sequence_resets(steps.terminated, steps.truncated))
        trained, metrics = learn_batch(Learner(learner.params, learner.opt_state), batch, keys[1:])
        return LearnerState(trained.params, trained.opt_state, obs_stats, return_stats, keys[0],
                            learner.env_steps + config.batch_size,
                            learner.gradient_steps + config.update_epochs * config.num_minibatches), metrics

    def policy(learner: LearnerState) -> PolicyParams:
        return PolicyParams(learner.params, learner.obs_stats)

    acting = make_acting(network, env, config.normalize_obs, config.gamma if config.normalize_reward else None,
                         with_value=True)
    return ActorLearner(
        init=init, learn=learn, policy=policy, acting=acting,
        num_envs=config.num_envs, steps_per_env=config.num_updates * config.num_steps,
        fragment_steps=config.num_steps, on_policy=True,
        summary=sparsify.learner_summary(config, training, lambda: init_params(jax.random.key(0))),
    )


def make_algorithm(config: Config, env: Env, meta_params: MetaParams | dict | None = None) -> Algorithm:
    """PPO on device (Discrete or Box actions): fragments of `num_steps` steps of `num_envs` JAX environments
    rolled out with the learner's current policy (`base.on_device`) and learned by `make_actor_learner`'s
    learner, the one the actor-learner runner drives. Raises `ConfigError` before tracing on a bad config.
    meta_params: as `make_actor_learner`'s.

    Semantics against the device PPO this replaced (its own rollout): observation statistics and the
    return statistics of reward scaling are updated once per fragment after it was acted (as on the host
    runner), not after every step, and the fragment is acted and normalised with the statistics before it;
    a run starts with empty statistics. Both estimate the same moments from the same observations; only
    the first fragment of a run and the lag of the statistics by up to `num_steps` steps differ, which the
    learning tests and the defaults matrix show does not hurt (BENCHMARKS.md, "PPO as an ActorLearner")."""
    if not has_tracers(config):
        config = config.validate(env)
    return on_device(make_actor_learner(config, env, meta_params, unroll=False), env, config.num_steps,
                     config.num_updates)


def make_train(config: Config, env: Env):
    """The whole run as `train(key, hparams=None) -> (state, metrics [num_updates])` (`base.make_hparams_train_fn`)."""
    return make_hparams_train_fn(make_algorithm, config.validate(env), env)

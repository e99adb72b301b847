"""The act-store-adjust-learn loop of TD3 and SAC with RLx2's settings, split for both runners.

    acting.explore(raw, key, env_steps, ...) -> (action, reference action)   actor side, [N, |A|] in [-1, 1]
    learn(learner, steps [T, N])             -> (learner, metrics)             learner side, jitted

`make_offpolicy` returns them as the actor-learner contract (`sparqrl.algos.base.ActorLearner`):
* on device (Anakin): `base.on_device(..., fragment_steps=1)` makes the `Algorithm` whose `update` is
  forward → explore → env.step → learn, all in one program;
* on the host (Sebulba): actors run the policy network (in the precision they were given) and `explore`
  on its output and step host environments; the learner calls `learn` on each step it receives
  (`sparqrl.runners.sebulba`).

`learn` (RLx2, `rlx2.md` §4-§5):
1. stores the row (one ring slot: one env step of all N environments);
2. if a `buffer_check_interval` of env steps ended, checks the dynamic-capacity buffer;
3. takes one gradient step per env step past `learning_start_step`: samples n-step windows, builds the
   (delayed) n-step terms — one-step before `nstep_delay` gradient steps, n after — and hands them to
   the algorithm's `Agent.gradient_step`.

Under vmap over seeds (whose counters move in lockstep) a skipped gate costs nothing: the dynamic-buffer
check is a `sparqrl.lockstep.lockstep_cond`, the gradient steps a loop of as many iterations as are due.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sparqrl import replay, returns, sparse
from sparqrl.algos import replay_learner, sparsify
from sparqrl.algos.base import (
    Acting, ActorLearner, Algorithm, Step, forward, has_tracers, keyed, make_hparams_train_fn, on_device, per_step,
)
from sparqrl.algos.offpolicy.config import OffPolicyConfig
from sparqrl.envs import action_dim
from sparqrl.nets.modules import HeadMLP, TorsoHead, TwinCritic
from sparqrl.nets.torso import TORSO_NAMES, check_torsos
from sparqrl.replay import dynamic, nstep


class Transition(NamedTuple):
    """One ring slot: one env step of all S = num_envs environments (every field has a leading [S])."""

    obs: jax.Array  # [S, *obs_shape]
    action: jax.Array  # [S, |A|], normalised to [-1, 1]
    reward: jax.Array  # [S]
    next_obs: jax.Array  # [S, *obs_shape], the env's final_obs: pre-reset, so truncation can bootstrap
    terminated: jax.Array  # bool [S]: cuts the bootstrap
    truncated: jax.Array  # bool [S]: time limit; the n-step return stops here and bootstraps
    reference_action: jax.Array  # [S, |A|]: the noise-free policy action (the random one in warm-up), RLx2's ā


class Windows(NamedTuple):
    """A batch of n-step windows as drawn for one gradient step."""

    items: Transition  # fields [B, n, ...]
    terms: returns.NStepTerms  # their n-step return terms (`returns.nstep_terms`)
    n_active: jax.Array  # int32 [], the horizon they are cut at


class Learner(NamedTuple):
    """Everything the learner keeps for one seed."""

    agent: Any  # the algorithm's networks, targets and optimizer states
    buffer: replay.BufferState  # of Transition
    key: jax.Array
    env_steps: jax.Array  # int32 [], summed over environments
    gradient_steps: jax.Array  # int32 [] (training iterations)
    buffer_distance: jax.Array  # float32 [], the dynamic buffer's D at its latest check


class Agent(NamedTuple):
    """What an algorithm (TD3, SAC) supplies. Every function is pure and jittable.

    init(key) -> agent                             networks (masked if sparse), targets, optimizer states
    policy(agent) -> policy_params                 what an actor needs to act
    network, network_params, activation            the policy network as a Dense chain on flat observations:
                                                   raw = network.apply(network_params(policy_params), obs)
                                                   (see `sparqrl.algos.base.Acting`)
    behaviour(raw [N, out], eps [N, |A|]) -> (action, reference)   after warm-up, both [N, |A|] in [-1, 1];
                                                   eps: standard normal exploration noise drawn ahead
    greedy(raw [..., out]) -> [..., |A|]           the deterministic action in [-1, 1] (evaluation, and the
                                                   dynamic buffer's π(s))
    gradient_step(agent, batch, terms, iteration, key) -> (agent, replay_learner.Metrics)
                                                   batch: n-step windows [B, n] of Transition fields;
                                                   terms: their `returns.NStepTerms`; iteration: 1-based
    report(agent) -> {name: scalar}                per-update readings (temperature, measured sparsity)
    metric_names                                   the keys of its metrics
    summary                                        static accounting for summary.json (sparsity, ratios)
    """

    init: Callable[[jax.Array], Any]
    policy: Callable[[Any], Any]
    network: Any
    network_params: Callable[[Any], Any]
    activation: str
    behaviour: Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]
    greedy: Callable[[jax.Array], jax.Array]
    gradient_step: Callable[
        [Any, Transition, returns.NStepTerms, jax.Array, jax.Array], tuple[Any, replay_learner.Metrics]
    ]
    report: Callable[[Any], dict[str, jax.Array]]
    metric_names: tuple[str, ...]
    summary: dict[str, Any]


# ---- per-network training and accounting ------------------------------------------------------


def net_training(config: OffPolicyConfig, sparsity: float, lr: float, t_end: int) -> sparse.NetTraining:
    """Adam for one network, masked and scheduled as the sparse method says (dense and tiny: plain)."""
    return sparsify.net_training(config, optax.adam(lr), sparsity, t_end)


def tiny_hidden(config: OffPolicyConfig, params_at: Callable[[tuple[int, ...]], Any], sparsity: float) -> tuple[int, ...]:
    """Hidden widths of the Tiny baseline: the widest proportional narrowing of `config.hidden` whose
    dense network has no more weights than the sparse one at `sparsity` (`params_at(hidden)`: the
    network's parameter shapes at those widths)."""
    hidden = tuple(config.hidden)
    widest = max(hidden)

    def narrowed(w: int) -> tuple[int, ...]:
        return tuple(max(1, h * w // widest) for h in hidden)

    as_sparse = sparse.NetTraining(optax.identity(), sparsity, allocation=config.sparse_allocation)
    budget = as_sparse.param_count(params_at(hidden)).active_weights
    width = sparse.matching_width(
        lambda w: sparse.count_params(params_at(narrowed(w))).total_weights, budget, largest=widest
    )
    return narrowed(width)


def examples(env: Any) -> tuple[jax.Array, jax.Array]:
    """A zero observation [*obs_shape] and action [|A|], to initialise networks."""
    return jnp.zeros(env.observation_shape, jnp.float32), jnp.zeros((action_dim(env),), jnp.float32)


def sized_networks(
    config: OffPolicyConfig, env: Any, actor_at: Callable[[tuple[int, ...], int, int], Any], critic_scheme: str
) -> tuple[Any, TwinCritic]:
    """(actor, twin critic) modules at `config.hidden`, or for tiny at the widths matching the sparse
    networks' weight counts. actor_at(hidden widths, |A|, observation ndim) -> the actor module;
    critic_scheme: the critic's initialisation (`nets.modules.init_dense`)."""
    obs_ndim, num_actions = len(env.observation_shape), action_dim(env)

    def actor_of(hidden: tuple[int, ...]) -> Any:
        return actor_at(hidden, num_actions, obs_ndim)

    def critic_at(hidden: tuple[int, ...]) -> TwinCritic:
        return TwinCritic(hidden, config.activation, obs_ndim, critic_scheme, config.network_of("critic"),
                          tuple(env.observation_shape))

    check_torsos(config, tuple(env.observation_shape), ("actor", "critic"))
    hidden = tuple(config.hidden)
    if config.sparse != "tiny":
        return actor_of(hidden), critic_at(hidden)
    obs, action = examples(env)
    key = jax.random.key(0)
    actor_hidden = tiny_hidden(config, lambda h: jax.eval_shape(actor_of(h).init, key, obs), config.actor_sparsity)
    critic_hidden = tiny_hidden(config, lambda h: jax.eval_shape(critic_at(h).init, key, obs, action), config.critic_sparsity)
    return actor_of(actor_hidden), critic_at(critic_hidden)


def network_shapes(actor: Any, critic: Any, env: Any) -> dict[str, Any]:
    """{'actor': ..., 'critic': ...} parameter shapes (for `sparse_summary`)."""
    obs, action = examples(env)
    key = jax.random.key(0)
    return {"actor": jax.eval_shape(actor.init, key, obs), "critic": jax.eval_shape(critic.init, key, obs, action)}


def sparse_summary(
    config: OffPolicyConfig, params: dict[str, Any], dense: dict[str, Any],
    trainings: dict[str, sparse.NetTraining], stored: list[str],
) -> dict[str, Any]:
    """The sparse fields of summary.json (none for a dense run), counted by `sparqrl.sparse.accounting`.

    params / dense: parameter shapes (`jax.eval_shape` of init) of the networks as trained and of their
    dense full-width versions, by name ('actor' acts); stored: the names in the size ratio, target
    copies repeated. FLOPs weights c_actor = 1, c_critic = 1.5 reproduce RLx2 Table 2's TD3 rows (the
    paper's SAC rows hold a term that cannot be identified; the same weights are used for SAC).
    """
    if config.sparse == "dense":
        return {}
    counts = {k: trainings[k].param_count(v) for k, v in params.items()}
    dense_counts = {k: sparse.count_params(v) for k, v in dense.items()}
    out = {"sparse": config.sparse, **sparse.summary(
        counts, acting="actor", train_weights={"actor": 1.0, "critic": 1.5}, stored=stored, dense=dense_counts
    )}
    if config.sparse == "tiny":
        out["tiny_weights"] = {k: c.total_weights for k, c in counts.items()}
    return out


def agent_summary(
    config: OffPolicyConfig, env: Any, nets: tuple[Any, Any], make_networks: Callable[[Any, Any], tuple[Any, Any]],
    trainings: dict[str, sparse.NetTraining], stored: list[str],
) -> dict[str, Any]:
    """`sparse_summary` of an agent's (actor, critic) `nets` against the dense full-width networks that
    `make_networks(config, env)` builds for the same config made dense."""
    dense = make_networks(dataclasses.replace(config, sparse="dense"), env)
    return sparse_summary(config, network_shapes(*nets, env), network_shapes(*dense, env), trainings, stored)


def sparsity_report(
    config: OffPolicyConfig, actor_training: sparse.NetTraining, critic_training: sparse.NetTraining,
    actor_opt: optax.OptState, critic_opt: optax.OptState,
) -> dict[str, jax.Array]:
    """The measured sparsity of the actor and critic (their masks live in their optimizer states); none
    for an unmasked run."""
    if not config.masked:
        return {}
    return {"actor_sparsity": actor_training.measured_sparsity(actor_opt),
            "critic_sparsity": critic_training.measured_sparsity(critic_opt)}


def acting_network(actor: Any, out: int, scheme: str) -> Any:
    """What actors run of the actor (before its squashing): its Dense chain `HeadMLP` on flat observations, or
    with a user's torso the torso and the chain (`TorsoHead`, the actor's own parameter names)."""
    if actor.network is None:
        return HeadMLP(actor.hidden, out, actor.activation, scheme)
    return TorsoHead(actor.network, tuple(actor.obs_shape), tuple(actor.hidden), out, actor.activation, scheme)


def head_params(actor_params: Any) -> Any:
    """The parameters of `acting_network` in the actor's: its `HeadMLP`'s, or all of them with a user's torso."""
    params = actor_params["params"]
    return {"params": params} if TORSO_NAMES[0] in params else {"params": params["HeadMLP_0"]}


# ---- the loop ---------------------------------------------------------------------------------


def nstep_replay(config: OffPolicyConfig, agent: Agent) -> replay_learner.Replay:
    """The gradient steps of the loop (`replay_learner`): the agent's on uniformly drawn n-step windows."""

    def draw(buffer: replay.BufferState, key: jax.Array, iteration: jax.Array) -> replay_learner.Drawn:
        """B n-step windows and their (delayed) n-step terms: one-step before `nstep_delay` gradient steps, n after."""
        n_active = jnp.where(iteration >= config.nstep_delay, config.horizon, 1).astype(jnp.int32)
        drawn = nstep.draw_windows(buffer, key, config.batch_size, config.horizon, config.gamma, n_active)
        return replay_learner.Drawn(Windows(drawn.items, drawn.terms, n_active))

    def update(agent_state: Any, drawn: replay_learner.Drawn, iteration: jax.Array,
               key: jax.Array) -> replay_learner.Stepped:
        """The agent's gradient step on the drawn windows; adds the horizon they were cut at ("nstep")."""
        windows: Windows = drawn.batch
        agent_state, metrics = agent.gradient_step(agent_state, windows.items, windows.terms, iteration, key)
        nstep_metric = (windows.n_active.astype(jnp.float32), jnp.ones(()))
        return replay_learner.Stepped(agent_state, {**metrics, "nstep": nstep_metric})

    return replay_learner.Replay(draw, update, agent.metric_names + ("nstep",))


def empty_row(env: Any, num_envs: int) -> Transition:
    """A ring slot of zeros, one env step of `num_envs` environments (to initialise the buffer)."""
    obs, action = examples(env)
    row = Transition(
        obs=obs, action=action, reward=jnp.zeros(()), next_obs=obs, terminated=jnp.zeros((), jnp.bool_),
        truncated=jnp.zeros((), jnp.bool_), reference_action=action,
    )
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (num_envs,) + x.shape), row)


def dynamic_rule(config: OffPolicyConfig) -> dynamic.DynamicReplay:
    """RLx2's dynamic-capacity rule for the loop's buffer of `config.num_envs` streams (`replay.dynamic`)."""
    return dynamic.make_dynamic_replay(
        max_size=config.buffer_capacity,
        min_size=min(config.buffer_min_size, config.buffer_capacity),
        num_oldest=min(config.num_oldest, config.buffer_capacity),
        threshold=config.buffer_threshold,
        shrink=config.buffer_shrink,
        distance=config.buffer_distance,
        streams=config.num_envs,
    )


def make_exploration(agent: Agent, num_actions: int, start: int) -> tuple[Callable, Callable]:
    """`Acting.noise` and `Acting.explore_with` of the loop: uniform random actions for the env steps before
    `start` (`learning_start_step`), then the agent's behaviour on exploration noise drawn ahead."""

    def noise(key: jax.Array, shape: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
        """(ε standard normal for the behaviour, the warm-up's uniform random action in [-1, 1]), [*shape, |A|]."""
        behaviour_key, random_key = jax.random.split(key)
        return (jax.random.normal(behaviour_key, (*shape, num_actions)),
                jax.random.uniform(random_key, (*shape, num_actions), minval=-1.0, maxval=1.0))

    def explore_with(raw: jax.Array, noise: tuple[jax.Array, jax.Array], env_steps: jax.Array,
                     slots: jax.Array | None = None, total_slots: int = 1, aux: Any = None
                     ) -> tuple[jax.Array, jax.Array]:
        """(action, reference action) [N, |A|] from the policy network's output raw [N, out]: uniform
        random for the env steps before `learning_start_step` (`env_steps` counts those already taken),
        then the agent's behaviour. (`slots`/`total_slots`: unused, every env explores alike; no `aux`.)"""
        del slots, total_slots, aux
        eps, random_action = noise
        action, reference = agent.behaviour(raw, eps)
        warmup = ((env_steps + jnp.arange(raw.shape[0])) < start)[:, None]  # per env step index
        return jnp.where(warmup, random_action, action), jnp.where(warmup, random_action, reference)

    return noise, explore_with


def make_offpolicy(config: OffPolicyConfig, env: Any, agent: Agent) -> ActorLearner:
    """The loop for a resolved `config` (`Config.validate(env)`) and an environment or host spec
    (`observation_shape`, `action_space`)."""
    num_envs = config.num_envs
    num_actions = action_dim(env)
    low = np.asarray(env.action_space.low, np.float32)
    high = np.asarray(env.action_space.high, np.float32)
    center, half_range = (high + low) / 2.0, (high - low) / 2.0
    capacity = config.buffer_capacity // num_envs  # ring slots, each one env step of every env
    rule = dynamic_rule(config)
    start = config.learning_start_step

    def to_env(action: jax.Array) -> jax.Array:
        """[-1, 1] box -> the env's [low, high]."""
        return center + half_range * action

    def init(key: jax.Array) -> Learner:
        key, agent_key = jax.random.split(key)
        return Learner(
            agent=agent.init(agent_key),
            buffer=replay.init(empty_row(env, num_envs), capacity),
            key=key,
            env_steps=jnp.zeros((), jnp.int32),
            gradient_steps=jnp.zeros((), jnp.int32),
            buffer_distance=jnp.zeros((), jnp.float32),
        )

    noise, explore_with = make_exploration(agent, num_actions, start)
    acting = Acting(agent.network, agent.network_params, agent.activation, keyed(noise, explore_with), agent.greedy,
                    to_env, noise=noise, explore_with=explore_with)
    obs_ndim = len(env.observation_shape)

    def dynamic_actions(policy_params: Any, items: Transition) -> tuple[jax.Array, jax.Array]:
        """The dynamic buffer's (π(s), ā) on stored items [R, S, ...]."""
        return agent.greedy(forward(acting, policy_params, items.obs, obs_ndim)), items.reference_action

    spec = nstep_replay(config, agent)

    def learn_step(learner: Learner, step: Step) -> tuple[Learner, dict[str, jax.Array]]:
        """Store one env step of every environment (`step`, leaves [N, ...]) and learn from it."""
        row = Transition(step.obs, step.action, step.reward, step.next_obs, step.terminated, step.truncated,
                         step.extra)
        key, learn_key = jax.random.split(learner.key)
        buffer = replay.add(learner.buffer, jax.tree.map(lambda x: x[None], row))
        env_steps_tm1, env_steps_t = learner.env_steps, learner.env_steps + num_envs

        buffer_distance = learner.buffer_distance
        if config.use_dynamic_buffer:
            due = dynamic.check_due(env_steps_tm1, env_steps_t, config.buffer_check_interval)
            buffer, info = dynamic.maybe_adjust(due, buffer, rule, dynamic_actions, agent.policy(learner.agent))
            buffer_distance = jnp.where(due, info.distance, learner.buffer_distance)

        num_grad = jnp.clip(env_steps_t - jnp.maximum(env_steps_tm1, start), 0, num_envs)
        carry = replay_learner.run(spec, replay_learner.start(spec, learner.agent, buffer, learner.gradient_steps),
                                   num_grad, learn_key, config.gradient_steps_per_update)
        metrics = {
            **replay_learner.means(carry),  # over this update; 0 if none
            **agent.report(carry.agent),
            "buffer_size": (carry.buffer.size * num_envs).astype(jnp.float32),  # valid transitions
            "buffer_distance": buffer_distance,
        }
        return Learner(carry.agent, carry.buffer, key, env_steps_t, carry.gradient_steps, buffer_distance), metrics

    def policy(learner: Learner) -> Any:
        return agent.policy(learner.agent)

    # n-step windows read consecutive rows: the actor-learner runner ends them at each fragment's end
    return ActorLearner(init, per_step(learn_step), policy, acting, num_envs, config.num_updates, agent.summary,
                        joins_fragments=config.horizon > 1)


def entry_points(make_agent: Callable[[Any, Any], Agent]) -> tuple[Callable, Callable, Callable]:
    """(make_actor_learner, make_algorithm, make_train) of an off-policy algorithm: TD3's and SAC's differ
    only in `make_agent(config, env)`, so they are made here once."""

    def make_actor_learner(config: Any, env: Any) -> ActorLearner:
        """The learner and acting halves for the actor-learner runner; checks and resolves the config first."""
        config = config.validate(env)
        return make_offpolicy(config, env, make_agent(config, env))

    def make_algorithm(config: Any, env: Any) -> Algorithm:
        """The algorithm on device for `env` (continuous actions). The config is checked here, on the host,
        before any tracing."""
        if not has_tracers(config):
            config = config.validate(env)
        return on_device(make_offpolicy(config, env, make_agent(config, env)), env, 1, config.num_updates)

    def make_train(config: Any, env: Any) -> Callable[..., tuple[Any, dict[str, jax.Array]]]:
        """The whole run as `train(key, hparams=None) -> (state, metrics [num_updates])`
        (`base.make_hparams_train_fn`)."""
        return make_hparams_train_fn(make_algorithm, config.validate(env), env)

    return make_actor_learner, make_algorithm, make_train

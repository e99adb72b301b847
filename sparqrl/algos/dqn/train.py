"""DQN: one learner (`make_actor_learner`) for both runners. The actor-learner runner feeds it the fragments
its actors send from host environments; on device, `make_algorithm` feeds it one env step of all
`num_envs` JAX environments per update (`base.on_device`), all in one compiled program.

The learner stores each row of N transitions, counts N env steps, then takes the gradient steps and target
update whose env-step intervals end within them:

    gradient steps  = (env_steps_t // train_interval − env_steps_tm1 // train_interval)  once learning
    target update   if env_steps_t // target_update_interval > env_steps_tm1 // target_update_interval

so every interval is in env steps and means what it says for any `num_envs` and any number of actors.
Learning starts at `max(learning_starts, batch_size)` env steps. Both gates are loops of as many iterations
as are due (under vmap over seeds, whose counters move in lockstep, a skipped gate costs nothing).

Replay and exploration (`Config.for_runner`): on device by default PureJaxRL's DQN (uniform replay, every env
epsilon-greedy on the linear schedule); on the actor-learner runner Ape-X (Horgan et al. 2018, arXiv
1803.00933):

* actors act epsilon-greedily on their (possibly quantized) copy's Q-values with a fixed epsilon per
  env slot j of all M actor envs, ε_j = ε^(1 + α·j/(M − 1)) (ε = 0.4, α = 7; one slot: ε), and send
  with each step the initial priority |r + γ(1 − terminated)·max_a Q(s', a) − Q(s, a)| from that copy
  (one-step; Ape-X's is n-step: with `nstep` > 1 it is the initial priority of the window starting there);
* the learner stores each row with priorities (p + ε_p)^α_p; each gradient step samples P(i) ∝ p_i^α_p,
  weights the loss by the normalised importance weights (n·P(i))^−β, and sets the sampled items'
  priorities to |δ| + ε_p (`sparqrl.replay.prioritized`).

Either part can be chosen on either runner (`prioritized`, `exploration`), so one DQN compares across both.
Unlike PureJaxRL's `dqn.py`, the key given to `init` is threaded through everything (network init, resets,
exploration, environment steps, replay sampling), so vmapped seeds really differ.

n-step targets (`nstep` > 1, either replay, either runner): each slot of the replay then holds one env step
of all N envs (with `truncated`), so consecutive slots are consecutive steps of each env, and a gradient step
draws B windows of n of them and regresses Q(s_0, a_0) on Σ_k γ^k r_k + γ^(m+1) Q_target(s'_m, a*), cut at a
termination or truncation as `returns.nstep_terms` says; a* is picked as in the one-step target
(`losses.bootstrap_value`). Windows are drawn uniformly (`replay.nstep.sample_windows`) or, with prioritized
replay, by the priority of the (slot, env) each starts at (`replay.nstep.sample_prioritized_windows`): on
arrival the actor's one-step priority of that first step, once replayed the window's n-step |δ|; a window is
drawn only once all its n slots are stored. On the actor-learner runner the replay stores the actors'
fragments in arrival order, so the runner marks each fragment's last step truncated
(`ActorLearner.joins_fragments`): a window ends there and bootstraps from that step's next_obs rather than
run into another actor's envs.

Why priorities on window starts, not Ape-X's n-step transitions built from each fragment before they enter
the replay: one replay layout and one n-step target serve uniform and prioritized replay on both runners (on
device a fragment is one env step, from which no n-step transition can be built), and prioritized replay is
the uniform window replay plus a weight per window, drawn by the same sampler as one-step items
(`replay.prioritized.sample_weighted`). The targets equal those built from each fragment (both cut at its end;
Ape-X's actors, which keep their last n − 1 steps across fragments, cut only at episode ends); only a
window's initial priority is its first step's one-step |δ| instead of the n-step one. nstep = 1 is the
one-step program unchanged.

RLx2 (`sparse=rlx2`; Tan et al. 2023, `rlx2.md` §4): RigL on the Q-network and the delayed multi-step target,
n = 3 (`nstep` None, `Config.for_runner`) with the windows' terms cut at one step until `nstep_delay` gradient
steps (a traced horizon, `replay.nstep.draw_windows`), as td3/sac do; the horizon is logged as "nstep". RLx2's
dynamic-capacity buffer is not used: its policy distance compares a continuous policy's action with each stored
noise-free reference action, which an epsilon-greedy DQN's replay does not hold.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from sparqrl import replay, returns, sparse
from sparqrl.algos import replay_learner, sparsify
from sparqrl.algos.base import (
    Acting, ActorLearner, Algorithm, Step, clipped_adam, has_tracers, keyed, make_hparams_train_fn, on_device, per_step,
)
from sparqrl.algos.dqn.config import Config
from sparqrl.algos.dqn.losses import apex_priority, bootstrap_value, chosen_q, q_target, td_loss, weighted_td_loss
from sparqrl.config import fail, require
from sparqrl.envs import Env, action_dim
from sparqrl.envs.core import is_atari, is_host_env
from sparqrl.nets.modules import QNetwork, torso_features
from sparqrl.nets.torso import check_torsos
from sparqrl.replay import frames, nstep, prioritized


class Transition(NamedTuple):
    """One replayed transition (shapes of one item; the buffer adds a leading [capacity])."""

    obs: jax.Array  # [*obs_shape]
    action: jax.Array  # int32 []
    reward: jax.Array  # float32 []
    next_obs: jax.Array  # [*obs_shape], the env's final_obs: pre-reset, so truncation can bootstrap
    terminated: jax.Array  # bool []; truncation is not stored: it does not cut the bootstrap


FRAGMENT_STEPS = 10
"""The fragment length T the frame ring is sized for unless told the run's (`ActorLearner.for_fragments`; the
actor-learner runner's default for replay learners): each fragment's first stacks add K / T frames per
transition. Shorter fragments than the ring was sized for fill it sooner, and the oldest transitions' frames
are then overwritten before the transitions: those are sampled with weight 0 and never again
(`replay.frames.valid`)."""


class FrameTransition(NamedTuple):
    """A replayed transition of stacked frames (Atari): the frames live once in the learner's `FrameRing`."""

    frames: jax.Array  # int32 [K + 1]: frame numbers of obs (K), then of next_obs's newest (`replay.frames`)
    action: jax.Array  # int32 []
    reward: jax.Array  # float32 []
    terminated: jax.Array  # bool []


class StepTransition(NamedTuple):
    """One env's step in the n-step replay (`nstep` > 1), whose slots hold a row of N of them ([capacity, N, ...]).
    `truncated` is kept: it ends a window's return, which then bootstraps from that step's next_obs."""

    obs: jax.Array  # [*obs_shape]
    action: jax.Array  # int32 []
    reward: jax.Array  # float32 []
    next_obs: jax.Array  # [*obs_shape], the env's final_obs
    terminated: jax.Array  # bool []
    truncated: jax.Array  # bool []


class NStepBatch(NamedTuple):
    """What a gradient step on n-step windows reads, leaves [B, ...]."""

    obs: jax.Array  # [B, *obs_shape], s_0: the window's first observation
    action: jax.Array  # int32 [B], a_0
    next_obs: jax.Array  # [B, *obs_shape], s'_m: the observation the target bootstraps from
    terms: returns.NStepTerms  # the window's reward sum and bootstrap discount
    n_active: int | jax.Array  # the horizon the terms are cut at: nstep, or int32 [] under RLx2's delay


class LearnerState(NamedTuple):
    """DQN's learner of one seed (`make_actor_learner`), on either runner."""

    params: Any  # online Q-network (what actors receive)
    target_params: Any  # target Q-network
    opt_state: optax.OptState
    buffer: Any  # of Transition: replay.PrioritizedState, or replay.BufferState with `prioritized=False`;
    # with nstep > 1 the same of rows of StepTransition [capacity // N, N, ...] (`replay.nstep`: weights per (row, env))
    key: jax.Array
    env_steps: jax.Array  # int32 [], env steps received, summed over all (actors') envs of this seed
    gradient_steps: jax.Array  # int32 []
    frames: Any = None  # `replay.frames.FrameRing` of stacked-frame observations (Atari; items: FrameTransition)


class Online(NamedTuple):
    """What DQN's gradient steps change: the online Q-network and its optimizer state."""

    params: Any
    opt_state: optax.OptState


METRIC_NAMES = ("loss", "q_mean", "td_abs_mean")
"""A gradient step's metrics: its loss, its batch's mean Q(s, a) and mean |δ| (of the replayed items)."""


# ---- shared by both runners ----------------------------------------------------------------


def epsilon_schedule(config: Config) -> Callable[[jax.Array], jax.Array]:
    """Epsilon at a given env step: linear from `epsilon_start` to `epsilon_finish`, then flat."""

    def epsilon(env_steps: jax.Array) -> jax.Array:
        frac = jnp.clip(env_steps / config.epsilon_steps, 0.0, 1.0)
        return config.epsilon_start + frac * (config.epsilon_finish - config.epsilon_start)

    return epsilon


def apex_epsilons(
    slots: jax.Array, total_slots: int | jax.Array, epsilon: float = 0.4, alpha: float = 7.0
) -> jax.Array:
    """Ape-X's fixed per-slot exploration (Horgan et al. 2018, §4.1), float32 [N]:

        ε_j = ε^(1 + α · j / (M − 1))      slot j ∈ {0, …, M − 1} of M = total_slots; M = 1: ε

    One epsilon per env slot across all actors' envs (as `uber-research/ape-x` per actor-batch slot):
    slot 0 explores most (ε), slot M − 1 least (ε^(1+α), 6.6e-4 at the defaults).
    """
    fraction = jnp.asarray(slots, jnp.float32) / jnp.maximum(jnp.asarray(total_slots, jnp.float32) - 1.0, 1.0)
    return jnp.power(jnp.float32(epsilon), 1.0 + alpha * fraction)


def exploration_noise(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """What `epsilon_greedy` draws for envs laid out as `shape`: uniform [*shape, 2] in [0, 1), one random-number
    program however many steps it serves (`base.Acting.noise`)."""
    return jax.random.uniform(key, (*shape, 2))


def epsilon_greedy(q: jax.Array, epsilon: jax.Array, noise: jax.Array) -> jax.Array:
    """int32 actions [N] from q [N, A]: uniform random with probability epsilon ([] or [N]), else argmax.

    noise [N, 2] (`exploration_noise`): [:, 0] < epsilon explores, [:, 1] picks the random action.
    """
    num_actions = q.shape[-1]
    greedy = jnp.argmax(q, axis=-1).astype(jnp.int32)
    random_action = jnp.minimum((noise[..., 1] * num_actions).astype(jnp.int32), num_actions - 1)
    return jnp.where(noise[..., 0] < epsilon, random_action, greedy)


def make_training(config: Config) -> sparse.NetTraining:
    """The Q-network's Adam, masked and scheduled when `config.sparse` is (`sparse.transform` makes it one
    optax transformation)."""
    lr: float | optax.Schedule = config.lr
    if config.anneal_lr:
        lr = optax.linear_schedule(config.lr, 0.0, max(config.num_gradient_steps, 1))
    adam = clipped_adam(lr, config.max_grad_norm if config.max_grad_norm > 0 else None)
    return sparsify.learner_training(config, adam, config.num_gradient_steps)


def gradient_steps_due(config: Config, env_steps_tm1: jax.Array, env_steps_t: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(learning bool [], gradient steps int32 []) for the env steps (env_steps_tm1, env_steps_t]:
    one per `train_interval` boundary crossed, once `learning_start_step` env steps are reached."""
    learning = env_steps_t >= config.learning_start_step
    crossed = env_steps_t // config.train_interval - env_steps_tm1 // config.train_interval
    return learning, jnp.where(learning, crossed, 0).astype(jnp.int32)


def target_update_due(
    config: Config, learning: jax.Array, env_steps_tm1: jax.Array, env_steps_t: jax.Array
) -> jax.Array:
    """bool []: a `target_update_interval` boundary was crossed in (env_steps_tm1, env_steps_t] while learning."""
    interval = config.target_update_interval
    return learning & (env_steps_t // interval > env_steps_tm1 // interval)


def update_target(config: Config, due: jax.Array, params: Any, target_params: Any) -> Any:
    """The target network after a possible update: hard copy (tau = 1) or Polyak average.

    Gated by a loop of `due` (0 or 1) iterations rather than a cond: vmapped over seeds, a cond whose
    untaken branch returns the parameters copied them at every call (measured: ~15 ms per env step for a
    3 x 2048 Q-network on CPU, vs ~0.1 ms with the loop, which runs zero times when no seed is due)."""
    return jax.lax.fori_loop(
        0, due.astype(jnp.int32), lambda _, target: optax.incremental_update(params, target, config.tau),
        target_params,
    )


def td_target(config: Config, network: QNetwork, params: Any, target_params: Any,
              batch: Transition | NStepBatch) -> jax.Array:
    """The Q-learning target y [B] (no gradient): one-step (`losses.q_target`) on a batch of Transition, n-step
    (`returns.nstep_q_target`) on NStepBatch windows when `nstep` > 1; both bootstrap from the target network's
    value of batch.next_obs at the action the target (DQN) or online (Double DQN) network picks there."""
    next_q_target = network.apply(target_params, batch.next_obs)
    next_q_online = network.apply(params, batch.next_obs) if config.double_dqn else next_q_target
    if config.nstep == 1:
        return q_target(batch.reward, batch.terminated, next_q_target, next_q_online, config.gamma, config.double_dqn)
    boot_q = bootstrap_value(next_q_target, next_q_online, config.double_dqn)
    return returns.nstep_q_target(batch.terms, boot_q)


def make_update(
    config: Config, network: QNetwork, optimizer: optax.GradientTransformation
) -> Callable[[Any, Online, replay_learner.Drawn, jax.Array, Any], replay_learner.Stepped]:
    """`update(target_params, online, drawn, iteration, key) -> Stepped`: one Adam step on the
    (importance-weighted, when `drawn.weights` is given) squared or Huber (`huber_delta`) TD error of `drawn.batch` [B]
    (`replay_learner.Replay.update` once the target parameters are bound; it draws nothing), with the one-step
    target on Transition or the n-step target on NStepBatch (`nstep` > 1).
    Its |δ| [B] is |Q(s, a) − y| under the parameters the step started from."""

    def loss_fn(
        params: Any, target_params: Any, batch: Transition | NStepBatch, weights: jax.Array | None
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        target = td_target(config, network, params, target_params, batch)
        q_sa = chosen_q(network.apply(params, batch.obs), batch.action)
        loss = (td_loss(q_sa, target, config.huber_delta) if weights is None
                else weighted_td_loss(q_sa, target, weights, config.huber_delta))
        return loss, (jnp.mean(q_sa), jax.lax.stop_gradient(jnp.abs(q_sa - target)))

    def update(
        target_params: Any, online: Online, drawn: replay_learner.Drawn, iteration: jax.Array, key: Any
    ) -> replay_learner.Stepped:
        del iteration, key
        value_and_grad = jax.value_and_grad(loss_fn, has_aux=True)
        (loss, (q_mean, td_abs)), grads = value_and_grad(online.params, target_params, drawn.batch, drawn.weights)
        updates, opt_state = optimizer.update(grads, online.opt_state, online.params)
        one = jnp.ones((), jnp.float32)
        metrics = {"loss": (loss, one), "q_mean": (q_mean, one), "td_abs_mean": (jnp.mean(td_abs), one)}
        if config.nstep > 1:  # the horizon of the targets (RLx2's delay: 1, then n), as td3/sac log it
            metrics["nstep"] = (jnp.asarray(drawn.batch.n_active, jnp.float32), one)
        return replay_learner.Stepped(Online(optax.apply_updates(online.params, updates), opt_state), metrics, td_abs)

    return update


def _q_network(config: Config, env: Any) -> QNetwork:
    """The Q-network for `env`; a user's torso (`config.network`) checked on shapes first."""
    check_torsos(config, tuple(env.observation_shape), ("",))
    return QNetwork(action_dim(env), tuple(env.observation_shape), tuple(config.hidden), config.activation,
                    config.network)


def _example_transition(observation_shape: tuple[int, ...]) -> Transition:
    example_obs = jnp.zeros(observation_shape, jnp.float32)
    return Transition(
        obs=example_obs,
        action=jnp.zeros((), jnp.int32),
        reward=jnp.zeros((), jnp.float32),
        next_obs=example_obs,
        terminated=jnp.zeros((), jnp.bool_),
    )


# ---- the learner, its acting, and the on-device runner ------------------------------------------


def make_acting(config: Config, spec: Any) -> Acting:
    """How an actor acts (`sparqrl.algos.base.Acting`): epsilon-greedy on the Q-values [N, A] of its network
    copy, with the schedule's epsilon or Ape-X's per-slot ones (`Config.exploration`; "auto": Ape-X's);
    `extra` is Q(s, a) [N] of the chosen action under that copy, which the Ape-X `priority` needs (only set
    with prioritized replay)."""
    config = config.for_runner(on_device=False)
    network = _q_network(config, spec)
    epsilon = epsilon_schedule(config)

    def explore_with(
        raw: jax.Array, noise: jax.Array, env_steps: jax.Array, slots: jax.Array, total_slots: int, aux: Any = None
    ) -> tuple[jax.Array, jax.Array]:
        del aux
        q = raw.astype(jnp.float32)
        if config.exploration == "apex":  # fixed per slot: no warm-up schedule
            eps = apex_epsilons(slots, total_slots, config.apex_epsilon, config.apex_alpha)
        else:
            eps = epsilon(env_steps)
        action = epsilon_greedy(q, eps, noise)
        return action, chosen_q(q, action)

    def greedy(raw: jax.Array) -> jax.Array:
        return jnp.argmax(raw, axis=-1).astype(jnp.int32)

    def evaluate(raw: jax.Array, key: jax.Array) -> jax.Array:
        """Epsilon-greedy at `epsilon_finish` (Mnih et al. 2015 evaluate Atari at 0.05)."""
        return epsilon_greedy(raw.astype(jnp.float32), jnp.float32(config.epsilon_finish),
                              exploration_noise(key, raw.shape[:1]))

    def priority(raw_next: jax.Array, step: Step) -> jax.Array:
        """|r + γ(1 − terminated) max_a Q(s', a) − Q(s, a)| [N] under the actor's copy (`apex_priority`)."""
        return apex_priority(step.reward, step.terminated, raw_next.astype(jnp.float32), step.extra, config.gamma)

    return Acting(
        network=network,
        network_params=lambda policy_params: policy_params,
        activation=config.activation,
        explore=keyed(exploration_noise, explore_with),
        greedy=greedy,
        to_env=lambda action: action,
        priority=priority if config.prioritized else None,
        features=None if config.network else torso_features(tuple(spec.observation_shape), config.activation),
        evaluate=evaluate,
        noise=exploration_noise,
        explore_with=explore_with,
    )


def make_actor_learner(config: Config, spec: Any, fragment_steps: int = FRAGMENT_STEPS) -> ActorLearner:
    """DQN's learner for a host env `spec` (`sparqrl.envs.gym_env.HostSpec`: name, observation_shape,
    action_space) or a JAX env (`make_algorithm`); on Atari its frame ring is sized for fragments of
    `fragment_steps` env steps. The config is checked here, before anything is traced."""
    stacked = is_atari(spec.name)  # frame stacks: each frame stored once (`replay.frames`)
    config = config.for_runner(on_device=False, stacked=stacked)
    if not has_tracers(config):
        config.validate(spec)
    obs_shape = tuple(spec.observation_shape)
    _check_observations(spec, stacked)
    _check_nstep(config, spec, stacked)
    num_envs, capacity = config.num_envs, config.replay_capacity
    network = _q_network(config, spec)
    training = make_training(config)
    update = make_update(config, network, sparse.transform(training))
    grad_slots = config.max_gradient_steps_per_update
    unroll = stacked and jax.default_backend() == "cpu"  # a CNN's gradient in a loop is slow on CPU (per_step)
    epsilon = epsilon_schedule(config)

    def init(key: jax.Array) -> LearnerState:
        key, net_key = jax.random.split(key)
        params, opt_state = sparse.init_transform(
            training, net_key, network.init(net_key, jnp.zeros(spec.observation_shape, jnp.float32)))
        example, ring = _example_transition(obs_shape), None
        if stacked:
            example = FrameTransition(jnp.zeros((obs_shape[-1] + 1,), jnp.int32), *example[1:3], example.terminated)
            ring = frames.init(frames.frames_for(capacity, fragment_steps, obs_shape[-1]), obs_shape[:2])
        return LearnerState(
            params=params,
            target_params=jax.tree.map(jnp.copy, params),  # its own buffers: `learn` may be donated
            opt_state=opt_state,
            buffer=_init_replay(config, example, capacity),
            key=key,
            env_steps=jnp.zeros((), jnp.int32),
            gradient_steps=jnp.zeros((), jnp.int32),
            frames=ring,
        )

    def learn_step(learner: LearnerState, step: Step) -> tuple[LearnerState, dict[str, jax.Array]]:
        """Store one env step of N envs (`step`, leaves [N, ...]) and take the gradient steps it makes due."""
        key, learn_key = jax.random.split(learner.key)
        buffer = _store(config, stacked, learner.buffer, step)
        env_steps_tm1, env_steps_t = learner.env_steps, learner.env_steps + num_envs

        learning, num_grad = gradient_steps_due(config, env_steps_tm1, env_steps_t)
        spec = _replay(config, update, learner.target_params, learner.frames)
        start = replay_learner.start(spec, Online(learner.params, learner.opt_state), buffer, learner.gradient_steps)
        carry = replay_learner.run(spec, start, num_grad, learn_key, grad_slots, unroll)
        online = carry.agent
        due = target_update_due(config, learning, env_steps_tm1, env_steps_t)
        target_params = update_target(config, due, online.params, learner.target_params)
        epsilon_tm1 = epsilon(env_steps_tm1) if config.exploration == "schedule" else None
        metrics = _update_metrics(config, carry, num_grad, step, epsilon_tm1)
        return learner._replace(  # gradient_steps: learner.gradient_steps + num_grad; frames unchanged
            params=online.params, target_params=target_params, opt_state=online.opt_state, buffer=carry.buffer,
            key=key, env_steps=env_steps_t, gradient_steps=carry.gradient_steps), metrics

    def learn(learner: LearnerState, steps: Step) -> tuple[LearnerState, dict[str, jax.Array]]:
        """A fragment: its new frames into the ring first (stacked frames), then step by step."""
        if stacked:
            ring, numbers = frames.add_fragment(learner.frames, steps.obs, steps.next_obs,
                                                steps.terminated | steps.truncated)
            learner, steps = learner._replace(frames=ring), steps._replace(obs=numbers, next_obs=None)
        return per_step(learn_step, unroll)(learner, steps)

    def policy(learner: LearnerState) -> Any:
        return learner.params

    return ActorLearner(
        init=init, learn=learn, policy=policy, acting=make_acting(config, spec), num_envs=num_envs,
        steps_per_env=config.num_updates,
        for_fragments=(lambda t: make_actor_learner(config, spec, t)) if stacked else None,
        summary=sparsify.learner_summary(
            config, training, lambda: network.init(jax.random.key(0), jnp.zeros(spec.observation_shape, jnp.float32)),
            stored=("q",)),
        joins_fragments=config.nstep > 1,  # n-step windows read consecutive rows
    )


def _check_observations(spec: Any, stacked: bool) -> None:
    """Fail unless the replay can hold the env's observations: flat, on device, or Atari's stacked frames."""
    obs_shape = tuple(spec.observation_shape)
    if is_host_env(spec.name) and len(obs_shape) != 1 and not stacked:
        fail(
            "env", spec.name,
            f"dqn on the actor-learner runner needs flat observations or Atari's stacked frames (its replay would "
            f"hold every step's observation and next observation whole); env {spec.name} has observations of "
            f"shape {obs_shape} (ppo and impala train on them)",
        )


def _check_nstep(config: Config, spec: Any, stacked: bool) -> None:
    """Fail unless the replay can hold n-step windows: not with Atari's stacked frames, whose replay keeps
    each frame once (`replay.frames`) and one-step items."""
    require(config.nstep == 1 or not stacked, "nstep", config.nstep,
            f"must be 1 with Atari's stacked frames (env {spec.name}): their replay holds one-step transitions")


def _init_replay(config: Config, example: Any, capacity: int) -> Any:
    """An empty replay of `capacity` transitions shaped like `example` (Transition or FrameTransition):
    prioritized or uniform; with nstep > 1 of slots holding a row of N StepTransition, prioritized with a
    weight per (slot, env) where a window starts (`replay.nstep.init_prioritized`)."""
    if config.nstep > 1:
        row = StepTransition(*example, truncated=jnp.zeros((), jnp.bool_))
        rows = jax.tree.map(lambda x: jnp.broadcast_to(x, (config.num_envs,) + x.shape), row)
        slots = capacity // config.num_envs
        return nstep.init_prioritized(rows, slots) if config.prioritized else replay.init(rows, slots)
    return prioritized.init(example, capacity) if config.prioritized else replay.init(example, capacity)


def _update_metrics(config: Config, carry: replay_learner.Carry, num_grad: jax.Array, step: Step,
                    epsilon_tm1: jax.Array | None) -> dict[str, jax.Array]:
    """What one learner update reports: its gradient steps' means, the replay's size, and with prioritized
    replay the actors' priorities and the smallest importance weight; `epsilon_tm1`: the epsilon this row
    was acted with (the schedule's), else None."""
    metrics = {
        **replay_learner.means(carry),  # loss, q_mean, td_abs_mean (|δ| of the replayed items)
        "buffer_size": (carry.buffer.size * (config.num_envs if config.nstep > 1 else 1)).astype(jnp.float32),
        "gradient_steps": num_grad.astype(jnp.float32),  # taken in this call
    }
    if config.prioritized:
        metrics["actor_priority_mean"] = jnp.mean(jnp.abs(jnp.asarray(step.priority, jnp.float32)))
        metrics["is_weight_min"] = carry.weight_min  # smallest normalised importance weight; 1 if none
    if epsilon_tm1 is not None:
        metrics["epsilon"] = jnp.asarray(epsilon_tm1, jnp.float32)
    return metrics


def _replay(config: Config, update: Callable, target_params: Any, ring: Any) -> replay_learner.Replay:
    """The gradient steps of one learner update (`replay_learner`): `update` (`make_update`) with the target
    parameters of this update, drawing from the replay with the learner's frame ring (or None), or n-step
    windows (`nstep` > 1)."""
    return replay_learner.Replay(
        draw=functools.partial(_draw_windows, config) if config.nstep > 1 else functools.partial(_draw, config, ring),
        update=functools.partial(update, target_params),
        metric_names=METRIC_NAMES + (("nstep",) if config.nstep > 1 else ()),
        update_draws=False,
        priorities=replay_learner.Priorities(config.priority_epsilon, config.priority_exponent)
        if config.prioritized else None,
    )


def _draw(config: Config, ring: Any, buffer: Any, key: jax.Array, iteration: jax.Array) -> replay_learner.Drawn:
    """A batch of Transition drawn from the replay, uniformly or prioritized (`replay_learner.draw_items`);
    with stacked frames (`ring`: the learner's frame ring, else None) the observations are rebuilt from the
    ring and items whose frames were overwritten weigh 0."""
    del iteration
    drawn = replay_learner.draw_items(buffer, key, config.batch_size,
                                      config.importance_exponent if config.prioritized else None)
    if ring is None:
        return drawn
    items = drawn.batch
    intact = frames.valid(ring, items.frames)
    weights = intact.astype(jnp.float32) * (1.0 if drawn.weights is None else drawn.weights)
    k = items.frames.shape[-1] - 1
    batch = Transition(frames.stacks(ring, items.frames[:, :k]), items.action, items.reward,
                       frames.stacks(ring, items.frames[:, 1:]), items.terminated)
    return replay_learner.Drawn(batch, weights, drawn.slots, intact)


def _draw_windows(config: Config, buffer: Any, key: jax.Array, iteration: jax.Array) -> replay_learner.Drawn:
    """B windows of `nstep` consecutive steps of one env, uniformly or by the priority of their start with
    importance weights (`replay.nstep.draw_windows`), as the n-step target reads them (NStepBatch): s_0, a_0, the
    window's terms and bootstrap observation s'_m; cut at one step for the first `nstep_delay` gradient steps
    (RLx2's delayed target; `iteration` is 1-based, as td3/sac count it)."""
    n_active = config.nstep
    if config.nstep_delay > 0:
        n_active = jnp.where(iteration >= config.nstep_delay, config.nstep, 1).astype(jnp.int32)
    drawn = nstep.draw_windows(buffer, key, config.batch_size, config.nstep, config.gamma, n_active,
                               config.importance_exponent if config.prioritized else None)
    window, terms = drawn.items, drawn.terms
    boot_obs = returns.at_index(window.next_obs, terms.boot_index)
    batch = NStepBatch(window.obs[:, 0], window.action[:, 0], boot_obs, terms, n_active)
    return replay_learner.Drawn(batch, drawn.weights, drawn.slots)


def _store(config: Config, stacked: bool, buffer: Any, step: Step) -> Any:
    """One row of N transitions into the replay (with the actors' priorities when prioritized; as one slot with
    nstep > 1, each priority then the window's that starts there); with stacked frames, step.obs holds the
    frame numbers `learn` put there."""
    action, reward = jnp.asarray(step.action, jnp.int32), jnp.asarray(step.reward, jnp.float32)
    terminated = jnp.asarray(step.terminated, jnp.bool_)
    if stacked:
        items = FrameTransition(step.obs, action, reward, terminated)
    else:
        items = Transition(jnp.asarray(step.obs, jnp.float32), action, reward,
                           jnp.asarray(step.next_obs, jnp.float32), terminated)
    if config.nstep > 1:  # one slot: the row of N
        row = StepTransition(*items, truncated=jnp.asarray(step.truncated, jnp.bool_))
        items = jax.tree.map(lambda x: x[None], row)
    if not config.prioritized:
        return replay.add(buffer, items)
    priority = jnp.abs(jnp.asarray(step.priority, jnp.float32)) + config.priority_epsilon
    if config.nstep > 1:
        return nstep.add_prioritized(buffer, items, priority[None], config.priority_exponent)
    return prioritized.add(buffer, items, priority, config.priority_exponent)


def make_algorithm(config: Config, env: Env) -> Algorithm:
    """DQN on device: the same learner, fed one env step of all `num_envs` JAX environments per update
    (`base.on_device`); by default with uniform replay and the epsilon schedule (`Config.for_runner`)."""
    config = config.for_runner(on_device=True)
    if not has_tracers(config):
        config.validate(env)
    return on_device(make_actor_learner(config, env), env, 1, config.num_updates)


def make_train(config: Config, env: Env) -> Callable[[jax.Array], tuple[Any, dict[str, jax.Array]]]:
    """The whole run as `train(key, hparams=None) -> (state, metrics [num_updates])` (`base.make_hparams_train_fn`)."""
    return make_hparams_train_fn(make_algorithm, config.validate(env), env)

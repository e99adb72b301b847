"""M-FOS, model-free opponent shaping (Lu et al., ICML 2022; reference `meta_mfos_act.md` §2).

A meta-agent plays a matrix game against a learning opponent: each meta-step is a whole inner game (the
exact infinite-horizon value, gamma 0.96, or sampled rounds), its action is its own inner policy for that
game (5 logits of a memory-1 policy; 1 for chicken), its observation both players' last inner policies,
and the opponent updates after every meta-step by its own rule (naive learner, LOLA, best response,
static). A meta-episode (100 meta-steps) is one whole learning run of the opponent
(`sparqrl.envs.matrix.MetaGame`). Two trainers of the meta-policy:

  es   the reference's mean network (state -> tanh -> logits, deterministic; 32 units, the reference's 256 with
       --set hidden=256) evolved by an evosax strategy through the generic meta loop: `make_task` is the
       `MetaTask` 'mfos', fitness = the meta-agent's mean reward per round over `games` meta-episodes (§2.5
       trains it by a (1 + lambda) hill-climber; OpenES is pax's choice, §2.8; `ES_DEFAULTS` its settings)
  ppo  the reference's PPO (§2.4, `PPOTrainer`, on the library's PPO loss, GAE and Adam): a Gaussian
       meta-policy (256 tanh, mean and softplus(raw) as the *variance*, the reference's quirk, or as the std
       with variance='std'), a
       separate 256 tanh critic, Monte-Carlo returns (gamma 0.99) normalised over the whole batch,
       advantage = normalised return - V, clip 0.2, 4 full-batch epochs, Adam 2e-3, entropy 0.01; one
       update per meta-episode of `games` parallel games. It has the `Strategy` methods the meta loop
       uses (init, center, best; its `generation` is one meta-episode and one update), so checkpoints,
       exact resume, fitness.csv, progress and plots are the loop's own.

With `opponent='self'` (meta-self-play, §2.6) two such PPO agents learn at once (`SelfPlayTrainer`): each
meta-episode they play each other with probability 1 - lambda, lambda falling from 1 by `self_play_decay`
per meta-episode, and otherwise each plays its own naive learner.

In the reference code the M-FOS agent is the column player (player 2) and the opponent the row player.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from sparqrl import config as cfg
from sparqrl.algos.base import clipped_adam
from sparqrl.algos.ppo import losses
from sparqrl.envs import matrix
from sparqrl.meta.strategies import GenerationOutput, TellMetrics
from sparqrl.meta.tasks import MetaTask
from sparqrl.nets.distributions import DiagGaussian, diag_gaussian

TRAINERS = ("es", "ppo")
SELF = "self"
"""--opponent self: meta-self-play, two M-FOS PPO agents (§2.6)."""
VARIANCES = ("softplus", "std")
COLUMNS = ("meta_return", "opponent_return")
SELF_PLAY_COLUMNS = COLUMNS + ("agent2_return", "self_play")
SELF_PLAY_LR = 2e-4
"""The reference's Adam learning rate of both meta-self-play agents (§2.6; 2e-3 against a fixed rule)."""
DEFAULT_GAMES = {"es": 128, "ppo": 4096}
DEFAULT_HIDDEN = {"es": 32, "ppo": 256}
"""Units of the meta-policy's hidden layer per trainer when --set hidden is not given: the reference's 256 for
PPO; 32 for ES, whose search space (a tenth of the parameters) OpenES shapes the naive learner in (BENCHMARKS.md,
"M-FOS against a naive learner")."""
ES_DEFAULTS = {"seeds": 1, "sigma": 0.1, "lr": 0.2, "fitness_shaping": "z_score"}
"""--trainer es with open_es, for what the command leaves unset: the settings extortion was reached with (OpenES
population 64 x 128 games x 48 generations: the naive learner below the NL-vs-NL -1.98 in 3 seeds of 4; the
preset's sigma 0.04 / lr 0.01 and ranked fitness leave it above). One inner seed: a member's fitness already
averages --games meta-episodes."""
STATE_NAMES = ("first", "CC", "CD", "DC", "DD")
AGENTS = ("agent1", "agent2")


@dataclasses.dataclass(frozen=True)
class MfosConfig:
    """The meta-game and the M-FOS trainer (recorded as the run's inner config)."""

    game: str = "ipd"
    """The matrix game: ipd (iterated prisoner's dilemma), imp (iterated matching pennies) or chicken."""
    opponent: str = "nl"
    """The opponent's learning rule: nl (naive learner), lola, br (best response) or static; or self
    (meta-self-play: two M-FOS PPO agents, trainer ppo)."""
    trainer: str = "es"
    """es (the meta-policy's mean network evolved by the meta loop's strategy) or ppo (`PPOTrainer`)."""
    games: int = 128
    """Meta-episodes played in parallel: per fitness evaluation and inner seed (es), per update (ppo)."""
    meta_steps: int = 100
    """Meta-steps (whole inner games, each followed by the opponent's update) per meta-episode."""
    gamma: float = 0.96
    """Inner discount of the exact game values."""
    opponent_lr: float = 1.0
    """Step size of the opponent's learning rule (nl, lola) on its inner policy's logits."""
    rounds: int = 0
    """0: exact infinite-horizon values; N: rewards from N sampled rounds of play."""
    hidden: int = 256
    """Units of the meta-policy's (and critic's) hidden layer; `sparqrl meta` sets DEFAULT_HIDDEN[trainer]."""
    lr: float = 2e-3
    """ppo: Adam learning rate."""
    meta_gamma: float = 0.99
    """ppo: discount of the Monte-Carlo returns over a meta-episode's meta-steps."""
    clip_eps: float = 0.2
    """ppo: clipping range of the probability ratio."""
    epochs: int = 4
    """ppo: full-batch epochs per update."""
    ent_coef: float = 0.01
    """ppo: weight of the entropy bonus in the loss."""
    vf_coef: float = 0.5
    """ppo: weight of the critic's mean squared error in the loss (the reference's 0.5)."""
    variance: str = "softplus"
    """ppo: softplus(raw) is the Gaussian's variance (the reference's quirk) or its std ('std')."""
    eval_games: int = 1024
    """Meta-episodes of the final evaluation (summary.json's meta_return_mean, opponent_return_mean)."""
    self_play_decay: float = 0.0015
    """opponent self: lambda falls by this much per meta-episode; the agents play each other with probability
    1 - lambda, else each its own naive learner (§2.6: pure self-play from meta-episode 1 / decay)."""

    def validate(self) -> "MfosConfig":
        """Raise a `ConfigError` naming the field, its value and what is allowed; return self."""
        cfg.one_of("game", self.game, matrix.GAMES)
        cfg.one_of("opponent", self.opponent, matrix.OPPONENTS + (SELF,))
        cfg.one_of("trainer", self.trainer, TRAINERS)
        cfg.require(self.opponent != SELF or self.trainer == "ppo", "trainer", self.trainer,
                    "must be ppo for opponent self (meta-self-play trains two PPO agents)")
        cfg.one_of("variance", self.variance, VARIANCES)
        cfg.check_ints(self)
        for name in ("games", "meta_steps", "hidden", "epochs", "eval_games"):
            cfg.positive_int(name, getattr(self, name))
        cfg.require(self.rounds >= 0, "rounds", self.rounds, "must be >= 0 (0: exact values)")
        for name in ("lr", "opponent_lr", "clip_eps"):
            cfg.positive(name, getattr(self, name))
        cfg.in_range("self_play_decay", self.self_play_decay, 0)
        for name in ("gamma", "meta_gamma"):
            cfg.in_range(name, getattr(self, name), 0, 1, open_low=True, open_high=True)
        cfg.check_numbers(self)
        return self


def make_meta_game(config: MfosConfig) -> matrix.MetaGame:
    """The meta-game against the opponent's learning rule (opponent self: each agent's naive learner)."""
    opponent = "nl" if config.opponent == SELF else config.opponent
    return matrix.MetaGame(game=config.game, opponent=opponent, gamma=config.gamma, lr=config.opponent_lr,
                           meta_steps=config.meta_steps, rounds=config.rounds or None)


def make_self_play_game(config: MfosConfig) -> matrix.SelfPlayGame:
    return matrix.SelfPlayGame(game=config.game, gamma=config.gamma, meta_steps=config.meta_steps,
                               rounds=config.rounds or None)


class OneHidden(nn.Module):
    """x -> Dense(hidden) -> tanh -> Dense(out), flax's default init: the reference's meta-policy, critic and
    mean network. Not `nets.HeadMLP`: here the output layer is 'Dense_0' and the hidden one 'Dense_1' (the
    order they are built in), which fixes the init draw the documented results were reached with, the leaf
    order of the ES search space and the layout of saved best_meta_params.npz."""

    hidden: int
    out: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return nn.Dense(self.out)(jnp.tanh(nn.Dense(self.hidden)(x)))


# --------------------------------------------------------------------------------------------------
# Playing meta-episodes
# --------------------------------------------------------------------------------------------------


class Played(NamedTuple):
    """One meta-episode per game, time-major: [T, G] (obs/action [T, G, D])."""

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    reward: jax.Array
    opponent_reward: jax.Array


Policy = Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]
"""(obs [G, D], key) -> (action [G, A], log-prob [G])."""


def play(env: Any, policy: Policy, key: jax.Array, games: int) -> Played:
    """`games` whole meta-episodes (env.max_episode_steps meta-steps each) of `policy` against the opponent
    (`MetaGame.advance`: the episodes end with the scan, so no step pays for an auto-reset)."""
    reset_key, run_key = jax.random.split(key)
    obs, state = jax.vmap(env.reset)(jax.random.split(reset_key, games))

    def step(carry, k):
        obs, state = carry
        act_key, env_key = jax.random.split(k)
        action, log_prob = policy(obs, act_key)
        next_obs, state, info = jax.vmap(env.advance)(jax.random.split(env_key, games), state, action)
        return (next_obs, state), Played(obs, action, log_prob, info["reward"], info["opponent_reward"])

    _, played = jax.lax.scan(step, (obs, state), jax.random.split(run_key, env.max_episode_steps))
    return played


def play_self(env: matrix.SelfPlayGame, policy1: Policy, policy2: Policy, key: jax.Array, games: int
              ) -> tuple[Played, Played]:
    """`games` whole meta-episodes of two meta-policies against each other (meta-self-play), each side's
    view: its own observations, actions and reward, the other's reward as `opponent_reward`."""
    reset_key, run_key = jax.random.split(key)
    obs1, obs2, state = jax.vmap(env.reset)(jax.random.split(reset_key, games))

    def step(carry, k):
        obs1, obs2, state = carry
        key1, key2 = jax.random.split(k)
        action1, log_prob1 = policy1(obs1, key1)
        action2, log_prob2 = policy2(obs2, key2)
        out = jax.vmap(env.step)(state, action1, action2)  # (its auto-reset after the last step is unused)
        return (out.obs1, out.obs2, out.state), (Played(obs1, action1, log_prob1, out.reward1, out.reward2),
                                                  Played(obs2, action2, log_prob2, out.reward2, out.reward1))

    _, played = jax.lax.scan(step, (obs1, obs2, state), jax.random.split(run_key, env.meta_steps))
    return played


def deterministic(apply: Callable[[Any, jax.Array], jax.Array], params: Any) -> Policy:
    return lambda obs, key: (apply(params, obs), jnp.zeros(obs.shape[0]))


def returns_per_round(played: Played) -> tuple[jax.Array, jax.Array]:
    """Each game's mean reward per round over its meta-episode, for both sides: ([G], [G])."""
    return played.reward.mean(axis=0), played.opponent_reward.mean(axis=0)


# --------------------------------------------------------------------------------------------------
# The task (es) and its final evaluation
# --------------------------------------------------------------------------------------------------


def policy_mean_fn(config: MfosConfig, action_dim: int) -> Callable[[Any, jax.Array], jax.Array]:
    """params -> the deterministic inner policy (logits) of a trainer's centre: the ES mean network's
    output, or the PPO actor's mean."""
    if config.trainer == "es":
        return OneHidden(config.hidden, action_dim).apply
    actor = OneHidden(config.hidden, 2 * action_dim)
    return lambda params, obs: actor.apply(params, obs)[..., :action_dim]


def cooperation(config: MfosConfig, params: Any, key: jax.Array, games: int = 256
                ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The deterministic policy of a centre played for one meta-episode on `games` games (opponent self: the
    two agents against each other): the meta-agent's (agent 1's) cooperation probability per inner state and
    meta-step [T, A] (mean over games), and each side's reward per round and meta-step ([T], [T])."""
    env = make_meta_game(config)
    mean = policy_mean_fn(config, env.action_space.shape[0])
    if config.opponent == SELF:
        played, _ = play_self(make_self_play_game(config), deterministic(mean, params["agent1"]),
                              deterministic(mean, params["agent2"]), key, games)
    else:
        played = play(env, deterministic(mean, params), key, games)
    return jax.nn.sigmoid(played.action).mean(axis=1), played.reward.mean(axis=1), played.opponent_reward.mean(axis=1)


def final_evaluation(config: MfosConfig) -> Callable[[Any, jax.Array], dict[str, Any]]:
    """centre params -> summary entries: each side's mean reward per round over `eval_games` meta-episodes
    of the deterministic policy (opponent self: agent 1's and agent 2's against each other), and the meta-agent's cooperation probability per inner state, averaged
    over the games at the start and at the end of the meta-episode."""
    run = jax.jit(functools.partial(cooperation, config, games=config.eval_games))

    def evaluate(params: Any, key: jax.Array) -> dict[str, Any]:
        cooperate, mine, theirs = run(params, key)
        names = STATE_NAMES[: cooperate.shape[-1]]
        return {"meta_return_mean": float(mine.mean()), "opponent_return_mean": float(theirs.mean()),
                "cooperation_start": {n: float(p) for n, p in zip(names, cooperate[0])},
                "cooperation_end": {n: float(p) for n, p in zip(names, cooperate[-1])}}

    return evaluate


def make_task(config: MfosConfig) -> MetaTask:
    """The meta task 'mfos': genome = the mean network's params (es; zeros, pax's zero-mean start) or the
    PPO actor-critic's (ppo; flax's default init; opponent self: one per agent, {"agent1", "agent2"}); fitness (es) = mean reward per round over `games`
    meta-episodes, metrics meta_return and opponent_return."""
    config = config.validate()
    env = make_meta_game(config)
    action_dim = env.action_space.shape[0]
    obs = jnp.zeros(env.observation_shape)
    network = OneHidden(config.hidden, action_dim)

    def init(key: jax.Array | None) -> Any:
        key = jax.random.PRNGKey(0) if key is None else key
        if config.trainer == "es":
            return jax.tree.map(jnp.zeros_like, network.init(key, obs))
        def agent(k: jax.Array) -> Any:
            actor_key, critic_key = jax.random.split(k)
            return {"actor": OneHidden(config.hidden, 2 * action_dim).init(actor_key, obs),
                    "critic": OneHidden(config.hidden, 1).init(critic_key, obs)}

        if config.opponent == SELF:
            return {name: agent(k) for name, k in zip(AGENTS, jax.random.split(key))}
        return agent(key)

    def fitness(genome: Any, key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        mine, theirs = returns_per_round(play(env, deterministic(network.apply, genome), key, config.games))
        return mine.mean(), {"meta_return": mine.mean(), "opponent_return": theirs.mean()}

    return MetaTask(name="mfos", init=init, fitness=fitness, env_steps=config.games * config.meta_steps,
                    algo="mfos-self-play" if config.opponent == SELF else f"mfos-{config.trainer}",
                    inner_config=config, columns=SELF_PLAY_COLUMNS if config.opponent == SELF else COLUMNS,
                    final_evaluation=final_evaluation(config))


# --------------------------------------------------------------------------------------------------
# The PPO trainer (§2.4)
# --------------------------------------------------------------------------------------------------


def gaussian(config: MfosConfig, out: jax.Array) -> DiagGaussian:
    """The meta-policy's diagonal Gaussian from the actor's [.., 2A] output."""
    mean, raw = jnp.split(out, 2, axis=-1)
    scale = jax.nn.softplus(raw)
    if config.variance == "softplus":
        scale = jnp.sqrt(scale)  # softplus(raw) is the variance
    return diag_gaussian(mean, jnp.maximum(scale, 1e-6))


def monte_carlo_returns(rewards: jax.Array, gamma: float) -> jax.Array:
    """Discounted returns of whole meta-episodes, [T, G] -> [T, G]: PPO's `gae` with lambda 1 and V = 0 is
    exactly the Monte-Carlo return (the episode ends after the last step, where GAE's recursion starts)."""
    zeros = jnp.zeros_like(rewards)
    return losses.gae(rewards, zeros, zeros, zeros, zeros, gamma, 1.0)[0]


def mfos_loss(config: MfosConfig, actor: OneHidden, critic: OneHidden, params: Any, batch: Played, returns: jax.Array
              ) -> tuple[jax.Array, losses.LossInfo]:
    """PPO's loss (`losses.ppo_loss`) as the reference computes it (§2.4), over the whole batch: the clipped
    surrogate with advantage = normalised return - V (V held fixed) and not normalised again, an unclipped
    value loss weighted vf_coef * MSE (the library's value loss is 0.5 * MSE, hence the doubled weight), and
    the entropy bonus."""
    dist = gaussian(config, actor.apply(params["actor"], batch.obs))
    value = critic.apply(params["critic"], batch.obs)[..., 0]
    advantage = returns - jax.lax.stop_gradient(value)
    surrogate = functools.partial(losses.policy_loss, clip_eps=config.clip_eps, normalize=False)
    return losses.ppo_loss(dist.log_prob(batch.action), batch.log_prob, advantage, value, value, returns,
                           dist.entropy(), clip_eps=config.clip_eps, clip_value=False, vf_coef=2 * config.vf_coef,
                           ent_coef=config.ent_coef, policy_objective=surrogate)


def batch_loss(config: MfosConfig, actor: OneHidden, critic: OneHidden, params: Any, batch: Played) -> jax.Array:
    """`mfos_loss` on a whole meta-episode batch, its Monte-Carlo returns normalised over the batch."""
    returns = losses.normalize_advantages(monte_carlo_returns(batch.reward, config.meta_gamma), eps=1e-5)
    return mfos_loss(config, actor, critic, params, batch, returns)[0]


class TrainerState(NamedTuple):
    """The PPO trainer's state as the meta loop keeps it: the learner's and the best batch's."""

    params: Any  # {"actor", "critic"}; meta-self-play: {"agent1": {...}, "agent2": {...}}
    opt_state: Any
    generation: jax.Array  # meta-episodes done
    best_fitness: jax.Array  # best batch-mean fitness so far
    best_actor: Any  # the actor(s) that played that batch


@dataclasses.dataclass(frozen=True, eq=False)
class PPOTrainer:
    """M-FOS's PPO with the methods of `sparqrl.meta.strategies.Strategy` that the meta loop uses."""

    config: MfosConfig
    env: Any
    name: str = "ppo"
    antithetic: bool = False

    @property
    def popsize(self) -> int:
        return self.config.games

    @property
    def optimizer(self) -> optax.GradientTransformation:
        """The library's Adam (`clipped_adam`; betas 0.9, 0.999, eps 1e-8 as the reference), without clipping."""
        return clipped_adam(self.config.lr, None)

    def networks(self) -> tuple[OneHidden, OneHidden]:
        return OneHidden(self.config.hidden, 2 * self.env.action_space.shape[0]), OneHidden(self.config.hidden, 1)

    def actors(self, params: Any) -> Any:
        return params["actor"]

    def init(self, key: jax.Array, params: Any) -> TrainerState:
        del key
        return TrainerState(params, self.optimizer.init(params), jnp.zeros((), jnp.int32), jnp.asarray(-jnp.inf),
                        self.actors(params))

    def center(self, state: TrainerState) -> Any:
        return self.actors(state.params)

    def best(self, state: TrainerState) -> tuple[Any, jax.Array]:
        return state.best_actor, state.best_fitness

    def sampling(self, actor_params: Any) -> Policy:
        """The stochastic meta-policy of one actor."""
        actor, _ = self.networks()

        def policy(obs: jax.Array, k: jax.Array) -> tuple[jax.Array, jax.Array]:
            dist = gaussian(self.config, actor.apply(actor_params, obs))
            action = dist.sample(k)
            return action, dist.log_prob(action)

        return policy

    def update(self, state: TrainerState, loss: Callable[[Any], jax.Array], fitness: jax.Array, aux: dict[str, jax.Array]
               ) -> tuple[TrainerState, GenerationOutput]:
        """`epochs` full-batch Adam steps on `loss`, then the state and the loop's outputs; the actors that
        played the batch become the best if its mean `fitness` [G] is the highest so far."""
        grad_fn = jax.grad(loss)

        def epoch(carry, _):
            params, opt_state = carry
            updates, opt_state = self.optimizer.update(grad_fn(params), opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), None

        (params, opt_state), _ = jax.lax.scan(epoch, (state.params, state.opt_state), None, length=self.config.epochs)
        mean = fitness.mean()
        better = mean > state.best_fitness
        best_actor = jax.tree.map(lambda new, old: jnp.where(better, new, old), self.center(state), state.best_actor)
        new = TrainerState(params, opt_state, state.generation + 1, jnp.maximum(mean, state.best_fitness), best_actor)
        metrics = TellMetrics(generation=new.generation, mean_fitness=mean, std_fitness=fitness.std(),
                              best_fitness_in_generation=fitness.max(), best_fitness=new.best_fitness)
        return new, GenerationOutput(metrics, fitness, aux)

    def generation(self, key: jax.Array, state: TrainerState) -> tuple[TrainerState, GenerationOutput]:
        """One meta-episode of `games` games with the stochastic meta-policy, then one PPO update."""
        actor, critic = self.networks()
        play_key, _ = jax.random.split(key)
        played = play(self.env, self.sampling(state.params["actor"]), play_key, self.config.games)
        mine, theirs = returns_per_round(played)
        return self.update(state, lambda p: batch_loss(self.config, actor, critic, p, played), mine,
                           {"meta_return": mine, "opponent_return": theirs})


@dataclasses.dataclass(frozen=True, eq=False)
class SelfPlayTrainer(PPOTrainer):
    """Meta-self-play (§2.6): two M-FOS PPO agents; in meta-episode e they play each other with probability
    1 - lambda(e) (`matrix.self_play_probability`), else each its own naive learner (`env`). One Adam over
    both agents' parameters is two independent Adams (it is elementwise, and each loss sees one agent).
    The fitness of a game is the two agents' mean reward per round (their welfare; -1 is mutual
    cooperation in the IPD); the columns keep agent 1's view (`meta_return`, `opponent_return`: agent 2's
    or its naive learner's), agent 2's own reward and whether the meta-episode was self-play."""

    name: str = "ppo-self-play"

    def actors(self, params: Any) -> Any:
        return {name: params[name]["actor"] for name in AGENTS}

    def generation(self, key: jax.Array, state: TrainerState) -> tuple[TrainerState, GenerationOutput]:
        config, (actor, critic) = self.config, self.networks()
        choice_key, play_key = jax.random.split(key)
        self_play = jax.random.uniform(choice_key) < matrix.self_play_probability(state.generation,
                                                                                  config.self_play_decay)
        policy1, policy2 = (self.sampling(state.params[name]["actor"]) for name in AGENTS)

        def each_other(k: jax.Array) -> tuple[Played, Played]:
            return play_self(make_self_play_game(config), policy1, policy2, k, config.games)

        def naive_learners(k: jax.Array) -> tuple[Played, Played]:
            key1, key2 = jax.random.split(k)
            return play(self.env, policy1, key1, config.games), play(self.env, policy2, key2, config.games)

        played = jax.lax.cond(self_play, each_other, naive_learners, play_key)

        def loss(params: Any) -> jax.Array:
            return sum(batch_loss(config, actor, critic, params[name], batch) for name, batch in zip(AGENTS, played))

        (mine, theirs), (agent2, _) = (returns_per_round(batch) for batch in played)
        aux = {"meta_return": mine, "opponent_return": theirs, "agent2_return": agent2,
               "self_play": jnp.broadcast_to(self_play.astype(jnp.float32), mine.shape)}
        return self.update(state, loss, (mine + agent2) / 2, aux)


def make_trainer(task: MetaTask) -> PPOTrainer:
    config = task.inner_config
    trainer = SelfPlayTrainer if config.opponent == SELF else PPOTrainer
    return trainer(config, make_meta_game(config))

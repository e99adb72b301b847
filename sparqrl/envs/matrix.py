"""The M-FOS matrix meta-games in pure JAX (jit- and vmap-safe): IPD, iterated matching pennies, chicken.

Model-Free Opponent Shaping (Lu, Willi, Schroeder de Witt, Foerster, ICML 2022, arXiv 2205.01447);
specification `reference/meta_mfos_act.md` §2.1-2.6. Inner policies are logit vectors:

- iterated games (ipd, imp): 5 logits = the first move, then a memory-1 response to the previous joint
  outcome CC, CD, DC, DD read from the player's OWN perspective (own action first);
- chicken: 1 logit, a one-shot game.

The probability of action 0 (cooperate / heads / swerve) is sigmoid(logit). Joint outcomes are indexed
2 * a1 + a2 (CC, CD, DC, DD) from player 1's (the row player's) side; player 2's response entries are
permuted CD <-> DC to read them from its own side.

The functions here take a `Game` (or its name) as a Python value closed over at trace time: its name,
`iterated` and `policy_dim` fix the program; its payoffs are NumPy constants, though traced [2, 2] arrays
work too. Every function works on ONE game; callers vmap.

`MetaGame` is the M-FOS meta-environment (`Env` protocol): one meta-step plays a whole inner game and lets
the opponent learn once; the M-FOS agent is player 2 (the column player), the opponent player 1, as in the
reference code. `SelfPlayGame` lets two M-FOS agents play each other (meta-self-play, §2.6).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sparqrl.config import in_unit_interval, is_int, one_of, require
from sparqrl.envs.core import Box, StepOut

GAMES = ("ipd", "imp", "chicken")
OPPONENTS = ("nl", "lola", "static", "br")
_PERMUTE = np.array([0, 2, 1, 3])
"""CC, CD, DC, DD -> CC, DC, CD, DD: swaps the roles of the two players in a joint outcome."""
DEFAULT_BOUND = 1e6
"""Default action bound: the reference's meta-actions are unbounded logits; a bound this large never binds
(sigmoid saturates long before) and keeps `Box` finite."""


class Game(NamedTuple):
    """One matrix game. payoff[a1, a2] for row action a1 (player 1) and column action a2 (player 2)."""

    name: str
    payoff1: np.ndarray  # [2, 2] float32, player 1's payoff
    payoff2: np.ndarray  # [2, 2] float32, player 2's payoff
    iterated: bool  # memory-1 iterated game (5 logits) or one-shot (1 logit)
    policy_dim: int


def _game(name: str, payoff1: list, payoff2: list, iterated: bool) -> Game:
    p1, p2 = np.asarray(payoff1, np.float32), np.asarray(payoff2, np.float32)
    p1.flags.writeable = p2.flags.writeable = False  # module-level constants shared by every caller
    return Game(name, p1, p2, iterated, 5 if iterated else 1)


_IPD = [[-1.0, -3.0], [0.0, -2.0]]
_IMP = [[-1.0, 1.0], [1.0, -1.0]]
_GAMES = {
    "ipd": _game("ipd", _IPD, np.transpose(_IPD), True),  # §2.2: player 2's matrix is the transpose
    "imp": _game("imp", _IMP, np.negative(_IMP), True),  # zero-sum
    "chicken": _game("chicken", [[0.0, -1.0], [1.0, -100.0]], [[0.0, 1.0], [-1.0, -100.0]], False),
}


def get_game(name: str | Game) -> Game:
    """The `Game` called `name` (one of `GAMES`); a `Game` passes through."""
    if isinstance(name, Game):
        return name
    one_of("game", name, GAMES)
    return _GAMES[name]


def _is_count(value: object) -> bool:
    """A Python int >= 1 (not a bool): a static length."""
    return is_int(value) and value >= 1


def _check_logits(game: Game, field: str, logits: jax.Array) -> jax.Array:
    """One player's logits as float32 [policy_dim]; a wrong shape is a one-line error (at trace time)."""
    require(jnp.shape(logits) == (game.policy_dim,), field, f"an array of shape {jnp.shape(logits)}",
            f"{game.name} policies are {game.policy_dim} logits, shape ({game.policy_dim},) per game "
            "(vmap over games)")
    return jnp.asarray(logits, jnp.float32)


def _joint(p: jax.Array, q: jax.Array) -> jax.Array:
    """Joint outcome probabilities [..., 4] (CC, CD, DC, DD) from independent cooperation probabilities."""
    return jnp.stack([p * q, p * (1 - q), (1 - p) * q, (1 - p) * (1 - q)], axis=-1)


def _coop(game: Game, logits: jax.Array, player: int) -> tuple[jax.Array, jax.Array]:
    """(first-move, response [4]) cooperation probabilities of `player`, responses indexed by joint
    outcomes from player 1's side. Chicken: both are the one-shot probability ([], [1])."""
    p = jax.nn.sigmoid(logits)
    if not game.iterated:
        return p[0], p
    response = p[1:] if player == 1 else p[1:][_PERMUTE]
    return p[0], response


def outcome_distribution(game: str | Game, logits1: jax.Array, logits2: jax.Array,
                         gamma: float | jax.Array = 0.96) -> jax.Array:
    """Normalised discounted visitation of joint outcomes, [4] (CC, CD, DC, DD; sums to 1).

    Iterated games: (1 - gamma) * p0 (I - gamma P)^-1, with p0 the first round's joint-outcome probabilities
    and P[s, s'] the 4x4 transition matrix the two memory-1 policies induce. Chicken: the one-shot joint
    probabilities (gamma unused). logits: [policy_dim] each.
    """
    game = get_game(game)
    logits1 = _check_logits(game, "logits1", logits1)
    logits2 = _check_logits(game, "logits2", logits2)
    first1, response1 = _coop(game, logits1, 1)
    first2, response2 = _coop(game, logits2, 2)
    p0 = _joint(first1, first2)
    if not game.iterated:
        return p0
    transition = _joint(response1, response2)  # [4, 4]: row = previous outcome
    system = jnp.eye(4, dtype=jnp.float32) - gamma * transition
    visits = _solve_dominant(system.T, p0)  # p0 (I - gamma P)^-1, as a column solve
    return (1 - gamma) * visits


def _solve_dominant(a: jax.Array, b: jax.Array) -> jax.Array:
    """x with a x = b for a [n, n] strictly diagonally dominant, b [n]: Gauss-Jordan elimination without
    pivoting, unrolled, in elementwise operations only.

    Written here rather than `jnp.linalg.solve` because jaxlib 0.10's batched LAPACK solve on the CPU
    (vmapped over thousands of games, and differentiated by the learning opponents) was seen to hang with
    every thread waiting, from 4,096 games on, as its batched QR does (`sparqrl.nets.sequential_under_vmap`);
    dots, batched the same way, are avoided too. (I - gamma P)^T is column diagonally dominant for
    gamma < 1 (P's rows sum to 1), so no pivoting is needed.
    """
    n = a.shape[0]
    augmented = jnp.concatenate([a, b[:, None]], axis=1)  # [n, n + 1]
    for k in range(n):
        row = augmented[k] / augmented[k, k]
        augmented = (augmented - augmented[:, k, None] * row[None, :]).at[k].set(row)
    return augmented[:, n]


def _expected(outcomes: jax.Array, payoff: np.ndarray) -> jax.Array:
    """outcomes [4] . payoff [2, 2] flattened, as a sum of products (no dot: see `_solve_dominant`)."""
    return jnp.sum(outcomes * jnp.reshape(jnp.asarray(payoff, jnp.float32), (4,)), axis=-1)


def exact_values(game: str | Game, logits1: jax.Array, logits2: jax.Array,
                 gamma: float | jax.Array = 0.96) -> tuple[jax.Array, jax.Array]:
    """Each player's exact expected reward per round, (r1, r2) scalars (§2.1).

    Iterated games: the infinitely discounted value p0 (I - gamma P)^-1 . payoff times (1 - gamma), an
    average reward per round. Chicken: the one-shot expected payoff. logits: [policy_dim] each.
    """
    game = get_game(game)
    outcomes = outcome_distribution(game, logits1, logits2, gamma)
    return _expected(outcomes, game.payoff1), _expected(outcomes, game.payoff2)


def value_of(game: str | Game, player: int, own: jax.Array, other: jax.Array,
             gamma: float | jax.Array = 0.96) -> jax.Array:
    """The exact value of `player` (1 = row, 2 = column) playing logits `own` against `other`: a scalar."""
    require(player in (1, 2), "player", player, "must be 1 (row) or 2 (column)")
    if player == 1:
        return exact_values(game, own, other, gamma)[0]
    return exact_values(game, other, own, gamma)[1]


def _sample_oneshot(key: jax.Array, game: Game, logits1: jax.Array, logits2: jax.Array,
                    rounds: int) -> tuple[jax.Array, jax.Array]:
    """`rounds` independent one-shot plays; mean rewards (r1, r2)."""
    u = jax.random.uniform(key, (rounds, 2))
    a1 = (u[:, 0] >= jax.nn.sigmoid(logits1[0])).astype(jnp.int32)  # 1 = defect / straight
    a2 = (u[:, 1] >= jax.nn.sigmoid(logits2[0])).astype(jnp.int32)
    return jnp.mean(jnp.asarray(game.payoff1)[a1, a2]), jnp.mean(jnp.asarray(game.payoff2)[a1, a2])


def _sample_iterated(key: jax.Array, game: Game, logits1: jax.Array, logits2: jax.Array,
                     rounds: int) -> tuple[jax.Array, jax.Array]:
    """`rounds` rounds of memory-1 play; mean rewards (r1, r2)."""
    first1, response1 = _coop(game, logits1, 1)
    first2, response2 = _coop(game, logits2, 2)
    # Index 4 stands for "no previous round", so one table serves the first move and the responses.
    coop1 = jnp.concatenate([response1, first1[None]])
    coop2 = jnp.concatenate([response2, first2[None]])
    reward1, reward2 = jnp.asarray(game.payoff1).reshape(4), jnp.asarray(game.payoff2).reshape(4)

    def play(previous: jax.Array, u: jax.Array) -> tuple[jax.Array, jax.Array]:
        a1 = (u[0] >= coop1[previous]).astype(jnp.int32)
        a2 = (u[1] >= coop2[previous]).astype(jnp.int32)
        outcome = 2 * a1 + a2
        return outcome, outcome

    _, outcomes = jax.lax.scan(play, jnp.int32(4), jax.random.uniform(key, (rounds, 2)))
    return jnp.mean(reward1[outcomes]), jnp.mean(reward2[outcomes])


def sample_rounds(key: jax.Array, game: str | Game, logits1: jax.Array, logits2: jax.Array,
                  rounds: int) -> tuple[jax.Array, jax.Array]:
    """Each player's mean reward per round over `rounds` sampled rounds of play, (r1, r2) scalars.

    Iterated games: one play of `rounds` rounds with the memory-1 policies; chicken: `rounds` independent
    one-shot plays. logits: [policy_dim] each; `rounds` a Python int (a static shape).
    """
    game = get_game(game)
    require(_is_count(rounds), "rounds", rounds, "must be an integer >= 1")
    logits1 = _check_logits(game, "logits1", logits1)
    logits2 = _check_logits(game, "logits2", logits2)
    sample = _sample_iterated if game.iterated else _sample_oneshot
    return sample(key, game, logits1, logits2, rounds)


# ---- opponents ----------------------------------------------------------------------------------


def learning_objective(game: str | Game, player: int, own: jax.Array, other: jax.Array,
                       gamma: float | jax.Array = 0.96) -> jax.Array:
    """What the learning opponents ascend, a scalar: the discounted return sum_t gamma^t r_t =
    value / (1 - gamma) for iterated games, the one-shot expected payoff for chicken.

    The reference differentiates this un-normalised loss (`ipd_batched`'s L) while its rewards are per
    round; lr = 1 is tuned to this scale (NL vs NL in the IPD reaches about -1.98 per round, §2.9).
    """
    value = value_of(game, player, own, other, gamma)
    return value / (1 - gamma) if get_game(game).iterated else value


def naive_step(game: str | Game, own: jax.Array, other: jax.Array, lr: float | jax.Array = 1.0,
               gamma: float | jax.Array = 0.96, player: int = 1) -> jax.Array:
    """A naive learner's step (NL, §2.3): exact gradient ascent on `learning_objective`,
    own + lr * d objective(player, own, other) / d own. [policy_dim]."""
    grad = jax.grad(lambda mine: learning_objective(game, player, mine, other, gamma))(own)
    return own + lr * grad


def lola_step(game: str | Game, own: jax.Array, other: jax.Array, lr: float | jax.Array = 1.0,
              gamma: float | jax.Array = 0.96, player: int = 1, taylor: bool = False) -> jax.Array:
    """One exact LOLA step (Foerster et al. 2018) on `learning_objective` V, [policy_dim].

    Lookahead form (default): ascend V_own(own, other + lr * grad_other V_other(own, other)), differentiating
    through the other's naive step (higher-order gradients). taylor=True: its first-order expansion, the
    form the M-FOS code uses, grad_own [V_own + lr * grad_other V_own . grad_other V_other]. The two
    steps agree up to O(lr^3) and differ clearly at lr = 1.
    """
    rival = 3 - player

    def lookahead(mine: jax.Array) -> jax.Array:
        other_next = naive_step(game, other, mine, lr, gamma, player=rival)
        return learning_objective(game, player, mine, other_next, gamma)

    def expansion(mine: jax.Array) -> jax.Array:
        grad_mine = jax.grad(lambda o: learning_objective(game, player, mine, o, gamma))(other)
        grad_theirs = jax.grad(lambda o: learning_objective(game, rival, o, mine, gamma))(other)
        return learning_objective(game, player, mine, other, gamma) + lr * jnp.sum(grad_mine * grad_theirs)

    return own + lr * jax.grad(expansion if taylor else lookahead)(own)


def best_response(game: str | Game, other: jax.Array, lr: float | jax.Array = 1.0,
                  gamma: float | jax.Array = 0.96, steps: int = 1000, player: int = 1) -> jax.Array:
    """Best response by `steps` naive gradient steps (`lax.fori_loop`) against fixed `other` (BR, §2.3).

    The start is all-zero logits (every probability 0.5), as the reference's `compute_best_response`
    (std 0), not its `MetaGames` BR's N(0, 1) draw: the response is then a deterministic function of
    `other` and needs no key. [policy_dim].
    """

    def ascend(_: int, mine: jax.Array) -> jax.Array:
        return naive_step(game, mine, other, lr, gamma, player)

    return jax.lax.fori_loop(0, steps, ascend, jnp.zeros_like(jnp.asarray(other, jnp.float32)))


def opponent_step(game: str | Game, kind: str, own_logits: jax.Array, other_logits: jax.Array,
                  lr: float | jax.Array = 1.0, gamma: float | jax.Array = 0.96, br_steps: int = 1000,
                  player: int = 1, lola_taylor: bool = False) -> jax.Array:
    """A learning player's next logits by its rule `kind` (one of `OPPONENTS`), [policy_dim].

    nl: one exact gradient ascent step on its `learning_objective`; lola: one exact LOLA step (lookahead
    form, or the reference code's first-order form with lola_taylor); static: unchanged;
    br: best response to `other_logits` by `br_steps` gradient steps from zero logits. `player` is the
    learner's seat: 1 (row; the M-FOS opponent) or 2 (column; e.g. an NL facing an agent in self-play).
    """
    one_of("opponent", kind, OPPONENTS)
    own = jnp.asarray(own_logits, jnp.float32)
    if kind == "nl":
        return naive_step(game, own, other_logits, lr, gamma, player)
    if kind == "lola":
        return lola_step(game, own, other_logits, lr, gamma, player, taylor=lola_taylor)
    if kind == "br":
        return best_response(game, other_logits, lr, gamma, br_steps, player)
    return own


# ---- the M-FOS meta-environment -------------------------------------------------------------------


class MetaState(NamedTuple):
    """A meta-episode's state (one game; vmapped: a leading [B])."""

    agent_logits: jax.Array  # [policy_dim] the agent's logits last played
    opponent_logits: jax.Array  # [policy_dim] the opponent's logits, to be played next
    t: jax.Array  # int32 meta-steps taken in this meta-episode


def _check_common(gamma: float, meta_steps: int, rounds: int | None, action_bound: float) -> None:
    """The checks `MetaGame` and `SelfPlayGame` share (one-line `ConfigError`s)."""
    in_unit_interval("gamma", gamma, closed_right=False)
    require(_is_count(meta_steps), "meta_steps", meta_steps, "must be an integer >= 1")
    require(rounds is None or _is_count(rounds), "rounds", rounds,
            "must be None (exact infinite-horizon values) or an integer >= 1")
    require(math.isfinite(action_bound) and action_bound > 0, "action_bound", action_bound,
            "must be a finite number > 0")


def _play(key: jax.Array, game: Game, logits1: jax.Array, logits2: jax.Array, gamma: float,
          rounds: int | None) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """One inner game: rewards (r1, r2), exact or the mean of `rounds` sampled rounds, and how often each
    player cooperates ({"cooperation1", "cooperation2"}: discounted frequencies; chicken: probabilities)."""
    outcomes = outcome_distribution(game, logits1, logits2, gamma)
    if rounds is None:
        r1, r2 = _expected(outcomes, game.payoff1), _expected(outcomes, game.payoff2)
    else:
        r1, r2 = sample_rounds(key, game, logits1, logits2, rounds)
    return r1, r2, {"cooperation1": outcomes[0] + outcomes[1], "cooperation2": outcomes[0] + outcomes[2]}


def _observe(own: jax.Array, other: jax.Array) -> jax.Array:
    """The meta-observation sigmoid(concat(own, other)), [2 * policy_dim] in (0, 1)."""
    return jax.nn.sigmoid(jnp.concatenate([own, other]))


def _auto_reset(done: jax.Array, fresh: NamedTuple, reached: NamedTuple) -> NamedTuple:
    return jax.tree.map(lambda a, b: jnp.where(done, a, b), fresh, reached)


class _LogitsGame:
    """What both meta-games share: the inner game (`spec`, from the subclass's `game` field) and their spaces:
    observations [2 * policy_dim] (both players' logits), actions one player's logits [policy_dim], clipped
    to the subclass's ±`action_bound`."""

    @property
    def spec(self) -> Game:
        return get_game(self.game)

    @property
    def observation_shape(self) -> tuple[int, ...]:
        return (2 * self.spec.policy_dim,)

    @property
    def action_space(self) -> Box:
        return Box.make(-self.action_bound, self.action_bound, (self.spec.policy_dim,))


@dataclasses.dataclass(frozen=True)
class MetaGame(_LogitsGame):
    """M-FOS meta-game (§2.1) against a learning opponent, following the `Env` protocol. The agent is the
    column player (player 2), the opponent the row player, as in the reference code.

    Observation [2 * policy_dim] = sigmoid(concat(agent's logits just played, opponent's logits before its
    update)). Action [policy_dim] = the agent's next logits. Reward = the agent's reward per round of the
    inner game; `info`: opponent_reward, agent_cooperation, opponent_cooperation (discounted frequencies
    of cooperating). A meta-episode lasts `meta_steps` meta-steps and ends with terminated=True.
    """

    game: str = "ipd"
    """One of GAMES: ipd, imp, chicken."""
    opponent: str = "nl"
    """The opponent's learning rule, one of OPPONENTS: nl, lola, static, br."""
    gamma: float = 0.96
    """Inner discount of the exact values (and of the opponent's gradients)."""
    lr: float = 1.0
    """The opponent's learning rate (also of LOLA's lookahead and of BR's gradient steps)."""
    meta_steps: int = 100
    """Meta-steps (opponent updates) per meta-episode."""
    rounds: int | None = None
    """None: rewards are the exact infinite-horizon values; an int: the mean of that many sampled rounds."""
    br_steps: int = 1000
    """Gradient steps of the best-response opponent per meta-step."""
    lola_taylor: bool = False
    """LOLA opponent: False = the exact lookahead step; True = the first-order (Taylor) step of the M-FOS
    code (`lola_step`)."""
    action_bound: float = DEFAULT_BOUND
    """Actions (logits) are clipped to [-action_bound, action_bound]. The default never binds (unbounded
    logits, as the reference); an algorithm that scales a tanh output to the bounds wants about 10."""

    def __post_init__(self) -> None:
        one_of("game", self.game, GAMES)
        one_of("opponent", self.opponent, OPPONENTS)
        require(math.isfinite(self.lr) and self.lr >= 0, "lr", self.lr, "must be a finite number >= 0")
        require(_is_count(self.br_steps), "br_steps", self.br_steps, "must be an integer >= 1")
        _check_common(self.gamma, self.meta_steps, self.rounds, self.action_bound)

    @property
    def name(self) -> str:
        return f"mfos-{self.game}-{self.opponent}"

    @property
    def max_episode_steps(self) -> int:
        return self.meta_steps

    def advance(self, key: jax.Array, state: MetaState, action: jax.Array) -> tuple[jax.Array, MetaState, dict]:
        """Play `action` against the opponent's current logits, then let the opponent learn once: one
        meta-step without the auto-reset, for callers that play whole meta-episodes (`sparqrl.meta.mfos`).
        Returns (obs, state, info with the agent's reward under "reward")."""
        opponent = state.opponent_logits
        r_opponent, r_agent, coop = _play(key, self.spec, opponent, action, self.gamma, self.rounds)
        updated = opponent_step(self.spec, self.opponent, opponent, action, self.lr, self.gamma, self.br_steps,
                                lola_taylor=self.lola_taylor)
        info = {"reward": r_agent, "opponent_reward": r_opponent, "agent_cooperation": coop["cooperation2"],
                "opponent_cooperation": coop["cooperation1"]}
        return _observe(action, opponent), MetaState(action, updated, state.t + 1), info

    def reset_with(self, key: jax.Array, opponent_logits: jax.Array) -> tuple[jax.Array, MetaState]:
        """Reset with given opponent logits [policy_dim] (e.g. a MAMAML initialisation): the agent's first
        logits ~ N(0, 1) and one step is played, its reward discarded (§2.1)."""
        key_agent, key_play = jax.random.split(key)
        dim = self.spec.policy_dim
        agent = jax.random.normal(key_agent, (dim,), jnp.float32)
        opponent = _check_logits(self.spec, "opponent_logits", opponent_logits)
        start = MetaState(agent, opponent, jnp.int32(0))
        obs, state, _ = self.advance(key_play, start, agent)
        return obs, state._replace(t=jnp.int32(0))

    def reset(self, key: jax.Array) -> tuple[jax.Array, MetaState]:
        """A new meta-episode: opponent logits ~ N(0, 1), then `reset_with`. obs [2 * policy_dim]."""
        key_opponent, key_rest = jax.random.split(key)
        return self.reset_with(key_rest, jax.random.normal(key_opponent, (self.spec.policy_dim,), jnp.float32))

    def step(self, key: jax.Array, state: MetaState, action: jax.Array) -> StepOut:
        """One meta-step for one game (auto-resets after `meta_steps`); action [policy_dim] logits."""
        key_play, key_reset = jax.random.split(key)
        action = jnp.clip(_check_logits(self.spec, "action", action), -self.action_bound, self.action_bound)
        obs, reached, info = self.advance(key_play, state, action)
        terminated = reached.t >= self.meta_steps
        fresh_obs, fresh = self.reset(key_reset)
        return StepOut(
            obs=jnp.where(terminated, fresh_obs, obs),
            state=_auto_reset(terminated, fresh, reached),
            reward=info.pop("reward"),
            terminated=terminated,
            truncated=jnp.zeros((), jnp.bool_),
            final_obs=obs,
            info=info,
        )


# ---- meta-self-play ---------------------------------------------------------------------------------


class SelfPlayState(NamedTuple):
    """Two M-FOS agents' meta-episode (one game; vmapped: a leading [B])."""

    logits1: jax.Array  # [policy_dim] player 1's (row) logits last played
    logits2: jax.Array  # [policy_dim] player 2's (column) logits last played
    t: jax.Array  # int32 meta-steps taken in this meta-episode
    key: jax.Array  # PRNG key for sampled rounds and the auto-reset, so `step` takes none


class SelfPlayOut(NamedTuple):
    """What `SelfPlayGame.step` returns; obs/final_obs are each player's own view, [2 * policy_dim]."""

    obs1: jax.Array
    obs2: jax.Array
    state: SelfPlayState
    reward1: jax.Array
    reward2: jax.Array
    terminated: jax.Array  # the meta-episode ended (the state is already the next one's)
    final_obs1: jax.Array
    final_obs2: jax.Array
    info: dict[str, jax.Array]


def self_play_probability(episode: int | jax.Array, decay: float | jax.Array = 0.0015) -> jax.Array:
    """Probability that the two M-FOS agents play each other in meta-episode `episode` (§2.6):
    1 - lambda, with lambda = max(0, 1 - decay * episode) starting at 1; pure self-play from 1 / decay.
    Traceable (the trainer draws it inside its compiled generation); episode and decay must be >= 0."""
    return 1.0 - jnp.maximum(0.0, 1.0 - decay * jnp.asarray(episode, jnp.float32))


@dataclasses.dataclass(frozen=True)
class SelfPlayGame(_LogitsGame):
    """Meta-self-play (§2.6): two M-FOS agents choose their logits each meta-step and play each other.

    Each player observes sigmoid(concat(own logits, other's logits)) as just played (its own logits are
    already read from its own perspective) and receives its own reward per round.
    """

    game: str = "ipd"
    """One of GAMES: ipd, imp, chicken."""
    gamma: float = 0.96
    """Inner discount of the exact values."""
    meta_steps: int = 100
    """Meta-steps per meta-episode."""
    rounds: int | None = None
    """None: exact infinite-horizon values; an int: the mean of that many sampled rounds."""
    action_bound: float = DEFAULT_BOUND
    """Both players' logits are clipped to [-action_bound, action_bound] (see `MetaGame.action_bound`)."""

    def __post_init__(self) -> None:
        one_of("game", self.game, GAMES)
        _check_common(self.gamma, self.meta_steps, self.rounds, self.action_bound)

    def reset(self, key: jax.Array) -> tuple[jax.Array, jax.Array, SelfPlayState]:
        """A new meta-episode: both players' first logits ~ N(0, 1), shown in the first observations (as the
        reference's reset, no rewards). Returns (obs1, obs2, state), obs [2 * policy_dim] each."""
        key1, key2, key_next = jax.random.split(key, 3)
        dim = self.spec.policy_dim
        logits1 = jax.random.normal(key1, (dim,), jnp.float32)
        logits2 = jax.random.normal(key2, (dim,), jnp.float32)
        state = SelfPlayState(logits1, logits2, jnp.int32(0), key_next)
        return _observe(logits1, logits2), _observe(logits2, logits1), state

    def step(self, state: SelfPlayState, action1: jax.Array, action2: jax.Array) -> SelfPlayOut:
        """Both players play their new logits [policy_dim]; auto-resets after `meta_steps`."""
        key_play, key_reset, key_next = jax.random.split(state.key, 3)
        bound = self.action_bound
        action1 = jnp.clip(_check_logits(self.spec, "action1", action1), -bound, bound)
        action2 = jnp.clip(_check_logits(self.spec, "action2", action2), -bound, bound)
        reward1, reward2, cooperation = _play(key_play, self.spec, action1, action2, self.gamma, self.rounds)
        reached = SelfPlayState(action1, action2, state.t + 1, key_next)
        obs1, obs2 = _observe(action1, action2), _observe(action2, action1)
        terminated = reached.t >= self.meta_steps
        fresh_obs1, fresh_obs2, fresh = self.reset(key_reset)
        return SelfPlayOut(
            obs1=jnp.where(terminated, fresh_obs1, obs1), obs2=jnp.where(terminated, fresh_obs2, obs2),
            state=_auto_reset(terminated, fresh, reached), reward1=reward1, reward2=reward2,
            terminated=terminated, final_obs1=obs1, final_obs2=obs2,
            info=cooperation,
        )

"""M-FOS matrix meta-games (sparqrl/envs/matrix.py) against plain NumPy and the numbers of
reference/meta_mfos_act.md §2.2, §2.9 and §8.2."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparqrl.config import ConfigError
from sparqrl.envs import matrix as mx
from sparqrl.envs.core import Box, StepOut

GAMMA = 0.96
C, D = 20.0, -20.0  # saturated logits: deterministic play
ALL_C = np.full(5, C, np.float32)
ALL_D = np.full(5, D, np.float32)
TFT = np.array([C, C, D, C, D], np.float32)  # cooperate first, then copy the other's last move


# ---- plain NumPy references ---------------------------------------------------------------------


def np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


def np_chain(game: mx.Game, logits1: np.ndarray, logits2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(p0 [4], P [4, 4]) of the joint-outcome Markov chain, each player reading outcomes as (own, other)."""
    p1, p2 = np_sigmoid(logits1), np_sigmoid(logits2)
    prob = lambda c, a: c if a == 0 else 1.0 - c  # noqa: E731  (action 0 = cooperate)
    p0 = np.array([prob(p1[0], a1) * prob(p2[0], a2) for a1 in (0, 1) for a2 in (0, 1)])
    transition = np.zeros((4, 4))
    for b1 in (0, 1):
        for b2 in (0, 1):  # previous round: player 1 played b1, player 2 played b2
            c1 = p1[1 + 2 * b1 + b2]  # player 1 sees (own b1, other b2)
            c2 = p2[1 + 2 * b2 + b1]  # player 2 sees (own b2, other b1)
            for a1 in (0, 1):
                for a2 in (0, 1):
                    transition[2 * b1 + b2, 2 * a1 + a2] = prob(c1, a1) * prob(c2, a2)
    return p0, transition


def np_values(game: mx.Game, logits1, logits2, gamma: float = GAMMA, horizon: int | None = None):
    """Per-round rewards (r1, r2): (1 - gamma) sum_t gamma^t p0 P^t r over 3000 rounds, or the plain mean
    over the first `horizon` rounds."""
    p0, transition = np_chain(game, logits1, logits2)
    rewards = np.stack([game.payoff1.reshape(4), game.payoff2.reshape(4)], axis=1).astype(np.float64)
    total, dist = np.zeros(2), p0
    steps = 3000 if horizon is None else horizon
    weight = 1.0
    for _ in range(steps):
        total += weight * dist @ rewards
        dist = dist @ transition
        weight *= gamma if horizon is None else 1.0
    return total * (1 - gamma) if horizon is None else total / horizon


# ---- shared jitted functions ----------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def batched_values(game: str):
    return jax.jit(jax.vmap(lambda a, b: jnp.stack(mx.exact_values(game, a, b))))


@functools.lru_cache(maxsize=None)
def learning_run(kind1: str, kind2: str, steps: int = 100):
    """(game name, logits1 [B, 5], logits2 [B, 5]) -> rewards [B, steps, 2] of both players learning at once.
    The payoffs are traced, so the iterated games share one compilation."""

    @jax.jit
    def run(payoff1, payoff2, logits1, logits2):
        game = mx.Game("iterated", payoff1, payoff2, True, 5)
        return jax.vmap(lambda a, b: one(game, a, b))(logits1, logits2)

    def one(game, logits1, logits2):
        def body(carry, _):
            a, b = carry
            rewards = jnp.stack(mx.exact_values(game, a, b))
            nxt = (mx.opponent_step(game, kind1, a, b, player=1), mx.opponent_step(game, kind2, b, a, player=2))
            return nxt, rewards

        return jax.lax.scan(body, (logits1, logits2), None, steps)[1]

    return lambda name, logits1, logits2: run(mx.get_game(name).payoff1, mx.get_game(name).payoff2, logits1, logits2)


@functools.lru_cache(maxsize=None)
def batched_step(game: str, kind: str, player: int = 1):
    """Jitted, vmapped `opponent_step`: (own [B, D], other [B, D]) -> [B, D]."""
    return jax.jit(jax.vmap(lambda own, other: mx.opponent_step(game, kind, own, other, player=player)))


def normal_starts(seed: int, n: int = 256, dim: int = 5):
    key1, key2 = jax.random.split(jax.random.PRNGKey(seed))
    return jax.random.normal(key1, (n, dim)), jax.random.normal(key2, (n, dim))


# ---- games and exact values -----------------------------------------------------------------------


def test_games_follow_the_payoff_table():
    ipd, imp, chicken = (mx.get_game(g) for g in mx.GAMES)
    np.testing.assert_array_equal(ipd.payoff1, [[-1, -3], [0, -2]])
    np.testing.assert_array_equal(ipd.payoff2, ipd.payoff1.T)
    np.testing.assert_array_equal(imp.payoff2, -imp.payoff1)
    np.testing.assert_array_equal(chicken.payoff2, [[0, 1], [-1, -100]])
    assert (ipd.policy_dim, imp.policy_dim, chicken.policy_dim) == (5, 5, 1)
    assert ipd.iterated and imp.iterated and not chicken.iterated
    assert ipd.payoff1.dtype == np.float32
    with pytest.raises(ConfigError, match=r"game='pd'.*ipd, imp, chicken"):
        mx.get_game("pd")


@pytest.mark.parametrize("first, second, expected", [
    (ALL_C, ALL_C, (-1.0, -1.0)),
    (ALL_D, ALL_D, (-2.0, -2.0)),
    (TFT, ALL_D, (-2.04, -1.92)),  # -2 - (1 - gamma) and -2 gamma
    (ALL_D, TFT, (-1.92, -2.04)),
    (TFT, TFT, (-1.0, -1.0)),
    (ALL_D, ALL_C, (0.0, -3.0)),
])
def test_ipd_exact_values_of_deterministic_policies(first, second, expected):
    np.testing.assert_allclose(batched_values("ipd")(first[None], second[None])[0], expected, atol=1e-3)


@pytest.mark.parametrize("game", ["ipd", "imp"])
def test_exact_values_match_a_numpy_markov_chain(game):
    rng = np.random.default_rng(1)
    logits1, logits2 = (rng.normal(0, 2, (8, 5)).astype(np.float32) for _ in range(2))
    got = np.asarray(batched_values(game)(logits1, logits2))
    want = np.array([np_values(mx.get_game(game), a, b) for a, b in zip(logits1, logits2)])
    np.testing.assert_allclose(got, want, atol=2e-4)
    outcomes = jax.vmap(lambda a, b: mx.outcome_distribution(game, a, b))(logits1, logits2)
    np.testing.assert_allclose(np.sum(outcomes, -1), 1.0, atol=1e-5)


def test_chicken_is_the_one_shot_expectation():
    for l1, l2 in [(0.3, -1.2), (2.0, 0.5), (-3.0, -3.0)]:
        p, q = 1 / (1 + np.exp(-l1)), 1 / (1 + np.exp(-l2))
        r1 = p * (1 - q) * -1 + (1 - p) * q * 1 + (1 - p) * (1 - q) * -100
        r2 = p * (1 - q) * 1 + (1 - p) * q * -1 + (1 - p) * (1 - q) * -100
        got = mx.exact_values("chicken", jnp.array([l1]), jnp.array([l2]))
        np.testing.assert_allclose(got, (r1, r2), rtol=1e-5, atol=1e-5)


def test_a_wrong_logit_shape_is_a_one_line_error():
    with pytest.raises(ConfigError, match="logits2.*shape \\(5,\\)"):
        mx.exact_values("ipd", ALL_C, np.zeros(4, np.float32))


# ---- sampled play -------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def batched_samples(game: str, rounds: int):
    return jax.jit(jax.vmap(lambda k, a, b: jnp.stack(mx.sample_rounds(k, game, a, b, rounds)),
                            in_axes=(0, None, None)))


def test_sample_rounds_of_deterministic_policies_are_exact():
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    rewards = batched_samples("ipd", 20)(keys, TFT, ALL_D)
    np.testing.assert_allclose(rewards, [[-2.05, -1.9]] * 2, atol=1e-5)  # one sucker round, then mutual D


@pytest.mark.parametrize("game", ["ipd", "imp"])
def test_sample_rounds_converge_to_the_finite_horizon_expectation(game):
    rng = np.random.default_rng(2)
    logits1, logits2 = rng.normal(0, 1, 5).astype(np.float32), rng.normal(0, 1, 5).astype(np.float32)
    keys = jax.random.split(jax.random.PRNGKey(3), 8192)
    got = np.asarray(batched_samples(game, 20)(keys, logits1, logits2)).mean(0)
    want = np_values(mx.get_game(game), logits1, logits2, horizon=20)
    np.testing.assert_allclose(got, want, atol=0.05)  # standard error below 0.015


def test_chicken_samples_converge_to_the_one_shot_expectation():
    logits1, logits2 = np.array([1.0], np.float32), np.array([0.5], np.float32)
    keys = jax.random.split(jax.random.PRNGKey(4), 16)
    got = np.asarray(batched_samples("chicken", 4096)(keys, logits1, logits2)).mean(0)
    want = np.asarray(mx.exact_values("chicken", logits1, logits2))
    np.testing.assert_allclose(got, want, atol=0.6)  # standard error about 0.12


# ---- learning opponents -------------------------------------------------------------------------


def test_the_two_seats_agree_in_the_symmetric_ipd():
    own, other = normal_starts(5, n=4)
    values = batched_values("ipd")(own, other)
    np.testing.assert_allclose(values, batched_values("ipd")(other, own)[:, ::-1], rtol=1e-5)

    @jax.jit
    def both_seats(own, other):
        return [[mx.opponent_step("ipd", kind, own, other, player=seat) for seat in (1, 2)] for kind in ("nl", "lola")]

    for row, col in both_seats(own[0], other[0]):
        np.testing.assert_allclose(row, col, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(mx.opponent_step("ipd", "static", own[0], other[0]), own[0])


def test_nl_step_follows_a_finite_difference_gradient():
    rng = np.random.default_rng(6)
    own, other = rng.normal(0, 1, 5), rng.normal(0, 1, 5)
    eps, grad = 1e-4, np.zeros(5)
    for i in range(5):
        up, down = own.copy(), own.copy()
        up[i] += eps
        down[i] -= eps
        ipd = mx.get_game("ipd")
        grad[i] = (np_values(ipd, up, other)[0] - np_values(ipd, down, other)[0]) / (2 * eps)
    got = batched_step("ipd", "nl")(own[None].astype(np.float32), other[None].astype(np.float32))[0]
    np.testing.assert_allclose(got, own + grad / (1 - GAMMA), atol=2e-3)  # the discounted-return scale, lr 1


def test_nl_vs_nl_matches_the_reference_numbers():
    ipd = np.asarray(learning_run("nl", "nl")("ipd", *normal_starts(0)))
    np.testing.assert_allclose(ipd.mean((0, 1)), [-1.98, -1.98], atol=0.03)
    imp = np.asarray(learning_run("nl", "nl")("imp", *normal_starts(0)))
    np.testing.assert_allclose(imp.mean((0, 1)), [0.0, 0.0], atol=0.05)


def test_lola_earns_more_than_nl_in_the_ipd():
    rewards = np.asarray(learning_run("lola", "nl")("ipd", *normal_starts(0))).mean((0, 1))
    assert rewards[0] > rewards[1] + 0.1, rewards


def test_lola_lookahead_and_taylor_forms_agree_for_small_steps():
    rng = np.random.default_rng(7)
    own, other = rng.normal(0, 1, 5).astype(np.float32), rng.normal(0, 1, 5).astype(np.float32)
    lr = 0.01
    steps = jax.jit(lambda a, b: (mx.lola_step("ipd", a, b, lr), mx.lola_step("ipd", a, b, lr, taylor=True),
                                  mx.naive_step("ipd", a, b, lr)))
    lookahead, taylor, naive = steps(own, other)
    shaping = np.abs(lookahead - naive).max()
    assert shaping > 1e-4  # the LOLA term is there
    assert np.abs(lookahead - taylor).max() < 0.05 * shaping  # and both forms give it to first order


def test_best_response_beats_random_policies():
    others = np.concatenate([np.asarray(jax.random.normal(jax.random.PRNGKey(8), (4, 5))), ALL_D[None]])
    responses = np.asarray(batched_step("ipd", "br")(np.zeros_like(others), others))
    value = np.asarray(batched_values("ipd")(responses, others))[:, 0]
    candidates = 4 * np.asarray(jax.random.normal(jax.random.PRNGKey(9), (512, 5)))
    best_random = [np.asarray(batched_values("ipd")(candidates, np.broadcast_to(o, (512, 5))))[:, 0].max()
                   for o in others]
    assert np.all(value >= np.asarray(best_random) - 1e-3), (value, best_random)
    against_all_d = responses[-1]
    # Defect against a defector where it matters: first move, and after (C, D) and (D, D); the outcomes
    # where the defector cooperated never occur, so their responses stay where they started.
    assert np.all(against_all_d[np.array([0, 2, 4])] < 0), against_all_d


# ---- the meta-environment -----------------------------------------------------------------------


IPD_NL = mx.MetaGame("ipd", "nl", meta_steps=3)


@functools.lru_cache(maxsize=None)
def jitted(env: mx.MetaGame):
    return jax.jit(jax.vmap(env.reset)), jax.jit(jax.vmap(env.step))


def test_meta_game_spaces():
    env = mx.MetaGame("ipd")
    assert env.observation_shape == (10,) and env.max_episode_steps == 100 and env.name == "mfos-ipd-nl"
    assert isinstance(env.action_space, Box) and env.action_space.shape == (5,)
    assert mx.MetaGame("chicken", "lola").observation_shape == (2,)
    from sparqrl.envs.custom import device_env

    checked = device_env("jax:sparqrl.envs.matrix:MetaGame")  # the protocol check sparqrl runs on own envs
    assert checked.observation_shape == (10,)


def test_meta_game_rewards_observations_and_opponent_update():
    reset, step = jitted(IPD_NL)
    keys = jax.random.split(jax.random.PRNGKey(10), (8, 8))
    obs, state = reset(keys[0])
    assert obs.shape == (8, 10) and np.all((obs > 0) & (obs < 1)) and np.all(state.t == 0)
    action = np.asarray(jax.random.normal(jax.random.PRNGKey(11), (8, 5)))
    out = step(keys[1], state, action)
    assert isinstance(out, StepOut)
    want = np.asarray(batched_values("ipd")(state.opponent_logits, action))
    np.testing.assert_allclose(out.reward, want[:, 1], rtol=1e-5)
    np.testing.assert_allclose(out.info["opponent_reward"], want[:, 0], rtol=1e-5)
    np.testing.assert_allclose(out.obs, np_sigmoid(np.concatenate([action, state.opponent_logits], -1)), rtol=1e-5)
    updated = batched_step("ipd", "nl")(state.opponent_logits, action)
    np.testing.assert_allclose(out.state.opponent_logits, updated, rtol=1e-5, atol=1e-5)
    assert np.all(out.state.t == 1) and not np.any(out.terminated | out.truncated)
    assert np.all((out.info["agent_cooperation"] >= 0) & (out.info["agent_cooperation"] <= 1))


def test_meta_episode_ends_after_meta_steps_and_resets():
    reset, step = jitted(IPD_NL)
    keys = jax.random.split(jax.random.PRNGKey(13), (8, 8))
    obs, state = reset(keys[0])
    ends = []
    for i in range(7):
        action = np.full((8, 5), 0.1 * i, np.float32)
        out = step(keys[i + 1], state, action)
        ends.append(bool(np.all(out.terminated)) if np.any(out.terminated) else False)
        if ends[-1]:
            played = np_sigmoid(np.concatenate([action, state.opponent_logits], -1))
            np.testing.assert_allclose(out.final_obs, played, rtol=1e-5)
            assert np.all(out.state.t == 0) and not np.allclose(out.obs, out.final_obs)
        else:
            np.testing.assert_array_equal(out.obs, out.final_obs)
        state = out.state
    assert ends == [False, False, True, False, False, True, False]


def test_sampled_meta_game_and_other_opponents():
    env = mx.MetaGame("ipd", "static", rounds=10)
    state = mx.MetaState(jnp.zeros(5), jnp.asarray(TFT), jnp.int32(0))
    out = jax.jit(env.step)(jax.random.PRNGKey(15), state, jnp.asarray(ALL_D))
    np.testing.assert_allclose([out.reward, out.info["opponent_reward"]], [-1.8, -2.1], atol=1e-5)
    np.testing.assert_array_equal(out.state.opponent_logits, TFT)  # static does not learn
    br = mx.MetaGame("chicken", "br", br_steps=50)
    state = mx.MetaState(jnp.zeros(1), jnp.zeros(1), jnp.int32(0))
    out = jax.jit(br.step)(jax.random.PRNGKey(17), state, jnp.full(1, -5.0))
    assert np.all(np.asarray(out.state.opponent_logits) > 0)  # swerve against a driver going straight


@pytest.mark.parametrize("kwargs, match", [
    ({"game": "pd"}, r"^game='pd' is not allowed: must be one of ipd, imp, chicken$"),
    ({"opponent": "mamaml"}, r"^opponent='mamaml' is not allowed: must be one of nl, lola, static, br$"),
    ({"meta_steps": 0}, r"^meta_steps=0 .*>= 1$"),
    ({"gamma": 1.0}, r"^gamma=1.0 .*\[0, 1\)$"),
    ({"rounds": 0}, r"^rounds=0 "),
])
def test_bad_meta_game_settings_are_one_line_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        mx.MetaGame(**kwargs)


# ---- meta-self-play -----------------------------------------------------------------------------


def test_self_play_gives_each_player_its_own_view():
    env = mx.SelfPlayGame("ipd", meta_steps=2)  # one game, jitted (MetaGame's tests cover vmap)
    obs1, obs2, state = jax.jit(env.reset)(jax.random.PRNGKey(18))
    np.testing.assert_array_equal(obs1[:5], obs2[5:])
    step = jax.jit(env.step)
    a1, a2 = (x[0] for x in normal_starts(19, n=1))
    out = step(state, a1, a2)
    want = np.asarray(batched_values("ipd")(a1[None], a2[None]))[0]
    np.testing.assert_allclose([out.reward1, out.reward2], want, rtol=1e-5)
    np.testing.assert_allclose(out.obs1, np_sigmoid(np.concatenate([a1, a2])), rtol=1e-5)
    np.testing.assert_allclose(out.obs2, np_sigmoid(np.concatenate([a2, a1])), rtol=1e-5)
    assert not out.terminated
    last = step(out.state, a2, a1)
    assert last.terminated and last.state.t == 0
    np.testing.assert_allclose(last.final_obs1, out.obs2)
    assert not np.allclose(last.obs1, last.final_obs1)  # the next meta-episode's first view


def test_self_play_probability_schedule():
    assert mx.self_play_probability(0) == 0.0
    assert mx.self_play_probability(100) == pytest.approx(0.15)
    assert mx.self_play_probability(1 / 0.0015) == pytest.approx(1.0)
    assert mx.self_play_probability(5000) == 1.0
    assert mx.self_play_probability(100, 0.0) == 0.0
    traced = jax.jit(mx.self_play_probability)(jnp.arange(0, 800, 200), 0.0015)
    np.testing.assert_allclose(traced, [0.0, 0.3, 0.6, 0.9], atol=1e-6)

"""M-FOS (`sparqrl meta mfos`): the PPO trainer's math against NumPy, an ES smoke run that shapes a naive
learner (reference `meta_mfos_act.md` §8.2), the PPO trainer's outputs and exact resume, one-line errors."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import fitness_rows, meta_checkpoint, run_cli

from sparqrl.meta import mfos
from sparqrl.meta import run as meta_run

NL_VS_NL = -1.98
"""IPD, naive learner against naive learner: mean reward per round over 100 steps (reference §2.9)."""


# --------------------------------------------------------------------------------------------------
# The PPO trainer's pieces against NumPy


def test_monte_carlo_returns_match_numpy():
    rewards = np.random.default_rng(0).normal(size=(7, 3)).astype(np.float32)
    expected = np.zeros_like(rewards)
    following = np.zeros(3, np.float32)
    for t in reversed(range(7)):
        following = rewards[t] + 0.9 * following
        expected[t] = following
    np.testing.assert_allclose(mfos.monte_carlo_returns(jnp.asarray(rewards), 0.9), expected, rtol=1e-5)


@pytest.mark.parametrize("variance", ["softplus", "std"])
def test_gaussian_log_prob_and_entropy_match_numpy(variance):
    rng = np.random.default_rng(1)
    out = rng.normal(size=(4, 10)).astype(np.float32)
    action = rng.normal(size=(4, 5)).astype(np.float32)
    dist = mfos.gaussian(mfos.MfosConfig(variance=variance), jnp.asarray(out))
    mean, raw = out[:, :5], out[:, 5:]
    softplus = np.log1p(np.exp(raw))
    var = softplus if variance == "softplus" else softplus ** 2
    log_prob = -0.5 * np.sum((action - mean) ** 2 / var + np.log(2 * np.pi * var), axis=1)
    entropy = 0.5 * np.sum(np.log(2 * np.pi * np.e * var), axis=1)
    np.testing.assert_allclose(dist.log_prob(jnp.asarray(action)), log_prob, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dist.entropy(), entropy, rtol=1e-4, atol=1e-4)


def test_ppo_loss_matches_numpy():
    """Clipped surrogate with advantage = return - V (V held fixed, not normalised again), 0.5 MSE and the
    entropy bonus, through the library's PPO loss."""
    config = mfos.MfosConfig(hidden=8)
    actor, critic = mfos.OneHidden(8, 2), mfos.OneHidden(8, 1)
    obs = jax.random.uniform(jax.random.PRNGKey(0), (6, 2))
    params = {"actor": actor.init(jax.random.PRNGKey(1), obs), "critic": critic.init(jax.random.PRNGKey(2), obs)}
    action = jax.random.normal(jax.random.PRNGKey(3), (6, 1))
    old_log_prob = jax.random.normal(jax.random.PRNGKey(4), (6,)) - 1.0
    returns = jax.random.normal(jax.random.PRNGKey(5), (6,))
    batch = mfos.Played(obs, action, old_log_prob, jnp.zeros(6), jnp.zeros(6))
    total, parts = mfos.mfos_loss(config, actor, critic, params, batch, returns)

    out = np.asarray(actor.apply(params["actor"], obs), np.float64)
    value = np.asarray(critic.apply(params["critic"], obs), np.float64)[:, 0]
    mean, var = out[:, :1], np.log1p(np.exp(out[:, 1:]))
    a = np.asarray(action, np.float64)
    log_prob = -0.5 * np.sum((a - mean) ** 2 / var + np.log(2 * np.pi * var), axis=1)
    ratio = np.exp(log_prob - np.asarray(old_log_prob))
    adv = np.asarray(returns) - value
    surrogate = -np.mean(np.minimum(ratio * adv, np.clip(ratio, 0.8, 1.2) * adv))
    value_loss = np.mean((value - np.asarray(returns)) ** 2)
    entropy = np.mean(0.5 * np.sum(np.log(2 * np.pi * np.e * var), axis=1))
    np.testing.assert_allclose(parts.policy_loss, surrogate, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(parts.value_loss, 0.5 * value_loss, rtol=1e-4, atol=1e-5)  # the library's 0.5 MSE
    np.testing.assert_allclose(parts.entropy, entropy, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(total, surrogate + 0.5 * value_loss - 0.01 * entropy, rtol=1e-4, atol=1e-5)


def test_networks_are_initialised_as_the_documented_runs_were():
    """The meta-policy, critic and mean network keep flax's default init and their layout, the output layer
    'Dense_0' (built first): the documented results, the ES search space's leaf order and saved
    best_meta_params.npz come from it (`nets.HeadMLP`, hidden layer first, would draw and order differently)."""
    import flax.linen as nn

    class Plain(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(3)(jnp.tanh(nn.Dense(8)(x)))

    obs = jnp.ones((5,))
    key = jax.random.PRNGKey(7)
    expected = Plain().init(key, obs)
    found = mfos.OneHidden(8, 3).init(key, obs)
    assert found["params"]["Dense_0"]["kernel"].shape == (8, 3)
    jax.tree.map(np.testing.assert_array_equal, found, expected)


# --------------------------------------------------------------------------------------------------
# Runs


def test_mfos_es_shapes_a_naive_learner(capsys, tmp_path):
    """IPD against a naive learner, OpenES population 64, 48 generations, 128 games per member: the plain documented
    command, whose defaults are sigma 0.1, lr 0.2, z-scored fitness (as the reference's evosax preset), a 32-unit
    network and one inner seed (issue 31, item 4). The reference's smoke test. The
    evolved meta-policy earns far more than the NL-vs-NL baseline (-1.98 per round; the start is -2.46) and
    shapes its opponent below that baseline.

    Seed 0 ends at -0.52 / NL -2.12; over seeds 0-3 these settings ended the opponent at -2.12, -1.78, -2.08
    and -2.21 (with centered ranks, 3 of 12 runs at several sigmas, lrs and seeds got there); benchmarks/history.md has
    the runs."""
    out = tmp_path / "es"
    code, text, err = run_cli(capsys, "meta", "mfos", "--game", "ipd", "--opponent", "nl", "--trainer", "es",
                              "--popsize", "64", "--games", "128", "--generations", "48",
                              "--out", str(out), "--no-progress", "--no-energy")
    assert code == 0, err
    summary = json.loads(text)
    print(f"\nM-FOS ES vs NL: {summary['meta_return_mean']:.3f} / NL {summary['opponent_return_mean']:.3f}, "
          f"{summary['wall_time_s']:.0f} s")
    assert summary["meta_return_mean"] > -1.0 > NL_VS_NL  # above mutual cooperation
    assert summary["opponent_return_mean"] < NL_VS_NL
    for name in ("fitness.csv", "fitness.png", "learned.png", "summary.json", "checkpoint",
                 "best_meta_params.npz"):
        assert (out / name).exists(), name
    rows = fitness_rows(out)
    assert float(rows[0]["meta_return"]) < -2.3  # the start: the naive learner exploits the random meta-policy
    assert len(rows) == 48 and {"meta_return", "opponent_return"} <= set(rows[0])
    assert set(summary["cooperation_end"]) == set(mfos.STATE_NAMES)


def test_mfos_ppo_outputs_and_killed_run_resumes_identically(capsys, tmp_path):
    """The PPO trainer through the meta loop: every output, and a run killed after meta-episode 2 of 3 ends
    bit-identical to an uninterrupted one."""
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    argv = ["--trainer", "ppo", "--games", "64", "--generations", "3", "--no-progress", "--no-energy"]
    code, text, err = run_cli(capsys, "meta", "mfos", *argv, "--out", str(whole))
    assert code == 0 and "final evaluation" not in err, err  # (--no-progress: not said)
    summary = json.loads(text)
    assert summary["algo"] == "mfos-ppo" and summary["env_steps"] == 3 * 64 * 100
    assert math.isfinite(summary["meta_return_mean"]) and math.isfinite(summary["opponent_return_mean"])

    class Killed(Exception):
        pass

    def kill(generation):
        if generation == 2:
            raise Killed

    config = meta_run.MetaConfig(task="mfos", trainer="ppo", games=64, generations=3, out=str(killed),
                                 energy=False, progress=False)
    with pytest.raises(Killed):
        meta_run.train_meta(config, on_generation=kill)
    code, _, err = run_cli(capsys, "meta", "--resume", str(killed), "--no-progress")
    assert code == 0, err
    assert fitness_rows(killed) == fitness_rows(whole)
    (a, _), (b, _) = meta_checkpoint(whole), meta_checkpoint(killed)
    jax.tree.map(np.testing.assert_array_equal, a, b)


def test_play_self_pays_each_side_its_own_view():
    """Two fixed memory-1 policies against each other: all-C vs all-C pays -1 each; all-C vs all-D pays the
    cooperator -3 and the defector 0 (IPD, exact values), each side reading its own reward."""
    env = mfos.make_self_play_game(mfos.MfosConfig(meta_steps=3))

    def fixed(logit):
        return lambda obs, key: (jnp.full((obs.shape[0], 5), logit), jnp.zeros(obs.shape[0]))

    for (l1, l2), (r1, r2) in {(9.0, 9.0): (-1.0, -1.0), (9.0, -9.0): (-3.0, 0.0)}.items():
        one, two = mfos.play_self(env, fixed(l1), fixed(l2), jax.random.PRNGKey(0), games=4)
        assert one.reward.shape == (3, 4) and one.obs.shape == (3, 4, 10)
        np.testing.assert_allclose(one.reward, r1, atol=0.01)
        np.testing.assert_allclose(two.reward, r2, atol=0.01)
        np.testing.assert_array_equal(one.opponent_reward, two.reward)
        np.testing.assert_allclose(one.obs[1:, :, :5], jax.nn.sigmoid(one.action[:-1]))  # own logits first
        np.testing.assert_array_equal(two.obs[1:, :, :5], one.obs[1:, :, 5:])


def test_mfos_self_play_outputs_and_schedule(capsys, tmp_path):
    """Meta-self-play through the meta loop: meta-episode 1 is against the naive learners (lambda = 1), the
    last ones (lambda = 0 from meta-episode 1 / decay = 2.5) are self-play, where agent 1's opponent is agent
    2; both agents' actors are saved and evaluated against each other."""
    out = tmp_path / "self"
    code, text, err = run_cli(capsys, "meta", "mfos", "--opponent", "self", "--trainer", "ppo", "--games", "16",
                              "--generations", "4", "--set", "self_play_decay=0.4", "--out", str(out),
                              "--no-progress", "--no-energy")
    assert code == 0, err
    summary = json.loads(text)
    assert summary["algo"] == "mfos-self-play"
    rows = fitness_rows(out)
    assert [float(r["self_play"]) for r in (rows[0], rows[-1])] == [0.0, 1.0]
    for row in rows:
        welfare = (float(row["meta_return"]) + float(row["agent2_return"])) / 2
        assert float(row["mean_fitness"]) == pytest.approx(welfare, abs=1e-5)
        if float(row["self_play"]):
            assert row["opponent_return"] == row["agent2_return"]
    config = json.loads((out / "config.json").read_text())["inner"]["config"]
    assert config["lr"] == mfos.SELF_PLAY_LR and config["opponent"] == "self"
    with np.load(out / "best_meta_params.npz") as saved:
        assert {k.split("/")[0] for k in saved.files} == set(mfos.AGENTS), saved.files
    for name in ("meta_return_mean", "opponent_return_mean"):
        assert -3.0 <= summary[name] <= 0.0
    assert (out / "learned.png").exists()


@pytest.mark.parametrize("argv,words", [
    (["meta", "mfos", "--opponent", "self"], "trainer='es' is not allowed: must be ppo for opponent self"),
    (["meta", "mfos", "--opponent", "self", "--trainer", "ppo", "--set", "self_play_decay=-1"], "self_play_decay=-1"),
    (["meta", "mfos", "--game", "pd"], "game='pd'"),
    (["meta", "mfos", "--opponent", "tft"], "opponent='tft'"),
    (["meta", "mfos", "--trainer", "sgd"], "trainer='sgd'"),
    (["meta", "mfos", "--env", "Acrobot-v1"], "--game"),
    (["meta", "mfos", "--trainer", "ppo", "--popsize", "8"], "trainer es"),
    (["meta", "mfos", "--trainer", "ppo", "--sigma", "0.1"], "sigma=0.1 is not allowed: is for trainer es"),
    (["meta", "mfos", "--fitness", "final"], "fitness='final'"),
    (["meta", "mfos", "--set", "variance=log"], "variance='log'"),
    (["meta", "mfos", "--set", "trainer=ppo"], "use --trainer instead"),
    (["meta", "lpo", "--game", "imp"], "task mfos only"),
])
def test_mfos_bad_input_is_one_line_exit_2(capsys, tmp_path, argv, words):
    code, _, err = run_cli(capsys, *argv, "--out", str(tmp_path / "x"))
    assert code == 2
    assert err.startswith("sparqrl: error:") and err.strip().count("\n") == 0, err
    assert words in err, err
    assert not (tmp_path / "x").exists()

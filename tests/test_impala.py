"""IMPALA: its loss against NumPy, learning CartPole on both runners with the one learner."""

from __future__ import annotations

import gymnasium as gym
import jax
import numpy as np
import pytest

from conftest import RAY_SERIAL, train_as_users_do, train_on_host_as_users_do
from sparqrl import cli, config as cfg, presets
from sparqrl.algos import impala
from sparqrl.algos.impala import train as impala_train
from sparqrl.algos.base import Step
from sparqrl.config import ConfigError
from sparqrl.envs import make_env
from sparqrl.runners import RunConfig, train


def _numpy_vtrace(log_rho, r, v, next_v, term, trunc, gamma, rho_bar, c_bar):
    """The reference's recursive V-trace (lambda 1), cut at every episode end, as a plain loop."""
    T = r.shape[0]
    rho, c = np.minimum(rho_bar, np.exp(log_rho)), np.minimum(c_bar, np.exp(log_rho))
    done = term | trunc
    disc = gamma * (1.0 - term)
    vs_minus_v, pg = np.zeros_like(r), np.zeros_like(r)
    acc = np.zeros_like(r[0])
    for t in reversed(range(T)):
        delta = rho[t] * (r[t] + disc[t] * next_v[t] - v[t])
        acc = delta + gamma * c[t] * (1.0 - done[t]) * acc
        vs_minus_v[t] = acc
    vs = vs_minus_v + v
    for t in range(T):
        boot = next_v[t] + (0.0 if t == T - 1 else (1.0 - done[t]) * (vs[t + 1] - v[t + 1]))
        pg[t] = rho[t] * (r[t] + disc[t] * boot - v[t])
    return vs, pg


def test_loss_matches_numpy():
    rng = np.random.default_rng(1)
    T, N = 12, 3
    kind = rng.choice(3, size=(T, N), p=[0.7, 0.15, 0.15])
    term, trunc = kind == 1, kind == 2
    log_prob = rng.normal(size=(T, N)).astype(np.float32) * 0.5 - 1.0
    behaviour = log_prob + rng.normal(size=(T, N)).astype(np.float32) * 0.7  # off-policy: some rho clipped
    v, next_v = rng.normal(size=(2, T, N)).astype(np.float32)
    r = rng.normal(size=(T, N)).astype(np.float32)
    entropy = rng.uniform(0.1, 0.7, size=(T, N)).astype(np.float32)
    config = impala.Config(gamma=0.95, rho_bar=1.0, c_bar=0.9, vf_coef=0.4, ent_coef=0.02)
    steps = Step(None, None, r, None, term, trunc, behaviour, None)
    loss, metrics = jax.jit(lambda *a: impala.impala_loss(*a, steps, config))(log_prob, behaviour, v, next_v, entropy)

    vs, pg = _numpy_vtrace(log_prob - behaviour, r, v, next_v, term, trunc, 0.95, 1.0, 0.9)
    policy = -np.mean(pg * log_prob)
    value = 0.5 * np.mean((vs - v) ** 2)
    np.testing.assert_allclose(float(metrics["policy_loss"]), policy, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["value_loss"]), value, rtol=1e-5)
    np.testing.assert_allclose(float(loss), policy + 0.4 * value - 0.02 * np.mean(entropy), rtol=1e-5)
    assert 0.0 < float(metrics["rho_clipped_fraction"]) < 1.0

    # The gradient flows through log pi and V only: d loss / d log_prob = -pg / (T N).
    grad = jax.grad(lambda lp: impala.impala_loss(lp, behaviour, v, next_v, entropy, steps, config)[0])(log_prob)
    np.testing.assert_allclose(np.asarray(grad), -pg / (T * N), rtol=1e-4, atol=1e-7)


def test_impala_learns_cartpole_on_device(tmp_path):
    """The defaults (8 envs x 20 steps, the IMPALA paper's unroll, gradient clip 40 and RMSProp; 4e-3 annealed,
    entropy 0.003), 500k steps, through `sparqrl train --seeds 2` over 2 CPU devices: every seed >= 400."""
    summary = train_as_users_do(tmp_path / "run", "impala", "CartPole-v1")
    assert min(summary["final_return_per_seed"]) >= 400.0, summary["final_return_per_seed"]


HOST_STEPS = 300_000
HOST_THRESHOLD = 100.0


@RAY_SERIAL
def test_impala_learns_cartpole_on_the_host(tmp_path):
    """The same learner on gym:CartPole-v1 as a user runs it: `sparqrl train impala --actors 2 --seeds 2`, the
    actors on the back-end the command picks (Ray), the impala-host preset (rho_bar 10, one request in flight:
    fragments lag the learner by about one version, V-trace corrects them), HOST_STEPS env steps (the defaults
    matrix row's budget): every seed's greedy return >= HOST_THRESHOLD, the better one >= 400. The actors race, so
    every run is a new draw: the matrix row's 20 draws of 4 seeds at this budget and this test's own 9 draws of 2
    ended every seed at 154 or more, all but one at 434-500 (benchmarks/history.md, "impala-host: lag 1, 300k"
    and "Learning tests through the command (issue 31 item 5)"); a one-action collapse ends at 9, random play at
    about 22."""
    summary = train_on_host_as_users_do(tmp_path / "run", "impala", "gym:CartPole-v1", HOST_STEPS)
    assert summary["policy_lag_mean"] > 0.5  # V-trace corrects the lag (about 1.0 in every draw)
    returns = summary["final_return_per_seed"]
    # Every seed clears HOST_THRESHOLD, which the rare seed still on a plateau (1 in 80, ~155) also clears, and the
    # better seed the 400 of the former one-seed test (both seeds on a plateau: about 1 run in 6,400).
    assert min(returns) >= HOST_THRESHOLD and max(returns) >= 400.0, returns


def test_a_run_saved_before_rmsprop_resumes_with_adam():
    """IMPALA's optimizer became TF1's RMSProp (epsilon 0.01, the paper's); a config.json saved before it (every
    field but the optimizer's) loads with the Adam its checkpoint holds, a partial file with today's default."""
    saved = cfg.to_dict(impala.Config())
    for name in ("optimizer", "rmsprop_alpha", "rmsprop_eps"):
        saved.pop(name)
    assert cfg.from_dict(impala.Config, saved).optimizer == "adam"
    assert cfg.from_dict(impala.Config, {"lr": 1e-3}).optimizer == "rmsprop"
    assert (impala.Config().optimizer, impala.Config().rmsprop_eps) == ("rmsprop", 0.01)


def test_on_device_fragments_are_on_policy():
    """`base.on_device` acts with the learner's current policy: one update is one gradient step on T x N env
    steps whose behaviour log-probabilities equal the learner's (rho = 1)."""
    env = make_env("CartPole-v1")
    config = impala.Config(num_envs=2, num_steps=4, total_timesteps=64).validate(env)
    algo = impala.make_algorithm(config, env)
    after, metrics = jax.jit(algo.update)(algo.init(jax.random.PRNGKey(0)))
    assert int(after.learner.gradient_steps) == 1 and int(after.env_steps) == 8
    assert abs(float(metrics["rho_mean"]) - 1.0) < 1e-5 and float(metrics["rho_clipped_fraction"]) == 0.0


@pytest.mark.parametrize("field, value, allowed", [("num_steps", 0, "must be > 0"), ("gamma", 1.5, "in \\[0, 1\\]"),
                                                   ("c_bar", -1.0, "must be > 0")])
def test_bad_config_is_a_clear_error(field, value, allowed):
    with pytest.raises(ConfigError, match=f"{field}.*{allowed}"):
        impala.Config(**{field: value}).validate(make_env("CartPole-v1"))


class _Counter(gym.Env):
    """Never terminates; its observation is the step count of the episode (0 after a reset), so a fragment
    shows where every episode ended and which observation each step reached."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.full(1, self.t, np.float32), 1.0, False, False, {}


def test_the_host_learner_bootstraps_a_time_limit_from_the_final_observation(tmp_path, monkeypatch):
    """Gymnasium's TimeLimit (3 steps here) ends the host episodes by truncation, as CartPole-v1's 500 does once
    a policy holds the pole: what IMPALA's loss receives from an actor must be that step's own final
    observation (pre-reset), V of it as the bootstrap, terminated False (so V-trace bootstraps rather than
    taking 0), and no learned transition from the final observation to the next episode's first."""
    gym.register("sparqrl-test/Counter-v0", entry_point=_Counter, max_episode_steps=3)
    seen = []

    def recording(log_prob, behaviour_log_prob, values, next_values, entropy, steps, config):
        jax.debug.callback(lambda *xs: seen.append([np.asarray(x) for x in xs]), steps.obs, steps.next_obs,
                           steps.terminated, steps.truncated, values, next_values)
        return real(log_prob, behaviour_log_prob, values, next_values, entropy, steps, config)

    real = impala_train.impala_loss
    monkeypatch.setattr(impala_train, "impala_loss", recording)
    T, N, fragments = 5, 2, 4  # fragments of 5 steps against 3-step episodes: ends at every place, the last too
    try:
        run = RunConfig(env="gym:sparqrl-test/Counter-v0", out=str(tmp_path / "run"), chunks=1, eval_every=0,
                        progress=False, energy=False, backend="inline", compile_cache=False)
        train("impala", impala.Config(num_envs=N, num_steps=T, total_timesteps=N * T * fragments), run)
    finally:
        del gym.registry["sparqrl-test/Counter-v0"]
    assert len(seen) == fragments
    clock = np.arange(T * fragments).reshape(fragments, T, 1)  # env steps of each env so far
    for f, (obs, next_obs, terminated, truncated, values, next_values) in enumerate(seen):
        obs, next_obs, terminated, truncated, values, next_values = (
            x.reshape(T, N) for x in (obs, next_obs, terminated, truncated, values, next_values))
        np.testing.assert_array_equal(obs, np.broadcast_to(clock[f] % 3, (T, N)))
        np.testing.assert_array_equal(next_obs, obs + 1)  # the step's own successor: 3 at the time limit
        np.testing.assert_array_equal(truncated, next_obs == 3)
        assert not terminated.any()
        # next_values is V of that successor, under the parameters of the values: V(x_{t+1}) within an episode,
        # V(final obs) at its end (the fragment's last step included), never V of the reset observation after it
        goes_on = ~truncated[:-1]
        np.testing.assert_allclose(next_values[:-1][goes_on], values[1:][goes_on], rtol=1e-5, atol=1e-6)
        at_limit = next_values[truncated]
        np.testing.assert_allclose(at_limit, at_limit[0], rtol=1e-5, atol=1e-6)
        assert not np.isclose(at_limit[0], values[obs == 0][0], rtol=1e-3, atol=1e-4)


def test_host_envs_start_from_the_impala_host_preset():
    """On the actor-learner runner V-trace's importance weights are left unclipped in practice (rho_bar 10) and
    each actor has one request in flight (the policy lag: 1 version with 2 actors, not 3; benchmarks/history.md
    'impala-host: lag 1, 300k'); JAX envs (lag 0, weights 1) keep the defaults, Atari its paper's settings."""
    run, config = cli._parse_with_preset("impala", ["--env", "gym:CartPole-v1", "--actors", "2"])
    assert run.preset == "impala-host" and config == impala.Config(rho_bar=10.0)
    assert run.in_flight == 1 and run.resolved_max_lag == 2
    assert presets.find("impala", "gym:Acrobot-v1").name == "impala-host"
    assert presets.find("impala", "CartPole-v1") is None
    assert presets.find("impala", "gym:ALE/Pong-v5").name == "impala-atari"
    run, config = cli._parse_with_preset("impala", ["--env", "gym:CartPole-v1", "--set", "rho_bar=1",
                                                    "--in-flight", "2"])
    assert config.rho_bar == 1.0 and run.in_flight == 2  # the user's values win
    assert cli._parse_with_preset("impala", ["--env", "gym:ALE/Pong-v5"])[0].in_flight is None
    assert cli._parse_with_preset("impala", ["--env", "gym:CartPole-v1", "--preset", "none"])[0].in_flight is None


def test_the_python_api_takes_the_presets_run_fields(monkeypatch, tmp_path):
    """`sparqrl.train` gives the runner the impala-host preset's in_flight 1, and the caller's value over it."""
    import sparqrl
    from sparqrl import runners

    class Handed(Exception):
        pass

    def hand(algo, config, run, **hooks):
        raise Handed(run, config)

    monkeypatch.setattr(runners, "train", hand)
    for options, in_flight in (({}, 1), ({"in_flight": 2}, 2)):
        with pytest.raises(Handed) as handed:
            sparqrl.train("impala", "gym:CartPole-v1", steps=1000, out=tmp_path / str(in_flight), **options)
        run, config = handed.value.args
        assert (run.preset, run.in_flight, config.rho_bar) == ("impala-host", in_flight, 10.0)

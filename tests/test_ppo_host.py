"""PPO on host environments (the actor-learner runner): GAE on fragments, what actors send, learning,
Ray against inline, stale fragments dropped, a stopped run resumed (PPO and IMPALA)."""

from __future__ import annotations

import csv

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import RAY_SERIAL, train_on_host_as_users_do

from sparqrl.algos import impala, ppo
from sparqrl.algos.base import Step
from sparqrl.algos.base import bootstrap_values
from sparqrl.algos.ppo.losses import gae
from sparqrl.algos.ppo.train import fragment_advantages
from sparqrl.config import ConfigError
from sparqrl.envs import host_spec, normalize
from sparqrl.nets import ActorCritic
from sparqrl.runners import RunConfig, RunInterrupted, resume, train
from sparqrl.runners.actors import ActorSpec, InlinePool, RayPool, network_paths, quantized_copy, ray_session
from sparqrl.runners.rundir import open_run_dir
from sparqrl.runners.sebulba import Prepared
from sparqrl.runners.session import saved_state

PENDULUM = "gym:Pendulum-v1"
# Continuous actions with both normalisers: the actors need the observation statistics, the log-std and
# the discounted returns.
SMALL = dict(num_envs=2, num_steps=8, total_timesteps=64, hidden=(16, 16), normalize_obs=True,
             normalize_reward=True)


def test_fragment_gae_equals_the_on_device_gae_on_the_same_data():
    """The host learner's GAE (next values V(next_obs) of every step) equals the on-device one (next values
    from the following step, V(final obs) only where truncated) on one trajectory with terminations,
    truncations and going-on episodes; V is a fixed linear function."""
    rng = np.random.default_rng(0)
    T, N, d = 40, 3, 4
    w = rng.normal(size=d).astype(np.float32)
    V = lambda x: np.asarray(x @ w, np.float32)  # noqa: E731
    kind = rng.choice(3, size=(T, N), p=[0.8, 0.1, 0.1])  # going on, terminated, truncated
    terminated, truncated = kind == 1, kind == 2
    states = rng.normal(size=(T + 1, N, d)).astype(np.float32)  # the observation each step starts in
    final = rng.normal(size=(T, N, d)).astype(np.float32)  # the observation an episode ended in
    next_obs = np.where((terminated | truncated)[..., None], final, states[1:])
    reward = rng.normal(size=(T, N)).astype(np.float32)
    config = ppo.Config(gamma=0.97, gae_lambda=0.9)

    steps = Step(states[:-1], None, reward, next_obs, terminated, truncated, None, None)
    host = fragment_advantages(config, V(states[:-1]), V(next_obs), steps, reward)
    truncated_value = np.where(truncated, V(final), 0.0)
    next_values = bootstrap_values(V(states[:-1]), V(states[-1]), truncated, truncated_value)
    device = gae(reward, V(states[:-1]), next_values, terminated, terminated | truncated, 0.97, 0.9)
    for a, b in zip(host, device):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def _spec(seeds: int = 2) -> ActorSpec:
    config = ppo.Config(**SMALL).validate(host_spec(PENDULUM))
    return ActorSpec("ppo", config, PENDULUM, seeds, 1, config.num_steps, seed=3)


def _copy(spec: ActorSpec):
    """A published fp32 copy of initialised learners whose observation statistics are not the identity."""
    al = ppo.make_actor_learner(spec.config, host_spec(PENDULUM))
    learner = jax.jit(jax.vmap(al.init))(jax.random.split(jax.random.PRNGKey(0), spec.seeds))
    stats = learner.obs_stats._replace(mean=learner.obs_stats.mean + 0.3, var=learner.obs_stats.var * 2.0)
    learner = learner._replace(obs_stats=stats)
    policy = jax.device_get(jax.vmap(al.policy)(learner))
    paths = network_paths(al.acting, policy, host_spec(PENDULUM).observation_shape)
    return al, learner, quantized_copy(5, policy, al.acting, paths, "fp32", "channel", env_steps=0)


def test_actors_send_behaviour_log_probs_and_discounted_returns():
    spec = _spec()
    _, learner, copy = _copy(spec)
    pool = InlinePool(spec)
    try:
        frags = []
        for _ in range(3):
            pool.submit(0, copy)
            frags.append(pool.next())
    finally:
        pool.close()
    steps = jax.tree.map(lambda *xs: np.concatenate(xs), *[f.steps for f in frags])  # [3 T, S, N, ...]
    assert steps.obs.shape == (24, 2, 2, 3) and steps.action.shape == (24, 2, 2, 1) and steps.extra.shape == (24, 2, 2)

    # The log-probability the actor sent is the learner's under the same parameters and statistics.
    net = ActorCritic(action_dim=1, discrete=False, obs_shape=(3,), hidden=(16, 16), activation="tanh")
    for s in range(2):
        params = jax.tree.map(lambda x: x[s], learner.params)
        stats = jax.tree.map(lambda x: x[s], learner.obs_stats)
        dist, _ = net.apply(params, normalize(stats, jnp.asarray(steps.obs[:, s])))
        np.testing.assert_allclose(np.asarray(dist.log_prob(steps.action[:, s])), steps.extra[:, s], rtol=1e-4,
                                   atol=1e-4)

    # Discounted returns: G_t = gamma G_{t-1} + r_t, restarted after every episode's end (NumPy loop).
    gamma, G = spec.config.gamma, np.zeros((2, 2), np.float32)
    expected = []
    for t in range(24):
        G = gamma * G + steps.reward[t]
        expected.append(G)
        G = np.where(steps.terminated[t] | steps.truncated[t], 0.0, G)
    np.testing.assert_allclose(steps.discounted_return, np.stack(expected), rtol=1e-5)


@RAY_SERIAL
def test_a_ray_actor_sends_the_fragments_an_inline_actor_sends():
    spec = _spec()
    _, _, copy = _copy(spec)

    def collect(pool, ref):
        out = []
        for _ in range(2):
            pool.submit(0, ref)
            out.append(pool.next())
        return out

    inline = InlinePool(spec)
    try:
        expected = collect(inline, copy)
    finally:
        inline.close()
    with ray_session(None, 1):
        pool = RayPool(spec)
        try:
            got = collect(pool, pool.publish(copy))
        finally:
            pool.close()
    for a, b in zip(expected, got):
        assert (a.version, a.sequence) == (b.version, b.sequence)
        for x, y in zip(jax.tree.leaves(a.steps), jax.tree.leaves(b.steps)):
            np.testing.assert_array_equal(x, y)


HOST_STEPS = 100_000
HOST_THRESHOLD = 300.0


@RAY_SERIAL
def test_ppo_learns_cartpole_on_the_host(tmp_path):
    """PureJaxRL's CartPole settings (4 envs x 128 steps) as a user runs them on a host env: `sparqrl train ppo
    --env gym:CartPole-v1 --actors 2 --seeds 2`, the actors on the back-end the command picks (Ray), HOST_STEPS
    env steps (the defaults matrix row's budget): every seed's greedy return >= HOST_THRESHOLD. The actors race, so
    every run is a new draw: 8 draws of 2 seeds and the matrix row's 4 seeds ended every seed at 394.7 or more, 18
    of 20 at 465 or more (benchmarks/history.md, "Learning tests through the command (issue 31 item 5)"); random
    play scores about 22."""
    summary = train_on_host_as_users_do(tmp_path / "run", "ppo", "gym:CartPole-v1", HOST_STEPS)
    assert summary["fragment_steps"] == 128
    assert summary["steps"] == HOST_STEPS // 512 * 512
    assert min(summary["final_return_per_seed"]) >= HOST_THRESHOLD, summary["final_return_per_seed"]


@RAY_SERIAL
def test_ppo_learns_cartpole_on_the_host_with_int8_actors(tmp_path):
    """ActorQ's setting as a user runs it: the same command with `--actor-precision int8`, so the 2 Ray actors act
    with an int8 copy of the fp32 learner's policy (int8 weights, activations quantized per call, as ActorQ's) while
    PPO's ratios are taken against the actors' own log-probabilities; every seed's greedy return (the fp32 policy)
    >= HOST_THRESHOLD, the fp32 test's bar. Draws: benchmarks/history.md, "int8 actors learn through the command"."""
    summary = train_on_host_as_users_do(tmp_path / "run", "ppo", "gym:CartPole-v1", HOST_STEPS,
                                        options=("--actor-precision", "int8"))
    assert summary["actor_precision"] == "int8"
    assert min(summary["final_return_per_seed"]) >= HOST_THRESHOLD, summary["final_return_per_seed"]


def test_fragments_older_than_max_lag_are_dropped_and_counted(tmp_path, monkeypatch):
    """Every third fragment the actors hand over is made 10 versions old: the learner must skip each one
    (counted), learn exactly its budget of fresh ones, and never see a stale one."""
    real_next = InlinePool.next
    calls = {"n": 0}

    def stale_next(self):
        frag = real_next(self)
        calls["n"] += 1
        return frag._replace(version=frag.version - 10) if calls["n"] % 3 == 0 else frag

    monkeypatch.setattr(InlinePool, "next", stale_next)
    # Two seeds: a vmapped learner (its orthogonal init once hung XLA's CPU thread pool when batched).
    run = RunConfig(env=PENDULUM, out=str(tmp_path / "run"), seeds=2, chunks=2, eval_every=0, eval_episodes=1,
                    progress=False, energy=False, max_lag=3)
    summary = train("ppo", ppo.Config(**SMALL | {"total_timesteps": 160}), run)
    assert summary["steps"] == 160 and summary["versions_published"] == 1 + 10
    assert summary["fragments_dropped"] == calls["n"] // 3 >= 3
    assert summary["policy_lag_mean"] <= 1.0  # of the fragments learned from


def test_bad_host_ppo_settings_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"fragment_steps=7 .*learns from fragments of exactly its num_steps \(8\)"):
        train("ppo", ppo.Config(**SMALL), RunConfig(env=PENDULUM, out=str(tmp_path / "a"), fragment_steps=7))
    with pytest.raises(ConfigError, match=r"max_lag=0 .*actors x in_flight - 1 = 1"):
        train("ppo", ppo.Config(**SMALL), RunConfig(env=PENDULUM, out=str(tmp_path / "b"), max_lag=0, in_flight=2))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("algo", ["ppo", "impala"])
def test_on_policy_learner_interrupted_resumes_from_the_exact_learner(tmp_path, algo):
    """Stopped after chunk 2 of 4 (as Ctrl-C stops a run: KeyboardInterrupt at a safe point), the checkpoint holds
    the learner of exactly those updates, and what was learned before the stop is what an uninterrupted run
    learned (inline actors are deterministic); `resume` finishes the run with every chunk logged once."""
    module = {"ppo": ppo, "impala": impala}[algo]
    config = module.Config(num_envs=2, num_steps=8, total_timesteps=256, hidden=(16, 16))
    run = lambda out: RunConfig(env="gym:CartPole-v1", out=str(out), chunks=4, eval_every=0, eval_episodes=1,  # noqa: E731
                                checkpoint_every=1, checkpoint_interval_s=0.0, progress=False, energy=False)

    def stop_after_two(chunk, row):
        if chunk == 2:
            raise KeyboardInterrupt

    with pytest.raises(RunInterrupted):
        train(algo, config, run(tmp_path / "a"), on_chunk=stop_after_two)
    rundir, _, saved_config, saved_run = open_run_dir(tmp_path / "a")
    learner = saved_state(rundir, Prepared(algo, saved_config, saved_run).learner_shape)
    updates = 2 * (256 // 16) // 4  # 2 of 4 chunks of 16 updates of 16 env steps
    assert int(learner.env_steps[0]) == updates * 16
    per_update = config.update_epochs * config.num_minibatches if algo == "ppo" else 1
    assert int(learner.gradient_steps[0]) == updates * per_update

    train(algo, config, run(tmp_path / "b"))
    read = lambda out: [{k: v for k, v in row.items() if k != "wall_time_s"}  # noqa: E731
                        for row in csv.DictReader((out / "metrics.csv").open())]
    assert read(tmp_path / "a") == read(tmp_path / "b")[:2]
    summary = resume(tmp_path / "a")
    assert summary["steps"] == 256 and summary["fragments_dropped"] == 0
    rows = read(tmp_path / "a")
    assert [int(r["chunk"]) for r in rows] == [1, 2, 3, 4] and int(rows[-1]["env_step"]) == 256

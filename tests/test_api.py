"""The Python API (`sparqrl.train`, `sparqrl.load`, `Agent.act` / `evaluate`): the same runs as the CLI's,
acting equal to the library's own deterministic policy, a callback that stops a run cleanly."""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import numpy as np
import pytest

import sparqrl
from sparqrl import runners
from sparqrl.config import ConfigError

TINY = dict(steps=4 * 512, chunks=4, num_steps=32, energy=False, eval_episodes=2)


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory):
    seen = []
    run = sparqrl.train("ppo", "CartPole-v1", seeds=2, out=tmp_path_factory.mktemp("api") / "ppo",
                        callback=lambda metrics: seen.append(metrics), lr=1e-3, hidden=(32, 32), **TINY)
    return run, seen


def test_train_returns_summary_curves_and_calls_back_per_chunk(ppo_run):
    run, seen = ppo_run
    assert not run.stopped and run.summary == json.loads((run.path / "summary.json").read_text())
    assert run.summary["seeds"] == 2 and run.summary["steps"] == 4 * 512
    assert list(run.metrics["chunk"]) == [1, 2, 3, 4] and list(run.metrics["env_step"]) == [512, 1024, 1536, 2048]
    assert run.metrics["episode_return"].shape == (4, 2)
    np.testing.assert_allclose(run.metrics["eval_return"][-1], run.summary["final_return_per_seed"], rtol=1e-5)
    assert [m["chunk"] for m in seen] == [1, 2, 3, 4] and seen[-1]["env_step"] == 2048
    np.testing.assert_allclose(seen[1]["episode_return"], run.metrics["episode_return"][1], rtol=1e-5)
    config = json.loads((run.path / "config.json").read_text())["config"]
    assert config["lr"] == 1e-3 and config["hidden"] == [32, 32]


def test_tensorboard_reads_the_runs_scalars(ppo_run):
    """The event files open in TensorBoard (installed by the set-up) with one point per chunk."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(ppo_run[0].path / "tensorboard"))
    events.Reload()
    points = events.Scalars("train/episode_return")
    assert [p.step for p in points] == [512, 1024, 1536, 2048]
    np.testing.assert_allclose([p.value for p in points], np.nanmean(ppo_run[0].metrics["episode_return"], axis=1),
                               rtol=1e-5)


def test_load_acts_as_the_librarys_deterministic_policy(ppo_run):
    run, _ = ppo_run
    agent = sparqrl.load(run.path)
    assert agent.algo == "ppo" and agent.env == "CartPole-v1" and agent.seeds == 2 and agent.obs_shape == (4,)
    _, _, _, _, driver, state = runners.anakin.load_state(run.path)
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    for seed in range(2):
        policy = driver.algo.policy(jax.tree.map(lambda x: x[seed], state))
        expected = [int(driver.algo.act(policy, o, jax.random.PRNGKey(1))) for o in obs]
        np.testing.assert_array_equal(agent.act(obs, seed=seed), expected)  # a batch
        assert int(agent.act(obs[3], seed=seed)) == expected[3]  # one observation
    assert agent.evaluate(episodes=2) == runners.evaluate_saved(run.path, 2)


def test_act_samples_as_the_library_does(ppo_run):
    """deterministic=False draws the algorithm's own exploring action (`Algorithm.sample`) with the given key;
    without a key, each call draws anew from the agent's stream."""
    run, _ = ppo_run
    agent = sparqrl.load(run.path)
    _, _, _, _, driver, state = runners.anakin.load_state(run.path)
    policy = driver.algo.policy(jax.tree.map(lambda x: x[1], state))
    obs = np.repeat(np.random.default_rng(1).normal(size=(1, 4)).astype(np.float32), 4000, axis=0)
    keys = jax.random.split(jax.random.PRNGKey(3), len(obs))
    expected = np.array([int(driver.algo.sample(policy, o, k)) for o, k in zip(obs[:50], keys[:50])])
    draws = agent.act(obs, seed=1, deterministic=False, key=3)
    np.testing.assert_array_equal(draws[:50], expected)
    greedy = int(agent.act(obs[0], seed=1))
    assert 0.5 <= (draws == greedy).mean() < 1.0  # two actions: the greedy one is the likelier, not the only one
    assert not np.array_equal(agent.act(obs, seed=1, deterministic=False), agent.act(obs, seed=1, deterministic=False))


def test_act_function_is_what_act_runs(ppo_run):
    """`act_function` (what `sparqrl export` checks a recurrent policy against): on a seed's `policy_params` and a
    key, the action `act` gives, greedy and sampled; a bad `deterministic` is a one-line error."""
    agent = sparqrl.load(ppo_run[0].path)
    obs = np.random.default_rng(2).normal(size=(16, 4)).astype(np.float32)
    keys = jax.random.split(jax.random.PRNGKey(5), len(obs))
    for deterministic in (True, False):
        one = jax.jit(agent.act_function(deterministic))
        for seed in range(2):
            got = [int(one(agent.policy_params(seed), o, k)) for o, k in zip(obs, keys)]
            acted = [int(agent.act(o, seed=seed, deterministic=deterministic, key=k)) for o, k in zip(obs, keys)]
            assert got == acted
    with pytest.raises(ConfigError, match="deterministic"):
        agent.act_function("no")


def test_a_callback_returning_false_stops_with_a_checkpoint_and_resume_finishes(ppo_run, tmp_path):
    run, _ = ppo_run
    out = tmp_path / "cut"
    options = dict(seeds=2, lr=1e-3, hidden=(32, 32), **TINY)
    stopped = sparqrl.train("ppo", "CartPole-v1", out=out, callback=lambda m: m["chunk"] < 2, **options)
    assert stopped.stopped and stopped.summary == {} and list(stopped.metrics["chunk"]) == [1, 2]
    assert (out / "checkpoint").is_dir() and not (out / "summary.json").exists()
    done = sparqrl.train("ppo", "CartPole-v1", out=out, resume=True, **options)
    assert not done.stopped and done.summary["final_return_per_seed"] == run.summary["final_return_per_seed"]
    np.testing.assert_array_equal(done.metrics["episode_return"], run.metrics["episode_return"])


@pytest.mark.parametrize("call,words", [
    (lambda: sparqrl.train("ppo", "CartPole-v1", steps=512, lrr=1e-3), "lrr=0.001 is not allowed: must be a run option"),
    (lambda: sparqrl.train("pp0", "CartPole-v1", steps=512), "algo='pp0'"),
    (lambda: sparqrl.train("ppo", "CartPole-v1", steps=512, num_envs=2.5), "num_envs"),
    (lambda: sparqrl.train("ppo", "CartPole-v1", steps=512, resume=True), "needs out="),
    (lambda: sparqrl.load("/no/such/run"), "run_dir"),
])
def test_bad_input_is_a_config_error(call, words):
    with pytest.raises(ConfigError, match=words):
        call()


def test_act_checks_its_input(ppo_run):
    agent = sparqrl.load(ppo_run[0].path)
    for kwargs, words in (({"obs": np.zeros(5)}, "obs"), ({"obs": np.zeros(4), "seed": 2}, "seed=2"),
                          ({"obs": np.zeros(4), "deterministic": "no"}, "deterministic")):
        with pytest.raises(ConfigError, match=words):
            agent.act(**kwargs)


def test_import_sparqrl_loads_no_jax():
    code = "import sys, sparqrl; print('jax' in sys.modules, sparqrl.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", sparqrl.__version__]


def test_load_a_host_run_acts_without_ray(tmp_path):
    """A gym: run (actor-learner) loads and acts in this process; Ray is not imported."""
    run = sparqrl.train("dqn", "gym:CartPole-v1", steps=600, out=tmp_path / "host", seeds=1, energy=False,
                        learning_starts=200, batch_size=32, hidden=(32, 32), fragment_steps=4,
                        chunks=2, eval_episodes=1)
    code = (f"import sys, numpy as np, sparqrl; a = sparqrl.load({str(run.path)!r}); "
            "g = a.act(np.zeros(4)); d = a.act(np.zeros((4000, 4)), deterministic=False, key=0); "
            "print(g, a.act(np.zeros((3, 4))).shape, 'ray' in sys.modules, (d != g).mean())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] in ("0", "1") and out[1:3] == ["(3,)", "False"], out
    assert abs(float(out[3]) - 0.4 / 2) < 0.03  # Ape-X's first slot: epsilon 0.4, half of it the other action


def test_td3_samples_its_exploration_noise_around_the_mean_action(tmp_path):
    run = sparqrl.train("td3", "Pendulum-v1", steps=1000, out=tmp_path / "td3", energy=False, chunks=2,
                        eval_episodes=1, learning_starts=200, batch_size=32, hidden=(32, 32))
    agent = sparqrl.load(run.path)
    obs = np.zeros((3000, 3), np.float32)
    mean, draws = agent.act(obs[0]), agent.act(obs, deterministic=False, key=0)
    assert draws.shape == (3000, 1) and np.all(np.abs(draws) <= 2.0)
    inside = np.abs(draws[:, 0]) < 2.0  # not clipped at the bounds [-2, 2]
    noise = draws[inside, 0] - mean[0]
    # Gaussian noise of std exploration_noise on the [-1, 1] action, scaled by the half-range 2
    assert abs(noise.std() - 2.0 * agent.config.exploration_noise) < 0.05 and abs(np.median(noise)) < 0.05

"""A user's own environment: a Gymnasium class or registered id on the host (`gym:MODULE:ATTR`, `--import`),
a JAX env on the device (sparqrl's Env protocol, a gymnax Environment), Python objects given to
`sparqrl.train`, re-import in a new process for eval and resume, `Agent.evaluate(env=...)`, and one-line
errors for broken environments. The envs are in tests/own_envs.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import own_envs
import sparqrl
from sparqrl import cli
from sparqrl.config import ConfigError
from sparqrl.envs import custom, host_spec, make_env

TESTS = Path(__file__).parent
DQN = ["--steps", "800", "--chunks", "2", "--config.num-envs", "4", "--config.buffer-size", "256",
       "--config.batch-size", "32", "--config.hidden", "16", "--fragment-steps", "10", "--eval-episodes", "2",
       "--no-energy", "--no-progress"]
DQN_API = dict(steps=800, chunks=2, num_envs=4, buffer_size=256, batch_size=32, hidden=(16,), fragment_steps=10,
               eval_episodes=2, energy=False)


def _config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


@pytest.fixture(scope="module")
def host_run(tmp_path_factory) -> Path:
    """DQN through the CLI on an id that `--import own_envs` registers."""
    out = tmp_path_factory.mktemp("own") / "registered"
    assert cli.main(["train", "dqn", "--import", "own_envs", "--env", "gym:GoRight-v0", *DQN, "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def device_run(tmp_path_factory) -> sparqrl.api.Run:
    """PPO on device on the Env-protocol class itself, passed as an object."""
    return sparqrl.train("ppo", own_envs.Chain, steps=2 * 256, seeds=1, out=tmp_path_factory.mktemp("own") / "chain",
                         chunks=2, num_steps=16, num_envs=16, hidden=(16, 16), energy=False, eval_episodes=2)


def test_the_cli_records_imports_and_the_env(host_run):
    run = _config(host_run)["run"]
    assert run["env"] == "gym:GoRight-v0" and run["imports"] == ["own_envs"]
    summary = json.loads((host_run / "summary.json").read_text())
    assert summary["runner"] == "sebulba" and 0.0 <= summary["final_return_mean"] <= 1.0
    assert (host_run / "checkpoint").is_dir() and (host_run / "metrics.csv").is_file()


def test_a_new_process_reimports_for_eval_and_resume(host_run, tmp_path):
    """A gym:MODULE:CLASS run stopped after a chunk from Python goes on in a new process, which also
    evaluates the --import run (without the recorded import GoRight-v0 would be unknown there)."""
    out = tmp_path / "class"
    stopped = sparqrl.train("dqn", own_envs.GoRight, out=out, callback=lambda metrics: False, **DQN_API)
    assert stopped.stopped and _config(out)["run"]["env"] == "gym:own_envs:GoRight"
    script = ("import json, sys; from sparqrl.cli import main; "
              f"assert 'own_envs' not in sys.modules; assert main(['eval', {str(host_run)!r}, '--import', 'own_envs']) == 0; "
              f"assert main(['train', '--resume', {str(out)!r}, '--no-progress', '--import', 'own_envs']) == 0")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", script], cwd=TESTS, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    evaluated = json.loads(done.stdout[:done.stdout.index("}") + 1])
    assert evaluated["env"] == "gym:GoRight-v0" and len(evaluated["return_per_seed"]) == 1
    assert json.loads((out / "summary.json").read_text())["env"] == "gym:own_envs:GoRight"


def test_evaluate_on_another_env_with_the_same_spaces(host_run):
    agent = sparqrl.load(host_run, trust_imports=True)  # (the run's imports: own_envs)
    own = agent.evaluate(episodes=2)
    # the class without the registry's wrappers: the same corridor, the same seeds, the same returns
    other = agent.evaluate(episodes=2, env=own_envs.GoRight)
    assert other["env"] == "gym:own_envs:GoRight" and other["return_per_seed"] == own["return_per_seed"]
    with pytest.raises(ConfigError, match=r"env='jax:own_envs:Chain'.*shape \(1,\).*GoRight-v0.*\(2,\)"):
        agent.evaluate(env=own_envs.Chain)


def _chain_return(agent: sparqrl.api.Agent, seed: int) -> float:
    """One episode of the Chain stepped here, one call at a time, with the agent's action (a reference that
    shares no code with the device evaluation)."""
    import jax

    env, key = own_envs.Chain(), jax.random.PRNGKey(0)
    obs, state = env.reset(key)
    total = 0.0
    for _ in range(env.max_episode_steps):
        out = env.step(key, state, agent.act(np.asarray(obs), seed=seed))
        total += float(out.reward)
        if out.terminated or out.truncated:
            break
        obs, state = out.obs, out.state
    return total


def test_a_jax_env_object_trains_on_device_with_a_full_run_folder(device_run):
    path = device_run.path
    assert _config(path)["run"]["env"] == "jax:own_envs:Chain"
    for name in ("summary.json", "metrics.csv", "returns.png", "checkpoint", "tensorboard", "config.json"):
        assert (path / name).exists(), name
    assert device_run.summary["env"] == "jax:own_envs:Chain" and device_run.metrics["episode_return"].shape == (2, 1)
    agent = sparqrl.load(path, env=own_envs.Chain)  # the run's own env: its module may be imported
    expected = [_chain_return(agent, 0)]
    assert agent.evaluate(episodes=2)["return_per_seed"] == expected
    # the same corridor as a gymnax Environment, instance or class (default params), evaluated on device
    for gymnax_env in (own_envs.gymnax_chain, own_envs.GymnaxChain):
        result = agent.evaluate(episodes=2, env=gymnax_env)
        assert result["return_per_seed"] == expected
    assert result["env"] == "jax:own_envs:GymnaxChain"
    with pytest.raises(ConfigError, match=r"shape \(2,\).*trained on jax:own_envs:Chain: observations \(1,\)"):
        agent.evaluate(env=own_envs.WideChain)


def test_spaces_and_casts():
    spec = host_spec("gym:own_envs:GoRight")  # int64 observations: cast to float32 by HostVecEnv
    assert spec.observation_shape == (2,) and spec.max_episode_steps == 1000  # no limit of its own: ours
    assert host_spec("gym:own_envs:GoRight-v0").max_episode_steps == own_envs.LIMIT  # the registry's
    env = make_env("jax:own_envs:gymnax_chain")
    assert env.observation_shape == (1,) and env.max_episode_steps == own_envs.LIMIT


def test_objects_that_cannot_be_imported_train_in_process_and_need_passing_again(host_run, tmp_path):
    factory = lambda: own_envs.GoRight()  # noqa: E731 - a lambda: no name a new process could import
    name = custom.name_for(factory)
    assert name.startswith("gym:<local>:") and custom.name_for(factory) == name
    assert host_spec(name).observation_shape == (2,)
    # a run of it, as a new process finds it: the registry is this process's only
    run = tmp_path / "local"
    shutil.copytree(host_run, run)
    config = _config(run)
    config["run"]["env"] = name
    (run / "config.json").write_text(json.dumps(config))
    del custom._objects[name]
    with pytest.raises(ConfigError, match=r"sparqrl.load\(DIR, env=obj\)"):
        sparqrl.load(run, trust_imports=True)
    assert cli.main(["eval", str(run), "--import", "own_envs"]) == 2
    agent = sparqrl.load(run, env=factory, trust_imports=True)
    expected = sparqrl.load(host_run, trust_imports=True).evaluate(episodes=2)["return_per_seed"]
    assert agent.evaluate(episodes=2)["return_per_seed"] == expected
    with pytest.raises(ConfigError, match="must be the run's own environment"):
        sparqrl.load(host_run, env=own_envs.GoRight)


@pytest.mark.parametrize("args,words", [
    (["dqn", "--env", "gym:own_envs:OldStep"], ["step must return", "4 values", "old Gym API"]),
    (["dqn", "--env", "gym:own_envs:MultiActions"], ["MultiDiscrete", "Discrete actions (dqn, ppo)", "Box actions"]),
    (["dqn", "--env", "gym:own_envs:TextObs"], ["dtype <U5", "must be numbers"]),
    (["dqn", "--import", "no_such_module", "--env", "gym:GoRight-v0"], ["imports='no_such_module'", "No module"]),
    (["dqn", "--env", "gym:own_envs:Nope"], ["gym:own_envs:Nope", "no attribute 'Nope'"]),
    (["dqn", "--env", "gym:own_envs:Chain"], ["JAX environment", "jax:own_envs:Chain"]),
    (["ppo", "--env", "jax:own_envs:SixTuple"], ["StepOut", "tuple of 6 values"]),
    (["ppo", "--env", "gym:own_envs:GoRight", "--fragment-steps", "7"], ["fragment_steps=7", "exactly its num_steps"]),
])
def test_bad_environments_are_one_line_errors_and_write_nothing(args, words, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["train", *args, "--out", str(out), "--no-energy"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sparqrl: error: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err, (word, err)
    assert not out.exists()


@pytest.mark.parametrize("env,words", [
    (42, "must be an environment name, a gymnasium.Env subclass"),
    (lambda: 3, "factory whose result (int) is neither"),
    (own_envs.GoRight(), "Gymnasium env instance, which cannot be copied"),
])
def test_objects_that_are_not_environments(env, words, tmp_path):
    with pytest.raises(ConfigError, match=re.escape(words)):
        sparqrl.train("dqn", env, steps=100, out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_program_keys_follow_the_envs_source(tmp_path, monkeypatch):
    """Stored traced programs of a user's env are keyed by its source, so an edited env is traced again."""
    module = tmp_path / "edited_env.py"
    module.write_text("from own_envs import Chain\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    custom.import_module("edited_env")
    first = custom.program_key("jax:edited_env:Chain")
    module.write_text("from own_envs import Chain  # edited\n")
    assert custom.program_key("jax:edited_env:Chain") != first
    assert custom.program_key("CartPole-v1") == "CartPole-v1" and custom.program_key("jax:<local>:x.y") is None

"""Your own network (`network=`, `sparqrl.nets.torso`) on every algorithm, its checks, a run folder naming it
(trusted or refused), sparse training of its Dense layers, and the `on_update` hook."""

from __future__ import annotations

import importlib
import json

import jax
import numpy as np
import pytest

import own_torsos
import sparqrl
from sparqrl import sparse
from sparqrl.config import ConfigError
from sparqrl.envs import make_env
from sparqrl.nets import torso

QUICK = dict(energy=False, eval_episodes=1, eval_every=0, checkpoint_every=1)
PPO = dict(steps=4 * 64, chunks=4, num_envs=4, num_steps=16, update_epochs=1, num_minibatches=1, **QUICK)


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory):
    """PPO with its own actor and critic torsos, one update per chunk, each update's metrics seen by the hook."""
    updates = []
    run = sparqrl.train("ppo", "CartPole-v1", out=tmp_path_factory.mktemp("net") / "ppo", on_update=updates.append,
                        network={"actor": own_torsos.Small, "critic": "own_torsos:wide"}, **PPO)
    return run, updates


def test_ppo_trains_a_torso_of_its_own_recorded_by_name(ppo_run):
    run, _ = ppo_run
    config = json.loads((run.path / "config.json").read_text())["config"]
    assert (config["network"], config["actor_network"], config["critic_network"]) == (
        None, "own_torsos:Small", "own_torsos:wide")
    assert run.summary["steps"] == 256 and np.isfinite(run.metrics["total_loss"]).all()
    agent = sparqrl.load(run.path, trust_imports=True)
    params = agent.policy_params().params["params"]
    assert set(params) >= {"Torso_0", "Torso_1", "Dense_0", "Dense_1"} and "MLP_0" not in params
    assert params["Torso_0"]["Small_0"]["Dense_1"]["kernel"].shape == (32, own_torsos.WIDTH)
    assert "LayerNorm_0" in params["Torso_1"]["Wide_0"]
    assert agent.act(np.zeros((3, 4))).shape == (3,)


def test_on_update_sees_each_update_with_the_values_metrics_csv_holds(ppo_run):
    run, updates = ppo_run
    assert len(updates) == 4  # 4 updates of 1 seed
    for name in ("total_loss", "value_loss", "entropy", "episode_return"):
        np.testing.assert_allclose([u[name] for u in updates], run.metrics[name][:, 0], rtol=1e-5, equal_nan=True)


def test_a_folder_naming_a_torso_opens_only_trusted(ppo_run, capsys):
    from sparqrl.cli import main

    run, _ = ppo_run
    with pytest.raises(ConfigError, match=r"actor_network='own_torsos:Small'.*needs module 'own_torsos'.*"
                                          r"trust_imports=True"):
        sparqrl.load(run.path)
    with pytest.raises(ConfigError, match=r"needs module 'own_torsos'"):
        sparqrl.train("ppo", "CartPole-v1", steps=256, out=run.path, resume=True)
    assert main(["eval", str(run.path), "--episodes", "1"]) != 0
    assert "--import own_torsos" in capsys.readouterr().err
    assert main(["eval", str(run.path), "--episodes", "1", "--import", "own_torsos"]) == 0


def test_dqn_trains_a_torso_of_its_own(tmp_path):
    run = sparqrl.train("dqn", "CartPole-v1", steps=512, chunks=2, out=tmp_path / "dqn", network="own_torsos:Small",
                        num_envs=4, learning_starts=128, batch_size=16, **QUICK)
    assert np.isfinite(run.metrics["loss"][-1]).all()
    params = sparqrl.load(run.path, trust_imports=True).policy_params()["params"]
    assert set(params) == {"Torso_0", "Dense_0"}


@pytest.mark.parametrize("algo, env", [("impala", "CartPole-v1"), ("td3", "Pendulum-v1"), ("sac", "Pendulum-v1")])
def test_every_algorithm_builds_on_a_torso_of_its_own(algo, env):
    """The actor and critic trees hold the torso under its own name; one update traces (abstractly) to the
    same shapes it started from."""
    module = importlib.import_module(f"sparqrl.algos.{algo}.train")
    env = make_env(env)
    sizes = dict(num_steps=16) if algo == "impala" else dict(learning_starts=64, batch_size=16)
    config = module.Config(total_timesteps=4096, network="own_torsos:Small", **sizes).validate(env)
    algo_ = module.make_algorithm(config, env)
    state = jax.eval_shape(algo_.init, jax.random.PRNGKey(0))
    names = {sparse.path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]}
    assert any("Torso_0/Small_0/Dense_0/kernel" in n for n in names)
    assert any("Torso_1/Small_0/Dense_0/kernel" in n for n in names)
    after, _ = jax.eval_shape(algo_.update, state)
    assert jax.tree.map(lambda a: (a.shape, a.dtype), after) == jax.tree.map(lambda a: (a.shape, a.dtype), state)


@pytest.mark.parametrize("spec, message", [
    ("own_torsos", r"network='own_torsos' is not allowed: must be MODULE:ATTR"),
    ("no_such_module:Torso", r"network='no_such_module:Torso' is not allowed: cannot be imported"),
    ("own_torsos:Missing", r"cannot be imported \(AttributeError"),
    ("own_torsos:WIDTH", r"must name a callable returning a flax Module"),
    ("own_torsos:not_a_module", r"must return a flax linen Module \(returned int\)"),
    ("own_torsos:raises", r"must return a flax Module when called with no arguments \(RuntimeError: no torso"),
    ("own_torsos:Rank3", r"must return features \[batch, F\].*returned \(2, 2, 8\)"),
    ("own_torsos:Integers", r"must return features \[batch, F\] of floats.*int32"),
])
def test_a_bad_network_is_one_line_naming_it(spec, message):
    with pytest.raises(ConfigError, match=message) as error:
        torso.check(spec, (4,))
    assert "\n" not in str(error.value)


def test_bad_networks_from_python_fail_before_anything_is_written(tmp_path):
    def local():
        return own_torsos.Small()

    with pytest.raises(ConfigError, match=r"network=.*must be defined at the top level of an importable module"):
        sparqrl.train("ppo", "CartPole-v1", out=tmp_path / "a", network=local, **PPO)
    with pytest.raises(ConfigError, match=r"network=\{'policy'.*must be a torso, or a dict"):
        sparqrl.train("ppo", "CartPole-v1", out=tmp_path / "b", network={"policy": own_torsos.Small}, **PPO)
    with pytest.raises(ConfigError, match=r"network='own_torsos:Rank3'"):
        sparqrl.train("dqn", "CartPole-v1", out=tmp_path / "c", network="own_torsos:Rank3", steps=512, **QUICK)
    with pytest.raises(ConfigError, match=r"critic_network=.*one network"):
        sparqrl.train("dqn", "CartPole-v1", out=tmp_path / "d", network={"critic": own_torsos.Small}, steps=512, **QUICK)
    assert not any(tmp_path.iterdir())


def test_sparse_training_holds_the_sparsity_of_a_torsos_dense_layers():
    from sparqrl.algos import sparsify
    from sparqrl.algos.ppo import train as ppo

    env = make_env("CartPole-v1")
    config = ppo.Config(total_timesteps=4 * 16 * 6, num_envs=4, num_steps=16, update_epochs=1, num_minibatches=1,
                        network="own_torsos:Small", sparse="set", sparsity=0.7, topology_interval=2).validate(env)
    state, _ = jax.jit(ppo.make_train(config, env))(jax.random.PRNGKey(0))
    params, opt_state = state.learner.params, state.learner.opt_state
    masks = sparse.get_masks(opt_state)
    groups = {p: s for p, s in sparsify.learner_groups(config).values()}
    expected = {a.path: a.n_active for a in sparse.allocate(params, groups, config.sparse_allocation)}
    assert {p for p in expected if "Torso_" in p} == {f"params/Torso_{i}/Small_0/Dense_{j}/kernel"
                                                      for i in (0, 1) for j in (0, 1)}
    assert {k: int(v) for k, v in sparse.layer_active_counts(masks).items()} == expected
    for (path, p), m in zip(jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(masks)):
        if sparse.is_sparse(m):
            assert not np.any(np.asarray(p)[~np.asarray(m)]), path
    assert ppo.make_algorithm(config, env).summary["actor_sparsity"] == pytest.approx(0.7, abs=1e-3)


def test_quantized_actors_run_a_torsos_dense_layers_or_name_the_layer_they_cannot():
    """Host actors run the actor as a Dense chain (`quant.stack_paths`): a torso of Dense layers with the config's
    activation is one, found by path; a LayerNorm is a one-line error naming it."""
    from sparqrl import quant
    from sparqrl.nets import ActorBranch

    obs = np.zeros((3, 4), np.float32)
    small = ActorBranch(2, (4,), activation="tanh", network="own_torsos:Small")
    variables = small.init(jax.random.PRNGKey(0), obs)
    assert quant.stack_paths(small, variables, obs) == tuple(
        ("params", *p) for p in (("Torso_0", "Small_0", "Dense_0"), ("Torso_0", "Small_0", "Dense_1"), ("Dense_0",)))
    wide = ActorBranch(2, (4,), activation="relu", network="own_torsos:wide")
    with pytest.raises(ConfigError, match=r"outside its Dense layers: params/Torso_0/Wide_0/LayerNorm_0$"):
        quant.stack_paths(wide, wide.init(jax.random.PRNGKey(0), obs), obs)


def test_without_a_hook_the_program_has_no_host_callback():
    from sparqrl.algos.ppo import train as ppo
    from sparqrl.runners import anakin

    env = make_env("CartPole-v1")
    config = ppo.Config(total_timesteps=128, num_envs=4, num_steps=16, num_minibatches=1).validate(env)
    algo_at = anakin.algorithm_at(ppo, config, env)
    state = jax.eval_shape(anakin.init_program(algo_at), jax.random.split(jax.random.PRNGKey(0), 1), {})

    def program(hook):
        return str(jax.make_jaxpr(anakin.chunk_program(algo_at, hook))(state, {}, 1))

    assert "callback" not in program(None)
    assert "debug_callback" in program(lambda metrics: None)


def test_export_refuses_a_run_of_a_torso_of_its_own(ppo_run):
    from sparqrl.export.policy import load_policy

    with pytest.raises(ConfigError, match=r"cannot be exported: it runs your own torso \(actor_network=own_torsos:Small, "
                                          r"critic_network=own_torsos:wide\)"):
        load_policy(ppo_run[0].path, 0, trust_imports=True)

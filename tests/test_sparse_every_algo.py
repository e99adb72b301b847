"""Sparse training for every algorithm (issue 32 item 7): the one optax transformation (`sparse.transform`),
the shared sparse config fields, exact sparsities through PPO, IMPALA and DQN runs, and learning tests."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from sparqrl import sparse
from sparqrl.algos.dqn.config import Config as DQNConfig
from sparqrl.algos.impala.config import Config as ImpalaConfig
from sparqrl.algos.ppo.config import Config as PPOConfig
from sparqrl.config import ConfigError
from sparqrl.envs import make_env
from conftest import last_metric, train_as_users_do


def _tree():
    key = jax.random.key(0)
    k1, k2 = jax.random.split(key)
    return {"params": {"Dense_0": {"kernel": jax.random.normal(k1, (8, 16)), "bias": jnp.zeros(16)},
                       "Dense_1": {"kernel": jax.random.normal(k2, (16, 4)), "bias": jnp.zeros(4)}}}


@pytest.mark.parametrize("method", ["static", "set", "rigl"])
def test_transform_keeps_pruned_weights_zero_and_counts_exact(method):
    schedule = sparse.TopologySchedule(method=method, interval=3, t_end=40, zeta0=0.5)
    training = sparse.NetTraining(optax.adam(1e-2), 0.75, schedule, "uniform")
    tx = sparse.transform(training)
    params, state = sparse.init_transform(training, jax.random.key(1), _tree())
    expected = {a.path: a.n_active for a in sparse.allocate(params, 0.75, "uniform")}

    @jax.jit
    def step(params, state, key):
        grads = jax.tree.map(lambda p: jax.random.normal(key, p.shape), params)  # dense: RigL scores them
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    first_masks = sparse.get_masks(state)
    for i in range(30):
        params, state = step(params, state, jax.random.key(100 + i))
        masks = sparse.get_masks(state)
        assert {k: int(v) for k, v in sparse.layer_active_counts(masks).items()} == expected
        for p, m in zip(jax.tree.leaves(params), jax.tree.leaves(masks)):
            if sparse.is_sparse(m):
                assert not np.any(np.asarray(p)[~np.asarray(m)])
    changed = any(np.any(np.asarray(a) != np.asarray(b)) for a, b in
                  zip(jax.tree.leaves(first_masks), jax.tree.leaves(sparse.get_masks(state))))
    assert changed == (method != "static")
    assert int(state.count) == 30


def test_transform_is_apply_gradients_as_an_update():
    """The transform's arithmetic is `apply_gradients`' (which TD3/SAC use), given the same topology keys."""
    schedule = sparse.TopologySchedule(method="set", interval=2, t_end=20, zeta0=0.5)
    training = sparse.NetTraining(optax.adam(1e-2), 0.6, schedule)
    tx = sparse.transform(training)
    params, state = sparse.init_transform(training, jax.random.key(3), _tree())
    ref_params, ref_state, key = params, state.masked, state.key
    for i in range(9):
        grads = jax.tree.map(lambda p: jax.random.normal(jax.random.key(i), p.shape), params)
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        key, topology_key = jax.random.split(key)
        ref = sparse.apply_gradients(topology_key, i + 1, ref_params, ref_state, grads, training.tx, schedule)
        ref_params, ref_state = ref.params, ref.opt_state
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


def test_dense_transform_is_the_inner_optimizer():
    inner = optax.adam(1e-3)
    training = sparse.NetTraining(inner)
    assert sparse.transform(training) is inner
    params = _tree()
    out, state = sparse.init_transform(training, jax.random.key(0), params)
    assert out is params and jax.tree.structure(state) == jax.tree.structure(inner.init(params))


@pytest.mark.parametrize("config, match", [
    (PPOConfig(sparse="rlx2", sparsity=0.8), "sparse='rlx2'.*replay buffer"),
    (ImpalaConfig(sparse="tiny", sparsity=0.8), "sparse='tiny'"),
    (DQNConfig(sparse="rigl", actor_sparsity=0.8), "actor_sparsity=0.8.*one network.*--sparsity"),
    (PPOConfig(sparsity=0.5), "sparsity=0.5.*sparse=dense"),
    (PPOConfig(sparse="set", sparsity=1.0), "sparsity=1.0"),
    (DQNConfig(sparse="rigl", topology_interval=0), "topology_interval=0"),
])
def test_bad_sparse_settings_are_one_line_config_errors(config, match):
    with pytest.raises(ConfigError, match=match) as err:
        config.validate(make_env("CartPole-v1"))
    assert "\n" not in str(err.value)


def test_a_masked_method_needs_a_sparsity():
    from sparqrl.algos.ppo.train import make_training

    with pytest.raises(ConfigError, match="actor_sparsity=None.*--sparsity or --actor-sparsity"):
        make_training(PPOConfig(sparse="rigl", critic_sparsity=0.5).validate(make_env("CartPole-v1")))


def _find(tree, name):
    """The first field `name` of the NamedTuples nested in `tree` (a learner state)."""
    if hasattr(tree, "_fields"):
        if name in tree._fields:
            return getattr(tree, name)
        for value in tree:
            found = _find(value, name)
            if found is not None:
                return found
    return None


@pytest.mark.parametrize("algo, config", [
    ("ppo", PPOConfig(total_timesteps=2048, num_envs=4, num_steps=64, sparse="rigl", actor_sparsity=0.8,
                      critic_sparsity=0.6, topology_interval=5)),
    ("impala", ImpalaConfig(total_timesteps=2048, num_envs=4, num_steps=16, sparse="set", sparsity=0.7,
                            topology_interval=4)),
    ("dqn", DQNConfig(total_timesteps=3000, learning_starts=500, sparse="rlx2", sparsity=0.8, topology_interval=20)),
])
def test_sparsities_hold_exactly_through_training(algo, config):
    """After a short run every sparse layer holds exactly the allocated count of active weights, pruned weights are
    0 (so the nonzeros per layer are at most that count), the topology changed, and summary reports the sparsity."""
    import importlib

    from sparqrl.algos import sparsify

    module = importlib.import_module(f"sparqrl.algos.{algo}.train")
    env = make_env("CartPole-v1")
    config = config.validate(env)
    state, _ = jax.jit(module.make_train(config, env))(jax.random.key(0))
    params, opt_state = _find(state, "params"), _find(state, "opt_state")
    masks = sparse.get_masks(opt_state)
    groups = {p: s for p, s in sparsify.learner_groups(config).values()}
    expected = {a.path: a.n_active for a in sparse.allocate(params, groups, config.sparse_allocation)}
    assert {k: int(v) for k, v in sparse.layer_active_counts(masks).items()} == expected
    for (path, p), m in zip(jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(masks)):
        if sparse.is_sparse(m):
            p, m = np.asarray(p), np.asarray(m)
            assert not np.any(p[~m]), path
            assert np.count_nonzero(p) <= expected[sparse.path_str(path)]
    assert int(opt_state.count) > config.topology_interval  # topology updates ran
    summary = module.make_algorithm(config, env).summary
    names = ("actor", "critic") if algo != "dqn" else ("q",)
    for name in names:
        assert summary[f"{name}_sparsity"] == pytest.approx(config.required_sparsity("" if algo == "dqn" else name),
                                                             abs=1e-3)
    assert 0 < summary["train_flops_ratio"] < 0.5 and 0 < summary["infer_flops_ratio"] < 0.5


@pytest.mark.parametrize("algo", ["ppo", "dqn", "impala"])
def test_dense_runs_report_no_sparse_fields(algo):
    import importlib

    module = importlib.import_module(f"sparqrl.algos.{algo}.train")
    config = {"ppo": PPOConfig, "dqn": DQNConfig, "impala": ImpalaConfig}[algo](total_timesteps=4096)
    assert module.make_algorithm(config, make_env("CartPole-v1")).summary == {}


@pytest.mark.slow
def test_ppo_learns_cartpole_at_80_percent_sparsity(tmp_path):
    summary = train_as_users_do(tmp_path / "ppo", "ppo", "CartPole-v1", seeds=2, steps=500_000,
                                sets=("sparse=rigl", "sparsity=0.8"))
    assert summary["actor_sparsity"] == pytest.approx(0.8, abs=1e-3)
    assert min(summary["final_return_per_seed"]) >= 450, summary["final_return_per_seed"]


@pytest.mark.slow
def test_dqn_learns_cartpole_with_rlx2_at_80_percent(tmp_path):
    """DQN's rlx2 (RigL at --sparsity 0.8 + RLx2's delayed 3-step target) on CartPole-v1, 200k steps: measured
    [500.0, 500.0] per seed (greedy 500 on both from 120k steps on); RigL alone (one-step) reached [379.0, 372.6]."""
    summary = train_as_users_do(tmp_path / "dqn", "dqn", "CartPole-v1", seeds=2, steps=200_000,
                                sets=("sparse=rlx2", "sparsity=0.8"))
    assert summary["q_sparsity"] == pytest.approx(0.8, abs=1e-3)
    assert min(summary["final_return_per_seed"]) >= 400, summary["final_return_per_seed"]


# RLx2's short Pendulum budgets of the dense learning tests (tests/test_td3.py, tests/test_sac.py): 1,000 random
# steps, then one gradient step per env step; a topology update every 1,000 scheduler calls; the dynamic buffer
# checked every 2,000 env steps above 5,000 transitions.
RLX2_PENDULUM_SETS = ("learning_starts=1000", "buffer_min_size=5000", "buffer_check_interval=2000",
                      "topology_interval=1000")


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_rlx2_at_90_percent_learns_pendulum(tmp_path, algo):
    """RLx2 TD3 and SAC at 90 % actor and critic sparsity (RigL topology, delayed 3-step target, dynamic buffer)
    through `sparqrl train ALGO --env Pendulum-v1 --seeds 2 --sparse rlx2 --actor-sparsity 0.9 --critic-sparsity
    0.9 --steps 10000`, the seeds spread over 2 CPU devices as the command spreads them: every seed's
    deterministic return (10 episodes) >= -400 (random play about -1,200, a good policy about -200). Measured
    (benchmarks/history.md, "RLx2 and host learning tests through the command (issue 31 item 5)" and "Pendulum
    learning tests at smaller budgets"): TD3 -209.9, -147.0 (the slower seed at -400 or better from 7,200 steps on),
    SAC -200.6, -300.9; at 8,000 steps SAC's slower seed ends at -457, so 10,000 is the smallest budget tried
    that both clear."""
    out = tmp_path / "run"
    summary = train_as_users_do(out, algo, "Pendulum-v1", steps=10_000, sets=RLX2_PENDULUM_SETS,
                                options=("--sparse", "rlx2", "--actor-sparsity", "0.9", "--critic-sparsity", "0.9"))
    config = json.loads((out / "config.json").read_text())["config"]
    assert (config["nstep"], config["dynamic_buffer"]) == (3, True)  # what rlx2 resolves to
    assert summary["actor_sparsity"] == pytest.approx(0.9, abs=1e-4)
    assert summary["critic_sparsity"] == pytest.approx(0.9, abs=1e-4)
    # measured in the masks at the end of the run (floor(s_l·N_l) zeros keep at most one extra weight per layer)
    for name in ("actor_sparsity", "critic_sparsity"):
        assert last_metric(out, name) == pytest.approx([0.9, 0.9], abs=1e-4), name
    assert min(summary["final_return_per_seed"]) >= -400, summary["final_return_per_seed"]

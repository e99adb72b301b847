"""`sparqrl export`: ONNX files whose actions equal the library's own deterministic policy
(`sparqrl.load(dir).act`), for every algorithm and both runners, dense and sparse, fp32 / fp16 / int8."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import onnx
import pytest

import sparqrl
from sparqrl import cli
from sparqrl.algos import dqn, impala, ppo, sac
from sparqrl.config import ConfigError
from sparqrl.envs import make_env
from sparqrl.export import describe, export, export_policy, load_policy, session

TINY = dict(chunks=2, energy=False, eval_episodes=1, eval_every=0)
N_OBS = 1000


def _obs(shape, count=N_OBS, seed=1, scale=1.0):
    return (scale * np.random.default_rng(seed).normal(size=(count, *shape))).astype(np.float32)


def _run(path, obs):
    return session(str(path)).run(None, {"obs": obs})[0]


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory):
    """Discrete PPO, 2 seeds, normalised observations (the running statistics must be in the graph)."""
    return sparqrl.train("ppo", "CartPole-v1", steps=1024, seeds=2, out=tmp_path_factory.mktemp("ex") / "ppo",
                         num_steps=64, hidden=(32, 32), normalize_obs=True, **TINY).path


@pytest.fixture(scope="module")
def td3_sparse_run(tmp_path_factory):
    """RLx2 TD3 (90 % of the actor pruned), continuous Pendulum-v1 (actions scaled to [-2, 2])."""
    return sparqrl.train("td3", "Pendulum-v1", steps=600, out=tmp_path_factory.mktemp("ex") / "td3",
                         sparse="rlx2", actor_sparsity=0.9, critic_sparsity=0.8, hidden=(64, 64), learning_starts=200,
                         batch_size=32, buffer_min_size=64, buffer_check_interval=100, buffer_num_oldest=32,
                         topology_interval=50, **TINY).path


def test_ppo_discrete_fp32_exact_and_fp16_int8_agree(ppo_run, tmp_path):
    agent = sparqrl.load(ppo_run)
    # raw CartPole-like observations at twice the standard normal's spread: the normaliser must be in the graph
    obs = _obs((4,), scale=2.0)
    want = agent.act(obs, seed=1)
    assert np.mean(agent.act(obs, seed=0) != want) > 0  # the seeds differ, so --seed really picks a policy
    report = export(ppo_run, tmp_path / "fp32.onnx", seed=1)
    assert (report["seed"], report["algo"], report["sparse"], report["run_sparse"]) == (1, "ppo", False, "dense")
    assert report["bytes"] == (tmp_path / "fp32.onnx").stat().st_size
    np.testing.assert_array_equal(_run(tmp_path / "fp32.onnx", obs), want)
    policy, reference, _ = load_policy(ppo_run, 1)
    np.testing.assert_array_equal(reference(obs), want)
    assert policy.obs_norm is not None
    for precision in ("fp16", "int8"):
        data, report = export_policy(policy, None, precision)
        got = session(data).run(None, {"obs": obs})[0]
        assert got.dtype == np.int32 and got.shape == (N_OBS,)
        assert np.mean(got == want) >= 0.99, precision
        assert report["bytes"] == len(data)


def test_td3_sparse_continuous_within_bounds_and_smaller(td3_sparse_run, tmp_path):
    agent = sparqrl.load(td3_sparse_run)
    obs = _obs((3,))
    want = agent.act(obs)
    report = export(td3_sparse_run, tmp_path / "fp32.onnx")
    assert report["sparse"] and report["run_sparse"] == "rlx2" and report["compact_tensors"] >= 1
    assert report["outputs"] == {"action": {"dtype": "float32", "shape": ["batch", 1]}}
    np.testing.assert_allclose(_run(tmp_path / "fp32.onnx", obs), want, atol=1e-5 * 4.0)
    policy, _, _ = load_policy(td3_sparse_run, 0)
    sizes = {}
    for precision, sparse, tol in (("fp32", "auto", 1e-5), ("fp32", "no", 1e-5), ("fp16", "auto", 2e-2),
                                   ("int8", "auto", 5e-2), ("int8", "no", 5e-2)):
        data, report = export_policy(policy, None, precision, sparse=sparse)
        got = session(data).run(None, {"obs": obs})[0]
        assert got.shape == want.shape == (N_OBS, 1) and got.dtype == np.float32
        assert np.all(np.abs(got) <= 2.0)  # Pendulum's torque bounds
        # tolerance relative to the action range [-2, 2]
        assert np.max(np.abs(got - want)) <= tol * 4.0, (precision, sparse, np.max(np.abs(got - want)))
        assert report["sparse"] == (sparse == "auto")
        sizes[precision, sparse] = len(data)
        assert ("dense_bytes" in report) == (sparse == "auto")
    assert sizes["fp32", "auto"] < 0.5 * sizes["fp32", "no"]
    assert sizes["int8", "auto"] < sizes["int8", "no"] < sizes["fp32", "no"]


@pytest.mark.slow
def test_host_dqn_run_exports(tmp_path):
    """Ape-X DQN on gym:CartPole-v1 through the actor-learner runner (one inline actor). Slow: ~25 s, mostly
    compiling the runner's programs; `test_host_dqn_network_exports` covers the same network fast."""
    run = sparqrl.train("dqn", "gym:CartPole-v1", steps=400, out=tmp_path / "dqn", num_envs=2, buffer_size=256,
                        batch_size=16, learning_starts=64, hidden=(32,), fragment_steps=10, **TINY)
    agent = sparqrl.load(run.path)
    obs = _obs((4,))
    want = agent.act(obs)
    export(run.path, tmp_path / "fp32.onnx")
    np.testing.assert_array_equal(_run(tmp_path / "fp32.onnx", obs), want)
    export(run.path, tmp_path / "int8.onnx", "int8")
    assert np.mean(_run(tmp_path / "int8.onnx", obs) == want) >= 0.99


def test_host_dqn_network_exports():
    """The actor-learner DQN's policy tree (what a gym:CartPole-v1 run saves) against the runner's own
    greedy policy (`sebulba.greedy_policy`, what `sparqrl.load(...).act` runs for host runs)."""
    from sparqrl.envs import host_spec
    from sparqrl.runners.sebulba import greedy_policy

    spec = host_spec("gym:CartPole-v1")
    config = dqn.Config(hidden=(32, 32), total_timesteps=1000, buffer_size=64, batch_size=16).validate(spec)
    al = dqn.make_actor_learner(config, spec)
    params = jax.tree.map(np.asarray, al.policy(jax.jit(al.init)(jax.random.PRNGKey(0))))
    act = jax.jit(greedy_policy(al, 1))
    reference = lambda obs: np.asarray(act(params, obs))  # noqa: E731
    policy = describe("dqn", config, spec.observation_shape, spec.action_space, params)
    obs = _obs((4,))
    for precision in ("fp32", "int8"):
        data, _ = export_policy(policy, None, precision, reference=reference)
        agreement = np.mean(session(data).run(None, {"obs": obs})[0] == reference(obs))
        assert agreement == 1.0 if precision == "fp32" else agreement >= 0.99, (precision, agreement)


# ---- policies the library initialises (no training): the other networks and heads -----------------


def _initial_policy(module, config, env, shift_head=0.0):
    """The library's freshly initialised policy and its own `act` on a batch; shift_head is added to PPO's
    actor head bias (its init gain 0.01 keeps every mean near 0, far from the action bounds)."""
    algo = module.make_algorithm(config, env)
    params = algo.policy(jax.jit(algo.init)(jax.random.PRNGKey(3)))
    if shift_head:
        head = params.params["params"]["Dense_0"]
        head["bias"] = head["bias"] + shift_head
    key = jax.random.PRNGKey(0)
    act = jax.jit(jax.vmap(lambda o: algo.act(params, o, key)))
    name = module.__name__.rsplit(".", 1)[-1]
    policy = describe(name, config.validate(env), tuple(env.observation_shape), env.action_space,
                      jax.tree.map(np.asarray, params))
    return policy, lambda obs: np.asarray(act(obs))


@pytest.mark.parametrize("name, module, config, env", [
    ("sac", sac, sac.Config(hidden=(32, 32), total_timesteps=1000), "Pendulum-v1"),  # [mean, log-std][:1], tanh, scale
    ("ppo-box", ppo, ppo.Config(hidden=(32, 32)), "Pendulum-v1"),  # Gaussian mean clipped to the bounds
    ("ppo-conv", ppo, ppo.Config(hidden=(32,), activation="relu"), "Breakout-MinAtar"),  # Conv torso, argmax
    ("impala", impala, impala.Config(hidden=(32, 32)), "CartPole-v1"),  # PPO's ActorCritic, on `base.on_device`
])
def test_other_networks_and_heads(name, module, config, env):
    env = make_env(env)
    policy, reference = _initial_policy(module, config, env, shift_head=2.0 if name == "ppo-box" else 0.0)
    obs = _obs(tuple(env.observation_shape), count=200)
    if name == "ppo-conv":
        obs = (obs > 0.5).astype(np.float32)  # MinAtar's binary grids
    want = reference(obs)
    for precision in ("fp32", "fp16", "int8"):
        data, report = export_policy(policy, None, precision, reference=reference)
        got = session(data).run(None, {"obs": obs})[0]
        assert got.shape == want.shape
        if policy.head.discrete:
            agreement = np.mean(got == want)
            assert agreement == 1.0 if precision == "fp32" else agreement >= 0.97, (precision, agreement)
        else:  # Pendulum's actions span [-2, 2]
            assert np.max(np.abs(got - want)) <= (1e-5 if precision == "fp32" else 0.05) * 4.0, precision
    if name == "ppo-box":
        assert 0 < np.mean(np.abs(want) == 2.0) < 1, "some means, not all, must be clipped to the bounds"


def test_a_misread_network_is_an_error_not_a_file(tmp_path):
    policy, reference = _initial_policy(sac, sac.Config(hidden=(32, 32), total_timesteps=1000), make_env("Pendulum-v1"))
    wrong = policy._replace(head=policy.head._replace(tanh=False))  # as if the exporter forgot SAC's squashing
    with pytest.raises(ConfigError, match="cannot be exported: the ONNX graph's actions differ from the library's"):
        export_policy(wrong, tmp_path / "x.onnx", reference=reference)
    assert not (tmp_path / "x.onnx").exists()
    with pytest.raises(ConfigError, match="algo='trpo' .*ppo, dqn, td3, sac, impala, a2c"):  # the registry's names
        describe("trpo", None, (3,), None, {})
    with pytest.raises(ConfigError, match="dqn policy cannot be exported: its parameters have no params"):
        describe("dqn", None, (3,), None, {})


def test_graph_encodes_bitmap_exactly_and_folds_it_at_load(td3_sparse_run, tmp_path):
    """The compact kernels decode to the run's pruned kernels bit for bit (inference uses dense kernels)."""
    policy, _, _ = load_policy(td3_sparse_run, 0)
    data, report = export_policy(policy, None, "fp32")
    model = onnx.load_from_string(data)
    assert {"BitShift", "CumSum", "Gather"} <= {n.op_type for n in model.graph.node}
    # rebuild each Gemm's weight with the ONNX reference evaluator and compare with the kernels
    from onnx.reference import ReferenceEvaluator

    gemm_weights = [n.input[1] for n in model.graph.node if n.op_type == "Gemm"]
    outputs = [onnx.helper.make_tensor_value_info(w, onnx.TensorProto.FLOAT, None) for w in gemm_weights]
    probe = onnx.helper.make_model(
        onnx.helper.make_graph(list(model.graph.node[:-1]), "probe", list(model.graph.input), outputs,
                               list(model.graph.initializer)),
        opset_imports=list(model.opset_import))
    probe.ir_version = model.ir_version
    decoded = ReferenceEvaluator(probe).run(None, {"obs": np.zeros((1, 3), np.float32)})
    for got, kernel in zip(decoded, policy.stack.kernels):
        np.testing.assert_array_equal(got, kernel)
    assert np.mean(policy.stack.kernels[1] == 0) > 0.8  # really pruned
    # ONNX Runtime folds the decoding into plain initializers when it loads the session
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "optimized.onnx"))
    assert not {"BitShift", "CumSum", "Gather"} & {n.op_type for n in optimized.graph.node}


def test_exported_file_runs_without_sparqrl(ppo_run, tmp_path):
    out = tmp_path / "p.onnx"
    export(ppo_run, out, "int8", seed=1)
    obs = _obs((4,), count=5)
    np.save(tmp_path / "obs.npy", obs)
    code = ("import sys, numpy as np, onnxruntime as ort; "
            f"a = ort.InferenceSession({str(out)!r}).run(None, {{'obs': np.load({str(tmp_path / 'obs.npy')!r})}})[0]; "
            "assert not any(m.startswith(('sparqrl', 'jax')) for m in sys.modules); print(a.tolist())")
    printed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    np.testing.assert_array_equal(json.loads(printed), _run(out, obs))


# ---- the command line and its errors --------------------------------------------------------------


def test_cli_prints_the_report_and_refuses_to_overwrite(ppo_run, tmp_path, capsys):
    out = tmp_path / "policy.onnx"
    assert cli.main(["export", str(ppo_run), "--format", "onnx", "--precision", "int8", "--seed", "1",
                     "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["path"] == str(out) and report["bytes"] == out.stat().st_size > 0
    assert (report["precision"], report["format"], report["seed"], report["sparse"]) == ("int8", "onnx", 1, False)
    assert report["inputs"] == {"obs": {"dtype": "float32", "shape": ["batch", 4]}}
    assert report["outputs"] == {"action": {"dtype": "int32", "shape": ["batch"]}}
    meta = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert (meta["algo"], meta["env"], meta["seed"]) == ("ppo", "CartPole-v1", "1")
    before = out.read_bytes()
    assert cli.main(["export", str(ppo_run), "--out", str(out)]) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err and out.read_bytes() == before
    assert cli.main(["export", str(ppo_run), "--out", str(out), "--overwrite"]) == 0
    assert out.read_bytes() != before  # fp32 now


@pytest.mark.parametrize("args, words", [
    (["--precision", "int4"], r"precision='int4' .*fp32, fp16, int8"),
    (["--format", "tflite"], r"format='tflite' .*onnx"),
    (["--seed", "2"], r"seed=2 .*\[0, 2\)"),
    (["--seed", "-1"], r"seed=-1 .*\[0, 2\)"),
    (["--sparse", "yes"], r"sparse='yes' .*auto, no"),
])
def test_bad_arguments_are_one_line_errors(ppo_run, tmp_path, capsys, args, words):
    out = tmp_path / "x.onnx"
    assert cli.main(["export", str(ppo_run), "--out", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sparqrl: error:") and len(err.splitlines()) == 1
    assert __import__("re").search(words, err), err
    assert not out.exists()


def test_missing_onnx_names_the_extra(ppo_run, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(ConfigError, match=r"sparqrl export needs onnx.*pip install 'sparqrl\[export\]'"):
        export(ppo_run, tmp_path / "x.onnx")
    assert not (tmp_path / "x.onnx").exists()


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_an_exported_file_gets_the_users_default_mode(tmp_path, umask, mode):
    """0o666 less the umask, as any file the user writes (it was mkstemp's 0600 whatever the umask)."""
    from sparqrl.export import _write

    saved = os.umask(umask)
    try:
        _write(tmp_path / "policy.onnx", b"onnx")
    finally:
        os.umask(saved)
    assert (tmp_path / "policy.onnx").stat().st_mode & 0o777 == mode
    assert [p.name for p in tmp_path.iterdir()] == ["policy.onnx"]  # no temporary left beside it

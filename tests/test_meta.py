"""Meta-evolution: PPO with learned rules at their start equals the hand-written rule, rules resolved to
their file's content, `sparqrl meta` outputs, an exact resume, one-line errors, and a learning test."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import fitness_rows, meta_checkpoint, run_cli, train_and_evaluate
from test_wandb import items, of_kind, wandb_records

from sparqrl import cli
from sparqrl import config as cfg
from sparqrl.algos import base, ppo
from sparqrl.algos.ppo import objectives
from sparqrl.config import ConfigError
from sparqrl.envs import make_env
from sparqrl.meta import run as meta_run
from sparqrl.runners.anakin import static_describe
from sparqrl.runners.session import RunInterrupted

TINY = ppo.Config(total_timesteps=3 * 4 * 16, num_envs=4, num_steps=16, num_minibatches=2, update_epochs=2)


@pytest.fixture(scope="module")
def cartpole():
    return make_env("CartPole-v1")


def trained_params(config, env, key=0, meta_params=None):
    algo = ppo.make_algorithm(config, env, meta_params)
    state, metrics = jax.jit(base.make_train_fn(algo))(jax.random.PRNGKey(key))
    return algo.policy(state).params, metrics


def assert_trees_close(a, b, atol=1e-6):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=atol)


# --------------------------------------------------------------------------------------------------
# Learned rules at their start are the hand-written ones


@pytest.mark.parametrize("env_name", ["CartPole-v1", "Pendulum-v1"])
def test_zero_lpo_network_trains_as_ppo_clip(tmp_path, env_name):
    """objective lpo:FILE with the all-zero network (discrete and continuous actions) trains to the same
    parameters as objective ppo-clip."""
    env = make_env(env_name)
    file = objectives.save_meta_params(tmp_path / "lpo.npz", objectives.lpo_init())
    clip, clip_metrics = trained_params(TINY, env)
    lpo, lpo_metrics = trained_params(dataclasses.replace(TINY, objective=f"lpo:{file}"), env)
    assert_trees_close(clip, lpo)
    np.testing.assert_allclose(clip_metrics["policy_loss"], lpo_metrics["policy_loss"], rtol=1e-5, atol=1e-6)
    if env_name != "CartPole-v1":
        return
    # the same weights given as an input (as meta-training does) train the same
    given, _ = trained_params(dataclasses.replace(TINY, objective="lpo"), env,
                              meta_params=objectives.MetaParams(lpo=objectives.lpo_init()))
    assert_trees_close(lpo, given, atol=0.0)


def test_learned_value_loss_at_init_trains_as_l2(tmp_path, cartpole):
    file = objectives.save_meta_params(tmp_path, objectives.value_loss_init())  # a folder: best_meta_params.npz
    l2, l2_metrics = trained_params(dataclasses.replace(TINY, value_loss="l2"), cartpole)
    learned, learned_metrics = trained_params(dataclasses.replace(TINY, value_loss=f"learned:{tmp_path}"), cartpole)
    assert file.endswith(objectives.META_PARAMS_FILE)
    assert_trees_close(l2, learned)
    np.testing.assert_allclose(l2_metrics["value_loss"], learned_metrics["value_loss"], rtol=1e-5)


# --------------------------------------------------------------------------------------------------
# Rules resolved to their file's content (program-cache correctness), old configs, errors


def test_learned_rule_resolves_to_its_content_hash(tmp_path, cartpole):
    folder = tmp_path / "run"
    folder.mkdir()
    objectives.save_meta_params(folder, objectives.lpo_init())
    config = dataclasses.replace(TINY, objective=f"lpo:{folder}")
    resolved = config.validate(cartpole)
    file = folder / objectives.META_PARAMS_FILE
    assert resolved.objective.startswith(f"lpo:{file}#sha256=")
    assert resolved.validate(cartpole) == resolved  # the resolved form loads, unchanged
    # re-evolved weights at the same path: another repr, so no stale stored program is reused ...
    changed = objectives.lpo_init()._replace(out=jnp.full((objectives.LPO_HIDDEN,), 0.1))
    objectives.save_meta_params(folder, changed)
    again = config.validate(cartpole)
    assert again.objective != resolved.objective
    assert static_describe("ppo", again) != static_describe("ppo", resolved)
    # ... and a run recorded with the old weights refuses the changed file
    with pytest.raises(ConfigError, match="objective=.*changed"):
        resolved.validate(cartpole)
    # plain rules stay as they are
    assert TINY.validate(cartpole).objective == "ppo-clip"


def test_old_config_with_clip_value_loads():
    for clip, expected in ((True, "clipped"), (False, "l2")):
        data = {**cfg.to_dict(ppo.Config()), "clip_value": clip}
        data.pop("value_loss")
        assert cfg.from_dict(ppo.Config, data).value_loss == expected


@pytest.mark.parametrize("field,value,words", [
    ("objective", "ppo", "must be one of ppo-clip, dpo, lpo:PATH"),
    ("objective", "lpo:", "needs a file"),
    ("value_loss", "learned:/no/such/file.npz", "not found"),
    ("value_loss", "huber", "must be one of l2, clipped, learned:PATH"),
])
def test_bad_rule_is_one_line_error(cartpole, field, value, words):
    with pytest.raises(ConfigError, match=words) as error:
        dataclasses.replace(TINY, **{field: value}).validate(cartpole)
    assert "\n" not in str(error.value) and field in str(error.value)


def test_wrong_shaped_meta_params_file_is_one_line_error(tmp_path, cartpole):
    file = objectives.save_meta_params(tmp_path / "v.npz", objectives.value_loss_init(hidden=8))
    with pytest.raises(ConfigError, match="wrong shape") as error:
        dataclasses.replace(TINY, value_loss=f"learned:{file}").validate(cartpole)
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="needs meta-parameters"):
        ppo.make_algorithm(dataclasses.replace(TINY, objective="lpo"), cartpole)


# --------------------------------------------------------------------------------------------------
# sparqrl meta: outputs, exact resume, errors

INNER = ["--set", "num_envs=4", "--set", "num_steps=16", "--set", "num_minibatches=1", "--set", "update_epochs=1",
         "--set", "hidden=16,16", "--steps", "128"]


# `train ppo` with a learned rule, through the runner (its shard_map over seeds), 2 seeds
TRAIN_TINY = ["--seeds", "2", "--steps", "256", "--set", "num_envs=4", "--set", "num_steps=32", "--set",
              "num_minibatches=1", "--set", "update_epochs=1", "--set", "hidden=16,16", "--chunks", "1",
              "--eval-episodes", "2", "--no-progress", "--no-energy"]


def meta_argv(task, out, *extra):
    return ["meta", task, "--popsize", "4", "--seeds", "2", *INNER, "--out", str(out), "--no-energy",
            "--no-progress", *extra]


def make_old_checkpoint(out):
    """Turn a meta run's checkpoint into the checkpoint.npz an older sparqrl wrote (strategy state leaves,
    generations done, running totals as JSON), as the only checkpoint of the folder."""
    state, meta = meta_checkpoint(out)
    leaves = {f"leaf_{i:04d}": np.asarray(leaf) for i, leaf in enumerate(jax.tree.leaves(state))}
    totals = {k: meta[k] for k in ("wall_time_s", "compile_time_s", "energy_kwh", "co2_kg", "energy_sessions",
                                   "energy_sessions_measured")}
    np.savez(out / meta_run.CHECKPOINT, **leaves, generation=np.asarray(meta["chunks_done"], np.int64),
             totals=np.asarray(json.dumps({**totals, "env_steps": 0})))
    shutil.rmtree(out / "checkpoint")


def test_meta_lpo_outputs_and_stopped_run_resumes_identically(capsys, tmp_path):
    """A run stopped (Ctrl-C) after generation 2 of 3 says how to go on in one line and, resumed from the
    checkpoint.npz of an older sparqrl, ends bit-identical to an uninterrupted one (fitness.csv, strategy
    state, best meta-parameters); a finished run has every output."""
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    start = time.perf_counter()
    code, out, err = run_cli(capsys, *meta_argv("lpo", whole, "--generations", "3"))
    assert code == 0, err
    summary = json.loads(out)
    for name in ("fitness.csv", "fitness.png", "learned.png", "summary.json", "config.json", "checkpoint",
                 objectives.META_PARAMS_FILE, "tensorboard", "sparqrl-run.json"):
        assert (whole / name).exists(), name
    for key in ("task", "env", "strategy", "generations", "popsize", "seeds", "steps", "best_fitness",
                "final_mean_fitness", "wall_time_s", "compile_time_s", "env_steps_per_s"):
        assert key in summary, key
    assert summary["generations"] == 3 and summary["env_steps"] == 3 * 4 * 2 * 128
    assert len(fitness_rows(whole)) == 3
    # the result is what `train --objective lpo:DIR` reads, through the runner
    code, _, err = run_cli(capsys, "train", "ppo", "--objective", f"lpo:{whole}", *TRAIN_TINY, "--out",
                           str(tmp_path / "trained"))
    assert code == 0, err

    def stop(generation):
        if generation == 2:
            raise KeyboardInterrupt  # as the session's check of a Ctrl-C

    args = meta_run.MetaConfig(task="lpo", popsize=4, seeds=2, steps=128, generations=3, out=str(killed),
                               energy=False, progress=False,
                               set=("num_envs=4", "num_steps=16", "num_minibatches=1", "update_epochs=1",
                                    "hidden=16,16"))
    with pytest.raises(RunInterrupted, match=f"after generation 2; checkpoint saved; continue with: sparqrl meta "
                                             f"--resume {killed}$"):
        meta_run.train_meta(args, on_generation=stop)
    assert len(fitness_rows(killed)) == 2 and not (killed / "summary.json").exists()
    make_old_checkpoint(killed)
    code, _, err = run_cli(capsys, "meta", "--resume", str(killed), "--no-progress")
    assert code == 0, err
    assert fitness_rows(killed) == fitness_rows(whole) and not (killed / meta_run.CHECKPOINT).exists()
    (a, a_meta), (b, b_meta) = meta_checkpoint(whole), meta_checkpoint(killed)
    jax.tree.map(np.testing.assert_array_equal, a, b)
    assert a_meta["chunks_done"] == b_meta["chunks_done"] == 3
    assert_trees_close(objectives.load_meta_params(whole, objectives.lpo_init()),
                       objectives.load_meta_params(killed, objectives.lpo_init()), atol=0.0)
    print(f"\nlpo meta runs: {time.perf_counter() - start:.0f} s")


def test_plain_meta_commands_take_their_tasks_documented_settings():
    """What a command leaves unset is its task's own (issue 31, item 4): M-FOS ES the extortion settings (OpenES
    sigma 0.1, lr 0.2, z-scored fitness, 32 units, one inner seed), M-FOS PPO the reference's 256 units and no
    strategy settings, ACT sigma 0.1 and lr 0.05, LPO the preset with ranked fitness on 2 seeds; what the user
    gives wins, and the resolved values are what the prepared config (config.json) holds."""
    def prepared(**fields):
        return meta_run.prepare(meta_run.MetaConfig(popsize=4, energy=False, **fields))

    es = prepared(task="mfos")
    assert (es.config.seeds, es.config.sigma, es.config.lr, es.config.fitness_shaping) == (1, 0.1, 0.2, "z_score")
    assert es.task.inner_config.hidden == 32
    assert meta_run.strategy_overrides(es.config) == {"fitness_shaping": "z_score", "antithetic": True, "sigma": 0.1,
                                                      "lr": 0.2}
    given = prepared(task="mfos", seeds=2, sigma=0.3, fitness_shaping="centered_rank", set=("hidden=8",))
    assert (given.config.seeds, given.config.sigma, given.config.lr, given.config.fitness_shaping,
            given.task.inner_config.hidden) == (2, 0.3, 0.2, "centered_rank", 8)
    snes = prepared(task="mfos", strategy="snes")  # the open_es settings are not another strategy's
    assert (snes.config.seeds, snes.config.sigma, snes.config.lr) == (1, 0.0, 0.0)
    ppo_trainer = meta_run.prepare(meta_run.MetaConfig(task="mfos", trainer="ppo", energy=False))
    assert ppo_trainer.task.inner_config.hidden == 256 and ppo_trainer.config.sigma == 0.0
    act = prepared(task="act", set=("num_steps=16", "total_timesteps=256"))
    assert (act.config.seeds, act.config.sigma, act.config.lr, act.config.fitness_shaping) == (1, 0.1, 0.05, "")
    lpo = prepared(task="lpo", set=("num_steps=16", "total_timesteps=256"))
    assert (lpo.config.seeds, lpo.config.sigma, lpo.config.lr) == (2, 0.0, 0.0)
    assert meta_run.strategy_overrides(lpo.config)["fitness_shaping"] == "centered_rank"


def test_meta_value_loss_more_generations_and_train_reads_the_result(capsys, tmp_path, cartpole):
    out = tmp_path / "vl"
    code, _, err = run_cli(capsys, *meta_argv("value-loss", out, "--generations", "1", "--fitness-shaping", "z_score",
                                              "--wandb", "sparqrl-meta"))
    assert code == 0, err
    code, summary, err = run_cli(capsys, "meta", "--resume", str(out), "--generations", "2", "--no-progress",
                                 "--no-energy")
    assert code == 0, err
    assert json.loads(summary)["generations"] == 2 and len(fitness_rows(out)) == 2
    # W&B (offline, the default) got each generation's meta/ scalars of fitness.csv, one W&B run over both sessions
    sessions = [wandb_records(f) for f in sorted((out / "wandb").glob("offline-run-*/run-*.wandb"))]
    assert len(sessions) == 2 and len({of_kind(r, "run")[0].run_id for r in sessions}) == 1
    logged = [items(h.item) for records in sessions for h in of_kind(records, "history")]
    assert [row["_step"] for row in logged] == [1, 2]
    for row, saved in zip(logged, fitness_rows(out)):
        assert {k: v for k, v in row.items() if not k.startswith("_")} == pytest.approx(
            {f"meta/{k}": float(v) for k, v in saved.items() if k not in ("generation", "env_steps")}, rel=1e-5)
    assert "fitness.csv" in {c.path for c in of_kind(sessions[1], "artifact")[0].manifest.contents}
    resolved = dataclasses.replace(TINY, value_loss=f"learned:{out}").validate(cartpole)
    assert resolved.value_loss.startswith("learned:") and "#sha256=" in resolved.value_loss
    code, _, err = run_cli(capsys, "train", "ppo", "--value-loss", f"learned:{out}", *TRAIN_TINY, "--out",
                           str(tmp_path / "trained"))
    assert code == 0, err


def test_meta_hparams_writes_best_hparams(capsys, tmp_path):
    out = tmp_path / "hp"
    code, _, err = run_cli(capsys, *meta_argv("hparams", out, "--generations", "1", "--fields", "lr,gamma",
                                              "--popsize", "2"))
    assert code == 0, err
    best = json.loads((out / meta_run.BEST_HPARAMS_FILE).read_text())
    assert set(best["hparams"]) == {"lr", "gamma"} and 0 < best["hparams"]["gamma"] < 1
    assert best["hparams"]["lr"] > 0 and (out / "learned.png").exists()
    _, config = cli.load_config("ppo", str(out / meta_run.BEST_HPARAMS_FILE))
    assert (config.lr, config.gamma) == (best["hparams"]["lr"], best["hparams"]["gamma"])
    # the meta folder itself is not a train run: one-line errors, nothing written
    for argv in (["train", "ppo", "--resume", str(out)], ["train", "ppo", "--load-config", str(out)],
                 ["eval", str(out)]):
        code, _, err = run_cli(capsys, *argv)
        assert code == 2 and "meta run" in err and err.strip().count("\n") == 0, (argv, err)


def test_damaged_old_checkpoint_is_one_line_and_nothing_changes(capsys, tmp_path):
    """A folder of an older sparqrl whose checkpoint.npz is damaged: `meta --resume` says so in one line (exit
    2), and nothing in the folder is written or deleted."""
    out = tmp_path / "old"
    config = meta_run.MetaConfig(task="mfos", popsize=4, games=8, out=str(out), energy=False, progress=False)
    rundir = meta_run.start_meta_dir(meta_run.prepare(config))
    rundir.claim(meta_run.CHECKPOINT).write_bytes(b"PK\x03\x04 cut short")
    rundir.release()
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.name != "sparqrl-run.lock"}
    code, _, err = run_cli(capsys, "meta", "--resume", str(out))
    assert code == 2 and "damaged checkpoint.npz" in err and err.strip().count("\n") == 0, err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != "sparqrl-run.lock"} == before


@pytest.mark.parametrize("argv,words", [
    (["meta", "value-los"], "close matches: value-loss"),
    (["meta", "lpo", "--strategy", "openes"], "close matches: open_es"),
    (["meta", "lpo", "--popsize", "5"], "popsize=5 is not allowed: must be even"),
    (["meta", "hparams", "--fields", "lr,clip_epsilon"], "close matches: clip_eps"),
    (["meta", "hparams", "--algo", "dqn", "--fields", "clip_eps"], "fields='clip_eps'"),
    (["meta", "lpo", "--set", "num_env=4"], "unknown field 'num_env'"),
    (["meta", "lpo", "--fitness", "best"], "fitness='best'"),
    (["meta", "lpo", "--popsize", "0"], "popsize=0"),
    (["meta", "lpo", "--wandb", "team/proj"], "wandb='team/proj' is not allowed: must not contain '/'"),
    (["meta"], "TASK"),
    (["meta", "--resume", "/no/such/run"], "no such folder"),
])
def test_meta_bad_input_is_one_line_exit_2(capsys, tmp_path, argv, words):
    code, _, err = run_cli(capsys, *argv, "--out", str(tmp_path / "x")) if "--resume" not in argv else run_cli(
        capsys, *argv)
    assert code == 2
    assert err.startswith("sparqrl: error:") and err.strip().count("\n") == 0, err
    assert words in err, err
    assert not (tmp_path / "x").exists()


def test_train_with_wrong_shaped_meta_params_is_one_line_exit_2(capsys, tmp_path):
    file = objectives.save_meta_params(tmp_path / "bad.npz", objectives.lpo_init(hidden=4))
    code, _, err = run_cli(capsys, "train", "ppo", "--objective", f"lpo:{file}", "--out", str(tmp_path / "x"))
    assert code == 2 and err.strip().count("\n") == 0 and "wrong shape" in err, err


# --------------------------------------------------------------------------------------------------
# Learning


def test_learned_value_loss_at_init_learns_cartpole(tmp_path, cartpole):
    """PPO with value_loss learned:FILE at the L2 start (PureJaxRL's CartPole config, 500k steps, 2 seeds
    vmapped) trains exactly as PPO with the L2 value loss on the same keys, and learns.

    The threshold was 400 until 2026-11-26: on that day's CI machine (AVX-512) L2 PPO itself scored 193.7 and
    354.8 on these keys, bit for bit what the learned loss scored, so 400 tested the machine's float path,
    not the learned loss. A random policy scores ~22."""
    objectives.save_meta_params(tmp_path, objectives.value_loss_init())

    def returns_of(value_loss):
        return train_and_evaluate(ppo.Config(value_loss=value_loss).validate(cartpole), cartpole, seed=0, num_seeds=2)

    returns = returns_of(f"learned:{tmp_path}")
    np.testing.assert_array_equal(returns, returns_of("l2"))
    assert returns.mean() >= 200.0

"""Hyperparameters as traced inputs and `sparqrl sweep`: settings x seeds in one program, each member
equal to the `train` run of its setting."""

import csv
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparqrl import cli
from sparqrl.algos import dqn, get_algorithm, ppo
from sparqrl.algos.base import hparams_of, make_train_fn, traced_fields
from sparqrl.config import ConfigError
from sparqrl.envs import make_env
from sparqrl.runners import RunConfig, RunInterrupted, resume, train
from sparqrl.runners.anakin import load_state
from sparqrl.runners.sweep import make_settings

PPO = ppo.Config(total_timesteps=4 * 512, num_envs=4, num_steps=128)
LRS = (1e-4, 1e-3)


def small_run(out, **kw) -> RunConfig:
    base = dict(env="CartPole-v1", seeds=2, out=str(out), chunks=4, checkpoint_every=1, checkpoint_interval_s=0.0,
                eval_every=0, eval_episodes=3, progress=False, energy=False)
    return RunConfig(**{**base, **kw})


TINY = {
    "ppo": ("CartPole-v1", dict(total_timesteps=256, num_envs=4, num_steps=32)),
    "dqn": ("CartPole-v1", dict(total_timesteps=400, num_envs=4, learning_starts=100, buffer_size=200, batch_size=16,
                                train_interval=4, target_update_interval=40, epsilon_anneal_time=200)),
    "td3": ("Pendulum-v1", dict(total_timesteps=60, learning_starts=20, batch_size=8, buffer_max_size=100,
                                buffer_min_size=20, hidden=(16, 16))),
    "sac": ("Pendulum-v1", dict(total_timesteps=60, learning_starts=20, batch_size=8, buffer_max_size=100,
                                buffer_min_size=20, hidden=(16, 16))),
}


@pytest.mark.parametrize("algo", list(TINY))
def test_every_traced_field_is_an_input_that_matters(algo):
    """Each algorithm's TRACED fields vmap as inputs, and at the config's values they give exactly the run
    with those values compiled in as constants."""
    module = get_algorithm(algo)
    env_name, fields = TINY[algo]
    env = make_env(env_name)
    config = dataclasses.replace(module.Config(), **fields).validate(env)
    assert traced_fields(config)
    train = module.make_train(config, env)
    key = jax.random.PRNGKey(3)
    hparams = {k: jnp.float32(v) for k, v in hparams_of(config).items()}
    traced_state, traced = jax.jit(train)(key, hparams)
    _, constant = jax.jit(make_train_fn(module.make_algorithm(config, env)))(key)
    for name in constant:
        np.testing.assert_allclose(traced[name], constant[name], rtol=2e-5, atol=1e-5, err_msg=name)
    # a different value in one program changes the training: the field is an input, not a constant
    lr = "lr" if "lr" in hparams else "critic_lr"
    doubled = {k: jnp.stack([v, v * (4.0 if k == lr else 1.0)]) for k, v in hparams.items()}
    _, both = jax.jit(jax.vmap(train, in_axes=(None, 0)))(key, doubled)
    loss = next(n for n in ("total_loss", "loss", "critic_loss") if n in both)
    np.testing.assert_allclose(both[loss][0], traced[loss], rtol=2e-5, atol=1e-5)
    assert not np.allclose(both[loss][1], both[loss][0])


def test_sweep_of_two_learning_rates_equals_two_train_runs(tmp_path):
    settings = [{"lr": lr} for lr in LRS]
    swept = train("ppo", PPO, small_run(tmp_path / "sweep"), settings=settings)
    assert swept["settings"] == 2 and swept["compilations"] == 1 and swept["seeds"] == 2 and swept["members"] == 4
    sweep_state = load_state(tmp_path / "sweep")[-1]
    for s, lr in enumerate(LRS):
        single = train("ppo", dataclasses.replace(PPO, lr=lr), small_run(tmp_path / f"lr{s}"))
        assert swept["final_return_per_seed"][2 * s:2 * s + 2] == single["final_return_per_seed"]
        single_state = load_state(tmp_path / f"lr{s}")[-1]
        for a, b in zip(jax.tree.leaves(sweep_state), jax.tree.leaves(single_state), strict=True):
            np.testing.assert_array_equal(np.asarray(a)[2 * s:2 * s + 2], np.asarray(b))

    out = tmp_path / "sweep"
    rows = list(csv.DictReader((out / "sweep.csv").open()))
    assert [float(r["lr"]) for r in rows] == list(LRS)
    returns = np.array(swept["final_return_per_seed"]).reshape(2, 2)
    assert [float(r["return_mean"]) for r in rows] == pytest.approx(returns.mean(axis=1).tolist())
    assert (out / "sweep.png").stat().st_size > 0
    best = json.loads((out / "best.json").read_text())
    assert best["config"]["lr"] == LRS[int(np.argmax(returns.mean(axis=1)))] == swept["best"]["lr"]
    # `train --load-config best.json` runs the best setting
    run, config = cli.load_config("ppo", str(out / "best.json"))
    assert config == dataclasses.replace(PPO, lr=best["config"]["lr"]) and run.env == "CartPole-v1"


def test_interrupted_sweep_resumes_to_the_same_end(tmp_path):
    settings = [{"lr": lr} for lr in LRS]
    whole = train("ppo", PPO, small_run(tmp_path / "whole", seeds=1), settings=settings)

    def stop_at_2(done, metrics):
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(RunInterrupted):
        train("ppo", PPO, small_run(tmp_path / "cut", seeds=1), settings=settings, on_chunk=stop_at_2)
    resumed = resume(tmp_path / "cut")
    assert resumed["final_return_per_seed"] == whole["final_return_per_seed"]
    assert (tmp_path / "cut" / "sweep.csv").read_text() == (tmp_path / "whole" / "sweep.csv").read_text()


def test_settings_grid_and_random():
    grid = make_settings(PPO, ["lr=1e-4,1e-3", "clip_eps=0.1,0.2,0.3"], [], None, 0)
    assert len(grid) == 6 and grid[0] == {"lr": 1e-4, "clip_eps": 0.1} and grid[-1] == {"lr": 1e-3, "clip_eps": 0.3}
    drawn = make_settings(PPO, [], ["lr=log:1e-5:1e-2", "ent_coef=lin:0:0.1"], 64, 0)
    lrs = np.array([s["lr"] for s in drawn])
    assert len(drawn) == 64 and lrs.min() >= 1e-5 and lrs.max() <= 1e-2
    assert (lrs < 1e-3).mean() > 0.4  # log-uniform: half the draws below the range's geometric middle (3e-4)
    assert make_settings(PPO, [], ["lr=log:1e-5:1e-2"], 8, 0) == make_settings(PPO, [], ["lr=log:1e-5:1e-2"], 8, 0)


@pytest.mark.parametrize("args, message", [
    (["--grid", "num_envs=4,8"], "num_envs.* is static .*separate runs"),
    (["--grid", "lrr=1e-4"], "not a field .*close matches: lr"),
    (["--grid", "lr=1e-4,abc"], "'abc' is not a number"),
    (["--grid", "lr=1e-4", "--grid", "lr=1e-3"], "repeats the field 'lr'"),
    (["--random", "lr=log:0:1"], "a log range needs low > 0"),
    (["--random", "lr=exp:1:2"], "log:low:high"),
    (["--grid", "lr=-1,1e-3"], "lr=-1.0 is not allowed: must be > 0"),
    ([], "needs --grid"),
    (["--grid", "lr=1e-4", "--env", "gym:CartPole-v1"], "a sweep runs on the device"),
])
def test_bad_sweeps_are_one_line_errors_before_anything_is_written(tmp_path, capsys, args, message):
    out = tmp_path / "never"
    code = cli.main(["sweep", "ppo", "--steps", "512", "--out", str(out), *args])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert pytest.importorskip("re").search(message, err), err
    assert not out.exists()


def test_dqn_sweep_members_equal_train_runs(tmp_path):
    config = dqn.Config(total_timesteps=2000, learning_starts=500, buffer_size=1000, batch_size=32,
                        epsilon_anneal_time=1000, target_update_interval=100)
    settings = [{"gamma": 0.9}, {"gamma": 0.99}]
    swept = train("dqn", config, small_run(tmp_path / "sweep", seeds=1, chunks=2), settings=settings)
    single = train("dqn", dataclasses.replace(config, gamma=0.9), small_run(tmp_path / "one", seeds=1, chunks=2))
    assert swept["final_return_per_seed"][:1] == single["final_return_per_seed"]
    with pytest.raises(ConfigError, match="gamma"):
        train("dqn", config, small_run(tmp_path / "bad", seeds=1), settings=[{"gamma": 1.5}])


def test_a_damaged_sweep_record_is_a_one_line_error(tmp_path, capsys):
    out = tmp_path / "sweep"
    train("ppo", PPO, small_run(out, seeds=1, chunks=1), settings=[{"lr": LRS[0]}])
    data = json.loads((out / "config.json").read_text())
    (out / "summary.json").unlink()  # an unfinished run, so --resume reads its settings
    for damaged in ([{"lr": "fast"}], [], [{"lr": 1e-4}, {"gamma": 0.9}]):
        (out / "config.json").write_text(json.dumps({**data, "sweep": damaged}))
        assert cli.main(["train", "--resume", str(out)]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "sweep settings" in err, err

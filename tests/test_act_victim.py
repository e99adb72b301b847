"""ACT at test time: a fresh PPO victim trained with the normal runner against an act meta run's adversary,
held fixed (`act:DIR`, `act:DIR:silent`, `sparqrl train ppo --load-config DIR`; `sparqrl.meta.act`).

The act meta run is made once per module without evolving (evolution is `test_cheap_talk`'s): its folder,
config.json and manifest as `sparqrl meta act` writes them (`prepare`, `start_meta_dir`), and a random,
non-zero adversary saved as the run saves its centre (`save_meta_params`). The victim run is trained once
and shared; the interrupted copy resumed here compiles nothing new (same programs, stored).
"""

import json
import shutil

import jax
import numpy as np
import pytest

from conftest import run_cli

from sparqrl import cli
from sparqrl.algos import ppo
from sparqrl.algos.ppo import objectives
from sparqrl.config import ConfigError, to_dict
from sparqrl.envs import make_env, resolve_env_name
from sparqrl.envs.cheap_talk import make_adversary
from sparqrl.meta import act, run as meta_run
from sparqrl.runners import RunConfig, RunInterrupted, train
from sparqrl.runners.rundir import new_run_dir, start_run_dir

N_DIMS, KIND, MODE = 3, "mlp", "pro"  # not the defaults: the env must read them from the run
VICTIM = ("num_steps=16", "total_timesteps=128", "update_epochs=1")  # 4 envs x 16 steps x 2 updates
TRAIN_FLAGS = ("--seeds", "2", "--chunks", "2", "--eval-episodes", "2", "--no-progress", "--no-energy")


def _random_params(like, seed=0):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), like)


def _make_act_run(out, task="act"):
    """A meta run's folder as `sparqrl meta TASK` leaves it (config.json, manifest); act: with a random adversary
    in best_meta_params.npz. Returns the prepared run (act) or None."""
    config = meta_run.MetaConfig(task=task, adversary=KIND, n_dims=N_DIMS, mode=MODE, popsize=4, set=VICTIM,
                                 out=str(out), energy=False, progress=False)
    if task != "act":  # (another task's config.json, without building it)
        new_run_dir(out, False, json.dumps({"meta": to_dict(meta_run.MetaConfig(task=task)), "inner": {}}))
        return None
    prepared = meta_run.prepare(config)
    rundir = meta_run.start_meta_dir(prepared)
    objectives.save_meta_params(rundir.claim(objectives.META_PARAMS_FILE), _random_params(prepared.task.init(None)))
    return prepared


@pytest.fixture(scope="module")
def act_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("act") / "run"
    _make_act_run(out)
    return out


@pytest.fixture(scope="module")
def victim_run(act_run, tmp_path_factory):
    """`sparqrl train ppo --load-config ACT_RUN`: 2 victims against the run's adversary."""
    out = tmp_path_factory.mktemp("victim") / "v"
    code = cli.main(["train", "ppo", "--load-config", str(act_run), *TRAIN_FLAGS, "--out", str(out)])
    assert code == 0
    return out


def _reset_obs(env, seed=3):
    return np.asarray(env.reset(jax.random.PRNGKey(seed))[0])


def test_act_env_is_the_meta_tasks_victim_env_with_the_saved_adversary(act_run):
    params = objectives.load_meta_params(act_run, act.read_fixed_adversary(str(act_run), silent=True).params)
    base = act.base_env("CartPole-v1", MODE)
    expected = _reset_obs(act.victim_env(base, params, N_DIMS, KIND))  # what the meta task's victims see
    obs = _reset_obs(make_env(f"act:{act_run}"))
    assert obs.shape == (4 + N_DIMS,)
    np.testing.assert_array_equal(obs, expected)
    # the message is scale * tanh(adversary(observation)), computed here from the network itself
    _, raw = make_adversary(4, N_DIMS, KIND).apply(params, None, obs[:4])
    np.testing.assert_allclose(obs[4:], act.SCALE * np.tanh(np.asarray(raw)), rtol=1e-6, atol=1e-6)
    assert np.all(np.abs(obs[4:]) > 1e-3)
    # silent: the same env and observation, message 0
    silent = _reset_obs(make_env(f"act:{act_run}:silent"))
    np.testing.assert_array_equal(silent[:4], obs[:4])
    np.testing.assert_array_equal(silent[4:], 0.0)


def test_a_recorded_name_rebuilds_only_the_same_adversary(act_run, tmp_path, monkeypatch):
    copy = tmp_path / "copy"
    shutil.copytree(act_run, copy)
    monkeypatch.chdir(tmp_path)
    resolved = resolve_env_name("act:copy")
    assert resolved.startswith(f"act:{copy}#sha256=") and resolve_env_name(resolved) == resolved
    silent = resolve_env_name("act:copy:silent")
    assert silent.startswith(f"act:{copy}:silent#sha256=") and silent.rpartition("=")[2] != resolved.rpartition("=")[2]
    assert resolve_env_name("CartPole-v1") == "CartPole-v1"
    like = act.read_fixed_adversary(str(copy), silent=True).params
    objectives.save_meta_params(copy, _random_params(like, seed=1))  # the run went on: another adversary
    with pytest.raises(ConfigError, match=r"env='act:.*changed since") as error:
        make_env(resolved)
    assert "\n" not in str(error.value)
    assert resolve_env_name(silent) == silent  # a silent adversary does not read the file


def test_train_load_config_trains_the_victim_config_against_the_adversary(victim_run, act_run, capsys):
    saved = json.loads((victim_run / "config.json").read_text())
    summary = json.loads((victim_run / "summary.json").read_text())
    assert saved["run"]["env"] == summary["env"] == resolve_env_name(f"act:{act_run}")
    assert saved["run"]["env"].startswith(f"act:{act_run}#sha256=")
    inner = json.loads((act_run / "config.json").read_text())["inner"]
    assert saved["algo"] == inner["algo"] == "ppo" and saved["config"] == inner["config"]
    assert saved["config"]["num_steps"] == 16 and saved["config"]["hidden"] == [32, 32]  # ACT's victim, --set
    assert summary["steps"] == 128 and len(summary["final_return_per_seed"]) == 2
    for name in ("metrics.csv", "returns.png", "checkpoint"):
        assert (victim_run / name).exists(), name
    code, text, err = run_cli(capsys, "eval", str(victim_run))
    assert code == 0, err
    assert json.loads(text)["return_per_seed"] == summary["final_return_per_seed"]


def test_an_interrupted_victim_run_resumes_from_another_folder(victim_run, act_run, tmp_path, monkeypatch, capsys):
    """The run records its act env resolved (absolute folder, hash): resumed from elsewhere, it ends as the
    uninterrupted victim run."""
    monkeypatch.chdir(act_run.parent)
    run, config = cli.load_config("ppo", act_run.name)  # a relative folder
    assert run.env == f"act:{act_run.name}"
    out = tmp_path / "cut"
    run = RunConfig(env=resolve_env_name(run.env), seeds=2, chunks=2, eval_episodes=2, progress=False, energy=False,
                    preset="none", out=str(out))

    def interrupt(chunk, metrics):
        raise KeyboardInterrupt

    with pytest.raises(RunInterrupted, match="--resume"):
        train("ppo", config, run, on_chunk=interrupt)
    monkeypatch.chdir(tmp_path)
    code, text, err = run_cli(capsys, "train", "--resume", "cut")
    assert code == 0, err
    whole = json.loads((victim_run / "summary.json").read_text())
    assert json.loads(text)["final_return_per_seed"] == whole["final_return_per_seed"]


@pytest.fixture(scope="module")
def bad_folders(act_run, tmp_path_factory):
    """Folders an act: name may wrongly point at."""
    root = tmp_path_factory.mktemp("bad")
    _make_act_run(root / "mfos", task="mfos")
    (root / "empty").mkdir()
    start_run_dir("ppo", ppo.Config(), RunConfig(out=str(root / "train")))
    for name, content in (("no-npz", None), ("bad-npz", b"not a zip")):
        shutil.copytree(act_run, root / name)
        (root / name / objectives.META_PARAMS_FILE).unlink()
        if content is not None:
            (root / name / objectives.META_PARAMS_FILE).write_bytes(content)
    return root


@pytest.mark.parametrize("argv, words", [
    (["--env", "act:{root}/nope"], ["env='act:", "no such folder"]),
    (["--env", "act:{root}/mfos"], ["env='act:", "`sparqrl meta mfos` run's folder"]),
    (["--env", "act:{root}/train"], ["env='act:", "ppo train or sweep run's folder"]),
    (["--env", "act:{root}/empty"], ["env='act:", "has no config.json"]),
    (["--env", "act:{root}/no-npz"], ["env='act:", "best_meta_params.npz not found"]),
    (["--env", "act:{root}/bad-npz"], ["env='act:", "not a readable .npz"]),
    (["--env", "act:{act}:loud"], ["env='act:", ":loud", "no other suffix than :silent"]),
    (["--env", "act:"], ["env='act:'", "act:DIR:silent"]),
    (["--load-config", "{root}/mfos"], ["--load-config=", "is a meta run's config", "act meta run's folder"]),
    (["--load-config", "{act}", "--env", "act:{act}:loud"], ["env='act:", "no other suffix"]),
])
def test_bad_act_input_is_one_line_exit_2(capsys, bad_folders, act_run, tmp_path, argv, words):
    argv = [a.format(root=bad_folders, act=act_run) for a in argv]
    code, _, err = run_cli(capsys, "train", "ppo", *argv, "--out", str(tmp_path / "x"))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sparqrl: error:"), err
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert not (tmp_path / "x").exists()


def test_load_config_of_an_act_run_for_another_algorithm(capsys, act_run, tmp_path):
    code, _, err = run_cli(capsys, "train", "dqn", "--load-config", str(act_run), "--out", str(tmp_path / "x"))
    assert code == 2 and "holds a ppo config, not dqn" in err and err.strip().count("\n") == 0, err


def test_the_python_api_records_the_name_as_the_cli_does(act_run, tmp_path, monkeypatch):
    """`sparqrl.train(..., "act:DIR")` hands the runner the resolved name (absolute folder, hash)."""
    import sparqrl
    from sparqrl import runners

    class Seen(Exception):
        pass

    def fake_train(algo, config, run, on_chunk=None):
        raise Seen(run.env)

    monkeypatch.setattr(runners, "train", fake_train)
    with pytest.raises(Seen) as seen:
        sparqrl.train("ppo", f"act:{act_run}", steps=128, out=tmp_path / "api")
    assert str(seen.value) == resolve_env_name(f"act:{act_run}") and "#sha256=" in str(seen.value)

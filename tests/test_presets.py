"""Per-environment presets: chosen by the env's name, under the user's own values, recorded by the run."""

from __future__ import annotations

import json

import pytest

import sparqrl
from sparqrl import cli, presets
from sparqrl.config import ConfigError


def test_the_envs_preset_is_the_default_and_every_flag_wins_over_it():
    run, config = cli._parse_with_preset("ppo", ["--env", "Breakout-MinAtar", "--config.lr", "1e-3",
                                                 "--set", "num_steps=32"])
    assert run.preset == "ppo-minatar"
    minatar = presets.find("ppo", "SpaceInvaders-MinAtar")
    assert config.lr == 1e-3 and config.num_steps == 32  # the user's
    assert (config.num_envs, config.num_minibatches, config.activation, config.torso) == (64, 8, "relu", "mlp")
    assert minatar.fields["num_envs"] == 64 and presets.find("ppo", "brax:ant").name == "ppo-brax"
    plain, default = cli._parse_with_preset("ppo", ["--env", "Breakout-MinAtar", "--preset", "none"])
    assert plain.preset == "none" and default == type(default)()
    other, config = cli._parse_with_preset("ppo", ["--env", "CartPole-v1"])  # no preset: the defaults
    assert other.preset == "none" and config == type(config)()
    _, config = cli._parse_with_preset("ppo", ["--env", "CartPole-v1", "--preset", "ppo-brax"])
    assert config.num_envs == 2048 and config.normalize_obs and config.normalize_reward
    assert presets.find("td3", "brax:ant") is None  # TD3's defaults are its paper's MuJoCo settings


@pytest.mark.parametrize("algo, argv, words", [
    ("ppo", ["--preset", "fast"], "preset='fast' is not allowed: must be one of auto, none, ppo-minatar"),
    ("dqn", ["--preset", "ppo-brax"], "is a preset of ppo, not of dqn"),
])
def test_a_bad_preset_is_a_one_line_error(capsys, tmp_path, algo, argv, words):
    assert cli.main(["train", algo, *argv, "--out", str(tmp_path / "run")]) == 2
    assert words in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_the_run_records_its_preset_and_says_which_values_it_took(tmp_path, capsys):
    run = sparqrl.train("ppo", "Breakout-MinAtar", steps=2 * 64 * 16, out=tmp_path / "minatar", num_steps=16,
                        chunks=1, eval_episodes=1, energy=False)
    saved = json.loads((run.path / "config.json").read_text())
    assert saved["run"]["preset"] == "ppo-minatar"
    assert "preset ppo-minatar for Breakout-MinAtar: lr=0.005, num_envs=64, num_steps=16" in capsys.readouterr().err
    assert saved["config"]["lr"] == 5e-3 and saved["config"]["num_steps"] == 16 and saved["config"]["torso"] == "mlp"
    with pytest.raises(ConfigError, match="preset"):
        sparqrl.train("ppo", "CartPole-v1", steps=512, preset="nope")


def test_ppo_learns_pendulum_with_its_preset(tmp_path):
    """The ppo-pendulum preset (sparqrl's own sweep): 300k steps reach about -180 on 4 held-out seeds
    (benchmarks/history.md, "Presets"); PPO's CartPole defaults stay near a random policy's -1200 there."""
    run = sparqrl.train("ppo", "Pendulum-v1", steps=307_200, out=tmp_path / "pendulum", chunks=2, energy=False)
    assert run.summary["final_return_mean"] > -400, run.summary["final_return_mean"]

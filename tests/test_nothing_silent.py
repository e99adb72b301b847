"""Issue 34 item 3: nothing changes silently. `--load-config` keeps the file's run settings (seeds included)
but not what a file may not choose; a prefix of a flag is an unknown flag, not the flag it begins."""

import json

import pytest

from sparqrl import cli, config as cfg
from sparqrl.meta.cli import parser as meta_parser


def best_json(tmp_path, **run):
    """A sweep's best.json layout with `run` settings."""
    path = tmp_path / "best.json"
    path.write_text(json.dumps({"algo": "ppo", "config": {"lr": 0.001}, "run": run}))
    return str(path)


def test_load_config_keeps_the_files_seeds_and_settings(tmp_path):
    path = best_json(tmp_path, env="CartPole-v1", seeds=4, seed=7, eval_episodes=3, out="runs/sweep",
                     overwrite=True, ray_address="10.0.0.1:6379", preset="ppo-pendulum")
    run, config = cli._parse("ppo", ["--out", str(tmp_path / "o")], *cli.load_config("ppo", path))
    assert (run.seeds, run.seed, run.eval_episodes, config.lr) == (4, 7, 3, 0.001)
    # the command's own: its output folder, --overwrite, where to connect; the file's config is whole
    assert (run.out, run.overwrite, run.ray_address, run.preset) == (str(tmp_path / "o"), False, None, "auto")


def test_a_flag_overrides_the_files_setting(tmp_path):
    path = best_json(tmp_path, env="CartPole-v1", seeds=4)
    run, _ = cli._parse("ppo", ["--seeds", "1"], *cli.load_config("ppo", path))
    assert run.seeds == 1


def test_a_bad_saved_setting_is_one_line_naming_it(tmp_path):
    with pytest.raises(cfg.ConfigError, match="seeds"):
        cli.load_config("ppo", best_json(tmp_path, seeds="four"))


def test_a_prefix_of_a_flag_is_an_unknown_flag_with_the_flag_named():
    with pytest.raises(cfg.ConfigError, match=r"unknown option --generation\b.*--generations"):
        meta_parser().parse_args(["hparams", "--generation", "3"])

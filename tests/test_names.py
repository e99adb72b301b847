"""Every wrong name gets the nearest right one, in one line, exit 2, before anything is compiled or written
(issue 34, item 4): unknown flags, config fields under another library's name, flags of other algorithms or
commands. In-process and cheap: every case fails while parsing."""

import dataclasses
import re

import pytest

from conftest import run_cli
from sparqrl import cli, config as cfg
from sparqrl.algos import ALGORITHMS, get_algorithm
from sparqrl.runners.run_config import RunConfig


@pytest.mark.parametrize("argv, words", [
    (["train", "ppo", "--lr", "1e-3"], ["unknown option --lr", "--set lr=1e-3", "--config.lr 1e-3"]),
    (["train", "ppo", "--learning-rate", "1e-3"], ["sparqrl calls it lr", "--set lr=1e-3"]),
    (["train", "td3", "--learning_rate=3e-4"], ["actor_lr and critic_lr", "--set actor_lr=3e-4 --set critic_lr=3e-4"]),
    (["train", "ppo", "--n-envs", "8"], ["sparqrl calls it num_envs", "--set num_envs=8"]),
    (["train", "ppo", "--num-workers", "4"], ["sparqrl calls it actors", "--actors 4"]),
    (["train", "ppo", "--config.seeds", "3"], ["use --seeds 3"]),
    (["train", "ppo", "--stepz", "100"], ["unknown option --stepz", "close matches: --steps"]),
    (["train", "ppo", "--evaluate-every", "3"], ["close matches: --eval-every"]),
    (["train", "dqn", "--objective", "dpo"], ["--objective", "ppo takes it, dqn does not"]),
    (["train", "ppo", "--config.buffer-size", "100"], ["dqn takes it, ppo does not"]),
    (["train", "ppo", "--buffer-size", "100"], ["a field of dqn's config"]),
    (["train", "ppo", "--grid", "lr=1e-4,1e-3"], ["an option of sparqrl sweep, not of sparqrl train"]),
    (["train", "ppo", "--set", "learning_rate=1e-3"], ["unknown field 'learning_rate'", "sparqrl calls it lr"]),
    (["train", "ppo", "--set", "clip_range=0.1"], ["sparqrl calls it clip_eps"]),
    (["train", "impala", "--set", "lambda=0.9"], ["sparqrl calls it vtrace_lambda"]),
    (["train", "sac", "--set", "ent_coef=0.1"], ["sparqrl calls it init_alpha"]),
    (["train", "td3", "--set", "buffer_size=1000"], ["sparqrl calls it buffer_max_size"]),
    (["train", "ppo", "--set", "buffer_size=1000"], ["a field of dqn's config, not of this algorithm's"]),
    (["train", "ppo", "--config.num_envs", "2", "--seeds", "abc"], ["--seeds", "abc"]),  # a known flag is not 'unknown'
    (["sweep", "ppo", "--gird", "lr=1e-4,1e-3"], ["unknown option --gird for sparqrl sweep ppo",
                                                  "close matches: --grid"]),
    (["sweep", "ppo", "--grid", "lr=1e-4,1e-3", "--set", "learning_rate=1"], ["sparqrl calls it lr"]),
    (["sweep", "ppo", "--grid", "learning_rate=1e-4,1e-3"], ["--grid", "sparqrl calls it lr"]),
    (["compare", "a", "b", "--outt", "c.png"], ["unknown option --outt", "close matches: --out"]),
    (["eval", "a", "--vidoe", "x.mp4"], ["close matches: --video"]),
    (["export", "a", "--formt", "onnx", "--out", "p.onnx"], ["close matches: --format"]),
])
def test_a_wrong_name_is_answered_with_the_nearest_right_one(capsys, tmp_path, argv, words):
    out = tmp_path / "run"
    if argv[0] in ("train", "sweep"):
        argv = argv + ["--out", str(out)]
    code, _, err = run_cli(capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("sparqrl: error:"), err
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert not out.exists()


def test_meta_answers_its_flags_and_fields(capsys, tmp_path):
    pytest.importorskip("evosax")
    for argv, word in ((["meta", "lpo", "--generationz", "3"], "close matches: --generations"),
                       (["meta", "hparams", "--set", "learning_rate=1e-3"], "sparqrl calls it lr")):
        code, _, err = run_cli(capsys, *argv, "--out", str(tmp_path / "x"))
        assert code == 2 and err.strip().count("\n") == 0 and word in err, err
    assert not (tmp_path / "x").exists()


def test_the_python_api_answers_another_librarys_name(tmp_path):
    import sparqrl

    with pytest.raises(cfg.ConfigError, match="learning_rate=0.001 .*sparqrl calls it lr$"):
        sparqrl.train("ppo", "CartPole-v1", steps=100, out=tmp_path / "run", learning_rate=1e-3)
    assert not (tmp_path / "run").exists()


def help_flags(text: str) -> set[str]:
    """The flags that tyro's help lists in its option lines ('│ --seeds INT', '│ --overwrite, --no-overwrite')."""
    lines = [line.strip("│ ") for line in text.splitlines()]
    return {flag for line in lines for flag in re.findall(r"(?:^|, )(--[a-z][\w.-]*)", line.removeprefix("-h, "))}


@pytest.mark.parametrize("command, algo", [("train", "ppo"), ("train", "td3"), ("sweep", "dqn")])
def test_the_flags_a_command_knows_are_those_its_help_lists(capsys, command, algo):
    with pytest.raises(SystemExit):
        cli.main([command, algo, "--help"])
    text = capsys.readouterr().out
    assert text.startswith(f"usage: sparqrl {command} {algo}")
    assert help_flags(text) == set(cli.command_flags(algo, command))


def test_sweep_help_names_sweep_and_its_own_flags(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["sweep", "ppo", "--help"])
    text = capsys.readouterr().out
    assert stop.value.code == 0 and "usage: sparqrl sweep ppo" in text and "sparqrl train" not in text
    for flag in ("--grid FIELD=V1,V2,...", "--random FIELD=log|lin:LOW:HIGH", "--samples"):
        assert flag in text


def test_every_alias_names_a_field_sparqrl_has_under_another_name():
    fields = {f.name for a in ALGORITHMS for f in dataclasses.fields(get_algorithm(a).Config)}
    fields |= {f.name for f in dataclasses.fields(RunConfig)}
    for name, ours in cfg.FIELD_ALIASES.items():
        assert ours and set(ours) <= fields, name
        assert name not in ours, name
    assert cfg.close_matches("learning_rate", ["lr", "gamma"]) == "; sparqrl calls it lr"
    assert cfg.close_matches("learning-rate", ["actor_lr", "critic_lr"]) == "; sparqrl calls it actor_lr and critic_lr"
    assert cfg.close_matches("lrr", ["lr", "gamma"]) == "; close matches: lr"  # spelling, when no alias applies
    assert cfg.close_flags("--stepz", ["--steps", "--config.ent-coef"]) == "; close matches: --steps"
    assert cfg.close_flags("--ent-coeff", ["--steps", "--config.ent-coef"]) == "; close matches: --config.ent-coef"
    assert cfg.close_flags("--bogus", ["--out", "--seeds"]) == ""

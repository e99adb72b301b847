import dataclasses

import pytest

from sparqrl import cli
from sparqrl.algos import dqn, ppo
from sparqrl.config import ConfigError, override, parse_set


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    "argv, words",
    [
        (["train", "ppo", "--steps", "-5"], ["steps", "-5", "positive"]),
        (["train", "ppo", "--steps", "0"], ["steps", "0"]),
        (["train", "ppo", "--set", "num_minibatches=3"], ["num_minibatches", "3"]),
        (["train", "a2c"], ["algo", "a2c", "ppo", "dqn"]),
        (["train", "ppo", "--set", "lrr=0.1"], ["lrr", "lr"]),
        (["train", "ppo", "--env", "CartPole-v9"], ["env", "CartPole-v9", "CartPole-v1"]),
        (["train", "dqn", "--env", "Pendulum-v1"], ["Pendulum-v1", "discrete"]),
        (["train", "ppo", "--set", "gamma=1.5"], ["gamma", "1.5"]),
        (["train", "ppo", "--set", "lr=fast"], ["lr", "fast", "float"]),
        (["train", "ppo", "--seeds", "0"], ["seeds", "0"]),
        (["eval", "/nonexistent/run"], ["DIR", "/nonexistent/run"]),
    ],
)
def test_bad_input_is_one_line_error_before_any_work(capsys, tmp_path, argv, words):
    out = tmp_path / "run"
    if argv[0] == "train":
        argv = argv + ["--out", str(out)]
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sparqrl: error:"), err
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert not out.exists()  # nothing was written (and nothing compiled: the check comes first)


@pytest.mark.parametrize("algo, module", [("ppo", ppo), ("dqn", dqn)])
def test_help_documents_every_field(capsys, algo, module):
    with pytest.raises(SystemExit) as stop:
        cli.main(["train", algo, "--help"])
    assert stop.value.code == 0
    text = capsys.readouterr().out
    for field in dataclasses.fields(module.Config):
        assert f"--config.{field.name.replace('_', '-')}" in text or f"--config.{field.name}" in text, field.name
    for flag in ("--env", "--seeds", "--out", "--steps", "--set", "--overwrite"):
        assert flag in text
    # every field's docstring reaches the help (tyro reads them from the source)
    assert "(default:" in text and text.count("(default:") >= len(dataclasses.fields(module.Config))


def test_set_overrides_convert_types():
    config = override(ppo.Config(), parse_set(["lr=1e-3", "anneal_lr=false", "hidden=32,32", "num_envs=8"]))
    assert config.lr == 1e-3 and config.anneal_lr is False and config.hidden == (32, 32) and config.num_envs == 8
    run, config = cli.apply_overrides(cli.RunConfig(), ppo.Config(), 1000, ["seeds=3", "ent_coef=0"])
    assert run.seeds == 3 and config.ent_coef == 0.0 and config.total_timesteps == 1000
    with pytest.raises(ConfigError, match="key=value"):
        parse_set(["lr"])
    with pytest.raises(ConfigError, match="num_envs"):
        override(ppo.Config(), {"num_envs": "2.5"})


def test_usage_and_unknown_command(capsys):
    assert run_cli(capsys, "--help")[0] == 0
    code, _, err = run_cli(capsys, "fly")
    assert code == 2 and "unknown command" in err

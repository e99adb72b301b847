import dataclasses
import json

import pytest

from sparqrl import cli
from sparqrl.algos import dqn, ppo
from sparqrl.config import ConfigError, override, parse_set
from sparqrl.runners.rundir import start_run_dir


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


BIG = "100000000000"


@pytest.mark.parametrize(
    "argv, words",
    [
        (["train", "ppo", "--steps", "-5"], ["steps", "-5", "positive"]),
        (["train", "ppo", "--steps", "0"], ["steps", "0"]),
        (["train", "ppo", "--steps", "1e20"], ["--steps", "1e20"]),
        (["train", "ppo", "--steps", BIG], ["total_timesteps", BIG, "32-bit"]),
        (["train", "ppo", "--set", "total_timesteps=1e20"], ["total_timesteps", "32-bit"]),
        (["train", "ppo", "--seeds", BIG], ["seeds", BIG, "32-bit"]),
        (["train", "ppo", "--seeds", "100000"], ["seeds", "100000", "65,536"]),
        (["train", "ppo", "--seeds", "abc"], ["--seeds", "abc"]),
        (["train", "ppo", "--seeds", "0"], ["seeds", "0"]),
        (["train", "ppo", "--seed", BIG], ["seed", BIG]),
        (["train", "ppo", "--set", "num_minibatches=3"], ["num_minibatches", "3"]),
        (["train", "trpo"], ["algo", "trpo", "ppo", "dqn", "a2c"]),
        (["train"], ["ALGO"]),
        (["train", "ppo", "--bogus", "3"], ["--bogus"]),
        (["train", "ppo", "--set", "lrr=0.1"], ["lrr", "lr"]),
        (["train", "ppo", "--set", "lr"], ["--set", "key=value"]),
        (["train", "ppo", "--set", "lr=inf"], ["lr", "inf", "finite"]),
        (["train", "ppo", "--set", "lr=nan"], ["lr", "nan", "finite"]),
        (["train", "ppo", "--set", "lr=-1"], ["lr", "-1"]),
        (["train", "ppo", "--set", "max_grad_norm=-inf"], ["max_grad_norm", "finite"]),
        (["train", "ppo", "--set", "lr=fast"], ["lr", "fast", "float"]),
        (["train", "ppo", "--set", "gamma=1.5"], ["gamma", "1.5"]),
        (["train", "ppo", "--set", "num_envs=2.5"], ["num_envs", "2.5"]),
        (["train", "ppo", "--env", "CartPole-v9"], ["env", "CartPole-v9", "CartPole-v1"]),
        (["train", "dqn", "--env", "Pendulum-v1"], ["Pendulum-v1", "discrete"]),
        (["train", "ppo", "--env", "gym:CartPole-v1", "--fragment-steps", "7"], ["fragment_steps=7", "num_steps"]),
        (["train", "ppo", "--chunks", "0"], ["chunks", "0"]),
        (["train", "ppo", "--eval-episodes", "-1"], ["eval_episodes", "-1"]),
        (["train", "ppo", "--eval-episodes", "100000000"], ["eval_episodes", "65,536", "side by side"]),
        (["train", "ppo", "--country", "XYZ"], ["country", "XYZ"]),
        (["train", "dqn", "--env", "gym:CartPole-v1", "--actors", "0"], ["actors", "0"]),
        (["train", "dqn", "--env", "gym:CartPole-v1", "--ray-address", "auto", "--backend", "inline"],
         ["ray_address", "ray backend"]),
        (["train", "dqn", "--seeds", "8", "--steps", "2000000000", "--set", "buffer_size=2000000000"],
             ["GiB", "buffer_size"]),  # (a buffer is capped at the run's transitions: a long run needs it)
        (["train", "ppo", "--seeds", "65536", "--set", "hidden=4096,4096"], ["GiB", "65536 seed(s)"]),
        (["eval", "/nonexistent/run"], ["DIR", "/nonexistent/run"]),
        (["eval", "/nonexistent/run", "--episodes", "many"], ["--episodes", "many"]),
        (["eval"], ["dir"]),
        (["train", "--resume", "/nonexistent/run"], ["resume", "/nonexistent/run"]),
        (["train", "--resume"], ["--resume"]),
        (["eval", "/nonexistent/run", "--seed", "1e20"], ["--seed", "1e20"]),
        (["eval", "/nonexistent/run", "--seed", str(10**30)], ["--seed", str(10**30), "32-bit"]),
        (["eval", "/nonexistent/run", "--episodes", BIG], ["--episodes", BIG, "32-bit"]),
        (["sweep", "ppo", "--random", "lr=log:1e-4:1e-3", "--samples", "0"], ["--samples", "'0'", "positive"]),
        (["sweep", "ppo", "--random", "lr=log:1e-4:1e-3", "--samples", "²"], ["--samples", "positive"]),
        (["sweep", "ppo", "--random", "lr=log:1e-4:1e-3", "--samples", BIG], ["--samples", BIG, "65,536"]),
        (["sweep", "ppo", *[f"--grid={f}=" + ",".join(map(str, range(1, 30))) for f in ("lr", "clip_eps", "ent_coef",
                                                                                       "vf_coef")]],
         ["--grid", "707,281 settings", "65,536"]),
        (["meta", "value-loss", "--steps", "0"], ["--steps", "0", "positive"]),
        (["meta", "value-loss", "--seed", str(10**30)], ["seed", "32-bit"]),
        (["meta", "value-loss", "--popsize", "100000"], ["popsize", "100000", "65,536"]),
        (["meta", "value-loss", "--popsize", "60000", "--seeds", "60000"], ["popsize=60000", "60000 seed(s)", "GiB"]),
        (["train", "dqn", "--env", "gym:CartPole-v1", "--actors", "1000000"], ["actors", "1000000", "per CPU core"]),
        (["train", "dqn", "--env", "gym:CartPole-v1", "--seeds", "1000", "--set", "num_envs=100"],
         ["num_envs", "100,000 host environments", "4,096"]),
    ],
)
def test_bad_input_is_one_line_error_before_any_work(capsys, tmp_path, argv, words):
    out = tmp_path / "run"
    if argv[0] in ("train", "sweep", "meta") and "--resume" not in argv:
        argv = argv + ["--out", str(out)]
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sparqrl: error:"), err
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert not out.exists()  # nothing was written (and nothing compiled: the check comes first)


def one_line_error(capsys, *argv) -> str:
    code, _, err = run_cli(capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("sparqrl: error:"), err
    return lines[0]


@pytest.mark.parametrize("name, words", [
    ("\udcff", ["out=", "UTF-8"]),  # how Python passes the byte 0xff of a command line
    ("a" * 256, ["out=", "256 bytes", "255"]),
])
@pytest.mark.parametrize("command", [["train", "ppo"], ["meta", "value-loss"]])
def test_an_out_path_the_os_cannot_hold_is_refused_before_anything_is_written(capsys, tmp_path, command, name, words):
    line = one_line_error(capsys, *command, "--out", str(tmp_path / name / "run"))
    assert all(word in line for word in words), line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("section, field, value, words", [
    ("config", "lr", "abc", ["lr='abc'", "a number"]),
    ("run", "env", 5, ["env=5", "a string"]),
    ("run", "imports", "x", ["imports='x'", "a list"]),  # was split into the modules 'x' (characters)
    ("config", "hidden", [64.5], ["hidden=64.5", "an integer"]),
    ("config", "lrr", 0.1, ["lrr", "not a field", "lr"]),
])
def test_load_config_values_of_the_wrong_type_are_one_line(capsys, tmp_path, section, field, value, words):
    data = {"algo": "ppo", "config": {}, "run": {}}
    data[section][field] = value
    file = tmp_path / "best.json"
    file.write_text(json.dumps(data))
    line = one_line_error(capsys, "train", "ppo", "--load-config", str(file), "--out", str(tmp_path / "run"))
    assert all(word in line for word in [str(file), *words]), line
    assert not (tmp_path / "run").exists()


DAMAGE = {
    "truncated": lambda text: text[: len(text) // 2],
    "not an object": lambda text: "[1, 2]",
    "missing run": lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "run"}),
    "lr a string": lambda text: json.dumps({**json.loads(text), "config": {"lr": "abc"}}),
    "run a string": lambda text: json.dumps({**json.loads(text), "run": "x"}),
    "seeds a string": lambda text: json.dumps({**json.loads(text), "run": {"seeds": "2"}}),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_config_json_is_one_line_for_every_reader(capsys, tmp_path, unstarted_run, damage):
    config = unstarted_run / "config.json"
    config.write_text(DAMAGE[damage](config.read_text()))
    before = {p.name: p.read_bytes() for p in unstarted_run.iterdir() if p.is_file()}
    for argv in (["eval", str(unstarted_run)], ["train", "--resume", str(unstarted_run)],
                 ["export", str(unstarted_run), "--format", "onnx", "--precision", "fp32", "--out",
                  str(tmp_path / "p.onnx")], ["compare", str(unstarted_run), "--out", str(tmp_path / "c.png")]):
        one_line_error(capsys, *argv)
    assert {p.name: p.read_bytes() for p in unstarted_run.iterdir() if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


@pytest.fixture
def unstarted_run(tmp_path):
    """A PPO run folder as a run interrupted during compilation leaves it: manifest and config.json."""
    run = cli.RunConfig(out=str(tmp_path / "run"), chunks=2, progress=False, energy=False)
    start_run_dir("ppo", ppo.Config(total_timesteps=2 * 512), run)
    return tmp_path / "run"


@pytest.mark.parametrize(
    "extra, words",
    [
        (["dqn"], ["ALGO", "dqn", "trains ppo"]),
        (["--steps", "-5"], ["steps", "-5"]),
        (["--seeds", "3"], ["seeds=3", "saved: 1"]),
        (["--set", "lr=0.1", "--chunks", "7"], ["lr=0.1", "chunks=7"]),
        (["--out", "elsewhere"], ["out='elsewhere'"]),
    ],
)
def test_resume_rejects_flags_that_contradict_the_run(capsys, unstarted_run, extra, words):
    before = {p.name: p.read_bytes() for p in unstarted_run.iterdir() if p.is_file()}
    argv = ["train", *extra[:1], "--resume", str(unstarted_run), *extra[1:]] if extra[0] == "dqn" else \
        ["train", "--resume", str(unstarted_run), *extra]
    code, _, err = run_cli(capsys, *argv)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sparqrl: error:"), err
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert {p.name: p.read_bytes() for p in unstarted_run.iterdir() if p.is_file()} == before


def test_out_holding_other_files_is_refused_even_with_overwrite(capsys, tmp_path):
    """The data-loss bug: `--overwrite` on a folder of the user's deleted it whole."""
    out = tmp_path / "x"
    out.mkdir()
    (out / "thesis.txt").write_text("important")
    code, _, err = run_cli(capsys, "train", "ppo", "--steps", "100000000000000000000", "--out", str(out), "--overwrite")
    assert code == 2 and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(capsys, "train", "ppo", "--out", str(out), "--overwrite")
    assert code == 2 and "not a sparqrl run" in err
    assert [p.name for p in out.iterdir()] == ["thesis.txt"] and (out / "thesis.txt").read_text() == "important"


def test_a_newer_run_format_says_why_it_cannot_load(capsys, unstarted_run):
    manifest = unstarted_run / "sparqrl-run.json"
    manifest.write_text(json.dumps({"format": 99, "files": ["config.json"]}))
    code, _, err = run_cli(capsys, "train", "--resume", str(unstarted_run))
    assert code == 2 and "format 99" in err and "upgrade" in err


def test_a_format0_run_is_recognised_and_overwritten_by_its_files_only(capsys, unstarted_run):
    """Runs written before manifests (format 0): recognised by config.json, and only its own files go."""
    (unstarted_run / "sparqrl-run.json").unlink()
    (unstarted_run / "mine.txt").write_text("keep")
    code, _, err = run_cli(capsys, "train", "ppo", "--out", str(unstarted_run))
    assert code == 2 and "--overwrite" in err
    run = cli.RunConfig(out=str(unstarted_run), overwrite=True)
    start_run_dir("ppo", ppo.Config(), run)
    assert sorted(p.name for p in unstarted_run.iterdir()) == ["config.json", "mine.txt", "sparqrl-run.json",
                                                               "sparqrl-run.lock"]


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
    import sparqrl

    assert run_cli(capsys, "--version")[:2] == (0, f"sparqrl {sparqrl.__version__}\n")
    for command in ("train", "sweep"):
        code, out, _ = run_cli(capsys, command, "--help")
        assert code == 0 and "ppo, dqn, td3, sac" in out and f"sparqrl {command} ALGO --help" in out


def test_a_closed_output_pipe_is_not_a_traceback():
    """`sparqrl train ppo --help | head -1`: the reader leaves early; exit 141 (SIGPIPE's), nothing on stderr."""
    import subprocess
    import sys

    program = "import sys; sys.argv = ['sparqrl', 'train', 'ppo', '--help']; from sparqrl.entry import main; main()"
    proc = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait() == 141 and err == b"", err[-2000:]


def test_a_damaged_manifest_never_reaches_outside_the_run_folder(tmp_path, unstarted_run):
    outside = tmp_path / "precious.txt"
    outside.write_text("keep")
    manifest = unstarted_run / "sparqrl-run.json"
    manifest.write_text(json.dumps({"format": 1, "files": ["config.json", str(outside), "../precious.txt"]}))
    start_run_dir("ppo", ppo.Config(), cli.RunConfig(out=str(unstarted_run), overwrite=True))
    assert outside.read_text() == "keep"

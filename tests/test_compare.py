"""`sparqrl compare`: curves and table of train runs and a sweep, checked against each run's own files."""

from __future__ import annotations

import csv
import json
import re
import shutil
from collections import defaultdict

import numpy as np
import pytest

import sparqrl
from sparqrl import cli
from sparqrl.compare import compare, format_table, load_rows, plot_curves, title_of
from sparqrl.config import ConfigError

# Tiny PPO runs of one program: the train runs' 4 seeds and the sweep's 2 settings x 2 seeds are 4 members
# with traced learning rates, so the later runs load the first one's traced program. eval_every=2 logs the
# train runs' evaluation return at chunks 2 and 4; the sweep evaluates only at its end.
TINY = dict(steps=4 * 512, chunks=4, num_steps=32, energy=False, eval_episodes=2, hidden=(16, 16))
LRS = (1e-4, 1e-3)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    a = sparqrl.train("ppo", "CartPole-v1", seeds=4, out=root / "a", lr=1e-3, eval_every=2, **TINY).path
    b = sparqrl.train("ppo", "CartPole-v1", seeds=4, out=root / "b", lr=3e-4, eval_every=2, **TINY).path
    sweep = root / "sweep"
    code = cli.main(["sweep", "ppo", "--env", "CartPole-v1", "--steps", str(TINY["steps"]), "--seeds", "2",
                     "--grid", "lr=" + ",".join(map(str, LRS)), "--chunks", "4", "--eval-episodes", "2",
                     "--no-energy", "--no-progress", "--config.num-steps", "32", "--config.hidden", "16", "16",
                     "--out", str(sweep)])
    assert code == 0
    return a, b, sweep


def csv_curves(path, metric, seeds_per_curve):
    """{curve index: (steps, mean, std)} of `metric` in metrics.csv, members grouped `seeds_per_curve` at a time,
    read with the csv module (the reference for compare's curves)."""
    values = defaultdict(lambda: defaultdict(list))
    with (path / "metrics.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            if row[metric]:
                values[int(row["seed"]) // seeds_per_curve][int(row["env_step"])].append(float(row[metric]))
    return {c: (sorted(by_step), [np.mean(by_step[s]) for s in sorted(by_step)],
                [np.std(by_step[s]) for s in sorted(by_step)]) for c, by_step in values.items()}


def test_table_values_are_each_runs_summary(runs):
    a, b, _ = runs
    rows = load_rows([a, b])
    assert [r.label for r in rows] == ["a", "b"]
    for row, path in zip(rows, (a, b)):
        summary = json.loads((path / "summary.json").read_text())
        assert (row.algo, row.env, row.seeds, row.setting) == ("ppo", "CartPole-v1", 4, None)
        assert row.return_mean == summary["final_return_mean"] and row.return_std == summary["final_return_std"]
        assert row.env_steps_per_s == summary["env_steps_per_s"] and row.wall_time_s == summary["wall_time_s"]
        assert row.energy_kwh is None  # energy=False
        # both runs evaluated at two chunks: the evaluation curve, equal to the CSV's per-step mean and std
        assert row.curve.metric == "eval_return"
        steps, mean, std = csv_curves(path, "eval_return", 4)[0]
        assert list(row.curve.steps) == steps == [1024, 2048]
        np.testing.assert_allclose(row.curve.mean, mean, rtol=1e-6)
        np.testing.assert_allclose(row.curve.std, std, rtol=1e-6, atol=1e-9)
    lines = format_table(rows).splitlines()
    assert lines[0].split()[:4] == ["run", "algo", "env", "seeds"] and len(lines) == 4
    summary = json.loads((a / "summary.json").read_text())
    assert re.search(rf"^a +ppo +CartPole-v1 +4 +{summary['final_return_mean']:.1f} ± "
                     rf"{summary['final_return_std']:.1f} +{summary['env_steps_per_s']:,.0f} +[\d.]+ s +-$", lines[2])


def test_the_cli_writes_a_picture_and_prints_the_table(runs, tmp_path, capsys):
    out = tmp_path / "compare.png"
    out.write_bytes(b"an older picture")  # a file the user named is replaced, as plotting tools do
    assert cli.main(["compare", *map(str, runs), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "a: " not in printed and "sweep: lr=0.0001" in printed and "whole sweep's" in printed
    assert f"curves (training episode return): {out}" in printed  # the sweep logged no evaluation curve
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = pytest.importorskip("matplotlib.image").imread(out)
    assert pixels.shape[0] > 300 and pixels.shape[1] > 500
    assert np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0).shape[0] > 50  # curves, bands, text
    assert [p.name for p in tmp_path.iterdir()] == ["compare.png"]  # no temporary file left behind


@pytest.mark.parametrize("name, magic", [("compare.pdf", b"%PDF"), ("compare.svg", b"<?xml")])
def test_the_picture_is_written_in_the_format_its_name_says(runs, tmp_path, capsys, name, magic):
    out = tmp_path / name
    assert cli.main(["compare", *map(str, runs), "--out", str(out)]) == 0
    assert out.read_bytes()[:len(magic)] == magic


def test_a_sweep_is_one_curve_per_setting(runs):
    a, _, sweep = runs
    rows = load_rows([a, sweep])
    setting_rows = rows[1:]
    assert [r.setting for r in setting_rows] == [{"lr": lr} for lr in LRS]
    assert [r.label for r in setting_rows] == ["sweep: lr=0.0001", "sweep: lr=0.001"]
    with (sweep / "sweep.csv").open(newline="") as f:
        table = list(csv.DictReader(f))
    for row, line in zip(setting_rows, table):
        assert row.seeds == int(line["seeds"]) == 2
        assert row.return_mean == pytest.approx(float(line["return_mean"]))
        assert row.return_std == pytest.approx(float(line["return_std"]))
    # the sweep has only its final evaluation: every curve, the train run's too, is the training return
    assert {r.curve.metric for r in rows} == {"episode_return"}
    reference = csv_curves(sweep, "episode_return", 2)
    assert len(reference) == 2
    for s, row in enumerate(setting_rows):
        np.testing.assert_allclose(row.curve.mean, reference[s][1], rtol=1e-6)
        np.testing.assert_allclose(row.curve.std, reference[s][2], rtol=1e-6, atol=1e-9)
    assert not np.allclose(setting_rows[0].curve.mean, setting_rows[1].curve.mean)
    plt = pytest.importorskip("matplotlib.pyplot")
    fig, ax = plt.subplots()
    plot_curves(ax, rows)
    assert [line.get_label() for line in ax.get_lines()] == [r.label for r in rows]
    plt.close(fig)


def test_other_environments_energy_equal_names_and_unfinished_runs(runs, tmp_path):
    a, b, _ = runs
    other = shutil.copytree(b, tmp_path / "other" / "a")  # same folder name as run a, another environment
    for name in ("config.json", "summary.json"):
        data = json.loads((other / name).read_text())
        data["run" if name == "config.json" else "env"] = ({**data["run"], "env": "Acrobot-v1"}
                                                           if name == "config.json" else "Acrobot-v1")
        if name == "summary.json":
            data["energy_kwh"] = 0.00123
        (other / name).write_text(json.dumps(data))
    unfinished = shutil.copytree(a, tmp_path / "cut")
    (unfinished / "summary.json").unlink()
    rows = compare([a, other, unfinished])
    assert [r.label for r in rows] == [f"{a.parent.name}/a", "other/a", "cut (unfinished)"]
    assert "different environments: CartPole-v1, Acrobot-v1" in title_of(rows)
    table = format_table(rows).splitlines()
    assert table[3].split()[-1] == "0.00123" and table[2].split()[-1] == "-"
    assert table[4].split()[-4:] == ["-"] * 4 and rows[2].curve.metric == "eval_return"
    plt = pytest.importorskip("matplotlib.pyplot")
    fig, ax = plt.subplots()
    plot_curves(ax, rows)
    assert ax.get_lines()[1].get_label() == "other/a (Acrobot-v1)"
    plt.close(fig)


def _meta_like(path):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"meta": {"task": "lpo"}, "inner": {"algo": "ppo"}}))
    return path


def _no_metrics(path, source):
    shutil.copytree(source, path)
    (path / "summary.json").unlink()
    (path / "metrics.csv").unlink()
    return path


@pytest.mark.parametrize("case, message", [
    ("none", "the following arguments are required: DIR"),
    ("missing", r"DIR='.*nowhere' is not allowed: .*no such folder"),
    ("user folder", r"DIR='.*mine' is not allowed: .*no sparqrl run there"),
    ("meta", r"DIR='.*meta' is not allowed: is a meta run's folder: its own plots are fitness.png and learned.png"),
    ("no metrics", r"DIR='.*early' is not allowed: is a run still in progress .*no metrics"),
    ("twice", r"DIR='.*' is not allowed: is given twice"),
    ("out folder", r"--out='.*' is not allowed: is a folder"),
    ("out format", r"--out='.*compare.csv' is not allowed: must end in an image format's extension: .*\.png"),
    ("out parent", r"--out='.*' is not allowed: cannot be written: its folder .* does not exist"),
])
def test_bad_input_is_a_one_line_error_and_writes_nothing(runs, tmp_path, capsys, case, message):
    a = str(runs[0])
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("a user's folder")
    out = str(tmp_path / "compare.png")
    argv = {
        "none": ["--out", out],
        "missing": [str(tmp_path / "nowhere"), "--out", out],
        "user folder": [a, str(tmp_path / "mine"), "--out", out],
        "meta": [a, str(_meta_like(tmp_path / "meta")), "--out", out],
        "no metrics": [str(_no_metrics(tmp_path / "early", runs[0])), "--out", out],
        "twice": [a, a, "--out", out],
        "out folder": [a, "--out", str(tmp_path / "mine")],
        "out format": [a, "--out", str(tmp_path / "compare.csv")],
        "out parent": [a, "--out", str(tmp_path / "not" / "there.png")],
    }[case]
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert cli.main(["compare", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("sparqrl: error: "), err
    assert re.search(message, err), err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    if case == "none":
        with pytest.raises(ConfigError, match="at least one run"):
            compare([])

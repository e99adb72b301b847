"""What README.md and docs/ say a run does, checked on the run (issue 34 item 1): the commands themselves run in
tests/test_documented_commands.py; these check statements about their behaviour."""

from __future__ import annotations

import csv
import re
import tomllib
from pathlib import Path

import numpy as np
import pytest

from sparqrl import cli
from sparqrl.algos import ALGORITHMS, get_algorithm

ROOT = Path(__file__).resolve().parents[1]

QUIET = ["--no-progress", "--no-energy"]


def test_a_host_run_prints_the_preset_it_applied(tmp_path, capsys):
    """README "Presets", docs/environments.md: "The command prints the values it took from the preset" holds for
    `gym:` runs too (the actor-learner runner), with the user's own values shown where they won. Atari ids resolve
    to their preset (`auto`), so they take this path."""
    assert cli._parse_with_preset("ppo", ["--env", "gym:ALE/Breakout-v5"])[0].preset == "ppo-atari"
    out = tmp_path / "run"
    assert cli.main(["train", "ppo", "--env", "gym:CartPole-v1", "--preset", "ppo-pendulum", "--steps", "64",
                     "--set", "num_envs=2", "--set", "num_steps=16", "--set", "num_minibatches=2",
                     "--set", "update_epochs=1", "--chunks", "1", "--eval-episodes", "1", "--out", str(out),
                     *QUIET]) == 0
    err = capsys.readouterr().err
    assert "sparqrl: preset ppo-pendulum for gym:CartPole-v1: lr=0.0003, num_envs=2, num_steps=16" in err, err


def test_a_sweeps_metrics_csv_has_a_row_per_member_and_tensorboard_their_mean(tmp_path):
    """README "Hyperparameters are inputs", docs/compiled-training.md "Sweeps": metrics.csv has one row per member
    per chunk (its `seed` column the member, s x seeds + k); TensorBoard has one series per metric, the mean over
    every member of every setting."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "sweep"
    assert cli.main(["sweep", "ppo", "--env", "CartPole-v1", "--grid", "lr=1e-4,1e-2", "--seeds", "2",
                     "--steps", "256", "--set", "num_envs=4", "--set", "num_steps=32", "--chunks", "2",
                     "--eval-every", "0", "--eval-episodes", "1", "--out", str(out), *QUIET]) == 0
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    steps = sorted({int(r["env_step"]) for r in rows})
    assert len(steps) == 2 and [int(r["seed"]) for r in rows] == [0, 1, 2, 3] * 2
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    assert [tag for tag in events.Tags()["scalars"] if "member" in tag or "seed" in tag] == []
    points = events.Scalars("train/total_loss")
    assert [p.step for p in points] == steps
    means = [np.mean([float(r["total_loss"]) for r in rows if int(r["env_step"]) == s]) for s in steps]
    np.testing.assert_allclose([p.value for p in points], means, rtol=1e-5)
    per_setting = [np.mean([float(r["total_loss"]) for r in rows if int(r["env_step"]) == steps[-1]
                            and int(r["seed"]) // 2 == s]) for s in range(2)]
    assert per_setting[0] != pytest.approx(per_setting[1])  # the mean mixes two different settings


def _table_rows(path: Path, header: str) -> list[list[str]]:
    """The cells of the Markdown table whose header line starts with `header` in `path`."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def test_the_traced_fields_table_is_config_traced():
    """docs/compiled-training.md's table of traced fields lists every algorithm's `Config.TRACED`, in order."""
    table = {row[0].lower(): re.findall(r"`(\w+)`", row[1])
             for row in _table_rows(ROOT / "docs" / "compiled-training.md", "| algorithm | traced fields |")}
    assert table == {name: list(get_algorithm(name).Config.TRACED) for name in ALGORITHMS}


def test_the_extras_tables_list_every_extra():
    """README's and docs/index.md's extras tables name every extra of pyproject.toml (`all`: "all of the above")."""
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    for doc, header in (("README.md", "| extra | adds |"), ("docs/index.md", "| extra | what it adds |")):
        named = {name for row in _table_rows(ROOT / doc, header) for name in re.findall(r"`([\w-]+)`", row[0])}
        assert named == extras, (doc, sorted(extras - named), sorted(named - extras))


def test_the_readme_layout_names_paths_that_exist():
    """README's Layout table points inside the repository, at paths that exist (it once pointed at a design file
    outside it), and names every package of sparqrl/."""
    rows = _table_rows(ROOT / "README.md", "| path | what it holds |")
    paths = {path for row in rows for path in re.findall(r"`([\w./-]+/[\w./-]*)`", row[0])}
    assert paths and not [path for path in paths if ".." in path or not (ROOT / path).exists()]
    packages = {f"sparqrl/{p.parent.name}/" for p in (ROOT / "sparqrl").glob("*/__init__.py")}
    assert packages <= paths, sorted(packages - paths)

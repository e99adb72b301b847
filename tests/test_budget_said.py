"""A budget the run rounds to whole updates is said in one line at the start and recorded as both asked and
run (issue 34, item 3): `--steps 700` of 128-step updates runs 640."""

import json

from conftest import run_cli


def test_a_rounded_budget_is_said_once_and_recorded_as_asked_and_run(capsys, tmp_path):
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "ppo", "--env", "CartPole-v1", "--steps", "700", "--set", "num_envs=2",
                           "--set", "num_steps=64", "--set", "hidden=8", "--set", "update_epochs=1", "--set",
                           "num_minibatches=1", "--chunks", "1", "--eval-episodes", "1", "--no-progress",
                           "--no-energy", "--out", str(out))
    assert code == 0, err
    said = [line for line in err.splitlines() if "env steps asked" in line]
    assert said == ["sparqrl: 700 env steps asked; 640 run per seed: whole updates of 128 env steps each "
                    "(rounded down)"], err
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["steps"], summary["steps_asked"]) == (640, 700)

"""Several devices in one process (issue 35 item 5): a meta run's population and a sweep's settings x seeds split
over 2 forced CPU devices, through the `sparqrl` command under a timeout (a hang fails, never waits), end where
the one-device run ends: each member's random streams do not depend on the layout, and at these shapes neither
does the float rounding (docs/compiled-training.md, "Reproducibility", says where it may)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from bounded_runs import run_bounded

TINY_PPO = ["--set", "num_envs=4", "--set", "num_steps=16", "--set", "num_minibatches=1", "--set", "update_epochs=1",
            "--set", "hidden=16,16", "--steps", "128", "--no-progress", "--no-energy"]


def rows(path: Path, drop: tuple[str, ...] = ()) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return [{k: v for k, v in row.items() if k not in drop} for row in csv.DictReader(f)]


def test_meta_population_over_two_devices_equals_one_device(tmp_path):
    argv = ["meta", "hparams", "--fields", "lr,clip_eps", "--popsize", "4", "--seeds", "1", "--generations", "2",
            *TINY_PPO]
    one, two = (run_bounded(argv, tmp_path / f"d{d}", d) for d in (1, 2))
    assert (one["devices_used"], two["devices_used"]) == (1, 2)
    fitness = [rows(tmp_path / f"d{d}" / "fitness.csv", drop=("wall_time_s",)) for d in (1, 2)]
    assert len(fitness[0]) == 2 and fitness[0] == fitness[1]  # every member's fitness, hence the strategy's state
    with np.load(tmp_path / "d1" / "best_meta_params.npz") as a, np.load(tmp_path / "d2" / "best_meta_params.npz") as b:
        assert sorted(a.files) == sorted(b.files) and all(np.array_equal(a[k], b[k]) for k in a.files)


def test_sweep_settings_over_two_devices_equal_one_device(tmp_path):
    argv = ["sweep", "ppo", "--grid", "lr=1e-3,3e-4", "--seeds", "1", "--chunks", "1", "--eval-episodes", "2",
            *TINY_PPO]
    one, two = (run_bounded(argv, tmp_path / f"d{d}", d) for d in (1, 2))
    assert (one["devices_used"], two["devices_used"]) == (1, 2)
    assert (tmp_path / "d1" / "sweep.csv").read_text() == (tmp_path / "d2" / "sweep.csv").read_text()
    assert one["final_return_per_seed"] == two["final_return_per_seed"]

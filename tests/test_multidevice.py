"""Several devices in one process (issue 35 item 5): a meta run's population and a sweep's settings x seeds split
over 2 forced CPU devices, through the `sparqrl` command under a timeout (a hang fails, never waits), end where
the one-device run ends: each member's random streams do not depend on the layout, and at these shapes neither
does the float rounding (docs/compiled-training.md, "Reproducibility", says where it may)."""

from __future__ import annotations

import csv
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

TIMEOUT_S = 240  # a run here takes 10-40 s on a loaded 2-core machine; a hang is forever
TINY_PPO = ["--set", "num_envs=4", "--set", "num_steps=16", "--set", "num_minibatches=1", "--set", "update_epochs=1",
            "--set", "hidden=16,16", "--steps", "128", "--no-progress", "--no-energy"]


def run_on(devices: int, argv: list[str], out: Path) -> dict:
    """`sparqrl ARGV --out OUT` on `devices` forced CPU devices: its summary.json; fails if it does not exit 0
    within TIMEOUT_S, killing it and anything it started."""
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}
    command = [str(Path(sys.executable).with_name("sparqrl")), *argv, "--out", str(out)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        _, err = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"`sparqrl {shlex.join(argv)}` on {devices} devices hung: no exit within {TIMEOUT_S} s")
    assert process.returncode == 0 and "Traceback" not in err, err[-3000:]
    return json.loads((out / "summary.json").read_text())


def rows(path: Path, drop: tuple[str, ...] = ()) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return [{k: v for k, v in row.items() if k not in drop} for row in csv.DictReader(f)]


def test_meta_population_over_two_devices_equals_one_device(tmp_path):
    argv = ["meta", "hparams", "--fields", "lr,clip_eps", "--popsize", "4", "--seeds", "1", "--generations", "2",
            *TINY_PPO]
    one, two = (run_on(d, argv, tmp_path / f"d{d}") for d in (1, 2))
    assert (one["devices_used"], two["devices_used"]) == (1, 2)
    fitness = [rows(tmp_path / f"d{d}" / "fitness.csv", drop=("wall_time_s",)) for d in (1, 2)]
    assert len(fitness[0]) == 2 and fitness[0] == fitness[1]  # every member's fitness, hence the strategy's state
    with np.load(tmp_path / "d1" / "best_meta_params.npz") as a, np.load(tmp_path / "d2" / "best_meta_params.npz") as b:
        assert sorted(a.files) == sorted(b.files) and all(np.array_equal(a[k], b[k]) for k in a.files)


def test_sweep_settings_over_two_devices_equal_one_device(tmp_path):
    argv = ["sweep", "ppo", "--grid", "lr=1e-3,3e-4", "--seeds", "1", "--chunks", "1", "--eval-episodes", "2",
            *TINY_PPO]
    one, two = (run_on(d, argv, tmp_path / f"d{d}") for d in (1, 2))
    assert (one["devices_used"], two["devices_used"]) == (1, 2)
    assert (tmp_path / "d1" / "sweep.csv").read_text() == (tmp_path / "d2" / "sweep.csv").read_text()
    assert one["final_return_per_seed"] == two["final_return_per_seed"]

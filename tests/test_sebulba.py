"""The actor-learner runner on host Gymnasium environments (gym:NAME)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from bounded_runs import descendants, wait_bounded
from conftest import RAY_SERIAL, alive

from sparqrl.algos import ppo, td3
from sparqrl.config import ConfigError
from sparqrl.runners import RunConfig, evaluate_saved, resume, train

SMALL = dict(total_timesteps=600, learning_starts=200, batch_size=32, hidden=(32, 32), buffer_min_size=64,
             buffer_check_interval=100, buffer_num_oldest=32, topology_interval=50)


@pytest.fixture(scope="module")
def sparse_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("seb") / "run"
    config = td3.Config(sparse="rlx2", actor_sparsity=0.9, critic_sparsity=0.8, **SMALL)
    # Sparse and quantized compose: the rlx2 actor (90 % of its weights pruned) acts in int8.
    run = RunConfig(env="gym:Pendulum-v1", seeds=2, out=str(out), chunks=3, eval_every=0, eval_episodes=2,
                    progress=False, actor_precision="int8", fragment_steps=4, publish_every=3)
    return out, train("td3", config, run)


def test_summary_and_logs(sparse_run):
    out, summary = sparse_run
    assert summary["runner"] == "sebulba" and summary["actors"] == 1 and summary["seeds"] == 2
    assert summary["steps"] == 600 and len(summary["final_return_per_seed"]) == 2
    assert summary["actor_steps_per_s"] > 0 and summary["learner_updates_per_s"] > 0
    assert summary["backend"] == "inline" and summary["actor_precision"] == "int8"
    # 150 fragments of 4 steps; a version every 3 updates (plus the first); inline: no policy lag beyond
    # the second request in flight, and versions never go back.
    assert summary["versions_published"] == 1 + 150 // 3 and summary["version_order_violations"] == 0
    assert 0 < summary["broadcast_bytes"] and summary["policy_lag_mean"] <= 3
    assert summary["energy_kwh"] > 0 and summary["co2_kg"] > 0 and summary["energy_country"] == "USA"
    assert summary["sparse"] == "rlx2" and summary["actor_sparsity"] == pytest.approx(0.9, abs=2e-3)
    assert 0 < summary["size_ratio"] < 0.25 and summary["infer_flops_ratio"] == pytest.approx(0.1, abs=2e-3)
    assert json.loads((out / "summary.json").read_text()) == summary
    config = json.loads((out / "config.json").read_text())["config"]
    assert (config["nstep"], config["dynamic_buffer"], config["critic_sparsity"]) == (3, True, 0.8)
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert [int(r["chunk"]) for r in rows] == [1, 1, 2, 2, 3, 3] and int(rows[-1]["env_step"]) == 600
    # The learner ran one gradient step per env step after the warm-up, on sparse networks.
    assert float(rows[-1]["critic_loss"]) > 0 and float(rows[-1]["actor_sparsity"]) == pytest.approx(0.9, abs=2e-3)
    assert float(rows[-1]["nstep"]) == 3.0
    assert (out / "returns.png").exists()


def test_eval_and_resume_of_a_finished_run_reproduce_the_final_evaluation(sparse_run):
    out, summary = sparse_run
    evaluated = evaluate_saved(out)
    np.testing.assert_allclose(evaluated["return_per_seed"], summary["final_return_per_seed"], rtol=1e-5)
    again = resume(out)
    np.testing.assert_allclose(again["final_return_per_seed"], summary["final_return_per_seed"], rtol=1e-5)


def test_bad_host_settings_are_errors_before_anything_is_written(tmp_path):
    with pytest.raises(ConfigError, match=r"torso='cnn' is not allowed: must be one of auto, mlp"):
        train("ppo", ppo.Config(torso="cnn"), RunConfig(env="gym:ALE/Breakout-v5", out=str(tmp_path / "x")))
    with pytest.raises(ConfigError, match=r"actor_sparsity=None .*must be given for env 'gym:Pendulum-v1'"):
        train("td3", td3.Config(sparse="rigl", **SMALL), RunConfig(env="gym:Pendulum-v1", out=str(tmp_path / "y")))
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()  # nothing written


def test_the_learner_s_state_is_fetched_only_where_a_checkpoint_needs_it(tmp_path, monkeypatch):
    """The driver asks the learner for its whole state (a remote learner's, `--learner-resources`, moves between
    processes with its replay buffer) only to write a checkpoint, here the last chunk's alone, not at each chunk's
    end; an evaluation asks for the policy params alone, as each published version does."""
    from sparqrl.runners.learner import Learner

    calls = {"current": 0, "policy_params": 0}
    for name in calls:
        def counted(self, name=name, method=getattr(Learner, name)):
            calls[name] += 1
            return method(self)

        monkeypatch.setattr(Learner, name, counted)
    run = RunConfig(env="gym:Pendulum-v1", out=str(tmp_path / "run"), chunks=4, checkpoint_every=1,
                    checkpoint_interval_s=3600.0, eval_every=2, eval_episodes=1, progress=False, energy=False,
                    fragment_steps=4)
    summary = train("td3", td3.Config(**SMALL), run)
    assert len(list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))) == 4
    assert calls == {"current": 1, "policy_params": 2 + summary["versions_published"]}, (calls, summary)


def test_ctrl_c_saves_the_learner_where_it_stopped_and_resume_finishes(tmp_path):
    """A real SIGINT: exit 130 and a checkpoint; `--resume` finishes with every chunk logged once."""
    out = tmp_path / "run"
    sets = [f"--set={k}={v}" for k, v in {**SMALL, "total_timesteps": 3000, "hidden": "32,32"}.items()]
    cmd = [sys.executable, "-m", "sparqrl.cli", "train", "td3", "--env", "gym:Pendulum-v1", "--out", str(out),
           "--chunks", "30", "--checkpoint-every", "1000", "--eval-every", "0", "--eval-episodes", "1",
           "--no-progress", *sets]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.csv"
    deadline = time.time() + 300
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 4):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "--resume" in err and any((out / "checkpoint").iterdir()) and not (out / "summary.json").exists()
    done = subprocess.run([sys.executable, "-m", "sparqrl.cli", "train", "--resume", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3000
    rows = list(csv.DictReader(metrics.open()))
    assert [int(r["chunk"]) for r in rows] == list(range(1, 31))
    assert int(rows[-1]["env_step"]) == 3000


@RAY_SERIAL
def test_ctrl_c_with_ray_actors_ends_every_process_the_run_started(tmp_path):
    """Two Ray actors: a terminal's Ctrl-C (SIGINT to the process group: the driver, the local Ray instance's
    processes and the actor workers, which Ray starts with SIGINT blocked) leaves one line, a resumable checkpoint
    and no process behind."""
    out = tmp_path / "run"
    sets = [f"--set={k}={v}" for k, v in {**SMALL, "total_timesteps": 40000, "hidden": "32,32"}.items()]
    cmd = [sys.executable, "-m", "sparqrl.cli", "train", "td3", "--env", "gym:Pendulum-v1", "--out", str(out),
           "--actors", "2", "--chunks", "400", "--checkpoint-every", "1000", "--eval-every", "0",
           "--eval-episodes", "1", "--no-progress", *sets]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    metrics = out / "metrics.csv"
    deadline = time.time() + 300
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 3):
        time.sleep(0.2)
    started = descendants(proc.pid)
    assert len(started) >= 3, started  # Ray's own processes and two actor workers
    os.killpg(proc.pid, signal.SIGINT)
    err = wait_bounded(proc, "the interrupted run", 120)
    assert proc.returncode == 130, err[-2000:]
    assert "--resume" in err and "Traceback" not in err and any((out / "checkpoint").iterdir()), err[-2000:]
    deadline = time.time() + 30
    while time.time() < deadline and any(alive(pid) for pid in started):
        time.sleep(0.2)
    assert not [pid for pid in started if alive(pid)]
    assert json.loads((out / "config.json").read_text())["run"]["actors"] == 2

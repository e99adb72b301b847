"""Ctrl-C and SIGTERM always stop a host run with Ray actors (the "no command hangs" rule): a signal sent while Ray
starts (~20 s on a loaded 2-core machine) once cleared or killed the run (`ray.init` takes SIGTERM over, and the run's
flag took that for a new run from Python: it ran on to the end of its budget), and a terminal's Ctrl-C reaches the
whole process group, the actors with the driver."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from bounded_runs import descendants, wait_bounded
from conftest import RAY_SERIAL, alive

# IMPALA on gym:CartPole-v1 with two Ray actors, small enough that a run a signal failed to stop ends (exit 0) in
# seconds, which the tests then report as the failure it is.
RUN = ["train", "impala", "--env", "gym:CartPole-v1", "--actors", "2", "--set", "num_envs=4", "--set", "num_steps=16",
       "--eval-every", "0", "--eval-episodes", "1", "--checkpoint-every", "1000", "--no-progress", "--no-energy"]
EXIT_S = 120  # generous on a loaded CI machine: a stopped run exits within seconds; a lost signal runs on to its end

# `sparqrl ARGV...` whose process signals itself (argv[1]) as Ray's driver connects: inside `ray.init`, after the
# head node and the driver's start would have installed Ray's SIGTERM handlers, a moment as deterministic as it gets.
SIGNAL_WHILE_RAY_STARTS = """
import os, signal, sys
from sparqrl import signals
signals.install()  # as the `sparqrl` command does first
import ray._private.worker as worker
connect = worker.connect
def connect_after_a_signal(*args, **kwargs):
    os.kill(os.getpid(), getattr(signal, sys.argv[1]))
    return connect(*args, **kwargs)
worker.connect = connect_after_a_signal
from sparqrl.cli import main
sys.exit(main(sys.argv[2:]))
"""


@RAY_SERIAL
def test_sigterm_while_ray_starts_stops_the_run(tmp_path):
    """Before: exit 15 (Ray's handler), and a Ctrl-C there was cleared, so the run went on to its end (exit 0). One
    signal suffices: with Ray's handlers kept out, the run's flag takes either the same way."""
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", SIGNAL_WHILE_RAY_STARTS, "SIGTERM", *RUN, "--steps", "20000",
                             "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    err = wait_bounded(proc, "the signalled run", EXIT_S)
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted before the first checkpoint" in err and "Traceback" not in err, err[-3000:]
    assert not (out / "summary.json").exists()


@RAY_SERIAL
def test_ctrl_c_to_the_process_group_stops_a_ray_run_with_a_checkpoint(tmp_path):
    """A terminal's Ctrl-C: SIGINT to the driver, Ray's processes and the actors at once (Ray's start them with SIGINT
    blocked), after a logged chunk. One line, exit 130, a checkpoint, and no process of the run left."""
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "sparqrl.cli", *RUN, "--steps", "2000000", "--chunks", "2000",
                             "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    metrics, deadline = out / "metrics.csv", time.time() + 600
    while proc.poll() is None and time.time() < deadline and not (metrics.exists() and
                                                                  metrics.read_text().count("\n") >= 2):
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    started = descendants(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)
    err = wait_bounded(proc, "the signalled run", EXIT_S)
    assert proc.returncode == 130, err[-3000:]
    assert "checkpoint saved; continue with" in err and "Traceback" not in err, err[-3000:]
    assert any((out / "checkpoint").iterdir()) and not (out / "summary.json").exists()
    deadline = time.time() + 60
    while time.time() < deadline and any(alive(pid) for pid in started):
        time.sleep(0.2)
    assert not [pid for pid in started if alive(pid)]

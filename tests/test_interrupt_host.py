"""Ctrl-C and SIGTERM always stop a host run with Ray actors (the "no command hangs" rule), also one sent while Ray
starts (~20 s on a loaded 2-core machine): it once cleared or killed the run (`ray.init` takes SIGTERM over, and the
run's flag took that for a new run from Python: it ran on to the end of its budget). A terminal's Ctrl-C to the
process group after a logged chunk: tests/test_sebulba.py."""

from __future__ import annotations

import signal
import subprocess
import sys

from bounded_runs import wait_bounded
from conftest import RAY_SERIAL

from sparqrl import signals

# IMPALA on gym:CartPole-v1 with two Ray actors, small enough that a run a signal failed to stop ends (exit 0) in
# seconds, which the test then reports as the failure it is.
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



def test_ray_start_keeps_the_run_s_handlers():
    """What `ray_session` wraps Ray's start in: Ray's SIGTERM setter does nothing there, and a handler set there
    another way is put back after it (`signals.kept`)."""
    import ray._private.utils as ray_utils

    from sparqrl.runners.actors import _signals_kept

    before, setter = {sig: signal.getsignal(sig) for sig in signals.SIGNALS}, ray_utils.set_sigterm_handler
    try:
        with _signals_kept():
            ray_utils.set_sigterm_handler(lambda signum, frame: None)
            assert signal.getsignal(signal.SIGTERM) is before[signal.SIGTERM]
            signal.signal(signal.SIGINT, lambda signum, frame: None)
        assert {sig: signal.getsignal(sig) for sig in signals.SIGNALS} == before
        assert ray_utils.set_sigterm_handler is setter
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)

"""Failure paths of a run, as a hostile user or a bad day would cause them (issue 10).

Each kind of stop is proved here: SIGKILL and SIGINT at seeded moments (during compilation, between
chunks, inside a checkpoint write) resume to a metrics.csv identical to an uninterrupted run; damaged
checkpoints are passed over; full and read-only disks (injected through the writers: tests run as root,
where chmod cannot make a folder unwritable) end in one line with a resumable folder; non-finite
training stops with one line and a finite checkpoint.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from sparqrl import cli
from sparqrl.runners.checkpoint import Checkpointer, first_non_finite
from sparqrl.runners.session import _Session

# 20 PPO updates of 512 env steps in 10 chunks, a checkpoint every 2: the run every fault test cuts.
RUN = ["train", "ppo", "--steps", str(20 * 512), "--chunks", "10", "--checkpoint-every", "2", "--checkpoint-interval-s", "0",
       "--eval-every", "5",
       "--eval-episodes", "2", "--seeds", "2", "--no-progress", "--no-energy"]

# Every run compared with another is a fresh process (in-process results could differ in the last digit
# from a worker's earlier tests).
# A child process running the CLI as the `sparqrl` command does (the signal flag first). With "slow"
# it pauses 0.3 s after logging each chunk, so that a signal sent once k chunks are logged lands in
# chunk k + 1 however fast the machine (the whole run takes well under a second after compiling). With
# "finalize N" it SIGKILLs itself inside its Nth checkpoint write: the data is written, the checkpoint
# not yet renamed into place.
DRIVER = """
import os, signal, sys, time
from sparqrl import signals
signals.install()
if sys.argv[1] == "slow":
    from sparqrl.telemetry import logger
    log = logger.RunLogger.log
    def slow_log(self, *a, **k):
        log(self, *a, **k)
        time.sleep(0.3)
    logger.RunLogger.log = slow_log
if sys.argv[1] in ("fail-metrics", "fail-checkpoint"):  # the 3rd write of that writer fails with errno N
    from sparqrl.runners.checkpoint import Checkpointer
    from sparqrl.telemetry.logger import RunLogger
    cls, name = (RunLogger, "log") if sys.argv[1] == "fail-metrics" else (Checkpointer, "save")
    original, calls = getattr(cls, name), {"n": 0}
    def failing(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            code = int(sys.argv[2])
            raise OSError(code, os.strerror(code), "injected")
        return original(self, *a, **k)
    setattr(cls, name, failing)
if sys.argv[1] == "fail-tensorstore":  # the 3rd checkpoint write fails inside orbax as tensorstore reports a full disk
    import orbax.checkpoint as ocp
    manager_save, saves = ocp.CheckpointManager.save, {"n": 0}
    def full_disk(self, *a, **k):
        saves["n"] += 1
        if saves["n"] == 3:
            code = int(sys.argv[2])
            raise ValueError('RESOURCE_EXHAUSTED: Error writing local file "checkpoint/8/_sharding": Failed to write '
                             f"5691 bytes to file 15: {os.strerror(code)} [os_error_code='{code}']")
        return manager_save(self, *a, **k)
    ocp.CheckpointManager.save = full_disk
if sys.argv[1] == "finalize":
    from orbax.checkpoint._src.path import atomicity
    calls = {"n": 0}
    for cls in (atomicity.AtomicRenameTemporaryPath, atomicity.CommitFileTemporaryPath):
        original = cls.finalize
        async def finalize(self, *a, _original=original, **k):
            calls["n"] += 1
            if calls["n"] == int(sys.argv[2]):
                os.kill(os.getpid(), signal.SIGKILL)
            return await _original(self, *a, **k)
        cls.finalize = finalize
from sparqrl.cli import main
from sparqrl.entry import exit_with
exit_with(main(sys.argv[3:]))
"""


def rows(out: Path) -> list[list[str]]:
    """Every metric of every chunk and seed, wall time left out."""
    lines = (out / "metrics.csv").read_text().strip().splitlines()
    return [line.split(",")[:3] + line.split(",")[4:] for line in lines]


def start(out: Path, mode: str = "-", arg: str = "0") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", DRIVER, mode, arg, *RUN, "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def resume(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", DRIVER, "-", "0", "train", "--resume", str(out)],
                          capture_output=True, text=True, timeout=600)


def wait_for(condition, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None and not condition():
        time.sleep(0.05)
    assert proc.poll() is None, f"the run ended before the moment to cut it: {proc.communicate()[1][-2000:]}"


def logged_chunks(out: Path) -> int:
    try:
        return max(0, (out / "metrics.csv").read_text().count("\n") - 1) // 2
    except FileNotFoundError:
        return 0


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("faults") / "whole"
    proc = subprocess.run([sys.executable, "-m", "sparqrl.cli", *RUN, "--out", str(out)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


# The seeded moments: (signal, when). "compile": config.json written, no chunk logged yet;
# ("chunk", k): after k chunks are logged; ("finalize", n): inside the nth checkpoint write.
_rng = random.Random(10)
MOMENTS = [
    ("SIGKILL", "compile", None),
    ("SIGINT", "compile", None),
    ("SIGKILL", "chunk", _rng.randint(3, 8)),
    ("SIGINT", "chunk", _rng.randint(3, 8)),
    ("SIGKILL", "finalize", _rng.randint(2, 4)),
    ("SIGHUP", "chunk", 4),  # a closed terminal: as SIGTERM and Ctrl-C, with exit status 129
]


@pytest.mark.parametrize("sig, when, k", MOMENTS)
def test_killed_run_resumes_to_the_uninterrupted_metrics(tmp_path, whole, sig, when, k):
    out = tmp_path / "run"
    if when == "finalize":
        proc = start(out, "finalize", str(k))
        proc.wait(timeout=600)
    else:
        proc = start(out, "slow")
        if when == "compile":
            wait_for(lambda: (out / "config.json").exists(), proc)
        else:
            wait_for(lambda: logged_chunks(out) >= k, proc)
        proc.send_signal(getattr(signal, sig))
        proc.wait(timeout=600)
    err = proc.stderr.read()
    if sig in ("SIGINT", "SIGHUP"):
        assert proc.returncode == (130 if sig == "SIGINT" else 128 + signal.SIGHUP), err[-2000:]
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "--resume" in lines[0] and "Traceback" not in err, err
    else:
        assert proc.returncode == -signal.SIGKILL
    assert not (out / "summary.json").exists()
    done = resume(out)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert rows(out) == rows(whole)
    summary, expected = (json.loads((d / "summary.json").read_text()) for d in (out, whole))
    assert summary["final_return_per_seed"] == expected["final_return_per_seed"]


def test_damaged_checkpoints_are_passed_over_then_reported(tmp_path, whole):
    """A truncated data file and bad metadata in the newest checkpoint: the older one is used, the run
    ends identical. With no intact checkpoint, a one-line error that says how to start over."""
    steps = sorted(int(p.name) for p in (whole / "checkpoint").iterdir() if p.name.isdigit())
    assert len(steps) == 2
    for damage in ("truncate", "metadata"):
        out = tmp_path / damage
        shutil.copytree(whole, out)
        (out / "summary.json").unlink()  # as if killed just after the last checkpoint
        newest = out / "checkpoint" / str(steps[-1])
        if damage == "truncate":
            for data in (newest / "state").rglob("d/*"):
                data.write_bytes(data.read_bytes()[:10])
        else:
            (newest / "meta" / "metadata").write_text("{not json")
        done = resume(out)
        assert done.returncode == 0, done.stderr[-2000:]
        err = done.stderr
        assert f"checkpoint at update {steps[-1]} is damaged" in err and f"update {steps[0]}" in err, err
        assert "Traceback" not in err
        assert rows(out) == rows(whole)

    out = tmp_path / "none"
    shutil.copytree(whole, out)
    (out / "summary.json").unlink()
    for data in (out / "checkpoint").rglob("d/*"):
        data.write_bytes(b"\0" * 5)
    done = resume(out)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no intact checkpoint" in lines[0] and "--resume" in lines[0], lines
    assert (out / "metrics.csv").exists() and (out / "config.json").exists()  # nothing deleted


@pytest.mark.parametrize("writer, code", [(writer, code) for writer in ("metrics", "checkpoint")
                                          for code in (errno.ENOSPC, errno.EROFS)] + [("tensorstore", errno.ENOSPC)])
def test_failed_writes_end_in_one_line_and_a_resumable_folder(tmp_path, whole, code, writer):
    """The disk fills (or turns read-only) in the middle of the run (the third write of the metrics or
    checkpoint writer fails; "tensorstore": inside orbax, with no OSError but tensorstore's words):
    one line, exit 1, and `--resume` (once the disk has room) ends identical to the uninterrupted run."""
    out = tmp_path / "run"
    proc = start(out, f"fail-{writer}", str(code))
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 1, err[-2000:]
    lines = err.strip().splitlines()
    reason = "the disk is full" if code == errno.ENOSPC else "read-only"
    assert len(lines) == 1 and reason in lines[0] and f"--resume {out}" in lines[0], lines
    done = resume(out)
    assert done.returncode == 0, done.stderr[-2000:]
    assert rows(out) == rows(whole)


def test_out_that_cannot_hold_a_run_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    a_file = tmp_path / "file.txt"
    a_file.write_text("mine")
    cases = {
        "is a file": a_file,
        "cannot be made": a_file / "run",
    }
    for words, out in cases.items():
        assert cli.main([*RUN, "--out", str(out)]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and words in lines[0], lines
    assert a_file.read_text() == "mine"
    # a read-only file system and a full disk, as the checks see them (root passes chmod)
    monkeypatch.setattr(os, "access", lambda *a, **k: False)
    assert cli.main([*RUN, "--out", str(tmp_path / "ro")]) == 2
    assert "read-only" in capsys.readouterr().err
    monkeypatch.undo()
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(100, 100, 0))
    assert cli.main([*RUN, "--out", str(tmp_path / "full")]) == 2
    assert "full disk" in capsys.readouterr().err
    assert not (tmp_path / "ro").exists() and not (tmp_path / "full").exists()


def test_diverged_training_stops_with_one_line(tmp_path, capsys):
    """lr=1e30 overflows the network at once: exit 1, one line naming the chunk and metric."""
    out = tmp_path / "nan"
    assert cli.main([*RUN, "--out", str(out), "--set", "lr=1e30"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "diverged in chunk 1 (updates 1-2)" in lines[0] and " is nan" in lines[0], lines
    assert not (out / "summary.json").exists()


def test_diverged_sweep_names_the_setting(tmp_path, capsys):
    """In a sweep the line names the diverged setting and seed, not a member index."""
    out = tmp_path / "nan-sweep"
    assert cli.main(["sweep", *RUN[1:], "--out", str(out), "--grid", "lr=1e-3,1e30"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and " is nan for lr=1e+30 seed 0" in lines[0] and "lr=0.001" not in lines[0], lines


def test_divergence_after_checkpoints_keeps_the_last_finite_one(tmp_path, monkeypatch, capsys):
    """A state that turns non-finite after two checkpoints: the run stops naming the leaf, and the
    checkpoints left are finite."""
    out = tmp_path / "late"
    original = _Session._save_checked

    def poisoned(self, chunk, state):
        if chunk >= 5:
            import jax
            state = jax.tree.map(lambda x: x * np.nan if np.issubdtype(x.dtype, np.floating) else x, state)
        return original(self, chunk, state)

    monkeypatch.setattr(_Session, "_save_checked", poisoned)
    assert cli.main([*RUN, "--out", str(out)]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "diverged in chunk 6" in lines[0] and "is not finite" in lines[0], lines
    assert "last finite checkpoint (4,096 env steps per seed)" in lines[0], lines
    checkpointer = Checkpointer(out / "checkpoint")
    try:
        assert checkpointer.steps() == [8, 4]
        from sparqrl.runners.anakin import load_state
        assert first_non_finite(load_state(out)[-1]) is None
    finally:
        checkpointer.close()


def test_checkpoints_of_another_state_layout_say_so(tmp_path):
    """A checkpoint that reads but holds another state than this version builds (a folder made by an older
    sparqrl) is not called damaged: the error says which array differs. Damaged data stays damaged."""
    import jax
    import jax.numpy as jnp

    from sparqrl.runners.checkpoint import DamagedCheckpoints, IncompatibleCheckpoints

    state = {"learner": {"w": jnp.ones((2, 3))}, "obs": jnp.zeros(4)}
    Checkpointer(tmp_path / "c").save(1, state, {})
    spec = lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)  # noqa: E731
    with pytest.raises(IncompatibleCheckpoints, match="lacks 'learner.v'"):
        Checkpointer(tmp_path / "c", read_only=True).restore_intact(spec({**state, "learner": {"v": jnp.ones((2, 3))}}))
    with pytest.raises(IncompatibleCheckpoints, match=r"'learner.w': \(2, 3\), expected \(2, 4\)"):
        Checkpointer(tmp_path / "c", read_only=True).restore_intact(spec({**state, "learner": {"w": jnp.ones((2, 4))}}))
    assert Checkpointer(tmp_path / "c", read_only=True).restore_intact(spec(state)).step == 1
    for data in (tmp_path / "c").rglob("d/*"):
        data.write_bytes(b"\0" * 5)
    with pytest.raises(DamagedCheckpoints):
        Checkpointer(tmp_path / "c", read_only=True).restore_intact(spec(state))

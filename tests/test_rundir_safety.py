"""A run folder is data (issue 30, items 2, 4 and 5): nothing outside it is written, deleted or followed
through a link; readers (eval, export, compare, load) change nothing in it; one writer at a time.

Every link test plants a link to a victim outside the folder and checks the victim byte for byte after
the command: the command must refuse in one line and leave the victim, and the folder, as they were.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

import sparqrl
from sparqrl.algos import ppo
from sparqrl.runfiles import LinkRefused, open_nofollow, write_atomic
from sparqrl.runners import RunConfig, train
from sparqrl.runners.checkpoint import Checkpointer
from sparqrl.runners.rundir import LOCK, MANIFEST, RunDir, _remove

VICTIM = b"a file of the user's, outside the run folder\n"


def make_victims(root: Path) -> tuple[Path, Path]:
    """A file and a folder (with a file and a subfolder) outside any run folder."""
    (root / "victim-dir" / "sub").mkdir(parents=True)
    (root / "victim-dir" / "a.txt").write_bytes(VICTIM)
    (root / "victim-dir" / "sub" / "b.txt").write_bytes(VICTIM)
    (root / "victim.txt").write_bytes(VICTIM)
    return root / "victim.txt", root / "victim-dir"


def tree(path: Path, skip: tuple[str, ...] = ()) -> dict[str, object]:
    """Every entry under `path` (links not followed): its bytes, its link target or 'dir', and its mtime."""
    found: dict[str, object] = {}
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            entry = Path(root) / name
            rel = str(entry.relative_to(path))
            if rel in skip:
                continue
            info = entry.lstat()
            content = (os.readlink(entry) if entry.is_symlink() else "dir" if entry.is_dir() else entry.read_bytes())
            found[rel] = (content, info.st_mtime_ns)
    if not skip:  # (a lock file made where there was none changes the folder's own mtime)
        found["."] = path.stat().st_mtime_ns
    return found


def victims_intact(victim: Path, victim_dir: Path) -> None:
    assert victim.read_bytes() == VICTIM
    assert sorted(str(p.relative_to(victim_dir)) for p in victim_dir.rglob("*")) == ["a.txt", "sub", "sub/b.txt"]
    assert (victim_dir / "a.txt").read_bytes() == VICTIM and (victim_dir / "sub" / "b.txt").read_bytes() == VICTIM


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A small finished PPO run with two checkpoints."""
    out = tmp_path_factory.mktemp("safety") / "run"
    train("ppo", ppo.Config(total_timesteps=4 * 512), RunConfig(
        env="CartPole-v1", out=str(out), chunks=4, checkpoint_every=1, checkpoint_interval_s=0.0, eval_every=0,
        eval_episodes=2, progress=False, energy=False))
    return out


@pytest.fixture
def stopped(finished, tmp_path) -> Path:
    """A copy of the run, as if stopped after its last checkpoint (resumable)."""
    out = tmp_path / "run"
    shutil.copytree(finished, out, symlinks=True)
    (out / "summary.json").unlink()
    return out


def test_own_writes_never_follow_a_link(tmp_path):
    victim, victim_dir = make_victims(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "returns.png").symlink_to(victim)
    with pytest.raises(OSError):
        open_nofollow(run / "returns.png", "a")
    (run / ".summary.json.tmp").symlink_to(victim)  # a planted temporary file of write_atomic
    write_atomic(run / "summary.json", "{}")
    write_atomic(run / "returns.png", b"png")  # the link itself is replaced, never its target
    assert not (run / "returns.png").is_symlink() and (run / "returns.png").read_bytes() == b"png"
    rundir = RunDir(run, [])
    for name, target in (("metrics.csv", victim), ("tensorboard", victim_dir)):
        (run / name).symlink_to(target)
        with pytest.raises(LinkRefused, match=name):
            rundir.claim(name)
    (run / "checkpoint").mkdir()
    (run / "checkpoint" / "1").symlink_to(victim_dir)
    with pytest.raises(LinkRefused, match="checkpoint/1"):
        rundir.claim("checkpoint")
    os.link(victim, run / "emissions.csv")  # a hard link: appending would change the victim too
    with pytest.raises(LinkRefused, match="hard link"):
        rundir.claim("emissions.csv")
    assert not (run / MANIFEST).exists()  # nothing claimed
    for name in ("tensorboard", "checkpoint", "metrics.csv"):
        _remove(run / name)
    victims_intact(victim, victim_dir)


@pytest.mark.parametrize("cpus", [2, 8])
def test_orbax_never_deletes_a_step_that_is_a_link(tmp_path, monkeypatch, cpus):
    """orbax deletes old steps with a thread pool on machines of 4 cores or more (its PathDeleter: half the
    cores), with one rmtree below that; a step that is a link is refused before either runs."""
    from etils import epath
    from orbax.checkpoint._src.path import deleter

    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    assert (deleter.PathDeleter(epath.Path(tmp_path))._parallel_deleter is not None) == (cpus >= 4)
    victim, victim_dir = make_victims(tmp_path)
    checkpointer = Checkpointer(tmp_path / "run" / "checkpoint")
    state = {"w": np.ones(3, np.float32)}
    try:
        for step in (1, 2):
            checkpointer.save(step, state, {})
        shutil.rmtree(tmp_path / "run" / "checkpoint" / "1")
        (tmp_path / "run" / "checkpoint" / "1").symlink_to(victim_dir)
        with pytest.raises(LinkRefused, match="checkpoint/1"):
            checkpointer.save(3, state, {})  # max_to_keep=2: orbax would delete step 1
        with pytest.raises(LinkRefused, match="checkpoint/1"):
            checkpointer.steps()
    finally:
        checkpointer.close()
    victims_intact(victim, victim_dir)


@pytest.mark.parametrize("avenue", ["checkpoint-step", "returns.png", "tensorboard", "metrics.csv"])
def test_resume_refuses_a_folder_holding_a_link(stopped, tmp_path, capsys, avenue):
    victim, victim_dir = make_victims(tmp_path)
    steps = sorted((stopped / "checkpoint").iterdir(), key=lambda p: int(p.name))
    link, target = {"checkpoint-step": (steps[0], victim_dir),
                    "returns.png": (stopped / "returns.png", Path("../victim.txt")),
                    "tensorboard": (stopped / "tensorboard", victim_dir),
                    "metrics.csv": (stopped / "metrics.csv", victim)}[avenue]
    if link.is_dir():
        shutil.rmtree(link)
    else:
        link.unlink()
    link.symlink_to(target)
    before = tree(stopped, skip=(LOCK,))
    code, _, err = run_cli(capsys, "train", "--resume", str(stopped))
    assert code == 2 and len(err.strip().splitlines()) == 1 and str(link) in err and "symbolic link" in err, err
    assert tree(stopped, skip=(LOCK,)) == before
    victims_intact(victim, victim_dir)


def test_overwrite_refuses_an_unlisted_link(finished, tmp_path, capsys):
    """An entry the manifest does not list is the user's: --overwrite neither keeps writing through it
    nor deletes it; it refuses before deleting the old run."""
    victim, victim_dir = make_victims(tmp_path)
    out = tmp_path / "run"
    shutil.copytree(finished, out, symlinks=True)
    files = json.loads((out / MANIFEST).read_text())["files"]
    (out / "returns.png").unlink()
    (out / MANIFEST).write_text(json.dumps({"format": 1, "files": [f for f in files if f != "returns.png"]}))
    (out / "returns.png").symlink_to("../victim.txt")
    before = tree(out, skip=(LOCK,))
    code, _, err = run_cli(capsys, "train", "ppo", "--steps", "512", "--no-progress", "--no-energy", "--out", str(out),
                           "--overwrite")
    assert code == 2 and "returns.png" in err and "symbolic link" in err, err
    assert tree(out, skip=(LOCK,)) == before
    victims_intact(victim, victim_dir)


@pytest.mark.parametrize("name", ["fitness.csv", "checkpoint.npz", "fitness.png", "best_meta_params.npz",
                                  "tensorboard"])
def test_meta_resume_refuses_a_folder_holding_a_link(tmp_path, capsys, name):
    victim, victim_dir = make_victims(tmp_path)
    out = tmp_path / "meta"
    out.mkdir()
    (out / MANIFEST).write_text(json.dumps({"format": 1, "files": ["config.json", "fitness.csv", "checkpoint.npz"]}))
    (out / "config.json").write_text(json.dumps({"meta": {"task": "value-loss", "generations": 2, "popsize": 4},
                                                 "inner": {"algo": "ppo", "config": {}}}))
    (out / name).symlink_to(victim_dir if name == "tensorboard" else victim)
    before = tree(out, skip=(LOCK,))
    code, _, err = run_cli(capsys, "meta", "--resume", str(out))
    assert code == 2 and name in err and "symbolic link" in err, err
    assert tree(out, skip=(LOCK,)) == before
    victims_intact(victim, victim_dir)


def test_readers_change_nothing_and_pass_a_damaged_checkpoint_over(stopped, tmp_path, capsys):
    """eval, export, compare and sparqrl.load: the newest checkpoint, damaged, is passed over and kept;
    no file or folder is created, changed or deleted (mtimes included)."""
    newest = max((stopped / "checkpoint").iterdir(), key=lambda p: int(p.name))
    for data in (newest / "state").rglob("d/*"):
        data.write_bytes(data.read_bytes()[:10])
    before = tree(stopped)
    code, _, err = run_cli(capsys, "eval", str(stopped), "--episodes", "1")
    assert code == 0 and f"update {newest.name} is damaged" in err, err
    assert run_cli(capsys, "export", str(stopped), "--out", str(tmp_path / "policy.onnx"))[0] == 0
    assert run_cli(capsys, "compare", str(stopped), "--out", str(tmp_path / "compare.png"))[0] == 0
    sparqrl.load(stopped)
    assert tree(stopped) == before


LIVE = ["train", "ppo", "--steps", str(4000 * 512), "--chunks", "4000", "--checkpoint-every", "1",
        "--checkpoint-interval-s", "0", "--eval-every", "0", "--no-progress", "--no-energy"]


def start_cli(*argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sparqrl.cli", *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def test_one_writer_per_folder_while_readers_read(tmp_path, capsys):
    """A run that trains holds its folder: --resume and --overwrite of it fail at once in one line naming
    its PID and change nothing; eval reads its newest complete checkpoint meanwhile; kill -9 leaves no lock."""
    out = tmp_path / "live"
    proc = start_cli(*LIVE, "--out", str(out))
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None and not any(
                p.name.isdigit() for p in (out / "checkpoint").glob("*")):
            time.sleep(0.1)
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        config = (out / "config.json").read_bytes()
        for argv in (["train", "--resume", str(out)], [*LIVE, "--out", str(out), "--overwrite"]):
            start = time.time()
            code, _, err = run_cli(capsys, *argv)
            assert code == 2 and f"PID {proc.pid}" in err and len(err.strip().splitlines()) == 1, err
            assert time.time() - start < 30
        assert (out / "config.json").read_bytes() == config
        code, _, err = run_cli(capsys, "eval", str(out), "--episodes", "1")
        assert code == 0, err
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    rundir = RunDir(out, json.loads((out / MANIFEST).read_text())["files"])
    rundir.lock()  # the kernel released the dead writer's lock
    rundir.release()


def test_two_starts_at_once_one_writes(tmp_path):
    out = tmp_path / "both"
    # (--overwrite: the later one must not stop at "already holds a run" once the first wrote config.json)
    procs = [start_cli(*LIVE, "--seed", str(seed), "--out", str(out), "--overwrite") for seed in (0, 1)]
    try:
        deadline = time.time() + 300
        while time.time() < deadline and all(p.poll() is None for p in procs):
            time.sleep(0.1)
        loser = next(p for p in procs if p.poll() is not None)
        winner = next(p for p in procs if p is not loser)
        err = loser.stderr.read()
        assert loser.returncode == 2 and f"PID {winner.pid}" in err and len(err.strip().splitlines()) == 1, err
        assert winner.poll() is None
        saved = json.loads((out / "config.json").read_text())["run"]["seed"]
        assert saved == procs.index(winner)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait()

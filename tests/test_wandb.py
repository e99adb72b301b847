"""`--wandb PROJECT`: W&B gets TensorBoard's scalars, config.json, summary.json and the run's files, offline (no
network), inside the run folder, and a resumed run goes on with the same W&B run id. What W&B wrote is read back
from its own offline files: the .wandb transaction log (LevelDB's log format) of wandb's protobuf records."""

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli
from sparqrl.algos import ppo
from sparqrl.cli import loadable_run
from sparqrl.runners import RunConfig, RunInterrupted, train
from sparqrl.telemetry.logger import read_metrics

BLOCK, HEADER = 32768, 7  # LevelDB log blocks; W&B's file header (":W&B", magic, version) and each record's
FULL, LAST = 1, 4  # record kinds that end a message (FIRST = 2 and MIDDLE = 3 continue it)


def wandb_records(path: Path) -> list:
    """The protobuf records of a .wandb file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pos, message = [], HEADER, b""
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if length == 0 and kind == 0:
            pos += BLOCK - pos % BLOCK
            continue
        message += data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(message)
            records.append(record)
            message = b""
    return records


def of_kind(records: list, kind: str) -> list:
    return [getattr(r, kind) for r in records if r.WhichOneof("record_type") == kind]


def items(entries) -> dict:
    """W&B's key/value_json items (config updates, history rows, summary updates) as a dict."""
    return {e.key or "/".join(e.nested_key): json.loads(e.value_json) for e in entries}


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """No network, W&B's own caches under tmp_path, and the working directory that must stay without ./wandb."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("CACHE", "DATA", "CONFIG"):
        monkeypatch.setenv(f"WANDB_{name}_DIR", str(tmp_path / name.lower()))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def test_an_offline_run_and_its_resume_log_what_tensorboard_gets(tmp_path, offline, capsys):
    out = tmp_path / "run"
    run = RunConfig(out=str(out), seeds=2, chunks=4, checkpoint_every=1, checkpoint_interval_s=0.0, eval_every=2,
                    eval_episodes=2, progress=False, energy=False, wandb="sparqrl-test")

    def stop_at_2(done, metrics):
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(RunInterrupted):
        train("ppo", ppo.Config(total_timesteps=4 * 512), run, on_chunk=stop_at_2)
    # a folder that says online (someone else's) never uploads unless the resuming command says so
    saved = (out / "config.json").read_text()
    (out / "config.json").write_text(saved.replace('"wandb_mode": "offline"', '"wandb_mode": "online"'))
    capsys.readouterr()  # the first session's lines
    code, _, err = run_cli(capsys, "train", "--resume", str(out))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"wandb_mode='online' in {out / 'config.json'}" in err and "add --wandb-mode online" in err
    (out / "config.json").write_text(saved)
    code, stdout, err = run_cli(capsys, "train", "--resume", str(out))
    assert code == 0, err
    assert "W&B run" in err and "resumed, offline" in err and f"wandb sync {out / 'wandb'}" in err

    run_id = (out / "wandb" / "sparqrl-run-id").read_text().strip()
    files = sorted((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert [f.name for f in files] == [f"run-{run_id}.wandb"] * 2  # one W&B run, a folder per session
    sessions = [wandb_records(f) for f in files]
    config = json.loads((out / "config.json").read_text())
    for records in sessions:
        (start,) = of_kind(records, "run")
        assert start.run_id == run_id and start.project == "sparqrl-test"
        assert {k: v for k, v in items(start.config.update).items() if k != "_wandb"} == config
    assert [of_kind(r, "exit")[0].exit_code for r in sessions] == [1, 0]  # interrupted, then finished

    # every chunk's scalars, at its env step: the mean over seeds of metrics.csv (its 6 significant digits)
    rows = [items(h.item) for records in sessions for h in of_kind(records, "history")]
    history = {row["_step"]: row for row in rows}
    assert len(history) == len(rows)  # each step logged once (the resume goes on after the checkpoint)
    metrics = read_metrics(out / "metrics.csv")
    assert sorted(history) == metrics["env_step"].tolist()
    for i, step in enumerate(metrics["env_step"].tolist()):
        expected = {f"{'eval' if k.startswith('eval') else 'train'}/{k}": float(np.nanmean(v[i]))
                    for k, v in metrics.items() if v.ndim == 2 and not np.all(np.isnan(v[i]))}
        logged = {k: v for k, v in history[step].items() if not k.startswith("_")}
        assert logged.keys() == expected.keys() and ("eval/eval_return" in logged) == (i % 2 == 1)
        assert logged == pytest.approx(expected, rel=1e-5)

    summary = json.loads((out / "summary.json").read_text())
    logged_summary = {}
    for update in of_kind(sessions[1], "summary"):
        logged_summary.update(items(update.update))
    assert {k: logged_summary[k] for k in summary} == summary
    (artifact,) = of_kind(sessions[1], "artifact")
    assert {c.path for c in artifact.manifest.contents} == {"config.json", "metrics.csv", "summary.json", "returns.png"}
    assert not of_kind(sessions[0], "artifact")

    # W&B's folder is the run's own, holding no link; nothing in the working directory
    assert not any(Path(root, name).is_symlink() for root, dirs, names in os.walk(out) for name in dirs + names)
    assert list(offline.iterdir()) == []
    assert "wandb" in json.loads((out / "sparqrl-run.json").read_text())["files"]


def test_without_the_wandb_package_it_is_one_line_before_anything_is_written(tmp_path, capsys, monkeypatch):
    import sparqrl.extras

    monkeypatch.setattr(sparqrl.extras, "available", lambda module: module != "wandb")
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "ppo", "--wandb", "proj", "--out", str(out), "--no-progress")
    assert code == 2 and not out.exists()
    assert err.strip() == ("sparqrl: error: --wandb needs wandb, which is not installed: pip install 'sparqrl[wandb]' "
                           "(or 'sparqrl[all]')")


@pytest.mark.parametrize("argv, words", [
    (["--wandb", "team/proj"], "wandb='team/proj' is not allowed: must not contain '/'"),
    (["--wandb", ""], "wandb='' is not allowed: must be a W&B project name"),
    (["--wandb", "proj", "--wandb-mode", "cloud"], "--wandb-mode"),
    (["--track"], "unknown option --track for sparqrl train ppo; sparqrl calls it wandb; use --wandb"),  # CleanRL's
    (["--wandb-project-name", "proj"], "use --wandb proj"),
])
def test_bad_wandb_flags_are_one_line(tmp_path, capsys, argv, words):
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "ppo", *argv, "--out", str(out))
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1 and not out.exists()


def test_a_loaded_config_never_chooses_to_upload():
    assert loadable_run({"wandb": "proj", "wandb_mode": "online", "seeds": 4}) == {"wandb": "proj", "seeds": 4}


def test_a_resumed_folder_uploads_only_when_the_command_names_online():
    """`require_trusted` on a folder whose run logs to W&B online: refused unless the command says
    `--wandb-mode online` (or Python's trust_imports=True); an offline folder needs nothing."""
    from sparqrl.config import ConfigError
    from sparqrl.trust import NOTHING, named, require_trusted

    require_trusted(NOTHING, "run/config.json", uploads=False)
    require_trusted(named(wandb_mode="online"), "run/config.json", uploads=True)
    require_trusted(named(python=True, everything=True), "run/config.json", uploads=True)
    for trust, allow in ((NOTHING, "add --wandb-mode online"), (named(wandb_mode="offline"), "add --wandb-mode online"),
                         (named(python=True), "pass trust_imports=True")):
        with pytest.raises(ConfigError, match=f"wandb_mode='online' in run/config.json: .*{allow}"):
            require_trusted(trust, "run/config.json", uploads=True)

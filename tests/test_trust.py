"""A run folder is data, never code (`sparqrl.trust`): a crafted folder whose config.json names a module
(its imports, a `gym:`/`jax:` env) or a Ray address gets none of them imported, resolved or joined by any
command that opens it, unless the command names the same module or address; the refusal is one line,
exit 2. Each payload would create a marker file: it must not exist afterwards."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

import sparqrl
from conftest import run_cli
from sparqrl import config as cfg
from sparqrl.algos import get_algorithm
from sparqrl.config import ConfigError
from sparqrl.envs import custom
from sparqrl.runners.run_config import RunConfig

PAYLOAD = "evilpkg_h2.payload"


@pytest.fixture
def crafted(tmp_path, monkeypatch):
    """(make(run fields) -> a run folder naming them, marker): the folder holds a package whose import
    creates the marker; the current folder is the run folder, as `sparqrl eval .` from inside it."""
    marker = tmp_path / "marker"

    def make(name: str = "run", finished: bool = False, **run_fields) -> Path:
        folder = tmp_path / name
        (folder / "evilpkg_h2").mkdir(parents=True)
        (folder / "evilpkg_h2" / "__init__.py").write_text("")
        (folder / "evilpkg_h2" / "payload.py").write_text(f"open({str(marker)!r}, 'w').close()\nEnv = None\n")
        data = {"algo": "ppo", "run": cfg.to_dict(RunConfig(**{"out": str(folder), **run_fields})),
                "config": cfg.to_dict(get_algorithm("ppo").Config())}
        (folder / "config.json").write_text(json.dumps(data))
        (folder / "sparqrl-run.json").write_text(json.dumps({"format": 1, "files": ["config.json"]}))
        if finished:
            (folder / "summary.json").write_text(json.dumps({"final_return_mean": 1.0}))
        monkeypatch.chdir(folder)
        return folder

    yield make, marker
    assert not any(m.startswith("evilpkg_h2") for m in sys.modules)


def refused(capsys, *argv) -> str:
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and err.startswith("sparqrl: error: ") and err.count("\n") == 1, (code, err)
    return err


FOLDER_NAMES = [dict(imports=(PAYLOAD,)), dict(env=f"jax:{PAYLOAD}:Env"), dict(env=f"gym:{PAYLOAD}:Env")]


@pytest.mark.parametrize("names", FOLDER_NAMES)
def test_eval_export_resume_and_load_refuse_the_folders_module(crafted, capsys, names):
    make, marker = crafted
    run = make(**names)
    for argv in (["eval", str(run)], ["eval", str(run), "--video", str(run / "v.mp4")],
                 ["export", str(run), "--out", str(run / "p.onnx")], ["train", "--resume", str(run)],
                 ["train", "ppo", "--resume", str(run), "--no-progress"]):
        err = refused(capsys, *argv)
        assert "evilpkg_h2.payload" in err and str(run / "config.json") in err, err
        assert "--import evilpkg_h2.payload" in err, err
    with pytest.raises(ConfigError, match="trust_imports=True"):
        sparqrl.load(run)
    with pytest.raises(ConfigError, match="trust_imports=True"):
        sparqrl.train("ppo", "CartPole-v1", steps=100, out=run, resume=True)
    finished = make("finished", finished=True, **names)
    refused(capsys, "train", "--resume", str(finished))
    assert not marker.exists()


def test_compare_reads_a_folder_without_importing_it(crafted, capsys):
    make, marker = crafted
    run = make(env=f"jax:{PAYLOAD}:Env", imports=(PAYLOAD,))
    refused(capsys, "compare", str(run), "--out", str(run / "c.png"))  # (no metrics yet)
    assert not marker.exists()


def test_load_config_copies_no_module(crafted, capsys):
    make, marker = crafted
    run = make(imports=(PAYLOAD,))
    err = refused(capsys, "train", "ppo", "--load-config", str(run / "config.json"), "--out", str(run / "new"))
    assert "--import evilpkg_h2.payload" in err and not (run / "new").exists()
    other = make("other", env=f"jax:{PAYLOAD}:Env")
    refused(capsys, "train", "ppo", "--load-config", str(other), "--out", str(other / "new"))
    assert not marker.exists()


def test_no_module_is_exempt(crafted, capsys, monkeypatch):
    """A standard-library module (already imported) is refused like any other: a folder naming
    `jax:os:ATTR` must not get os.ATTR called."""
    make, marker = crafted
    monkeypatch.setattr("os.sparqrl_h2_payload", lambda: marker.touch(), raising=False)
    run = make(env="jax:os:sparqrl_h2_payload")
    assert "--import os" in refused(capsys, "eval", str(run))
    with pytest.raises(ConfigError):
        sparqrl.load(run)
    assert not marker.exists()


def test_the_current_folder_is_not_imported_from(crafted):
    make, marker = crafted
    make()  # the current folder holds the package
    with pytest.raises(ConfigError, match="PYTHONPATH"):
        custom.import_module(PAYLOAD)
    assert not marker.exists()


def test_act_folder_names_no_env_module(crafted, capsys):
    make, marker = crafted
    pytest.importorskip("evosax")
    act = make("act")
    meta = {"meta": {"task": "act", "env": f"jax:{PAYLOAD}:Env", "out": str(act)}, "inner": {}}
    (act / "config.json").write_text(json.dumps(meta))
    err = refused(capsys, "train", "ppo", "--env", f"act:{act}", "--out", str(act / "new"))
    assert "never on a module a run folder names" in err
    assert "--import evilpkg_h2.payload" in refused(capsys, "meta", "--resume", str(act))
    assert not marker.exists()


def test_meta_resume_refuses_the_folders_module(crafted, capsys):
    make, marker = crafted
    pytest.importorskip("evosax")
    run = make("meta")
    (run / "config.json").write_text(json.dumps({"meta": {"task": "hparams", "env": f"jax:{PAYLOAD}:Env",
                                                          "out": str(run)}}))
    assert "--import evilpkg_h2.payload" in refused(capsys, "meta", "--resume", str(run))
    assert not marker.exists()


def test_resume_joins_no_address_the_folder_names(crafted, capsys):
    make, _ = crafted
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.2)
        address = f"ray://127.0.0.1:{listener.getsockname()[1]}"
        run = make(env="gym:CartPole-v1", actors=2, backend="ray", ray_address=address)
        err = refused(capsys, "train", "--resume", str(run))
        assert f"--ray-address {address}" in err
        with pytest.raises(ConfigError, match="trust_imports=True"):
            sparqrl.train("ppo", "gym:CartPole-v1", steps=100, out=run, resume=True)
        with pytest.raises(socket.timeout):
            listener.accept()


def test_the_payload_would_run_if_trusted(crafted, monkeypatch):
    """The crafted package is a real payload (so the tests above can fail): trusting it runs it."""
    make, marker = crafted
    run = make()
    monkeypatch.syspath_prepend(str(run))
    monkeypatch.delitem(sys.modules, "evilpkg_h2", raising=False)
    custom.import_module(PAYLOAD)
    assert marker.exists()
    del sys.modules[PAYLOAD], sys.modules["evilpkg_h2"]

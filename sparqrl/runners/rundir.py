"""A run's output folder: recognised by its manifest, never mistaken for a user's folder.

`sparqrl-run.json` (the manifest) is the first file a run writes: the folder's format version and the
name of every file or folder the run writes in it, recorded before the run creates it. `--overwrite`
therefore deletes exactly those, never anything else a user keeps there, and only a folder holding a
manifest (or a run of the format before manifests, format 0, recognised by its own files) is replaced.

Files are written whole or not at all (a temporary file renamed into place), so a kill or a full disk
never leaves a half-written config.json or summary.json behind.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path
from typing import Any

from sparqrl import config as cfg
from sparqrl.algos import get_algorithm
from sparqrl.envs.custom import import_modules
from sparqrl.runners.run_config import RunConfig

FORMAT = 1
MANIFEST = "sparqrl-run.json"
CONFIG = "config.json"
SUMMARY = "summary.json"
# What a format-0 run (before manifests) wrote: only these are deleted when one is overwritten.
FORMAT0_FILES = ("config.json", "summary.json", "metrics.csv", "tensorboard", "returns.png", "checkpoint",
                 "emissions.csv")
MIN_FREE_BYTES = 16 * 2**20  # a run's config, first logs and first checkpoint of a small network


class RunDir:
    """The output folder of one run; `claim(name)` records a file in the manifest before it is written."""

    def __init__(self, path: Path, files: list[str]):
        self.path = path
        self.files = files

    def claim(self, name: str) -> Path:
        if name not in self.files:
            self.files.append(name)
            self._write_manifest()
        return self.path / name

    def write_text(self, name: str, text: str) -> None:
        write_atomic(self.claim(name), text)

    def _write_manifest(self) -> None:
        write_atomic(self.path / MANIFEST, json.dumps({"format": FORMAT, "files": self.files}, indent=2))

    @property
    def finished(self) -> bool:
        return (self.path / SUMMARY).is_file()


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_manifest(path: Path) -> tuple[int, list[str]] | None:
    """(format, files) of the run in `path`, or None when `path` holds no sparqrl run. A manifest
    from a newer format is an error that says so."""
    manifest = path / MANIFEST
    if manifest.is_file():
        try:
            data = json.loads(manifest.read_text())
            version, files = int(data["format"]), [str(f) for f in data["files"]]
            # only names of this folder's own entries: a damaged manifest must never reach outside it
            files = [f for f in files if f and Path(f).name == f and f not in (".", "..")]
        except (ValueError, KeyError, TypeError) as error:
            cfg.fail("out", str(path), f"holds a damaged {MANIFEST} ({type(error).__name__}); remove the folder by hand")
        cfg.require(version <= FORMAT, "out", str(path),
                    f"holds a run of format {version}, newer than this sparqrl reads (formats 0-{FORMAT}); upgrade sparqrl")
        return version, files
    if _is_format0_run(path):
        return 0, [name for name in FORMAT0_FILES if (path / name).exists()]
    return None


def _is_format0_run(path: Path) -> bool:
    try:
        data = json.loads((path / CONFIG).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and {"algo", "run", "config"} <= set(data)


def check_out(path: str, overwrite: bool) -> None:
    """The checks `--out` must pass before a new run is prepared; nothing is written or deleted."""
    out = Path(path)
    if out.exists() or out.is_symlink():
        cfg.require(out.is_dir(), "out", path, "is a file, not a folder; name a folder for the run")
        if any(out.iterdir()):
            held = read_manifest(out)
            cfg.require(held is not None, "out", path,
                        "holds files that are not a sparqrl run (nothing was deleted); name a new or empty folder")
            cfg.require(overwrite, "out", path,
                        "already holds a run; pass --overwrite to replace it or --resume DIR to continue it")
    ancestor = out
    while not ancestor.exists():
        ancestor = ancestor.parent
    cfg.require(ancestor.is_dir(), "out", path, f"cannot be made: {ancestor} is a file")
    cfg.require(os.access(ancestor, os.W_OK | os.X_OK), "out", path, f"cannot be written: {ancestor} is read-only")
    free = shutil.disk_usage(ancestor).free
    cfg.require(free >= MIN_FREE_BYTES, "out", path,
                f"is on a full disk ({free // 2**20} MiB free, a run needs at least {MIN_FREE_BYTES // 2**20} MiB)")


def start_run_dir(algo_name: str, algo_config: Any, run: RunConfig, sweep: list[dict[str, float]] | None = None
                  ) -> RunDir:
    """The output folder of a new run, holding its manifest and resolved config.json (with a sweep's
    settings under "sweep"). Called once every input check has passed: only then is an earlier run in the
    folder (with `--overwrite`) deleted, and only the files that run recorded."""
    data = {"algo": algo_name, "run": cfg.to_dict(run), "config": cfg.to_dict(algo_config)}
    if sweep is not None:
        data["sweep"] = sweep
    return new_run_dir(run.out, run.overwrite, json.dumps(data, indent=2, sort_keys=True))


def new_run_dir(path: str, overwrite: bool, config_json: str) -> RunDir:
    """A new run folder at `path` holding its manifest and `config_json` as config.json (any kind of run:
    train, sweep, meta). The `check_out` rules first: an earlier sparqrl run there is replaced only with
    `overwrite`, and only the files it recorded are deleted."""
    check_out(path, overwrite)
    out = Path(path)
    try:
        held = read_manifest(out) if out.is_dir() else None
        if held is not None:
            for name in held[1]:
                _remove(out / name)
            (out / MANIFEST).unlink(missing_ok=True)
        out.mkdir(parents=True, exist_ok=True)
        rundir = RunDir(out, [])
        rundir.write_text(CONFIG, config_json)
    except OSError as error:
        cfg.fail("out", path, f"cannot be written: {os_reason(error)}")
    return rundir


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def is_meta_config(data: Any) -> bool:
    """A `sparqrl meta` run's config.json content (its meta config and inner config, no "algo")."""
    return isinstance(data, dict) and "meta" in data and "algo" not in data


def open_run_dir(path: str | Path, field: str = "resume") -> tuple[RunDir, str, Any, RunConfig]:
    """The run in `path` (any format this sparqrl reads): its folder, algorithm name and saved configs."""
    out = Path(path)
    cfg.require(out.is_dir(), field, str(path), "must be the output folder of a run (no such folder)")
    held = read_manifest(out)
    cfg.require(held is not None and (out / CONFIG).is_file(), field, str(path),
                "must be the output folder of a run (no sparqrl run there)")
    try:
        data = json.loads((out / CONFIG).read_text())
        cfg.require(not is_meta_config(data), field, str(path),
                    "is a meta run's folder, not a train or sweep run's (`sparqrl meta TASK --resume DIR` continues it)")
        module = get_algorithm(data["algo"])
        algo_config = cfg.from_dict(module.Config, data["config"])
        run = cfg.from_dict(RunConfig, data["run"])
    except cfg.ConfigError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as error:
        cfg.fail(field, str(path), f"holds a damaged {CONFIG} ({type(error).__name__}: {error})")
    import_modules(run.imports)  # what the run imported before resolving its env, in this process too
    return RunDir(out, held[1]), data["algo"], algo_config, run


def saved_sweep(path: Path) -> list[dict[str, float]] | None:
    """The settings of the sweep whose folder is `path` (read after `open_run_dir`), None for a train run."""
    sweep = json.loads((Path(path) / CONFIG).read_text()).get("sweep")
    well_formed = sweep is None or (isinstance(sweep, list) and sweep and all(
        isinstance(s, dict) and s.keys() == sweep[0].keys()
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in s.values()) for s in sweep))
    cfg.require(well_formed, "resume", str(path), f"holds a damaged {CONFIG} (its sweep settings are not a list of "
                "settings with the same numeric fields)")
    return sweep


def os_reason(error: OSError) -> str:
    """A one-line reason for a failed write, e.g. 'No space left on device'."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return "the disk is full"
    if error.errno == errno.EROFS:
        return "the file system is read-only"
    return error.strerror or str(error)

"""A run's output folder: recognised by its manifest, never mistaken for a user's folder.

`sparqrl-run.json` (the manifest) is the first file a run writes: the folder's format version and the
name of every file or folder the run writes in it, recorded before the run creates it. `--overwrite`
therefore deletes exactly those, never anything else a user keeps there, and only a folder holding a
manifest (or a run of the format before manifests, format 0, recognised by its own files) is replaced.

Files are written whole or not at all (a temporary file renamed into place), so a kill or a full disk
never leaves a half-written config.json or summary.json behind.

One writer per folder: `train`, `--resume`, `--overwrite`, `sweep` and `meta` hold an exclusive flock on
`sparqrl-run.lock` (holding the writer's PID) from before they change anything until they end; the
kernel drops it on any death, kill -9 included. Readers (eval, export, compare, load) take no lock and
change nothing. Nothing is written, replaced or deleted through a link (`sparqrl.runfiles`): a writer
refuses a folder holding one before it changes anything.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from sparqrl import config as cfg
from sparqrl.algos import get_algorithm
from sparqrl.envs.custom import import_modules
from sparqrl.runfiles import check_no_links, refuse_link, write_atomic
from sparqrl.runfiles import reason as os_reason
from sparqrl.runners.run_config import RunConfig
from sparqrl.trust import NOTHING, Trust, require_trusted

FORMAT = 1
MANIFEST = "sparqrl-run.json"
CONFIG = "config.json"
SUMMARY = "summary.json"
LOCK = "sparqrl-run.lock"  # the writer's flock and PID; never deleted (an --overwrite keeps it, held)
# What a format-0 run (before manifests) wrote: only these are deleted when one is overwritten.
FORMAT0_FILES = ("config.json", "summary.json", "metrics.csv", "tensorboard", "returns.png", "checkpoint",
                 "emissions.csv")
MIN_FREE_BYTES = 16 * 2**20  # a run's config, first logs and first checkpoint of a small network


class RunDir:
    """The output folder of one run; `claim(name)` records a file in the manifest before it is written. `saved`: its
    config.json as `open_run_dir` read it (None for a folder this process writes anew)."""

    def __init__(self, path: Path, files: list[str], saved: dict[str, Any] | None = None):
        self.path = path
        self.files = files
        self.saved = saved

    def claim(self, name: str) -> Path:
        """`name` in the folder, recorded in the manifest; checked to be (and hold) no link, just before
        the caller or a library writes it."""
        check_no_links(self.path, [name])
        if name not in self.files:
            self.files.append(name)
            self._write_manifest()
        return self.path / name

    def lock(self) -> None:
        """Become the folder's one writer (for this process's life, or until `release`), then check that
        the folder holds no link to write through: a one-line error, with nothing changed, when another
        process writes it (naming its PID) or a link is there. This process may take it again (a run that
        failed in Python before it released the lock does not lock its own process out)."""
        key = self.path.resolve()
        if key not in _HELD:
            _HELD[key] = _take_lock(self.path)
        try:
            self.check_writable()
            if self.files and LOCK not in self.files:  # a run is there (a new folder records it with config.json)
                self.claim(LOCK)
        except BaseException:
            self.release()
            raise

    def check_writable(self) -> None:
        """No entry of the folder is a link, nor anything under the run's own folders (checkpoint/, tensorboard/):
        what a writer checks before it changes anything."""
        for entry in sorted(os.listdir(self.path)):
            refuse_link(self.path / entry)
        check_no_links(self.path, self.files)

    def release(self) -> None:
        """Give up the writer's lock, if held (the lock file stays: another writer may hold it next)."""
        fd = _HELD.pop(self.path.resolve(), None)
        if fd is not None:
            os.close(fd)

    def write_text(self, name: str, text: str) -> None:
        write_atomic(self.claim(name), text)

    def _write_manifest(self) -> None:
        write_atomic(self.path / MANIFEST, json.dumps({"format": FORMAT, "files": self.files}, indent=2))

    @property
    def finished(self) -> bool:
        return (self.path / SUMMARY).is_file()


_HELD: dict[Path, int] = {}  # this process's writer locks: resolved folder -> the descriptor holding its flock


def _take_lock(folder: Path) -> int:
    """An exclusive flock on `folder`'s lock file, holding this process's PID; a one-line error naming the
    PID of the process that holds it. The kernel releases it when the descriptor closes or the process dies."""
    path = folder / LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as error:
        refuse_link(path)
        cfg.fail("out", str(folder), f"cannot be written: {os_reason(error)}")
    try:
        refuse_link(path)  # a hard link: the PID would be written into the other file
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        cfg.fail("out", str(folder), f"is being written by another sparqrl process (PID {holder}); wait for it to "
                 "end or stop it (eval, export and compare can read the run meanwhile); nothing was changed")
    except OSError as error:  # a file system without locks (some network ones): no writer could be kept out
        os.close(fd)
        cfg.fail("out", str(folder), f"cannot be locked for writing ({os_reason(error)}); put the run on a local disk")
    except BaseException:
        os.close(fd)
        raise
    return fd


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
        if any(entry.name != LOCK for entry in out.iterdir()):  # a lock file alone: a run killed as it began
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
    `overwrite`, and only the files it recorded are deleted, once this process holds the folder's lock
    and has found no link in it (`RunDir.lock`)."""
    check_out(path, overwrite)
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)  # to hold the lock file
    except OSError as error:
        cfg.fail("out", path, f"cannot be written: {os_reason(error)}")
    held = read_manifest(out)
    rundir = RunDir(out, held[1] if held else [])
    rundir.lock()
    try:
        check_out(path, overwrite)  # again as the one writer: another may have written the folder meanwhile
        held = read_manifest(out)
        for name in held[1] if held else ():
            if name != LOCK:
                _remove(out / name)
        (out / MANIFEST).unlink(missing_ok=True)
        rundir.files = [LOCK]
        rundir.write_text(CONFIG, config_json)
    except OSError as error:
        rundir.release()
        cfg.fail("out", path, f"cannot be written: {os_reason(error)}")
    except BaseException:
        rundir.release()
        raise
    return rundir


def _remove(path: Path) -> None:
    """Delete a run's file or folder; a link is removed itself, never followed (rmtree does not enter links)."""
    try:
        is_folder = stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return
    if is_folder:
        shutil.rmtree(path)
    else:
        path.unlink()


def is_meta_config(data: Any) -> bool:
    """A `sparqrl meta` run's config.json content (its meta config and inner config, no "algo")."""
    return isinstance(data, dict) and "meta" in data and "algo" not in data


def open_run_dir(path: str | Path, field: str = "resume", trust: Trust | None = NOTHING, pbt: bool = False
                 ) -> tuple[RunDir, str, Any, RunConfig]:
    """The run in `path` (any format this sparqrl reads): its folder, algorithm name and saved configs.
    `trust`: what the command named (`sparqrl.trust`); the modules the folder names must be among them,
    checked before the run's imports are imported (its Ray address: by `runners.resume`, which joins it). None: the caller builds nothing of the run
    (its env, its actors), so nothing is imported or checked. `pbt`: a PBT run's folder is taken (its state is a
    population's, which only `runners.pbt` and readers of its files know)."""
    out = Path(path)
    cfg.require(out.is_dir(), field, str(path), "must be the output folder of a run (no such folder)")
    held = read_manifest(out)
    cfg.require(held is not None and (out / CONFIG).is_file(), field, str(path),
                "must be the output folder of a run (no sparqrl run there)")
    try:
        data = json.loads((out / CONFIG).read_text())
        cfg.require(not is_meta_config(data), field, str(path),
                    "is a meta run's folder, not a train or sweep run's (`sparqrl meta TASK --resume DIR` continues it)")
        cfg.require(pbt or "pbt" not in data, field, str(path), "is a PBT run's folder: `sparqrl pbt --resume DIR` "
                    "continues it; DIR/best is its best member as a run folder (eval, load, export)")
        module = get_algorithm(data["algo"])
        algo_config = cfg.from_dict(module.Config, data["config"], str(out / CONFIG))
        run = cfg.from_dict(RunConfig, data["run"], str(out / CONFIG))
        algo_config = algo_config.as_saved_run(run.env)
    except cfg.ConfigError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as error:
        cfg.fail(field, str(path), f"holds a damaged {CONFIG} ({type(error).__name__}: {error})")
    if trust is not None:
        require_trusted(trust, out / CONFIG, run.imports, run.env, networks=algo_config.network_references())
        import_modules(run.imports)  # what the run imported before resolving its env, in this process too
    return RunDir(out, held[1], data), data["algo"], algo_config, run


def saved_sweep(path: Path) -> list[dict[str, float]] | None:
    """The settings of the sweep whose folder is `path` (read after `open_run_dir`), None for a train run."""
    sweep = json.loads((Path(path) / CONFIG).read_text()).get("sweep")
    well_formed = sweep is None or (isinstance(sweep, list) and sweep and all(
        isinstance(s, dict) and s.keys() == sweep[0].keys()
        and all(cfg.is_number(v) for v in s.values()) for s in sweep))
    cfg.require(well_formed, "resume", str(path), f"holds a damaged {CONFIG} (its sweep settings are not a list of "
                "settings with the same numeric fields)")
    return sweep


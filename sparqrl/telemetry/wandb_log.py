"""Weights & Biases beside TensorBoard (`--wandb PROJECT`): the scalars TensorBoard gets, at the same env steps
(`RunLogger` hands both the same values), the run's config.json as W&B's config, its summary.json as W&B's
summary and its files as an artifact at the end.

Offline by default (`--wandb-mode offline`): nothing leaves the machine; `wandb sync DIR/wandb` uploads the
run later. W&B's folder is the run's own `wandb/` (claimed like `tensorboard/`), never ./wandb in the working
directory; W&B is told to make no links there and the one its service makes to its own log (outside the run
folder) is removed, so the folder keeps the rule that a run folder holds no link (`sparqrl.runfiles`). The W&B
run's id is kept in `wandb/sparqrl-run-id`: `--resume` continues the same W&B run (offline, each session is an
offline run folder of that id; `wandb sync` joins them).

wandb is imported only when a run asks for it: the command line starts as fast without it.
"""

from __future__ import annotations

import json
import os
import secrets
import string
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from sparqrl.config import ConfigError, fail, one_of, require
from sparqrl.extras import need, need_installed
from sparqrl.runfiles import write_atomic

MODES = ("offline", "online")
ID_FILE = "sparqrl-run-id"
PROJECT_FORBIDDEN = "/\\#?%:"  # characters W&B refuses in a project name
PROJECT_MAX = 128


def validate(project: str | None, mode: str) -> None:
    """`--wandb PROJECT` and `--wandb-mode`, checked on their form (nothing imported, nothing joined)."""
    one_of("wandb_mode", mode, MODES)
    if project is None:
        return
    require(isinstance(project, str) and 0 < len(project) <= PROJECT_MAX and project.strip() == project,
            "wandb", project, f"must be a W&B project name of 1 to {PROJECT_MAX} characters, no surrounding spaces")
    bad = sorted({c for c in project if c in PROJECT_FORBIDDEN or not c.isprintable()})
    require(not bad, "wandb", project, f"must not contain {' '.join(map(repr, bad))} (W&B project names exclude "
            f"{' '.join(PROJECT_FORBIDDEN)})")


def check_installed() -> None:
    """A run that logs to W&B needs the wandb package: a one-line error naming the extra, before anything is
    compiled or written."""
    need_installed("wandb", "--wandb")


class WandbWriter:
    """A `ScalarWriter` (`sparqrl.telemetry.logger`) for one session of a run logging to W&B project `project`.

    `run_folder`: the run's folder (its `wandb/` claimed by the caller); `files`: the names of the run's files
    at the end (the artifact takes the regular files among them). `startup_s`: the seconds W&B took to start
    (left out of the run's env_steps_per_s, as compilation is)."""

    def __init__(self, run_folder: Path, project: str, mode: str, files: Callable[[], Iterable[str]]):
        started = time.perf_counter()
        wandb = need("wandb", "--wandb")
        self.run_folder, self.files = run_folder, files
        folder = run_folder / "wandb"
        folder.mkdir(exist_ok=True)
        run_id, resumed = _run_id(folder)
        config = json.loads((run_folder / "config.json").read_text())
        settings = wandb.Settings(console="off", symlink=False, silent=True)  # the terminal stays sparqrl's
        try:
            self.run = wandb.init(project=project, dir=str(run_folder), mode=mode, id=run_id, resume="allow",
                                  config=config, settings=settings)
        except Exception as error:  # noqa: BLE001 - wandb's errors (login, network) have no common base
            raise ConfigError(f"--wandb {project}: W&B could not start the run ({type(error).__name__}: "
                              f"{_first_line(error)})" + (" (run `wandb login` first, or use --wandb-mode offline)"
                                                          if mode == "online" else "")) from None
        _remove_links(folder)
        self.startup_s = time.perf_counter() - started  # W&B's import and service start: not training time
        where = self.run.url if mode == "online" else f"{folder}; `wandb sync {folder}` uploads it"
        print(f"sparqrl: W&B run {run_id} ({'resumed, ' if resumed else ''}{mode}): {where}", file=sys.stderr,
              flush=True)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        """Ends the W&B run: finished, with summary.json as its summary and the run's files as an artifact,
        once the run has its summary.json; otherwise as failed (interrupted or stopped: `--resume` goes on)."""
        summary_file = self.run_folder / "summary.json"
        finished = summary_file.is_file()
        if finished:
            self.run.summary.update(json.loads(summary_file.read_text()))
            self.run.log_artifact(self._artifact())
        self.run.finish(exit_code=0 if finished else 1)
        _remove_links(self.run_folder / "wandb")

    def _artifact(self) -> Any:
        import wandb

        artifact = wandb.Artifact(f"run-{self.run.id}", type="sparqrl-run",
                                  description="the sparqrl run folder's files (checkpoints and TensorBoard left out)")
        for name in self.files():
            path = self.run_folder / name
            if path.is_file() and not path.is_symlink() and not name.endswith(".lock"):
                artifact.add_file(str(path), name=name)
        return artifact


def _run_id(folder: Path) -> tuple[str, bool]:
    """(the W&B run id of this run, whether an earlier session made it): a new one (8 random base-36 digits,
    as W&B's own) is kept before W&B starts."""
    path = folder / ID_FILE
    if path.is_file():
        saved = path.read_text().strip()
        if saved.isascii() and saved.isalnum():
            return saved, True
        fail("resume", str(folder.parent), f"holds a damaged {path.relative_to(folder.parent)} ({saved[:40]!r}); "
             "remove it to log the rest of the run as a new W&B run")
    run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
    write_atomic(path, run_id + "\n")
    return run_id, False


def _remove_links(folder: Path) -> None:
    """The links W&B's service makes in its run folder (to its own log under ~/.cache/wandb) removed, never
    followed: a run folder holds no link."""
    for root, dirs, files in os.walk(folder):
        for name in (*dirs, *files):
            path = Path(root) / name
            if path.is_symlink():
                path.unlink()


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0]

"""Runners drive algorithms: `anakin` runs everything on device in jitted chunks (gymnax, brax:NAME);
`sebulba` runs host environments (gym:NAME) with an actor and a jitted learner. `train`, `resume` and
`evaluate_saved` pick the runner from the environment name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparqrl.config import require
from sparqrl.envs import is_host_env
from sparqrl.runners import anakin, sebulba
from sparqrl.runners.anakin import RunConfig, RunInterrupted


def train(algo_name: str, algo_config: Any, run: RunConfig, **kwargs: Any) -> dict:
    """Train from scratch; returns the summary (also written to `run.out/summary.json`)."""
    if is_host_env(run.env):
        return sebulba.train(algo_name, algo_config, run)
    return anakin.train(algo_name, algo_config, run, **kwargs)


def resume(out_dir: str | Path, **kwargs: Any) -> dict:
    """Continue the run in `out_dir` from its last checkpoint, with its saved configuration."""
    _, _, run = anakin.load_config(Path(out_dir))
    if is_host_env(run.env):
        return sebulba.resume(out_dir)
    return anakin.resume(out_dir, **kwargs)


def evaluate_saved(out_dir: str | Path, episodes: int | None = None, seed: int | None = None) -> dict:
    """Evaluate the saved policy of the run in `out_dir`: deterministic episodes per seed."""
    require((Path(out_dir) / "config.json").exists(), "DIR", str(out_dir), "must be the output directory of a run")
    _, _, run = anakin.load_config(Path(out_dir))
    if is_host_env(run.env):
        return sebulba.evaluate_saved(out_dir, episodes, seed)
    return anakin.evaluate_saved(out_dir, episodes, seed)


__all__ = ["RunConfig", "RunInterrupted", "evaluate_saved", "resume", "train"]

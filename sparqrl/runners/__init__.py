"""Runners drive algorithms: `anakin` runs everything on device in jitted chunks (gymnax, brax:NAME);
`sebulba` runs host environments (gym:NAME) with actors and a jitted learner. Both run in the one host
loop of `session`. `train`, `resume` and `evaluate_saved` pick the runner from the environment name."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from sparqrl.config import require
from sparqrl.envs import is_host_env
from sparqrl.runners import anakin
from sparqrl.runners.rundir import open_run_dir
from sparqrl.runners.run_config import RunConfig
from sparqrl.runners.session import RunFailed, RunInterrupted, finished_summary, notify, use_compile_cache


def _host_runner() -> Any:
    """The actor-learner runner, imported only for host environments (it loads Gymnasium)."""
    from sparqrl.runners import sebulba

    return sebulba


def train(algo_name: str, algo_config: Any, run: RunConfig, **kwargs: Any) -> dict:
    """Train from scratch; returns the summary (also written to `run.out/summary.json`)."""
    use_compile_cache(run.compile_cache)
    if is_host_env(run.env):
        return _host_runner().train(algo_name, algo_config, run, **kwargs)
    return anakin.train(algo_name, algo_config, run, **kwargs)


def resume(out_dir: str | Path, progress: bool | None = None, **kwargs: Any) -> dict:
    """Continue the run in `out_dir` from its newest intact checkpoint, with its saved configuration
    (from the beginning when it has none yet). A finished run is left as it is: its summary is returned.
    `progress`: show the progress bar or not (default: as the run was started)."""
    rundir, algo_name, algo_config, run = open_run_dir(out_dir)
    if progress is not None:
        run = dataclasses.replace(run, progress=progress)
    if rundir.finished:
        notify(f"{out_dir} is a finished run ({run.env}, {algo_name}); nothing to do")
        return finished_summary(rundir)
    use_compile_cache(run.compile_cache)
    if is_host_env(run.env):
        return _host_runner().resume(rundir, algo_name, algo_config, run, **kwargs)
    return anakin.resume(rundir, algo_name, algo_config, run, **kwargs)


def evaluate_saved(out_dir: str | Path, episodes: int | None = None, seed: int | None = None) -> dict:
    """Evaluate the saved policy of the run in `out_dir`: deterministic episodes per seed."""
    rundir, algo_name, algo_config, run = open_run_dir(out_dir, "DIR")
    episodes = run.eval_episodes if episodes is None else episodes
    require(episodes >= 1, "episodes", episodes, "must be >= 1")
    runner = _host_runner() if is_host_env(run.env) else anakin
    return runner.evaluate_saved(rundir, algo_name, algo_config, run, episodes, seed)


__all__ = ["RunConfig", "RunFailed", "RunInterrupted", "evaluate_saved", "resume", "train"]

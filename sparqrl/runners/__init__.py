"""Runners drive algorithms: `anakin` runs everything on device in jitted chunks (gymnax, brax:NAME);
`sebulba` runs host environments (gym:NAME) with actors and a jitted learner. Both run in the one host
loop of `session`. `train`, `resume` and `evaluate_saved` pick the runner from the environment name;
`evaluate_policy` evaluates trained policies on another environment of the same spaces."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from sparqrl.config import require
from sparqrl.envs import is_host_env
from sparqrl.runners.errors import RunFailed, RunInterrupted
from sparqrl.runners.rundir import open_run_dir
from sparqrl.runners.run_config import RunConfig, check_episodes
from sparqrl.telemetry import wandb_log
from sparqrl.trust import NOTHING, Trust, require_trusted


def _device_runner() -> Any:
    """The on-device runner, imported at the first run (it loads JAX; the command's help and checks do not)."""
    from sparqrl.runners import anakin

    return anakin


def _host_runner(algo_name: str | None = None) -> Any:
    """The actor-learner runner, imported only for host environments (it loads Gymnasium): in gradient mode
    (`gradients`) for an algorithm whose actors send gradients (A3C) when training, else `sebulba`."""
    from sparqrl.runners import gradients, sebulba

    return gradients if algo_name is not None and gradients.sends_gradients(algo_name) else sebulba


def train(algo_name: str, algo_config: Any, run: RunConfig, **kwargs: Any) -> dict:
    """Train from scratch; returns the summary (also written to `run.out/summary.json`)."""
    from sparqrl.runners.session import use_compile_cache

    _check_update_hook(run, kwargs)
    use_compile_cache(run.compile_cache)
    _check_loggers(run)
    if kwargs.get("workers") is not None:  # a sweep over Ray workers
        from sparqrl.runners import sweep_workers

        return sweep_workers.train_on_workers(algo_name, algo_config, run, **kwargs)
    kwargs.pop("workers", None)
    if is_host_env(run.env):
        return _host_runner(algo_name).train(algo_name, algo_config, run, **kwargs)
    return _device_runner().train(algo_name, algo_config, run, **kwargs)


def _check_update_hook(run: RunConfig, kwargs: dict[str, Any]) -> None:
    """An `on_update` hook is for on-device runs: it is called from inside their compiled program."""
    hook = kwargs.get("on_update")
    require(hook is None or not is_host_env(run.env), "on_update", repr(hook), f"runs inside the on-device program; "
            f"{run.env} is stepped on the host by actors (use callback=, called after each chunk)")


def _check_loggers(run: RunConfig) -> None:
    """What the run logs to is installed (W&B's package), before anything is compiled or written; `eval` and
    `export` of the run do not need it."""
    if run.wandb is not None:
        wandb_log.check_installed()


def resume(out_dir: str | Path, progress: bool | None = None, trust: Trust = NOTHING, **kwargs: Any) -> dict:
    """Continue the run in `out_dir` from its newest intact checkpoint, with its saved configuration
    (from the beginning when it has none yet). A finished run is left as it is: its summary is returned.
    `progress`: show the progress bar or not (default: as the run was started). `trust`: the modules and Ray
    address the command names (`sparqrl.trust`): those the folder names must be among them."""
    from sparqrl.runners.session import finished_summary, notify, use_compile_cache

    rundir, algo_name, algo_config, run = open_run_dir(out_dir, trust=trust)
    require_trusted(trust, rundir.path / "config.json", ray_address=run.ray_address,  # before any Ray is joined
                    uploads=run.wandb is not None and run.wandb_mode == "online")
    _check_update_hook(run, kwargs)
    if progress is not None:
        run = dataclasses.replace(run, progress=progress)
    if rundir.finished:
        notify(f"{out_dir} is a finished run ({run.env}, {algo_name}); nothing to do")
        return finished_summary(rundir)
    _check_loggers(run)
    rundir.lock()  # the one writer from here on (the session releases it; so does a failure before it)
    try:
        use_compile_cache(run.compile_cache)
        if is_host_env(run.env):
            return _host_runner(algo_name).resume(rundir, algo_name, algo_config, run, **kwargs)
        return _device_runner().resume(rundir, algo_name, algo_config, run, **kwargs)
    finally:
        rundir.release()


def evaluate_saved(out_dir: str | Path, episodes: int | None = None, seed: int | None = None,
                   trust: Trust = NOTHING) -> dict:
    """Evaluate the saved policy of the run in `out_dir`: deterministic episodes per seed. `trust`: as `resume`'s."""
    rundir, algo_name, algo_config, run = open_run_dir(out_dir, "DIR", trust)
    episodes = run.eval_episodes if episodes is None else episodes
    require(episodes >= 1, "episodes", episodes, "must be >= 1")
    check_episodes("episodes", episodes)
    runner = _host_runner() if is_host_env(run.env) else _device_runner()
    return runner.evaluate_saved(rundir, algo_name, algo_config, run, episodes, seed)


def evaluate_policy(run: RunConfig, params: Any, act: Callable[[Any, Any, Any], Any], env: Any, episodes: int,
                    seed: int | None = None) -> dict:
    """Evaluate trained policies on another environment `env` (a name or an env object, as `sparqrl.train`
    takes): deterministic episodes per member. Returns what `evaluate_saved` does.

    params: the policies, [members, ...] (a run's seeds; a sweep's settings x seeds); act(one member's params,
    ONE observation, key) -> its deterministic action. The env's observation shape and action space must be
    those of the run's env: checked before anything is compiled.
    """
    import jax
    import numpy as np

    from sparqrl.algos import evaluate
    from sparqrl.envs import host_spec, make_env, validate_env_name
    from sparqrl.envs.custom import name_for
    from sparqrl.runners.session import eval_summary

    require(isinstance(episodes, int) and episodes >= 1, "episodes", episodes, "must be an int >= 1")
    name = env if isinstance(env, str) else name_for(env)
    validate_env_name(name)
    trained, target = (host_spec(n) if is_host_env(n) else make_env(n) for n in (run.env, name))
    shapes = [(tuple(e.observation_shape), e.action_space) for e in (trained, target)]
    require(shapes[0] == shapes[1], "env", name,
            f"has observations of shape {shapes[1][0]} and {shapes[1][1]} actions; the policies were trained on "
            f"{run.env}: observations {shapes[0][0]}, {shapes[0][1]} actions")
    members = int(jax.tree.leaves(params)[0].shape[0])
    key = jax.random.PRNGKey(0)  # the deterministic action ignores it
    if is_host_env(name):
        from sparqrl.envs import evaluate_host

        batched = jax.jit(jax.vmap(act, in_axes=(None, 0, None)))
        base = run.seed + 100 if seed is None else seed  # as the host runner's own evaluation
        per_seed = np.array([evaluate_host(name, lambda o, i=i: np.asarray(
            batched(jax.tree.map(lambda x: x[i], params), o, key)), episodes, base + i).mean() for i in range(members)])
    else:
        anakin = _device_runner()
        keys = anakin.member_keys(anakin.eval_keys(run.seed if seed is None else seed, run.seeds), members)
        returns = jax.jit(jax.vmap(lambda p, k: evaluate(target, act, p, k, episodes)))(params, keys)
        per_seed = np.asarray(returns).mean(axis=1)
    return eval_summary(dataclasses.replace(run, env=name), episodes, per_seed)


__all__ = ["RunConfig", "RunFailed", "RunInterrupted", "evaluate_policy", "evaluate_saved", "resume", "train"]

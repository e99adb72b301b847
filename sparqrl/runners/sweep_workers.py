"""Sweeps over Ray workers (`--workers N`, `--ray-address`): a sweep's settings split into contiguous slices, each
run on a worker by the single-process sweep's own driver (`anakin.make_driver`), gathered in order.

Its own module, beside `runners.sweep` (settings, outputs) and `runners.anakin` (which imports `sweep` for its
outputs): it needs both, and neither needs it, so no import runs round in a circle.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from sparqrl import config as cfg
from sparqrl.runners.session import WholeChunks
from sparqrl.runners.sweep import Setting

@dataclasses.dataclass(frozen=True)
class SweepSlice:
    """A Ray worker's job (`runners.workers.Job`): a contiguous slice of a sweep's settings, each with all its seeds,
    driven as the single-process run drives its settings (`anakin.make_driver`): member s * seeds + k of the slice
    gets seed k's key, as it does in the whole sweep, so it trains what the whole program trains for it."""

    algo_name: str
    algo_config: Any  # resolved (`anakin.prepare`)
    run_config: Any  # RunConfig
    settings: tuple[tuple[tuple[str, float], ...], ...]  # the slice's, each as (field, value) pairs

    @property
    def key(self) -> str:
        return repr(self)

    @property
    def compile_cache(self) -> bool:
        return self.run_config.compile_cache

    def build(self) -> Any:
        from sparqrl.runners import anakin

        run = dataclasses.replace(self.run_config, progress=False)
        module, algo_config, env = anakin.prepare(self.algo_name, self.algo_config, run)
        driver = anakin.make_driver(self.algo_name, module, algo_config, env, run, [dict(s) for s in self.settings])
        driver.build()
        return driver

    def run(self, driver: Any, step: str, state: Any = None, updates: int = 0) -> Any:
        """step "init": the slice's initial state; "chunk": `updates` updates from `state` (state, metrics);
        "evaluate": the deterministic returns [members, episodes] of `state`. Host arrays in and out."""
        import jax

        if step == "init":
            return jax.device_get(driver.init_state())
        if step == "chunk":
            return jax.device_get(driver.chunk(state, updates))
        return np.asarray(driver.evaluate(jax.device_put(state, driver.sharding)))


def _joined(parts: list[Any]) -> Any:
    """The slices' results (trees of host arrays, leading member axis) as one, in the slices' order."""
    import jax

    return jax.tree.map(lambda *xs: np.concatenate(xs), *parts)


class WorkersDriver(WholeChunks):
    """A sweep for the session (`runners.session.TrainDriver`) whose settings are split over Ray workers: each
    chunk, initialisation and evaluation is one task per contiguous slice of settings (`SweepSlice`), its state in
    and out, gathered in the settings' order. The state lives in this process between chunks (checkpoints as a
    single-process sweep's), so a slice whose worker died is simply run again (`runners.workers`)."""

    startup_s = 0.0

    def __init__(self, whole: Any, pool: Any, algo_name: str, algo_config: Any, run: Any, settings: list[Setting]):
        """`whole`: the single-process driver of the same sweep (`anakin.make_driver`, nothing compiled): its shapes,
        counts, names, summary and outputs."""
        from sparqrl.runners.workers import slices

        self.whole, self.pool = whole, pool
        self.bounds, self.env_steps_per_update = whole.bounds, whole.env_steps_per_update
        self.members, self.member_names = whole.members, whole.member_names
        self.compile_time_s = 0.0
        parts = slices(len(settings), pool.workers)
        self.jobs = [SweepSlice(algo_name, algo_config, run, tuple(tuple(s.items()) for s in settings[a:b]))
                     for a, b in parts]
        self.edges = [a * run.seeds for a, _ in parts[1:]]  # where the member axis is cut
        self._state: Any = None

    def _map(self, step: str, *args_per_job: tuple) -> Any:
        """`step` of every slice (`SweepSlice.run`), with its own arguments."""
        args_per_job = args_per_job or ((),) * len(self.jobs)
        return self.pool.map([(job, (step, *args)) for job, args in zip(self.jobs, args_per_job)])

    def _split(self, state: Any) -> list[tuple]:
        import jax

        leaves, treedef = jax.tree.flatten(jax.device_get(state))
        cut = [np.split(leaf, self.edges) for leaf in leaves]
        return [(jax.tree.unflatten(treedef, [c[i] for c in cut]),) for i in range(len(self.jobs))]

    def abstract_state(self) -> Any:
        return self.whole.abstract_state()

    def build(self) -> None:
        """Each slice's programs are compiled by its first task (on the workers); the time to the first state counts
        as compilation (`init_state`)."""

    def init_state(self) -> Any:
        start = time.perf_counter()
        state = _joined(self._map("init"))
        self.compile_time_s += time.perf_counter() - start
        return state

    def start(self, state: Any, updates_done: int, stop: Any) -> None:
        self._state = state

    def run_chunk(self, chunk: int) -> tuple[Any, dict[str, np.ndarray]]:
        updates = self.bounds[chunk] - (self.bounds[chunk - 1] if chunk else 0)
        results = self._map("chunk", *[(*s, updates) for s in self._split(self._state)])
        self._state, metrics = _joined([r[0] for r in results]), _joined([r[1] for r in results])
        return self._state, metrics

    def evaluate(self, state: Any) -> np.ndarray:
        return _joined(self._map("evaluate", *self._split(state)))

    def summary(self) -> dict[str, Any]:
        return {**self.whole.summary(), "workers": self.pool.workers, "slices": len(self.jobs)}

    def finish(self, rundir: Any, final: np.ndarray) -> dict[str, Any]:
        return self.whole.finish(rundir, final)

    def close(self) -> None:
        self._state = None


def train_on_workers(algo_name: str, algo_config: Any, run: Any, *, settings: list[Setting], workers: Any,
                     **hooks: Any) -> dict:
    """A sweep whose settings are split over Ray workers (`workers`: a checked `runners.workers.Workers`); the
    same checks, folder and outputs as a single-process sweep (`anakin.train`); summary.json adds `workers`."""
    from sparqrl import presets
    from sparqrl.runners import anakin
    from sparqrl.runners.rundir import start_run_dir
    from sparqrl.runners.session import notify, run_session
    from sparqrl.runners.workers import worker_session

    cfg.require(not hooks.get("on_update"), "on_update", hooks.get("on_update"), "runs inside the program on this "
                "process's device: not with workers")
    module, algo_config, env = anakin.prepare(algo_name, algo_config, run)
    anakin.check_settings(algo_config, env, settings)
    if run.preset not in ("auto", "none"):  # said once every check has passed
        notify(presets.describe(run.preset, algo_config, run.env))
    with worker_session(workers) as pool:
        whole = anakin.make_driver(algo_name, module, algo_config, env, run, settings)
        rundir = start_run_dir(algo_name, algo_config, run, sweep=settings)
        driver = WorkersDriver(whole, pool, algo_name, algo_config, run, settings)
        return run_session(rundir, run, algo_name, driver, resuming=False, on_chunk=hooks.get("on_chunk"))

"""The on-device ("Anakin") runner: one jitted program per chunk of updates, seeds vmapped.

The host loop between chunks logs, draws the progress bar, evaluates and checkpoints; nothing else
leaves the device. The chunk program is a `lax.while_loop` whose trip count is an argument, so
chunks of any length share one compilation. With several devices, the seed axis is split over them
with `shard_map`: each device runs its own seeds, vmapped, and no collective is ever emitted (left to
GSPMD, the sharded while-loop deadlocked on forced host devices).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sparqrl import config as cfg
from sparqrl.algos import Algorithm, evaluate, get_algorithm
from sparqrl.algos.base import EPISODE_COUNT, EPISODE_RETURN_SUM
from sparqrl.envs import Env, make_env
from sparqrl.devices import seed_spread
from sparqrl.runners.programs import Program, build_program
from sparqrl.runners.rundir import RunDir, open_run_dir, start_run_dir
from sparqrl.runners.run_config import RunConfig
from sparqrl.runners.session import (check_memory, chunk_bounds, eval_summary, program_store, run_session,
                                     saved_state)


# ---------------------------------------------------------------------------------------------
# Pure building blocks


def over_seeds(fn: Callable, in_axes: tuple = (0,)) -> Callable:
    """`jax.vmap(fn, in_axes)`, except that a seed axis of size 1 (one seed per device) is indexed out
    instead of vmapped: XLA:CPU runs PPO's update ~5 % slower vmapped over a unit axis, and compiles the
    vmapped init and evaluation programs more slowly."""
    batched = jax.vmap(fn, in_axes=in_axes)

    def wrapped(*args: Any) -> Any:
        seeds = next(jax.tree.leaves(a)[0].shape[0] for a, ax in zip(args, in_axes) if ax == 0)
        if seeds != 1:
            return batched(*args)
        args = [jax.tree.map(lambda x: x[0], a) if ax == 0 else a for a, ax in zip(args, in_axes)]
        return jax.tree.map(lambda x: x[None], fn(*args))

    return wrapped


def chunk_program(algo: Algorithm) -> Callable[[Any, jax.Array], tuple[Any, dict[str, jax.Array]]]:
    """`(state [S], n) -> (state [S], metrics [S])`: n updates per seed, metrics reduced on device.

    Returns per seed: episode_return (mean over episodes finished in the chunk, NaN if none),
    episodes (their count) and the mean of every other metric over the n updates.
    """

    def one_seed(state: Any, n: jax.Array) -> tuple[Any, dict[str, jax.Array]]:
        shapes = jax.eval_shape(algo.update, state)[1]
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

        def body(carry):
            i, s, sums = carry
            s, metrics = algo.update(s)
            return i + 1, s, jax.tree.map(jnp.add, sums, metrics)

        _, state, sums = jax.lax.while_loop(lambda c: c[0] < n, body, (jnp.zeros((), jnp.int32), state, zeros))
        count = sums.pop(EPISODE_COUNT)
        total = sums.pop(EPISODE_RETURN_SUM)
        out = {k: v / jnp.maximum(n, 1) for k, v in sums.items()}
        out["episode_return"] = jnp.where(count > 0, total / jnp.maximum(count, 1.0), jnp.nan)
        out["episodes"] = count
        return state, out

    return over_seeds(one_seed, (0, None))


def per_device(fn: Callable, sharding: NamedSharding, in_specs: tuple, out_specs: Any) -> Callable:
    """Run `fn` (batched over a leading seed axis) on each device's own slice of the seeds."""
    return jax.shard_map(fn, mesh=sharding.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


def seed_sharding(seeds: int) -> NamedSharding:
    """Shard the seed axis over as many devices as divide the number of seeds."""
    devices = jax.devices()
    n = math.gcd(seeds, len(devices))
    return NamedSharding(Mesh(np.array(devices[:n]), ("seeds",)), PartitionSpec("seeds"))


def eval_keys(seed: int, seeds: int) -> jax.Array:
    """Fixed evaluation keys, so `sparqrl eval` reproduces the final evaluation."""
    return jax.random.split(jax.random.fold_in(jax.random.PRNGKey(seed), 0x5EED), seeds)


# ---------------------------------------------------------------------------------------------
# The run


class AnakinDriver:
    """The on-device run for the shared session loop (`sparqrl.runners.session`)."""

    def __init__(self, algo: Algorithm, env: Env, run: RunConfig, describe: str):
        self.algo, self.env, self.run = algo, env, run
        self.describe = f"{describe} env={run.env} eval_episodes={run.eval_episodes}"  # what the programs close over
        self.bounds = chunk_bounds(algo.num_updates, run.chunks)
        self.env_steps_per_update = algo.env_steps_per_update
        self.compile_time_s = 0.0
        self.startup_s = 0.0
        self.programs_loaded = 0  # of the 3 programs, how many came traced from the cache (`programs`)
        self.sharding = seed_sharding(run.seeds)
        self.replicated = NamedSharding(self.sharding.mesh, PartitionSpec())
        self.keys = jax.device_put(jax.random.split(jax.random.PRNGKey(run.seed), run.seeds), self.sharding)
        self.eval_keys = jax.device_put(eval_keys(run.seed, run.seeds), self.sharding)
        self._inflight: tuple[Any, dict[str, jax.Array]] | None = None

    def abstract_state(self) -> Any:
        abstract = jax.eval_shape(jax.vmap(self.algo.init), self.keys)
        return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=self.sharding), abstract)

    def build(self) -> None:
        """Compile every program the run needs ahead of time, so compile time is measured apart. A later
        run of the same configuration loads them traced (`programs`) and compiled (XLA's cache)."""
        start = time.perf_counter()
        algo, env, run, sharding = self.algo, self.env, self.run, self.sharding
        seeds, replicated = PartitionSpec("seeds"), PartitionSpec()
        store = program_store() if run.compile_cache else None

        def build(name: str, fn: Callable, in_specs: tuple, out_specs: Any, *args: Any) -> Program:
            return build_program(name, per_device(fn, sharding, in_specs, out_specs), args, describe=self.describe,
                                 store=store)

        self._init = build("init", over_seeds(algo.init), (seeds,), seeds, self.keys)
        abstract = self._init.out_info
        self._chunk = build("chunk", chunk_program(algo), (seeds, replicated), (seeds, seeds), abstract,
                            jax.device_put(jnp.int32(1), self.replicated))
        eval_all = over_seeds(lambda s, k: evaluate(env, algo.act, algo.policy(s), k, run.eval_episodes), (0, 0))
        self._evaluate = build("evaluate", eval_all, (seeds, seeds), seeds, abstract, self.eval_keys)
        self.programs_loaded = sum(p.loaded for p in (self._init, self._chunk, self._evaluate))
        self.compile_time_s += time.perf_counter() - start

    def init_state(self) -> Any:
        return self._init(self.keys)

    def _launch(self, chunk: int, state: Any) -> None:
        if chunk < len(self.bounds):
            n = self.bounds[chunk] - (self.bounds[chunk - 1] if chunk else 0)
            # the trip count is placed as the compiled program expects it (replicated over devices)
            self._inflight = self._chunk(state, jax.device_put(jnp.int32(n), self.replicated))

    def start(self, state: Any, updates_done: int, stop: Any) -> None:
        self._launch(self.bounds.index(updates_done) + 1 if updates_done else 0, state)

    def run_chunk(self, chunk: int) -> tuple[Any, dict[str, np.ndarray]]:
        state, metrics = self._inflight
        # queue the next chunk before the host works on this one, so logging, evaluation and
        # checkpointing overlap with training instead of stalling the device
        self._launch(chunk + 1, state)
        return state, {k: np.asarray(v) for k, v in jax.device_get(metrics).items()}

    def evaluate(self, state: Any) -> np.ndarray:
        return np.asarray(self._evaluate(state, self.eval_keys))

    def interrupted_state(self) -> None:
        return None  # only whole chunks: the session saves the last logged one

    def meta(self) -> dict[str, Any]:
        return {}

    def restore_meta(self, meta: dict[str, Any]) -> None:
        pass

    def summary(self) -> dict[str, Any]:
        used = len(self.sharding.mesh.devices.flat)
        return {"devices_used": used, "seed_spread": seed_spread(used), "programs_loaded": self.programs_loaded,
                **self.algo.summary}

    def close(self) -> None:
        self._inflight = None


def prepare(algo_name: str, algo_config: Any, run: RunConfig) -> tuple[Any, Any, Env]:
    """Every check that can fail on user input, before anything is compiled or written."""
    module = get_algorithm(algo_name)
    run.validate()
    cfg.check_numbers(algo_config)
    env = make_env(run.env)
    algo_config = algo_config.validate(env)  # resolved for the env (e.g. a sparse preset's sparsities)
    return module, algo_config, env


def train(algo_name: str, algo_config: Any, run: RunConfig, *, on_chunk: Callable[[int], None] | None = None) -> dict:
    """Train from scratch; returns the summary (also written to `run.out/summary.json`)."""
    module, algo_config, env = prepare(algo_name, algo_config, run)
    driver = AnakinDriver(module.make_algorithm(algo_config, env), env, run, f"{algo_name} {algo_config!r}")
    check_memory(driver.abstract_state(), run)
    rundir = start_run_dir(algo_name, algo_config, run)
    return run_session(rundir, run, algo_name, driver, resuming=False, on_chunk=on_chunk)


def resume(rundir: RunDir, algo_name: str, algo_config: Any, run: RunConfig, *,
           on_chunk: Callable[[int], None] | None = None) -> dict:
    """Continue the run in `rundir` from its newest intact checkpoint, with its saved configuration."""
    module, algo_config, env = prepare(algo_name, algo_config, run)
    driver = AnakinDriver(module.make_algorithm(algo_config, env), env, run, f"{algo_name} {algo_config!r}")
    return run_session(rundir, run, algo_name, driver, resuming=True, on_chunk=on_chunk)


def _abstract_init(algo: Algorithm, run: RunConfig) -> Any:
    return jax.eval_shape(jax.vmap(algo.init), jax.random.split(jax.random.PRNGKey(run.seed), run.seeds))


def load_state(out: str | Path) -> tuple[str, Any, RunConfig, Env, Algorithm, Any]:
    """The saved run in `out`: its configs, environment, algorithm and newest intact checkpointed state."""
    rundir, algo_name, algo_config, run = open_run_dir(out, "DIR")
    module, algo_config, env = prepare(algo_name, algo_config, run)
    algo = module.make_algorithm(algo_config, env)
    state = saved_state(rundir, _abstract_init(algo, run))
    return algo_name, algo_config, run, env, algo, state


def evaluate_saved(rundir: RunDir, algo_name: str, algo_config: Any, run: RunConfig, episodes: int,
                   seed: int | None) -> dict:
    """Evaluate the saved policy of the run in `rundir`: deterministic episodes per seed."""
    module, algo_config, env = prepare(algo_name, algo_config, run)
    algo = module.make_algorithm(algo_config, env)
    state = saved_state(rundir, _abstract_init(algo, run))
    keys = eval_keys(run.seed if seed is None else seed, run.seeds)
    returns = jax.jit(over_seeds(lambda s, k: evaluate(env, algo.act, algo.policy(s), k, episodes), (0, 0)))(state, keys)
    return eval_summary(run, episodes, np.asarray(returns).mean(axis=1))

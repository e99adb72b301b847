"""The on-device ("Anakin") runner: one jitted program per chunk of updates, members vmapped.

A member is one training: a seed of one setting of the traced hyperparameters (`algos.base`). A
`train` run has one setting, so its members are its seeds; a sweep has settings x seeds members, setting
s's seed k at index s * seeds + k with seed k's key, so each equals the `train` run of that setting.

The host loop between chunks logs, draws the progress bar, evaluates and checkpoints; nothing else
leaves the device. The chunk program is a `lax.while_loop` whose trip count is an argument, so
chunks of any length share one compilation. With several devices, the seed axis is split over them
with `shard_map`: each device runs its own seeds, vmapped, and no collective is ever emitted (left to
GSPMD, the sharded while-loop deadlocked on forced host devices).
"""

from __future__ import annotations

import functools
import math
import threading
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sparqrl import config as cfg, presets
from sparqrl.algos import Algorithm, evaluate, get_algorithm
from sparqrl.algos.base import EPISODE_COUNT, EPISODE_RETURN_SUM, HParams, hparams_of, traced_fields, with_hparams
from sparqrl.envs import Env, make_env
from sparqrl.envs.custom import program_key
from sparqrl.devices import seed_spread
from sparqrl.runners.programs import Program, build_program, run_once_options, training_options
from sparqrl.runners.rundir import RunDir, open_run_dir, saved_sweep, start_run_dir
from sparqrl.trust import NOTHING, Trust
from sparqrl.runners import sweep
from sparqrl.runners.run_config import RunConfig
from sparqrl.runners.session import (ChunkHook, check_memory, chunk_bounds, eval_summary, notify, program_store, run_session,
                                     saved_state, WholeChunks)


# ---------------------------------------------------------------------------------------------
# Pure building blocks

SEEDS, REPLICATED = PartitionSpec("seeds"), PartitionSpec()  # a program argument split over the devices, or not


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


def update_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """One update's metrics as floats, its episode sums as metrics.csv names them (episode_return, NaN with no
    episode; episodes): what `on_update` hooks are called with."""
    out = {k: float(v) for k, v in metrics.items() if k not in (EPISODE_COUNT, EPISODE_RETURN_SUM)}
    count = float(metrics[EPISODE_COUNT])
    return {**out, "episode_return": float(metrics[EPISODE_RETURN_SUM]) / count if count else float("nan"),
            "episodes": count}


def chunk_program(algo_at: Callable[[HParams], Algorithm], on_update: Callable[[dict], Any] | None = None
                  ) -> Callable[..., tuple[Any, dict[str, jax.Array]]]:
    """`(state [M], hparams [M], n) -> (state [M], metrics [M])`: n updates per member, metrics reduced on
    device. on_update: called on the host with each update's metrics (`update_metrics`) through an unordered
    `jax.debug.callback` (under vmap, one call per member); None: the program has no host callback at all.

    Returns per member: episode_return (mean over episodes finished in the chunk, NaN if none),
    episodes (their count) and the mean of every other metric over the n updates.
    """

    def one_seed(state: Any, hparams: HParams, n: jax.Array) -> tuple[Any, dict[str, jax.Array]]:
        algo = algo_at(hparams)
        shapes = jax.eval_shape(algo.update, state)[1]
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

        def body(carry):
            i, s, sums = carry
            s, metrics = algo.update(s)
            if on_update is not None:
                jax.debug.callback(lambda m: on_update(update_metrics(m)), metrics)
            return i + 1, s, jax.tree.map(jnp.add, sums, metrics)

        _, state, sums = jax.lax.while_loop(lambda c: c[0] < n, body, (jnp.zeros((), jnp.int32), state, zeros))
        count = sums.pop(EPISODE_COUNT)
        total = sums.pop(EPISODE_RETURN_SUM)
        out = {k: v / jnp.maximum(n, 1) for k, v in sums.items()}
        out["episode_return"] = jnp.where(count > 0, total / jnp.maximum(count, 1.0), jnp.nan)
        out["episodes"] = count
        return state, out

    return over_seeds(one_seed, (0, 0, None))


def init_program(algo_at: Callable[[HParams], Algorithm]) -> Callable[[jax.Array, HParams], Any]:
    """`(keys [M], hparams [M]) -> state [M]`."""
    return over_seeds(lambda key, hparams: algo_at(hparams).init(key), (0, 0))


def eval_program(algo_at: Callable[[HParams], Algorithm], env: Env, episodes: int) -> Callable[..., jax.Array]:
    """`(state [M], hparams [M], keys [M]) -> returns [M, episodes]` of the deterministic policy."""

    def one(state: Any, hparams: HParams, key: jax.Array) -> jax.Array:
        algo = algo_at(hparams)
        return evaluate(env, algo.act, algo.policy(state), key, episodes)

    return over_seeds(one, (0, 0, 0))


def algorithm_at(module: Any, config: Any, env: Env) -> Callable[[HParams], Algorithm]:
    """The algorithm of a checked `config` with its traced fields set from `hparams` (tracers)."""
    return lambda hparams: module.make_algorithm(with_hparams(config, hparams), env)


def member_hparams(config: Any, settings: list[dict[str, float]] | None, seeds: int) -> dict[str, np.ndarray]:
    """float32 [settings * seeds] per traced field: each setting's values (the config's for the fields
    it leaves out), repeated for its seeds. No settings: the config's own values for `seeds` members."""
    rows = [{**hparams_of(config), **setting} for setting in (settings or [{}])]
    return {name: np.repeat(np.array([row[name] for row in rows], np.float32), seeds) for name in traced_fields(config)}


def member_names(settings: list[dict[str, float]] | None, seeds: int) -> list[str]:
    """Per member, for messages: "seed k", or a sweep's "lr=0.01 seed k" (member s*seeds+k)."""
    prefixes = [" ".join(f"{k}={v:g}" for k, v in s.items()) + " " for s in settings] if settings else [""]
    return [f"{prefix}seed {k}" for prefix in prefixes for k in range(seeds)]


def static_describe(algo_name: str, config: Any) -> str:
    """What a program closes over: the config without its traced fields (inputs, not constants), so that
    runs that differ only in those share their stored programs (`programs`)."""
    return f"{algo_name} {with_hparams(config, {name: None for name in traced_fields(config)})!r}"


def per_device(fn: Callable, sharding: NamedSharding, in_specs: tuple, out_specs: Any) -> Callable:
    """Run `fn` (batched over a leading seed axis) on each device's own slice of the seeds."""
    return jax.shard_map(fn, mesh=sharding.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


def seed_sharding(seeds: int) -> NamedSharding:
    """Shard the seed axis over as many devices as divide the number of seeds."""
    devices = jax.devices()
    n = math.gcd(seeds, len(devices))
    return NamedSharding(Mesh(np.array(devices[:n]), ("seeds",)), SEEDS)


def compiling_line(env: str, cache: bool, storable: bool) -> str:
    """What `AnakinDriver` says before it compiles: why this run compiles, and whether the next one will."""
    why = ("first time for this configuration; later runs load it from the cache" if cache and storable
           else "the compile cache is off (--no-compile-cache): every run compiles" if not cache
           else "an environment object, not a name: its programs are not cached between runs")
    return f"compiling the training program for {env} ({why})"


def eval_keys(seed: int, seeds: int) -> jax.Array:
    """Fixed evaluation keys, so `sparqrl eval` reproduces the final evaluation."""
    return jax.random.split(jax.random.fold_in(jax.random.PRNGKey(seed), 0x5EED), seeds)


def member_keys(keys: jax.Array, members: int) -> jax.Array:
    """Seed keys [seeds] repeated for each setting: member s * seeds + k gets key k."""
    return jnp.tile(keys, (members // keys.shape[0], 1))


def run_keys(seed: int, seeds: int, members: int) -> tuple[jax.Array, jax.Array]:
    """(training keys, evaluation keys) [members] of a run (`member_keys`, `eval_keys`), computed by one program
    compiled at XLA's lowest optimisation (it runs once): op by op, JAX compiles a program per random op (seed,
    split, fold_in, tile: 0.30-0.36 s of CPU on the 2-core machine against 0.11 s, issue 33). The same bits."""
    def keys() -> tuple[jax.Array, jax.Array]:
        return (member_keys(jax.random.split(jax.random.PRNGKey(seed), seeds), members),
                member_keys(eval_keys(seed, seeds), members))

    return jax.jit(keys).lower().compile(run_once_options())()


class Background:
    """`fn()` on a thread of its own (a compile: XLA releases the GIL while it works)."""

    def __init__(self, fn: Callable[[], Any], name: str):
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._value = fn()
        except BaseException as error:  # noqa: BLE001 - raised again by `result`, in the caller's thread
            self._error = error

    def wait(self) -> None:
        self._thread.join()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> Any:
        """`fn`'s value once it has returned; what it raised, raised here."""
        self.wait()
        if self._error is not None:
            raise self._error
        return self._value


def host_metrics(metrics: dict[str, jax.Array]) -> dict[str, np.ndarray]:
    """A chunk's metrics fetched to the host, as NumPy arrays."""
    return {k: np.asarray(v) for k, v in jax.device_get(metrics).items()}


class QueuedChunks(WholeChunks):
    """A whole-chunk driver that queues each chunk before the host works on the one before, called on a thread of
    its own: on a GPU the call returns only when the chunk is done (XLA:GPU's host drives the while loop, reading
    its condition back each update), and the host's work between chunks (logging, evaluation, checkpoints: 7 s of
    a 4096-seed run on an H200) then stalled the device instead of overlapping it; on the CPU the call returns at
    once anyway. The driver sets `bounds`, `_inflight = None` and `_trips = {}`, and says how a chunk is called."""

    bounds: list[int]
    _inflight: Background | None  # the chunk queued last: (state, metrics) once called
    _trips: dict[tuple[int, bool], tuple[jax.Array, ...]]  # `_place_trips`' arrays, by (updates, last chunk)

    def _place_trips(self, updates: int, last: bool) -> tuple[jax.Array, ...]:
        """The chunk program's trip arguments on the devices (placed once per length, not per chunk)."""
        raise NotImplementedError

    def _call_chunk(self, state: Any, trips: tuple[jax.Array, ...]) -> tuple[Any, Any]:
        """The chunk program called on `state`: (state, metrics), on the devices."""
        raise NotImplementedError

    def _before_next(self, chunk: int, state: Any) -> None:
        """Called with chunk `chunk`'s result before the next chunk is queued (`run_chunk`); nothing here."""

    def _launch(self, chunk: int, state: Any) -> None:
        if chunk < len(self.bounds):
            n = self.bounds[chunk] - (self.bounds[chunk - 1] if chunk else 0)
            last = chunk == len(self.bounds) - 1
            if (n, last) not in self._trips:
                self._trips[n, last] = self._place_trips(n, last)
            trips = self._trips[n, last]
            self._inflight = Background(lambda: self._call_chunk(state, trips), "sparqrl-chunk")

    def start(self, state: Any, updates_done: int, stop: Any) -> None:
        self._launch(self.bounds.index(updates_done) + 1 if updates_done else 0, state)

    def run_chunk(self, chunk: int) -> tuple[Any, dict[str, np.ndarray]]:
        state, metrics = self._inflight.result()
        self._before_next(chunk, state)
        self._launch(chunk + 1, state)  # queued before the host logs, evaluates and checkpoints this one
        return state, host_metrics(metrics)


# ---------------------------------------------------------------------------------------------
# The run


class AnakinDriver(QueuedChunks):
    """The on-device run for the shared session loop (`sparqrl.runners.session`)."""

    def __init__(self, algo_at: Callable[[HParams], Algorithm], env: Env, run: RunConfig, describe: str,
                 hparams: dict[str, np.ndarray], sweep: Callable[..., dict] | None = None,
                 settings: list[dict[str, float]] | None = None,
                 on_update: Callable[[dict], Any] | None = None):
        """`hparams`: [members] per traced field, members a multiple of run.seeds (`member_hparams`);
        `sweep(rundir, final [members])` writes a sweep's own outputs and returns its summary fields;
        `settings`: a sweep's, which name its members in messages.
        on_update: `chunk_program`'s (a program with it is never stored: a host callback cannot be)."""
        self.algo_at, self.env, self.run, self.sweep, self.on_update = algo_at, env, run, sweep, on_update
        self.algo = algo_at({})  # at the config's own values: the static facts (update count, summary)
        # what the programs close over; a user's own env by its code too (None: a local object, never stored)
        self.env_key = program_key(run.env)
        self.describe = f"{describe} env={self.env_key} eval_episodes={run.eval_episodes}"
        if on_update is not None:  # never the stored program without its callback
            self.describe += " on_update"
        self.bounds = chunk_bounds(self.algo.num_updates, run.chunks)
        self.env_steps_per_update = self.algo.env_steps_per_update
        self.compile_time_s = 0.0
        self.startup_s = 0.0
        self.programs_loaded = 0  # of the 3 programs, how many came traced from the cache (`programs`)
        self._said_compiling = False
        self._evaluate: Program | None = None
        self._eval_build: Background | None = None  # the evaluation program compiling on a thread (`build`)
        self._eval_started: tuple[Any, Any] | None = None  # (state, its evaluation: `_before_next`)
        self._init_build: Background | None = None  # the init program compiling on a thread (`build`)
        self._abstract: Any = None  # `abstract_state`'s
        self.members = len(next(iter(hparams.values()))) if hparams else run.seeds
        self.member_names = member_names(settings, run.seeds)
        self.sharding = seed_sharding(self.members)
        self.replicated = NamedSharding(self.sharding.mesh, REPLICATED)
        # (placed from NumPy: a jnp array first would compile a copy program on a cold start, as jnp.int32 would)
        self.hparams = jax.device_put({k: np.asarray(v) for k, v in hparams.items()}, self.sharding)
        self.keys, self.eval_keys = jax.device_put(run_keys(run.seed, run.seeds, self.members), self.sharding)
        self._inflight: Background | None = None
        self._trips: dict[tuple[int, bool], tuple[jax.Array, ...]] = {}

    def abstract_state(self) -> Any:
        """The state's shapes, dtypes and shardings (traced once: the memory check, the programs and a restore)."""
        if self._abstract is None:
            abstract = jax.eval_shape(jax.vmap(self.algo.init), self.keys)
            self._abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=self.sharding),
                                          abstract)
        return self._abstract

    def build(self) -> None:
        """Compile the programs training starts with (init, chunk) ahead of time, so compile time is measured
        apart. A later run of the same configuration loads them traced (`programs`) and compiled (XLA's cache).

        The chunk program, the longest to compile, is traced first (on the state's shapes, `abstract_state`);
        once it is lowered, XLA's compile of it (which releases the GIL) runs beside a thread that builds the init
        program and then the evaluation program, so that neither adds to the time before training on two cores
        (issue 33: the init program's build, ~0.8 s of CPU on the 2-core machine, was before the chunk's, and the
        evaluation program's ~1.5 s beside it). The first evaluation waits only for what is left of the
        evaluation's build: that wait is in compile_time_s.

        The init program runs once, so on the CPU it is compiled at XLA's lowest optimisation (`run_once_options`).
        The evaluation program is not: it ran 2.4-3x slower so (PPO on CartPole and Breakout-MinAtar), which a run
        with many or long evaluations would pay more than the 0.7-1 s of compilation saved."""
        start = time.perf_counter()
        try:
            self._chunk = self._build("chunk", chunk_program(self.algo_at, self.on_update), (SEEDS, SEEDS, REPLICATED),
                                      (SEEDS, SEEDS), self.abstract_state(), self.hparams,
                                      jax.device_put(np.int32(1), self.replicated), options=training_options(),
                                      on_compile=self._say_compiling, on_lowered=self._start_side_builds)
        except BaseException:
            self.close()  # no build left running into the error's report
            raise
        build, self._init_build = self._init_build, None
        self._init = build.result()
        self.programs_loaded += self._init.loaded + self._chunk.loaded
        self.compile_time_s += time.perf_counter() - start

    def _start_side_builds(self) -> None:
        """The init program's build, then the evaluation program's, on a thread (`build`)."""
        if self._init_build is None and self._evaluate is None and self._eval_build is None:
            self._init_build = Background(self._init_then_evaluation, "sparqrl-init-compile")

    def _init_then_evaluation(self) -> Program:
        init = self._build("init", init_program(self.algo_at), (SEEDS, SEEDS), SEEDS, self.keys, self.hparams,
                           options=run_once_options(), on_compile=self._say_compiling)
        self._eval_build = Background(self._evaluation_program, "sparqrl-eval-compile")
        return init

    def _build(self, name: str, fn: Callable, in_specs: tuple, out_specs: Any, *args: Any, options: Any = None,
               on_compile: Callable[[], None] | None = None, on_lowered: Callable[[], None] | None = None) -> Program:
        """`fn` (batched over the seed axis) on each device's own seeds, compiled or loaded (`build_program`); the
        caller counts it in programs_loaded (on its own thread: the evaluation program builds beside the chunk)."""
        store = program_store() if self.run.compile_cache and self.env_key is not None else None
        return build_program(name, per_device(fn, self.sharding, in_specs, out_specs), args, describe=self.describe,
                             store=store, compiler_options=options, on_compile=on_compile, on_lowered=on_lowered)

    def _say_compiling(self) -> None:
        """One line before the training programs compile where the cache does not hold them (a Brax env's
        take about a minute on a CPU, in silence otherwise); none with --no-progress."""
        if self._said_compiling or not self.run.progress:
            return
        self._said_compiling = True
        notify(compiling_line(self.run.env, self.run.compile_cache, self.env_key is not None))

    def init_state(self) -> Any:
        return self._init(self.keys, self.hparams)

    def _place_trips(self, updates: int, last: bool) -> tuple[jax.Array, ...]:
        return (jax.device_put(np.int32(updates), self.replicated),)  # replicated over devices, as the program expects

    def _call_chunk(self, state: Any, trips: tuple[jax.Array, ...]) -> tuple[Any, Any]:
        return self._chunk(state, self.hparams, *trips)

    def _evaluation_program(self) -> Program:
        return self._build("evaluate", eval_program(self.algo_at, self.env, self.run.eval_episodes),
                           (SEEDS, SEEDS, SEEDS), SEEDS, self.abstract_state(), self.hparams, self.eval_keys)

    def chunk(self, state: Any, updates: int) -> tuple[Any, dict[str, np.ndarray]]:
        """`updates` updates of every member from `state` (host arrays), nothing queued after it: a sweep slice's
        Ray task (`sweep_workers.SweepSlice`)."""
        state, metrics = self._call_chunk(jax.device_put(state, self.sharding), self._place_trips(updates, True))
        return state, host_metrics(metrics)

    def evaluate(self, state: Any) -> np.ndarray:
        started, self._eval_started = self._eval_started, None
        if started is not None and started[0] is state:
            running = started[1]
            return np.asarray(running.result() if isinstance(running, Background) else running)
        return np.asarray(self._evaluation()(state, self.hparams, self.eval_keys))

    def _evaluation(self) -> Program:
        """The evaluation program; the first call waits for what is left of its build (or builds it: no `build`),
        which is compile time."""
        if self._evaluate is None:
            start = time.perf_counter()
            build, self._eval_build = self._eval_build, None
            self._evaluate = build.result() if build is not None else self._evaluation_program()
            self.programs_loaded += self._evaluate.loaded
            self.compile_time_s += time.perf_counter() - start
        return self._evaluate

    def _before_next(self, chunk: int, state: Any) -> None:
        """Start the evaluation due after this chunk before the next chunk is queued: queued after that chunk it
        waited for it (issue 33: 0.18 s per evaluation on the 2-core CPU at 8 seeds, where the chunk takes both
        cores, and 1.42 s in all at 1024 seeds on an H200), which the run's time split counted as evaluation. On
        the CPU the call only queues the program, so it runs first; on a GPU the call returns when the evaluation
        is done, so it is made on a thread of its own, beside the next chunk's. Not before the program is built
        (the first evaluation then waits for its build and the queued chunk, as before)."""
        if not self.run.evaluates_after(chunk, len(self.bounds)) or chunk == len(self.bounds) - 1:
            return
        if self._evaluate is None and (self._eval_build is None or not self._eval_build.done()):
            return
        program, hparams, keys = self._evaluation(), self.hparams, self.eval_keys
        if self.sharding.mesh.devices.flat[0].platform == "cpu":
            self._eval_started = (state, program(state, hparams, keys))
        else:
            self._eval_started = (state, Background(lambda: program(state, hparams, keys), "sparqrl-eval"))

    def summary(self) -> dict[str, Any]:
        used = len(self.sharding.mesh.devices.flat)
        return {"devices_used": used, "seed_spread": seed_spread(used), "programs_loaded": self.programs_loaded,
                **self.algo.summary}

    def finish(self, rundir: RunDir, final: np.ndarray) -> dict[str, Any]:
        if self.sweep is None:
            return {}
        # one program for every setting: the chunk program above, built once with all members
        return {"compilations": 1, **self.sweep(rundir, final)}

    def close(self) -> None:
        # nothing left running into the process's exit: the chunk queued last, and the compiles of a run stopped
        # before evaluating (the init's thread starts the evaluation's: waited for first)
        started, self._eval_started = self._eval_started, None
        if started is not None and isinstance(started[1], Background):
            started[1].wait()
        for name in ("_inflight", "_init_build", "_eval_build"):
            pending = getattr(self, name)
            setattr(self, name, None)
            if pending is not None:
                pending.wait()


def prepare(algo_name: str, algo_config: Any, run: RunConfig) -> tuple[Any, Any, Env]:
    """Every check that can fail on user input, before anything is compiled or written."""
    module = get_algorithm(algo_name)
    run.validate()
    cfg.check_numbers(algo_config)
    env = make_env(run.env)
    algo_config = algo_config.validate(env)  # resolved for the env (e.g. a sparse preset's sparsities)
    return module, algo_config, env


def make_driver(algo_name: str, module: Any, algo_config: Any, env: Env, run: RunConfig,
                settings: list[dict[str, float]] | None = None, on_update: Callable[[dict], Any] | None = None
                ) -> AnakinDriver:
    """The driver of a checked config; `settings` (a sweep's) x run.seeds members, else run.seeds; on_update:
    `chunk_program`'s."""
    sweep_outputs = None
    if settings is not None:
        sweep_outputs = functools.partial(sweep.write_outputs, algo_name=algo_name, algo_config=algo_config, run=run,
                                          settings=settings)
    # a user's torso by its code too, keyed as a jax:MODULE:ATTR env's is: an edited torso is traced again
    torsos = "".join(f" torso={program_key('jax:' + spec)}" for _, spec in algo_config.network_references())
    return AnakinDriver(algorithm_at(module, algo_config, env), env, run,
                        static_describe(algo_name, algo_config) + torsos,
                        member_hparams(algo_config, settings, run.seeds), sweep_outputs, settings, on_update)


def train(algo_name: str, algo_config: Any, run: RunConfig, *, settings: list[dict[str, float]] | None = None,
          on_chunk: ChunkHook | None = None, on_update: Callable[[dict], Any] | None = None) -> dict:
    """Train from scratch (every setting of a sweep x run.seeds); returns the summary (also written to
    `run.out/summary.json`). on_update: `chunk_program`'s."""
    module, algo_config, env = prepare(algo_name, algo_config, run)
    if settings is not None:
        check_settings(algo_config, env, settings)
    driver = make_driver(algo_name, module, algo_config, env, run, settings, on_update)
    check_memory(driver.abstract_state(), run)
    if run.preset not in ("auto", "none"):  # said once every check has passed
        notify(presets.describe(run.preset, algo_config, run.env))
    rundir = start_run_dir(algo_name, algo_config, run, sweep=settings)
    return run_session(rundir, run, algo_name, driver, resuming=False, on_chunk=on_chunk)


def resume(rundir: RunDir, algo_name: str, algo_config: Any, run: RunConfig, *,
           on_chunk: ChunkHook | None = None, on_update: Callable[[dict], Any] | None = None) -> dict:
    """Continue the run in `rundir` from its newest intact checkpoint, with its saved configuration."""
    module, algo_config, env = prepare(algo_name, algo_config, run)
    driver = make_driver(algo_name, module, algo_config, env, run, saved_sweep(rundir.path), on_update)
    return run_session(rundir, run, algo_name, driver, resuming=True, on_chunk=on_chunk)


def check_settings(algo_config: Any, env: Env, settings: list[dict[str, float]]) -> None:
    """Every setting of a sweep passes the config's own checks (one line naming the field and value)."""
    for setting in settings:
        with_hparams(algo_config, setting).validate(env)


def load_state(out: str | Path, trust: Trust = NOTHING) -> tuple[str, Any, RunConfig, Env, AnakinDriver, Any]:
    """The saved run in `out`: its configs, environment, driver (nothing compiled) and newest intact state.
    `trust`: the modules the caller names (`sparqrl.trust`)."""
    rundir, algo_name, algo_config, run = open_run_dir(out, "DIR", trust)
    module, algo_config, env = prepare(algo_name, algo_config, run)
    driver = make_driver(algo_name, module, algo_config, env, run, saved_sweep(rundir.path))
    state = saved_state(rundir, driver.abstract_state())
    return algo_name, algo_config, run, env, driver, state


def evaluate_saved(rundir: RunDir, algo_name: str, algo_config: Any, run: RunConfig, episodes: int,
                   seed: int | None) -> dict:
    """Evaluate the saved policy of the run in `rundir`: deterministic episodes per member."""
    module, algo_config, env = prepare(algo_name, algo_config, run)
    driver = make_driver(algo_name, module, algo_config, env, run, saved_sweep(rundir.path))
    state = saved_state(rundir, driver.abstract_state())
    keys = member_keys(eval_keys(run.seed if seed is None else seed, run.seeds), driver.members)
    returns = jax.jit(eval_program(driver.algo_at, env, episodes))(state, driver.hparams, keys)
    return eval_summary(run, episodes, np.asarray(returns).mean(axis=1))

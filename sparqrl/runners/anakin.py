"""The on-device ("Anakin") runner: one jitted program per chunk of updates, seeds vmapped.

The host loop between chunks logs, draws the progress bar, evaluates and checkpoints; nothing else
leaves the device. The chunk program is a `lax.while_loop` whose trip count is an argument, so
chunks of any length share one compilation. With several devices, the seed axis is split over them
with `shard_map`: each device runs its own seeds, vmapped, and no collective is ever emitted (left to
GSPMD, the sharded while-loop deadlocked on forced host devices).
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import signal
import time
from pathlib import Path
from typing import Any, Callable, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sparqrl import config as cfg
from sparqrl.algos import Algorithm, evaluate, get_algorithm
from sparqrl.algos.base import EPISODE_COUNT, EPISODE_RETURN_SUM
from sparqrl.envs import Env, make_env, validate_env_name
from sparqrl.runners.checkpoint import Checkpointer, abstract_like
from sparqrl.telemetry import EnergyMeter, RunLogger, make_progress, plot_returns, validate_country


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """How a run is driven; the algorithm's hyperparameters live in its own Config."""

    env: str = "CartPole-v1"
    """Environment: a gymnax id (e.g. CartPole-v1, Breakout-MinAtar) or brax:NAME (e.g. brax:ant), both on
    device; or gym:NAME (e.g. gym:HalfCheetah-v5), a Gymnasium environment stepped on the host (td3, sac)."""
    seeds: int = 1
    """Independent seeds trained at once in one vmapped program (sharded over devices)."""
    seed: int = 0
    """Base seed; the seeds' keys are split from it."""
    out: str = "runs/latest"
    """Output directory (summary.json, metrics.csv, TensorBoard, returns.png, checkpoint/, config.json)."""
    overwrite: bool = False
    """Replace an existing, non-empty output directory (otherwise that is an error)."""
    chunks: int = 50
    """Number of host-loop chunks: progress, logging and checkpoints happen between chunks."""
    eval_every: int = 10
    """Evaluate the deterministic policy every this many chunks (0: only at the end)."""
    eval_episodes: int = 10
    """Deterministic evaluation episodes per seed."""
    checkpoint_every: int = 5
    """Save a checkpoint every this many chunks (and always at the end and on Ctrl-C)."""
    progress: bool = True
    """Draw the progress bar."""
    energy: bool = True
    """Measure the run's energy and CO2 with codecarbon's offline tracker (never online): summary.json gets
    energy_kwh, co2_kg and energy_method (how power was read: RAPL, NVML, or codecarbon's estimate), and
    emissions.csv one row per session. Costs about 2 s once per process, then milliseconds."""
    country: str = "USA"
    """3-letter ISO code of the country whose electricity grid powers the run (e.g. USA, FRA, DEU, IND):
    co2_kg = energy_kwh x its carbon intensity from codecarbon's offline data, so CO2 scales with it."""

    # ---- the actor-learner runner (gym:NAME environments) ----
    actors: int = 1
    """Actors, each stepping its own seeds × num_envs host environments."""
    actor_precision: Literal["fp32", "bf16", "fp16", "int8"] = "fp32"
    """Precision of the policy copy actors act with (ActorQ): int8 (symmetric weights, activations quantized
    per call, ONNX Runtime integer kernels), fp16/bf16 (16-bit weights), fp32. The learner trains in fp32."""
    quant_granularity: Literal["channel", "tensor"] = "channel"
    """int8 weight scales: one per output channel, or one per tensor (ActorQ / PyTorch dynamic quantization)."""
    backend: Literal["auto", "inline", "ray"] = "auto"
    """Where actors run: inline (this process, one request at a time: debugging, tests), ray (one process per
    actor), auto (ray when actors > 1)."""
    ray_address: str | None = None
    """Connect to this existing Ray cluster (e.g. auto or ray://host:10001) instead of starting a local one."""
    fragment_steps: int = 10
    """Env steps per environment in one fragment an actor sends (the learner learns from it in one call)."""
    publish_every: int = 1
    """Publish a new policy copy every this many learner updates (fragments learned), once per version."""
    in_flight: int = 2
    """Collect requests in flight per actor: bounds the data waiting for the learner (backpressure)."""

    @property
    def resolved_backend(self) -> str:
        return ("ray" if self.actors > 1 else "inline") if self.backend == "auto" else self.backend

    def validate(self) -> None:
        validate_env_name(self.env)
        for name in ("seeds", "chunks", "eval_episodes", "checkpoint_every"):
            cfg.require(getattr(self, name) >= 1, name, getattr(self, name), "must be >= 1")
        cfg.require(self.eval_every >= 0, "eval_every", self.eval_every, "must be >= 0")
        cfg.require(bool(self.out), "out", self.out, "must be a directory path")
        validate_country(self.country, "country")
        for name in ("actors", "fragment_steps", "publish_every", "in_flight"):
            cfg.require(isinstance(getattr(self, name), int) and getattr(self, name) >= 1, name, getattr(self, name),
                        "must be an int >= 1")
        cfg.one_of("actor_precision", self.actor_precision, ("fp32", "bf16", "fp16", "int8"))
        cfg.one_of("quant_granularity", self.quant_granularity, ("channel", "tensor"))
        cfg.one_of("backend", self.backend, ("auto", "inline", "ray"))
        cfg.require(self.ray_address is None or self.resolved_backend == "ray", "ray_address", self.ray_address,
                    f"needs the ray backend (backend is {self.backend!r} with {self.actors} actor(s))")


class RunInterrupted(Exception):
    """Raised after Ctrl-C / SIGTERM once a resumable checkpoint has been written."""


# ---------------------------------------------------------------------------------------------
# Pure building blocks


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

    return jax.vmap(one_seed, in_axes=(0, None))


def per_device(fn: Callable, sharding: NamedSharding, in_specs: tuple, out_specs: Any) -> Callable:
    """Run `fn` (batched over a leading seed axis) on each device's own slice of the seeds."""
    return jax.shard_map(fn, mesh=sharding.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


def seed_sharding(seeds: int) -> NamedSharding:
    """Shard the seed axis over as many devices as divide the number of seeds."""
    devices = jax.devices()
    n = math.gcd(seeds, len(devices))
    return NamedSharding(Mesh(np.array(devices[:n]), ("seeds",)), PartitionSpec("seeds"))


def chunk_bounds(num_updates: int, chunks: int) -> list[int]:
    """Cumulative update counts at the end of each chunk (as even as possible)."""
    chunks = min(chunks, num_updates)
    return [round((i + 1) * num_updates / chunks) for i in range(chunks)]


def eval_keys(seed: int, seeds: int) -> jax.Array:
    """Fixed evaluation keys, so `sparqrl eval` reproduces the final evaluation."""
    return jax.random.split(jax.random.fold_in(jax.random.PRNGKey(seed), 0x5EED), seeds)


# ---------------------------------------------------------------------------------------------
# The run


@dataclasses.dataclass
class _Compiled:
    init: Any
    chunk: Any
    evaluate: Any
    compile_time_s: float


def _build(algo: Algorithm, env: Env, run: RunConfig, sharding: NamedSharding, keys: jax.Array) -> _Compiled:
    """Compile every program the run needs ahead of time, so compile time is measured apart."""
    start = time.perf_counter()
    seeds, replicated = PartitionSpec("seeds"), PartitionSpec()
    init = jax.jit(per_device(jax.vmap(algo.init), sharding, (seeds,), seeds)).lower(keys).compile()
    abstract = jax.eval_shape(jax.vmap(algo.init), keys)
    abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), abstract)
    chunk_fn = per_device(chunk_program(algo), sharding, (seeds, replicated), (seeds, seeds))
    chunk = jax.jit(chunk_fn).lower(abstract, jnp.int32(1)).compile()

    def eval_all(state, keys):
        policy = jax.vmap(algo.policy)(state)
        return jax.vmap(lambda p, k: evaluate(env, algo.act, p, k, run.eval_episodes))(policy, keys)

    evaluate_c = jax.jit(per_device(eval_all, sharding, (seeds, seeds), seeds)).lower(abstract, keys).compile()
    return _Compiled(init, chunk, evaluate_c, time.perf_counter() - start)


def _prepare(algo_name: str, algo_config: Any, run: RunConfig) -> tuple[Any, Any, Env]:
    """Every check that can fail on user input, before anything is compiled or written."""
    module = get_algorithm(algo_name)
    run.validate()
    env = make_env(run.env)
    algo_config = algo_config.validate(env)  # resolved for the env (e.g. a sparse preset's sparsities)
    return module, algo_config, env


def start_run_dir(algo_name: str, algo_config: Any, run: RunConfig) -> Path:
    """The empty output directory of a new run, holding its resolved config.json. An existing run there
    is an error unless `run.overwrite` (both runners call this after every input check)."""
    out = Path(run.out)
    if out.exists() and any(out.iterdir()):
        cfg.require(
            run.overwrite, "out", run.out,
            "already holds a run; pass --overwrite to replace it or --resume DIR to continue it",
        )
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    data = {"algo": algo_name, "run": cfg.to_dict(run), "config": cfg.to_dict(algo_config)}
    (out / "config.json").write_text(json.dumps(data, indent=2, sort_keys=True))
    return out


def load_config(out: Path) -> tuple[str, Any, RunConfig]:
    path = out / "config.json"
    cfg.require(path.exists(), "resume", str(out), "must be the output directory of an earlier run (no config.json)")
    data = json.loads(path.read_text())
    module = get_algorithm(data["algo"])
    return data["algo"], cfg.from_dict(module.Config, data["config"]), cfg.from_dict(RunConfig, data["run"])


def train(algo_name: str, algo_config: Any, run: RunConfig, *, on_chunk: Callable[[int], None] | None = None) -> dict:
    """Train from scratch; returns the summary (also written to `run.out/summary.json`)."""
    module, algo_config, env = _prepare(algo_name, algo_config, run)
    out = start_run_dir(algo_name, algo_config, run)
    return _loop(module, algo_name, algo_config, run, env, out, resume_meta=None, on_chunk=on_chunk)


def resume(out_dir: str | Path, *, on_chunk: Callable[[int], None] | None = None) -> dict:
    """Continue the run in `out_dir` from its last checkpoint, with its saved configuration."""
    out = Path(out_dir)
    algo_name, algo_config, run = load_config(out)
    module, algo_config, env = _prepare(algo_name, algo_config, run)
    return _loop(module, algo_name, algo_config, run, env, out, resume_meta={}, on_chunk=on_chunk)


def _loop(module, algo_name, algo_config, run, env, out, *, resume_meta, on_chunk) -> dict:
    """One session of a run (fresh or resumed), measured whole (compilation included) by an energy meter
    whose own start-up is left out of wall_time_s. The meter stops on every way out."""
    meter = EnergyMeter(out, run.country, run.energy).start()
    try:
        return _session(module, algo_name, algo_config, run, env, out, meter,
                        resume_meta=resume_meta, on_chunk=on_chunk)
    finally:
        meter.stop()  # idempotent and never raises; the normal path has stopped it before the summary


def _session(module, algo_name, algo_config, run, env, out, meter, *, resume_meta, on_chunk) -> dict:
    wall_start = time.perf_counter()
    algo: Algorithm = module.make_algorithm(algo_config, env)
    sharding = seed_sharding(run.seeds)
    keys = jax.device_put(jax.random.split(jax.random.PRNGKey(run.seed), run.seeds), sharding)
    compiled = _build(algo, env, run, sharding, keys)
    checkpointer = Checkpointer(out / "checkpoint")
    bounds = chunk_bounds(algo.num_updates, run.chunks)
    steps_per_seed = algo.num_updates * algo.env_steps_per_update

    state = compiled.init(keys)
    replicated = NamedSharding(sharding.mesh, PartitionSpec())
    eval_keys_sharded = jax.device_put(eval_keys(run.seed, run.seeds), sharding)
    done_chunks, prior = 0, {"wall_time_s": 0.0, "compile_time_s": 0.0}
    if resume_meta is not None:
        state, meta = checkpointer.restore(abstract_like(state))
        done_chunks = meta["chunks_done"]
        prior = {k: meta[k] for k in prior}
        meter.include_prior(meta)  # the earlier sessions' energy and CO2
    updates_done = bounds[done_chunks - 1] if done_chunks else 0
    logger = RunLogger(
        out,
        resume_chunk=done_chunks if resume_meta is not None else None,
        resume_step=updates_done * algo.env_steps_per_update + 1 if resume_meta is not None else None,
    )
    compile_time = prior["compile_time_s"] + compiled.compile_time_s

    def elapsed() -> float:
        return prior["wall_time_s"] + time.perf_counter() - wall_start

    def meta(chunks_done: int) -> dict:
        # running energy totals, like wall time: a resumed run's summary covers all its sessions
        return {"chunks_done": chunks_done, "wall_time_s": elapsed(), "compile_time_s": compile_time,
                **meter.totals()}

    stop = StopRequests()
    progress = make_progress(run.progress)
    saved_at = done_chunks
    session_start = (updates_done * algo.env_steps_per_update, time.perf_counter())
    eval_returns = None
    latest = (done_chunks, state)

    def launch(chunk: int, state: Any) -> tuple[Any, dict[str, jax.Array]]:
        n = bounds[chunk] - (bounds[chunk - 1] if chunk else 0)
        # the trip count is placed as the compiled program expects it (replicated over devices)
        return compiled.chunk(state, jax.device_put(jnp.int32(n), replicated))
    try:
        with progress:
            task = progress.add_task(f"{algo_name} {run.env}", total=steps_per_seed, sps=0.0, ret="-")
            progress.update(task, completed=updates_done * algo.env_steps_per_update)
            inflight = launch(done_chunks, state) if done_chunks < len(bounds) else None
            for chunk in range(done_chunks, len(bounds)):
                stop.check()
                chunk_state, metrics = inflight
                # queue the next chunk before the host works on this one, so logging, evaluation
                # and checkpointing overlap with training instead of stalling the device
                inflight = launch(chunk + 1, chunk_state) if chunk + 1 < len(bounds) else None
                per_seed = {k: np.asarray(v) for k, v in jax.device_get(metrics).items()}
                updates_done = bounds[chunk]
                is_last = chunk == len(bounds) - 1
                if is_last or (run.eval_every and (chunk + 1) % run.eval_every == 0):
                    eval_returns = np.asarray(compiled.evaluate(chunk_state, eval_keys_sharded))
                    per_seed["eval_return"] = eval_returns.mean(axis=1)
                env_step = updates_done * algo.env_steps_per_update
                logger.log(chunk + 1, env_step, elapsed(), per_seed)
                # Only a logged chunk may be checkpointed on Ctrl-C: a resume truncates the CSV to its
                # checkpoint, so a row past it is redone, but a row missing before it would be lost.
                latest = (chunk + 1, chunk_state)  # one assignment: an interrupt sees a consistent pair
                session_time = max(time.perf_counter() - session_start[1], 1e-9)
                progress.update(
                    task,
                    completed=env_step,
                    sps=(env_step - session_start[0]) * run.seeds / session_time,
                    ret=_fmt_return(per_seed),
                )
                if is_last or (chunk + 1) % run.checkpoint_every == 0:
                    checkpointer.save(chunk + 1, chunk_state, meta(chunk + 1))
                    saved_at = chunk + 1
                if on_chunk is not None:
                    on_chunk(chunk + 1)
    except KeyboardInterrupt:
        done_chunks, state = latest
        if saved_at != done_chunks:
            checkpointer.save(done_chunks, state, meta(done_chunks))
        raise RunInterrupted(
            f"interrupted after {bounds[done_chunks - 1] * algo.env_steps_per_update if done_chunks else 0} "
            f"env steps per seed; checkpoint saved; continue with: sparqrl train --resume {out}"
        ) from None
    finally:
        stop.close()
        logger.close()
        checkpointer.close()

    state = latest[1]
    if eval_returns is None:  # resumed a run that had already finished
        eval_returns = np.asarray(compiled.evaluate(state, eval_keys_sharded))
    wall = elapsed()
    energy = meter.stop()
    final = eval_returns.mean(axis=1)
    total_steps = steps_per_seed * run.seeds
    summary = {
        "algo": algo_name,
        "env": run.env,
        "steps": steps_per_seed,
        "seeds": run.seeds,
        "final_return_mean": float(final.mean()),
        "final_return_std": float(final.std()),
        "final_return_per_seed": [float(x) for x in final],
        "eval_episodes": run.eval_episodes,
        "wall_time_s": wall,
        "env_steps_per_s": total_steps / max(wall - compile_time, 1e-9),
        "compile_time_s": compile_time,
        "device": _device_name(),
        "devices_used": len(sharding.mesh.devices.flat),
        **energy,
        **algo.summary,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_returns(out / "metrics.csv", out / "returns.png", f"{algo_name} on {run.env}, {run.seeds} seed(s)")
    return summary


class StopRequests:
    """Ctrl-C and SIGTERM become a flag that a runner checks at safe points (`check` raises
    KeyboardInterrupt there). Raised anywhere else, the interrupt could land inside TensorBoard's or
    orbax's writers (and hang the final close) or, on the host runner, while donated buffers are in
    flight. Both signals are taken over explicitly: a process started with SIGINT ignored (as
    pytest-xdist workers start their children) would otherwise run on through Ctrl-C."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = {sig: signal.signal(sig, self._request) for sig in (signal.SIGINT, signal.SIGTERM)}

    def _request(self, signum: int, frame: Any) -> None:  # noqa: ARG002 - signal handler signature
        self.requested = True

    def check(self) -> None:
        if self.requested:
            raise KeyboardInterrupt

    def close(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _fmt_return(per_seed: dict[str, np.ndarray]) -> str:
    values = per_seed["episode_return"]
    return "-" if np.all(np.isnan(values)) else f"{np.nanmean(values):.1f}"


def _device_name() -> str:
    device = jax.devices()[0]
    return f"{device.platform}:{getattr(device, 'device_kind', '')} x{jax.device_count()}"


def load_state(out: Path) -> tuple[str, Any, RunConfig, Env, Algorithm, Any]:
    """The saved run in `out`: its configs, environment, algorithm and last checkpointed state."""
    algo_name, algo_config, run = load_config(out)
    module, algo_config, env = _prepare(algo_name, algo_config, run)
    algo = module.make_algorithm(algo_config, env)
    keys = jax.random.split(jax.random.PRNGKey(run.seed), run.seeds)
    abstract = jax.eval_shape(jax.vmap(algo.init), keys)
    checkpointer = Checkpointer(out / "checkpoint")
    try:
        state, _ = checkpointer.restore(abstract)
    finally:
        checkpointer.close()
    return algo_name, algo_config, run, env, algo, state


def evaluate_saved(out_dir: str | Path, episodes: int | None = None, seed: int | None = None) -> dict:
    """Evaluate the saved policy of the run in `out_dir`: deterministic episodes per seed."""
    out = Path(out_dir)
    cfg.require((out / "config.json").exists(), "DIR", str(out), "must be the output directory of a run")
    _, _, run, env, algo, state = load_state(out)
    episodes = run.eval_episodes if episodes is None else episodes
    cfg.require(episodes >= 1, "episodes", episodes, "must be >= 1")
    keys = eval_keys(run.seed if seed is None else seed, run.seeds)
    policy = jax.vmap(algo.policy)(state)
    returns = jax.jit(jax.vmap(lambda p, k: evaluate(env, algo.act, p, k, episodes)))(policy, keys)
    per_seed = np.asarray(returns).mean(axis=1)
    return {
        "env": run.env,
        "episodes_per_seed": episodes,
        "return_mean": float(per_seed.mean()),
        "return_std": float(per_seed.std()),
        "return_per_seed": [float(x) for x in per_seed],
    }

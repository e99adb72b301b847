"""The one host loop both runners share: one session of a run, fresh or resumed.

A runner supplies a `Driver` (how to compile, initialise and run one chunk of updates) and the run's
`Records` (what it writes per chunk and its summary: a train run's `TrainRecords`, metrics.csv, TensorBoard,
evaluations; a meta run's own, one generation per chunk); the session does everything around them, once for
every kind of run: the run folder and its manifest, verified checkpoints and resume, progress, checkpoint
cadence, energy and CO2, Ctrl-C / SIGTERM / SIGHUP, non-finite values, failed writes and summary.json.

How each way a run can stop ends (the README's "what happens when" table, proved by tests/test_faults.py):
  Ctrl-C / SIGTERM   `RunInterrupted` (exit 130; SIGHUP the same, exit 129): the last logged chunk is
                     checkpointed (a run stopped before its first checkpoint keeps its config.json, and
                     `--resume` starts it over)
  kill -9            the last periodic checkpoint stays; `--resume` redoes the chunks after it
  damaged checkpoint reported in one line; the newest intact one is used, or a one-line error
  non-finite values  `RunFailed` (exit 1) naming the chunk, its updates and the metric or state leaf;
                     the last finite checkpoint is kept
  failed write       `RunFailed` (exit 1) naming the reason (full disk, read-only, also when tensorstore
                     reports it in words only); the folder stays resumable from its last checkpoint
  a link appears     `RunFailed` naming it (a writer refuses a folder holding one before it starts)
The folder's writer lock (`RunDir.lock`) is released when the session ends.
"""

from __future__ import annotations

import errno
import json
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple, Protocol

import numpy as np

from sparqrl.config import ConfigError
from sparqrl.runfiles import LinkRefused
from sparqrl.signals import StopRequests
from sparqrl.runners.checkpoint import (Checkpointer, DamagedCheckpoints, IncompatibleCheckpoints, NonFiniteState,
                                       import_orbax)
from sparqrl.runners.errors import RunFailed, RunInterrupted
from sparqrl.runners.rundir import CONFIG, SUMMARY, RunDir, os_reason
from sparqrl.runners.run_config import RunConfig
from sparqrl.telemetry import EnergyMeter, RunLogger, make_progress, plot_returns
from sparqrl.telemetry.plots import pyplot
from sparqrl.telemetry.timing import TimeSplit
from sparqrl.telemetry.wandb_log import WandbWriter

# What a write may fail with, recognised also in the text of an error that is not an OSError (tensorstore's).
WRITE_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
# Per-seed values that are not training metrics: NaN there is normal (no episode ended in a chunk).
NOT_CHECKED = {"episode_return", "episodes", "eval_return"}


ChunkHook = Callable[[int, dict[str, Any]], None]
"""Called after each logged chunk with (chunks done, {"env_step": per seed so far, metric: [members]}); the
chunk is already in metrics.csv, so raising KeyboardInterrupt there stops the run with a checkpoint."""


class Driver(Protocol):
    """What a runner supplies to the session (a train run's state leaves carry a leading seed axis)."""

    bounds: list[int]  # cumulative learner updates at the end of each chunk
    env_steps_per_update: int  # per seed
    members: int  # trainings in the program: run.seeds, or a sweep's settings x seeds
    member_names: list[str]  # per member, for messages: "seed 2", or a sweep's "lr=0.01 seed 2"
    compile_time_s: float  # this session's compilation so far
    startup_s: float  # this session's other set-up kept out of env_steps_per_s (starting actors)

    def abstract_state(self) -> Any: ...  # the restore target: shapes, dtypes, shardings (nothing compiled)
    def build(self) -> None: ...  # compile what training starts with (more may compile later: compile_time_s)
    def init_state(self) -> Any: ...
    def start(self, state: Any, updates_done: int, stop: StopRequests) -> None: ...
    def run_chunk(self, chunk: int) -> tuple[Any, dict[str, np.ndarray]]: ...  # -> (state, per-seed metrics)
    # ^ the state may be `Deferred` (so may interrupted_state's): the session fetches it only to save it
    def interrupted_state(self) -> tuple[int, Any] | None: ...  # (updates, state) saved inside a chunk
    def meta(self) -> dict[str, Any]: ...  # runner-specific counters a checkpoint carries
    def restore_meta(self, meta: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


class Deferred:
    """A driver's state fetched only where it is used, then kept: by the session to checkpoint it (`concrete`), by
    the driver where it evaluates or sums up. A remote learner's (`sebulba`), which lives in another process:
    fetching its whole state (replay buffer included) at every chunk's end would move it for nothing."""

    def __init__(self, fetch: Callable[[], Any]):
        self._fetch: Callable[[], Any] | None = fetch
        self._state: Any = None

    @property
    def fetched(self) -> bool:
        return self._fetch is None

    def get(self) -> Any:
        if self._fetch is not None:
            self._state, self._fetch = self._fetch(), None
        return self._state


def concrete(state: Any) -> Any:
    """`state` itself, or the state a `Deferred` one fetches."""
    return state.get() if isinstance(state, Deferred) else state


class WholeChunks:
    """`Driver`'s defaults for a driver that saves only whole chunks (the session checkpoints the last logged one)
    and whose checkpoints carry no counters of its own."""

    def interrupted_state(self) -> tuple[int, Any] | None:
        return None

    def meta(self) -> dict[str, Any]:
        return {}

    def restore_meta(self, meta: dict[str, Any]) -> None:
        pass


class TrainDriver(Driver, Protocol):
    """A train run's driver (both runners'): also evaluates the policy and adds its own summary fields."""

    def evaluate(self, state: Any) -> np.ndarray: ...  # [seeds, episodes] deterministic returns
    def summary(self) -> dict[str, Any]: ...  # runner-specific summary fields
    def finish(self, rundir: RunDir, final: np.ndarray) -> dict[str, Any]: ...  # own outputs (a sweep's), summary


class Totals(NamedTuple):
    """The whole run's running totals at its end (all sessions), for its summary."""

    wall_time_s: float
    compile_time_s: float
    steady_env_steps_per_s: float | None  # this session's (`SteadyRate`)
    energy: dict[str, Any]  # `EnergyMeter.stop`'s summary fields


class Records(Protocol):
    """What a kind of run writes besides its checkpoints, and the words its messages use."""

    resume_command: str  # how the user goes on with the run: "sparqrl train --resume"
    finite: bool  # a chunk's metrics and the state must be finite (else `RunFailed`; not saved)

    def label(self) -> str: ...  # the progress bar's
    def done_text(self, updates: int) -> str: ...  # how far `updates` took the run: "1,024 env steps per seed"
    def open(self, rundir: RunDir, chunks_done: int, updates_done: int, resuming: bool) -> None: ...
    def chunk(self, chunk: int, env_step: int, elapsed: Callable[[], float], state: Any,
              per_seed: dict[str, Any]) -> str: ...
    # ^ records a finished chunk (it may add values to `per_seed`; `elapsed()`: the run's wall time so far);
    #   returns the progress bar's return
    def finish(self, rundir: RunDir, state: Any, totals: Totals) -> dict[str, Any]: ...  # own outputs; the summary
    def close(self) -> None: ...


def chunk_bounds(num_updates: int, chunks: int) -> list[int]:
    """Cumulative update counts at the end of each chunk (as even as possible)."""
    chunks = min(chunks, num_updates)
    return [round((i + 1) * num_updates / chunks) for i in range(chunks)]


def compile_cache_dir() -> Path:
    """XLA's compiled programs (JAX's persistent compilation cache)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sparqrl" / "xla"


def program_store() -> Path:
    """Traced programs (`sparqrl.runners.programs`), beside XLA's cache and switched with it."""
    return compile_cache_dir().parent / "programs"


def use_compile_cache(enabled: bool) -> None:
    """Turn JAX's persistent compilation cache on (every program, however quick to compile) or off. JAX
    settles this at the first compilation of a process: call it before anything is compiled."""
    import jax

    if enabled:
        jax.config.update("jax_compilation_cache_dir", str(compile_cache_dir()))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_enable_compilation_cache", enabled)


def check_memory(abstract_state: Any, run: RunConfig) -> None:
    """The training state must fit the devices' memory: checked on shapes alone, before anything is
    allocated, compiled or written (an absurd buffer or seed count would otherwise end in an
    out-of-memory error from XLA, or the kernel's OOM killer, after the folder was written)."""
    import jax

    need = sum(math.prod(s.shape) * np.dtype(s.dtype).itemsize for s in jax.tree.leaves(abstract_state))
    have = memory_bytes()
    if need > have:
        raise ConfigError(
            f"the training state of this run needs {need / 2**30:,.1f} GiB ({run.seeds} seed(s)), more than the "
            f"{have / 2**30:,.1f} GiB of memory of {device_name()}; lower seeds, buffer_size, num_envs or the "
            "network sizes")


def memory_bytes() -> int:
    """Memory of all devices: an accelerator's own (its allocator's limit), else the host's RAM."""
    import jax

    stats = [d.memory_stats() or {} for d in jax.devices()]
    if all("bytes_limit" in s for s in stats):
        return sum(int(s["bytes_limit"]) for s in stats)
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def prefetch_writers() -> None:
    """Import, on a thread of its own while the first chunks train, what the run's end waits for otherwise:
    orbax (the first checkpoint, often the last one: checkpoint_interval_s) and matplotlib (returns.png), about
    0.6 s on the 2-core CPU. Not before: the set-up before compilation imports neither (tests/
    test_startup_imports.py). The main thread's own import of either waits for this one (Python's module locks);
    a failure here is left to that import to report."""
    def load() -> None:
        try:
            import_orbax()
            pyplot()
        except Exception:  # noqa: BLE001 - the import where the module is used raises it again, in its place
            pass

    threading.Thread(target=load, name="sparqrl-prefetch", daemon=True).start()


def notify(message: str) -> None:
    """One line to the user on stderr (the CLI's stdout carries the summary)."""
    print(f"sparqrl: {message}", file=sys.stderr, flush=True)


def finished_summary(rundir: RunDir) -> dict[str, Any]:
    return json.loads((rundir.path / SUMMARY).read_text())


def incompatible(path: Path, error: IncompatibleCheckpoints) -> str:
    return (f"the checkpoints in {path / 'checkpoint'} were written by another sparqrl version, whose state for "
            f"this algorithm differs from this one's ({error}): they cannot be read by this version")


def saved_state(rundir: RunDir, abstract_state: Any) -> Any:
    """The state of the newest intact checkpoint of a run (for `eval`); a one-line error without one."""
    checkpointer = Checkpointer(rundir.path / "checkpoint", read_only=True)
    try:
        restored = checkpointer.restore_intact(abstract_state)
    except DamagedCheckpoints as error:
        raise RunFailed(f"no intact checkpoint in {rundir.path / 'checkpoint'} ({error})") from None
    except IncompatibleCheckpoints as error:
        raise RunFailed(incompatible(rundir.path, error)) from None
    finally:
        checkpointer.close()
    if restored is None:
        raise RunFailed(f"{rundir.path} has no checkpoint yet; `sparqrl train --resume {rundir.path}` trains it")
    for step, why in restored.damaged:
        notify(f"checkpoint at update {step} is damaged ({why}); using the one at update {restored.step}")
    return restored.state


def eval_summary(run: RunConfig, episodes: int, per_seed: np.ndarray) -> dict[str, Any]:
    """What `sparqrl eval` prints: per-seed mean returns over `episodes` deterministic episodes."""
    return {"env": run.env, "episodes_per_seed": episodes, "return_mean": float(per_seed.mean()),
            "return_std": float(per_seed.std()), "return_per_seed": [float(x) for x in per_seed]}


def run_session(rundir: RunDir, run: RunConfig, algo_name: str, driver: Driver, *, resuming: bool,
                on_chunk: ChunkHook | None = None, records: Records | None = None) -> dict:
    """Run one session to the end of the run and return the summary (also written to summary.json).
    `records`: a train run's (`TrainRecords`, the default; `driver` is then a `TrainDriver`) or another kind's."""
    out = rundir.path
    records = records if records is not None else TrainRecords(run, algo_name, driver)  # type: ignore[arg-type]
    times = TimeSplit(lambda: driver.compile_time_s)
    if isinstance(records, TrainRecords):
        records.times = times  # its evaluations are timed on the session's clock
    go_on = f"{records.resume_command} {out}"
    stop = StopRequests()  # from the start: Ctrl-C during set-up or compilation ends in one line too
    session = None
    try:
        session = _Session(rundir, run, driver, records, stop, on_chunk, times)
        return session.execute(resuming)
    except KeyboardInterrupt:
        saved = session.save_on_interrupt() if session is not None else None
        if saved is None:
            raise RunInterrupted(f"interrupted before the first checkpoint; `{go_on}` starts the run over with its "
                                 "saved config") from None
        raise RunInterrupted(f"interrupted after {records.done_text(saved)}; checkpoint saved; continue with: "
                             f"{go_on}") from None
    except DamagedCheckpoints as error:
        raise RunFailed(f"no intact checkpoint in {out / 'checkpoint'} ({error}); remove that folder and run "
                        f"`{go_on}` to start the run over with its saved config") from None
    except IncompatibleCheckpoints as error:
        raise RunFailed(f"{incompatible(out, error)}; remove {out / 'checkpoint'} and run `{go_on}` to start the "
                        "run over with its saved config") from None
    except LinkRefused as error:  # found while the run went on (a writer checks the folder before it starts)
        raise RunFailed(str(error)) from None
    except OSError as error:
        raise RunFailed(_failed_write(out, go_on, error, session)) from None
    except Exception as error:
        cause = _os_error_in(error)  # orbax and TensorBoard's writers wrap the OSError of a full disk
        if cause is None:
            raise
        raise RunFailed(_failed_write(out, go_on, cause, session)) from None
    finally:
        stop.close()
        if session is not None:
            session.close()
        driver.close()
        rundir.release()  # the last: another writer may start once this one has closed its files


def _os_error_in(error: BaseException) -> OSError | None:
    """The OSError behind `error` (orbax and TensorBoard's writers wrap it), or one made from the text of
    an error that carries only the OS's words (tensorstore's RESOURCE_EXHAUSTED of a full disk)."""
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, OSError):
            return error
        for code in WRITE_ERRORS:
            if os.strerror(code) in str(error):
                return OSError(code, os.strerror(code))
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def _failed_write(out: Path, go_on: str, error: OSError, session: "_Session | None") -> str:
    """`go_on`: the command that resumes the run in `out`."""
    where = f" ({error.filename})" if getattr(error, "filename", None) else ""
    kept = session.settled() if session is not None else None
    state = (f"the run can go on from its checkpoint at {session.records.done_text(kept)}" if kept
             else "the run can start over from its saved config")
    return f"writing to {out} failed: {os_reason(error)}{where}; {state}: fix that, then `{go_on}`"


class _Session:
    def __init__(self, rundir: RunDir, run: RunConfig, driver: Driver, records: Records, stop: StopRequests,
                 on_chunk: ChunkHook | None, times: TimeSplit):
        self.rundir, self.run, self.driver, self.records, self.stop = rundir, run, driver, records, stop
        self.on_chunk, self.times = on_chunk, times
        self.meter = EnergyMeter(rundir.path, run.country, run.energy)
        self.checkpointer: Checkpointer | None = None
        self.latest: tuple[int, int, Any] | None = None  # (chunks, updates, state) of the last logged chunk
        self.saved_updates: int | None = None  # of the newest checkpoint written (this session's or restored)
        self.saving: int | None = None  # of the checkpoint being written in the background
        self.prior = {"wall_time_s": 0.0, "compile_time_s": 0.0}
        self.wall_start = time.perf_counter()
        self.steady = SteadyRate()
        self.last_save = self.wall_start  # periodic checkpoints: at least run.checkpoint_interval_s apart

    def elapsed(self) -> float:
        return self.prior["wall_time_s"] + time.perf_counter() - self.wall_start

    def compile_time(self) -> float:
        return self.prior["compile_time_s"] + self.driver.compile_time_s

    def training_clock(self) -> float:
        """Seconds that leave out this session's compilation, also what is compiled between chunks (the
        evaluation program, at the first evaluation): the clock of the steps/s shown and of the steady rate."""
        return time.perf_counter() - self.driver.compile_time_s

    def meta(self, chunks_done: int, updates_done: int) -> dict[str, Any]:
        # running totals, like wall time: a resumed run's summary covers all its sessions
        return {"chunks_done": chunks_done, "updates_done": updates_done, "wall_time_s": self.elapsed(),
                "compile_time_s": self.compile_time(), **self.driver.meta(), **self.meter.totals()}

    def save(self, chunks_done: int, updates_done: int, state: Any) -> None:
        """Start writing a checkpoint (the one still being written, if any, is waited for first)."""
        assert self.checkpointer is not None
        with self.times.part("checkpoints"):
            self._wait_saved()
            self.checkpointer.save(updates_done, concrete(state), self.meta(chunks_done, updates_done))
        self.saving = updates_done
        self.last_save = time.perf_counter()

    def _wait_saved(self) -> None:
        """Wait until the checkpoint being written is (raising what failed it); it is then the newest saved."""
        saving, self.saving = self.saving, None
        if saving is not None:
            assert self.checkpointer is not None
            self.checkpointer.wait()
            self.saved_updates = saving

    def settled(self) -> int | None:
        """The updates of the newest checkpoint written, once the one being written is (if it fails: the one
        before): what a message about a stopped run names."""
        try:
            self._wait_saved()
        except Exception:  # noqa: BLE001 - the failure being reported already says what went wrong
            pass
        return self.saved_updates

    def save_on_interrupt(self) -> int | None:
        """Checkpoint where the run stopped (unless saved there already); the updates saved."""
        if self.checkpointer is None:
            return self.saved_updates
        inside = self.driver.interrupted_state()
        if inside is not None and self.latest is not None and inside[0] > self.latest[1]:
            chunks, updates, state = self.latest[0], inside[0], inside[1]
        elif self.latest is not None:
            chunks, updates, state = self.latest
        else:
            return self.saved_updates
        if updates and updates not in (self.saved_updates, self.saving):  # (the initial state is made again from the seed)
            try:
                self.save(chunks, updates, state)
            except NonFiniteState:
                pass  # the last finite checkpoint stays
        self._wait_saved()
        return self.saved_updates

    def restore(self) -> tuple[Any, int, int] | None:
        """(state, chunks done, updates done) of the newest intact checkpoint, or None (no checkpoint:
        the run starts from the beginning)."""
        restored = self.checkpointer.restore_intact(self.driver.abstract_state())
        for step, why in restored.damaged if restored else ():
            notify(f"checkpoint at update {step} is damaged ({why}); using the newest intact one")
        if restored is None:
            notify("no checkpoint yet: starting the run from the beginning with its saved config")
            return None
        meta = restored.meta
        if restored.damaged:
            notify(f"resuming from the checkpoint at update {restored.step} (chunk {meta['chunks_done']})")
        self.prior = {k: float(meta[k]) for k in self.prior}
        self.meter.include_prior(meta)  # the earlier sessions' energy and CO2
        self.driver.restore_meta(meta)
        self.saved_updates = restored.step
        chunks = int(meta["chunks_done"])
        # format 0 (anakin) checkpoints counted chunks, not updates
        updates = int(meta.get("updates_done", self.driver.bounds[chunks - 1] if chunks else 0))
        return restored.state, chunks, updates

    def execute(self, resuming: bool) -> dict:
        driver, run, stop = self.driver, self.run, self.stop
        self.rundir.claim("emissions.csv")  # (claimed before codecarbon may write it)
        self.checkpointer = Checkpointer(self.rundir.claim("checkpoint"), finite=self.records.finite, asynchronous=True)
        restored = self.restore() if resuming else None  # verified before anything compiles
        stop.check()
        driver.build()
        stop.check()
        state, done_chunks, updates_done = restored if restored is not None else (driver.init_state(), 0, 0)
        self.latest = (done_chunks, updates_done, state)
        self.records.open(self.rundir, done_chunks, updates_done, resuming)
        bounds = driver.bounds
        steps_per_seed = bounds[-1] * driver.env_steps_per_update
        session_start = (updates_done * driver.env_steps_per_update, self.training_clock())
        driver.start(state, updates_done, stop)
        # Off the critical path: codecarbon's ~1.5 s start-up overlaps the first chunks on the device
        # instead of delaying compilation (which it slowed by as much, started beside it) or the first
        # progress line. What it measures therefore starts with training (README, "Energy").
        self.meter.start_in_background()
        prefetch_writers()
        progress = make_progress(run.progress)
        with progress:
            task = progress.add_task(self.records.label(), total=steps_per_seed, sps=0.0, ret="-")
            progress.update(task, completed=session_start[0])
            for chunk in range(done_chunks, len(bounds)):
                stop.check()
                with self.times.part("training"):
                    state, per_seed = driver.run_chunk(chunk)
                env_step = bounds[chunk] * driver.env_steps_per_update
                self.steady.chunk_done(env_step * driver.members, self.training_clock())
                is_last = chunk == len(bounds) - 1
                shown = self.records.chunk(chunk, env_step, self.elapsed, state, per_seed)
                if self.records.finite:
                    self._check_finite(chunk, per_seed)
                # Only a logged chunk may be checkpointed on Ctrl-C: a resume truncates the CSV to its
                # checkpoint, so a row past it is redone, but a row missing before it would be lost.
                self.latest = (chunk + 1, bounds[chunk], state)  # one assignment: an interrupt sees a consistent triple
                seconds = max(self.training_clock() - session_start[1], 1e-9)
                rate = (env_step - session_start[0]) * driver.members / seconds
                progress.update(task, completed=env_step, sps=rate, ret=shown)
                due = (chunk + 1) % run.checkpoint_every == 0
                if is_last or (due and time.perf_counter() - self.last_save >= run.checkpoint_interval_s):
                    self._save_checked(chunk, state)
                if self.on_chunk is not None:
                    self.on_chunk(chunk + 1, {"env_step": env_step, **per_seed})
        return self._finish(state)

    def _check_finite(self, chunk: int, per_seed: dict[str, np.ndarray]) -> None:
        for name, values in per_seed.items():
            values = np.asarray(values, np.float64)
            if name not in NOT_CHECKED and not np.isfinite(values).all():
                bad = np.flatnonzero(~np.isfinite(values)).tolist()
                names = ", ".join(self.driver.member_names[i] for i in bad[:4]) + (", ..." if len(bad) > 4 else "")
                self._fail_non_finite(chunk, f"{name} is {values[bad[0]]} for {names}")

    def _save_checked(self, chunk: int, state: Any) -> None:
        try:
            self.save(chunk + 1, self.driver.bounds[chunk], state)
        except NonFiniteState as error:
            self._fail_non_finite(chunk, str(error))

    def _fail_non_finite(self, chunk: int, what: str) -> None:
        first = self.driver.bounds[chunk - 1] + 1 if chunk else 1
        kept = self.settled()
        raise RunFailed(
            f"training diverged in chunk {chunk + 1} (updates {first}-{self.driver.bounds[chunk]}): {what}; "
            + (f"the last finite checkpoint ({self.records.done_text(kept)}) is kept" if kept is not None
               else "no checkpoint was written")
            + "; lower the learning rate or check the reward scale")

    def _finish(self, state: Any) -> dict:
        totals = Totals(self.elapsed(), self.compile_time(), self.steady.rate(), self.meter.stop())
        summary = self.records.finish(self.rundir, state, totals)  # (while the last checkpoint is written)
        with self.times.part("checkpoints"):
            self._wait_saved()
        summary["time_s"] = self.times.seconds()
        self.rundir.write_text(SUMMARY, json.dumps(summary, indent=2))  # last: its presence means finished
        return summary

    def close(self) -> None:
        self.meter.stop()  # idempotent and never raises
        for closer in (self.records, self.checkpointer):
            if closer is not None:
                try:
                    closer.close()
                except Exception:  # noqa: BLE001 - closing after a failed write must not hide the failure
                    pass


class TrainRecords:
    """A train run's records: metrics.csv and TensorBoard per chunk (`RunLogger`; W&B too with `run.wandb`), the
    deterministic policy's evaluation every `run.eval_every` chunks and at the end, returns.png and the summary."""

    resume_command = "sparqrl train --resume"
    finite = True

    def __init__(self, run: RunConfig, algo_name: str, driver: TrainDriver):
        self.run, self.algo_name, self.driver = run, algo_name, driver
        self.logger: RunLogger | None = None
        self.eval_returns: np.ndarray | None = None  # the last evaluation's [seeds, episodes]
        self.steps_asked: int | None = None  # the config's total_timesteps (`open`)
        self.wandb: WandbWriter | None = None  # with run.wandb (`open`)
        self.times = TimeSplit(lambda: driver.compile_time_s)  # the session's, which `run_session` sets

    def evaluate(self, state: Any) -> np.ndarray:
        """The deterministic policy's returns [seeds, episodes], timed as the run's evaluation."""
        with self.times.part("evaluation"):
            return self.driver.evaluate(state)

    def label(self) -> str:
        return f"{self.algo_name} {self.run.env}"

    def done_text(self, updates: int) -> str:
        return f"{updates * self.driver.env_steps_per_update:,} env steps per seed"

    def open(self, rundir: RunDir, chunks_done: int, updates_done: int, resuming: bool) -> None:
        self.steps_asked = json.loads((rundir.path / CONFIG).read_text())["config"]["total_timesteps"]
        steps, per_update = self.driver.bounds[-1] * self.driver.env_steps_per_update, self.driver.env_steps_per_update
        if not resuming and steps != self.steps_asked:  # said once, at the start: a budget never changes silently
            notify(f"{self.steps_asked:,} env steps asked; {steps:,} run per seed: whole updates of {per_update:,} "
                   f"env steps each (rounded {'down' if steps < self.steps_asked else 'up'})")
        rundir.claim("metrics.csv")
        rundir.claim("tensorboard")
        if self.run.wandb is not None:
            rundir.claim("wandb")
            self.wandb = WandbWriter(rundir.path, self.run.wandb, self.run.wandb_mode, lambda: rundir.files)
        self.logger = RunLogger(rundir.path, resume_chunk=chunks_done if resuming else None,
                                resume_step=updates_done * self.driver.env_steps_per_update + 1 if resuming else None,
                                writers=[self.wandb] if self.wandb is not None else [])

    def chunk(self, chunk: int, env_step: int, elapsed: Callable[[], float], state: Any,
              per_seed: dict[str, Any]) -> str:
        """Evaluates where due (adding eval_return to `per_seed`), then logs the chunk."""
        if self.run.evaluates_after(chunk, len(self.driver.bounds)):
            self.eval_returns = self.evaluate(state)
            per_seed["eval_return"] = self.eval_returns.mean(axis=1)
        assert self.logger is not None
        self.logger.log(chunk + 1, env_step, elapsed(), per_seed)
        return _fmt_return(per_seed)

    def finish(self, rundir: RunDir, state: Any, totals: Totals) -> dict[str, Any]:
        if self.eval_returns is None:  # resumed after the last checkpoint, before the summary was written
            self.eval_returns = self.evaluate(state)
        driver, run = self.driver, self.run
        final = self.eval_returns.mean(axis=1)
        steps_per_seed = driver.bounds[-1] * driver.env_steps_per_update
        excluded = totals.compile_time_s + driver.startup_s + (self.wandb.startup_s if self.wandb is not None else 0.0)
        summary = {
            "algo": self.algo_name,
            "env": run.env,
            "steps": steps_per_seed,
            "steps_asked": self.steps_asked,
            "seeds": run.seeds,
            "final_return_mean": float(final.mean()),
            "final_return_std": float(final.std()),
            "final_return_per_seed": [float(x) for x in final],
            "eval_episodes": run.eval_episodes,
            "wall_time_s": totals.wall_time_s,
            "env_steps_per_s": steps_per_seed * driver.members / max(totals.wall_time_s - excluded, 1e-9),
            "steady_env_steps_per_s": totals.steady_env_steps_per_s,
            "compile_time_s": totals.compile_time_s,
            "device": device_name(),
            **driver.summary(),
            **totals.energy,
        }
        summary.update(driver.finish(rundir, final))
        plot_returns(rundir.path / "metrics.csv", rundir.claim("returns.png"),
                     f"{self.algo_name} on {run.env}, {run.seeds} seed(s)")
        return summary

    def close(self) -> None:
        if self.logger is not None:
            self.logger.close()


class SteadyRate:
    """Env steps per second of all members between the end of a session's first chunk and the end of its
    last: the host's work between chunks (logging, evaluations, periodic checkpoints) is in it; compilation
    (the session's `training_clock` leaves it out), init, the first chunk, the final evaluation and the final
    checkpoint are not."""

    def __init__(self) -> None:
        self.first: tuple[int, float] | None = None  # (env steps, time) at the end of the first chunk
        self.last: tuple[int, float] | None = None

    def chunk_done(self, env_steps: int, now: float) -> None:
        mark = (env_steps, now)
        if self.first is None:
            self.first = mark
        else:
            self.last = mark

    def rate(self) -> float | None:
        """None with fewer than two chunks in the session."""
        if self.first is None or self.last is None:
            return None
        return (self.last[0] - self.first[0]) / max(self.last[1] - self.first[1], 1e-9)


def _fmt_return(per_seed: dict[str, np.ndarray]) -> str:
    values = per_seed["episode_return"]
    return "-" if np.all(np.isnan(values)) else f"{np.nanmean(values):.1f}"


def device_name() -> str:
    import jax

    device = jax.devices()[0]
    return f"{device.platform}:{getattr(device, 'device_kind', '')} x{jax.device_count()}"

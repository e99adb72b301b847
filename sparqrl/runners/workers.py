"""Sweeps and meta-evolution spread over Ray workers (`--workers N`, or `--ray-address` of a cluster).

The members of one program (a sweep's settings x seeds, a generation's population) are split into contiguous
slices (`slices`), one Ray task per slice (`Pool.map`: slice i on worker actor i % workers); each task runs the same
compiled, vmapped program over its slice on its worker's devices, and the results come back in the original order.
A member's random streams come from its index in the whole program (the slice's keys are the whole program's,
sliced), so a slice computes what the single-process program computes for those members: bit for bit where the
slice's shape is the program's.

A task whose worker process or node dies runs again on the worker restarted elsewhere (Ray's actor restarts and
task retries, `MAX_RETRIES`): a slice keeps no state on its worker, its inputs live in the driver. A worker builds a
job's programs once (`_BUILT`, per process) and jit compiles them once per shape; XLA's persistent compilation
cache, set up in the worker as in the driver (`use_compile_cache`), serves what an earlier process compiled.

A local instance (`--workers N`) listens on loopback only (`actors.ray_session`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Hashable, Iterator, Protocol, Sequence

from sparqrl import config as cfg

MAX_WORKERS = 1024
"""Workers of a local Ray instance at most: each is a process holding its own JAX runtime and programs."""
MAX_RETRIES = 3
"""Times a slice is run again after its worker (or its node) died before it answered."""


@dataclasses.dataclass(frozen=True)
class Workers:
    """Where the slices run: a local Ray instance of `count` workers, or the Ray cluster at `address` (one worker
    per CPU it offers when joined)."""

    count: int | None = None
    address: str | None = None


def check_workers(count: Any, address: str | None) -> Workers | None:
    """The `Workers` of `--workers` / `--ray-address` (None: neither, the run stays in this process); a one-line
    ConfigError for a bad count, both given, or an address where no Ray cluster answers. Before anything compiles."""
    if count is None and address is None:
        return None
    cfg.require(count is None or address is None, "workers", count, "starts a local Ray instance: leave it out with "
                "--ray-address (a cluster's workers are its CPUs)")
    if count is not None:
        cfg.require(cfg.is_int(count) and 1 <= count <= MAX_WORKERS, "workers", count,
                    f"must be an integer from 1 to {MAX_WORKERS:,}")
    if address is not None:
        from sparqrl.runners.actors import check_ray_address

        check_ray_address(address)
    return Workers(count, address)


def slices(items: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous (start, stop) slices of `items` members in order: min(parts, items) of them, the first
    `items % parts` one member longer (so at most two shapes)."""
    parts = max(1, min(parts, items))
    size, longer = divmod(items, parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + size + (i < longer))
    return list(zip(bounds[:-1], bounds[1:]))


class Job(Protocol):
    """What a slice task runs on its worker: `build()` once per worker process (its programs, traced on first use),
    then `run(built, *args)` per task. Picklable (it travels to the worker with every task)."""

    key: Hashable  # the worker keeps one `build()` per key
    compile_cache: bool  # XLA's persistent compilation cache on or off in the worker (`RunConfig.compile_cache`)

    def build(self) -> Any: ...
    def run(self, built: Any, *args: Any) -> Any: ...


_BUILT: dict[Hashable, Any] = {}
"""In a worker process: each job's built programs, by `Job.key`."""


def run_slice(job: Job, args: tuple) -> Any:
    """The body of a slice task, in the worker process (also callable in this one: the tests)."""
    built = _BUILT.get(job.key)
    if built is None:
        from sparqrl.runners.session import use_compile_cache

        if not _BUILT:  # JAX settles its cache at a process's first compilation
            use_compile_cache(job.compile_cache)
        built = _BUILT[job.key] = job.build()
    return job.run(built, *args)


SHARED_GPU_ENV = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


def gpu_share(gpus: float, workers: int) -> float:
    """The GPUs each worker asks Ray for: none on a cluster without GPUs; one each where there are enough; else an
    equal share of one, 1 / ceil(workers / GPUs), so that every worker fits (Ray places a fractional share within one
    GPU, and points the worker's CUDA_VISIBLE_DEVICES at it; a worker that asks for none would see every GPU)."""
    if gpus < 1:
        return 0
    return 1 / math.ceil(workers / int(gpus)) if workers > gpus else 1


class SliceFailed(RuntimeError):
    """A slice's task failed on every try (its worker died `MAX_RETRIES` + 1 times)."""


class SliceWorker:
    """A Ray actor: one worker process that runs the slice tasks sent to it (`run_slice`). Slice i always goes to
    worker i % workers, so each worker builds the programs of its own slices only (as plain tasks, slices wandered
    between workers and each worker built every slice)."""

    def run(self, job: Job, args: tuple) -> Any:
        return run_slice(job, args)


class Pool:
    """The workers of a run (inside `worker_session`): up to `workers` actors, started as `map` needs them. A
    worker whose process or node died is started again (on a node that has room) and its unfinished tasks run there."""

    def __init__(self, workers: int):
        import ray

        self.ray, self.workers = ray, workers
        self._actors: list[Any] = []

    def _started(self, needed: int) -> list[Any]:
        """The first `needed` workers (at most `workers`), started where not yet."""
        needed = min(needed, self.workers)
        if len(self._actors) < needed:
            share = gpu_share(self.ray.cluster_resources().get("GPU", 0), self.workers)
            # workers that share a GPU must not each take most of its memory first
            env = {"runtime_env": {"env_vars": SHARED_GPU_ENV}} if 0 < share < 1 else {}
            # a worker's death is retried; an error the job raises is not (it would raise again)
            actor = self.ray.remote(num_cpus=1, num_gpus=share, max_restarts=MAX_RETRIES, max_task_retries=MAX_RETRIES,
                                    **env)(SliceWorker)
            self._actors += [actor.remote() for _ in range(needed - len(self._actors))]
        return self._actors

    def map(self, tasks: Sequence[tuple[Job, tuple]]) -> list[Any]:
        """`job.run(built, *args)` for each (job, args) of `tasks`, task i on worker i % workers, results in their
        order. An error a job raised is raised here as itself; a slice whose workers kept dying is a `SliceFailed`."""
        actors = self._started(len(tasks))
        refs = [actors[i % len(actors)].run.remote(job, args) for i, (job, args) in enumerate(tasks)]
        try:
            return self.ray.get(refs)
        except self.ray.exceptions.RayTaskError as error:
            raise error.as_instanceof_cause() from None
        except self.ray.exceptions.RayError as error:  # ActorDiedError, NodeDiedError, ... after the retries
            raise SliceFailed(f"a slice's worker died {MAX_RETRIES + 1} times ({type(error).__name__}); the run "
                              "stops here: resume it when the workers are back") from None

    def close(self) -> None:
        """End the workers (their CPUs are free for other runs of a cluster)."""
        for actor in self._actors:
            self.ray.kill(actor, no_restart=True)
        self._actors = []


@contextlib.contextmanager
def worker_session(workers: Workers) -> Iterator[Pool]:
    """Ray for a run's slices (`actors.ray_session`: join the cluster at `workers.address`, or start a local
    instance on loopback with a CPU per worker), and the pool of its tasks; on exit Ray is left as found."""
    from sparqrl.runners.actors import ray_session

    with ray_session(workers.address, workers.count or 1):
        import ray

        pool = Pool(workers.count or max(1, int(ray.cluster_resources().get("CPU", 1))))
        try:
            yield pool
        finally:
            pool.close()

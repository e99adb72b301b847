"""Checkpoints of the whole vmapped training state with orbax, plus a small JSON of host-side facts.

Every checkpoint's meta carries a CRC-32 of the state's bytes and is written only for a finite state, so
a restore can tell an intact checkpoint from a damaged one (a truncated or altered data file, bad
metadata) and a run never resumes from NaNs. `restore_intact` takes the newest intact checkpoint.
"""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import shutil
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import jax
import numpy as np

CHECKSUM = "state_crc32"


class NonFiniteState(Exception):
    """The state holds a NaN or an infinity (the message names the leaf); it is not saved."""


class Restored(NamedTuple):
    state: Any
    meta: dict[str, Any]
    step: int
    damaged: list[tuple[int, str]]  # newer checkpoints passed over: (step, why)


def state_checksum(state: Any) -> int:
    """CRC-32 of every leaf's bytes in tree order (the state is fetched to the host)."""
    crc = 0
    for leaf in jax.tree.leaves(jax.device_get(state)):
        crc = zlib.crc32(np.ascontiguousarray(leaf).tobytes(), crc)
    return crc


def first_non_finite(state: Any) -> str | None:
    """The path of the first float leaf holding a NaN or an infinity, or None."""
    for path, leaf in jax.tree_util.tree_leaves_with_path(jax.device_get(state)):
        leaf = np.asarray(leaf)
        if np.issubdtype(leaf.dtype, np.inexact) and not np.isfinite(leaf).all():
            return jax.tree_util.keystr(path)
    return None


def _orbax() -> Any:
    """orbax.checkpoint, imported when a checkpoint is first written or read: its ~0.25 s import would
    otherwise delay every run's first progress line (BENCHMARKS.md, "Start fast")."""
    import orbax.checkpoint as ocp

    return ocp


class Checkpointer:
    """Keeps the last two checkpoints in `directory`; each holds `state` and `meta` (JSON)."""

    def __init__(self, directory: Path):
        self._directory = directory.absolute()
        self._directory.mkdir(parents=True, exist_ok=True)  # a folder that cannot be made fails here, as before
        self._opened: Any = None  # orbax's CheckpointManager, made on first use

    @property
    def _manager(self) -> Any:
        if self._opened is None:
            ocp = _orbax()
            self._opened = ocp.CheckpointManager(
                self._directory,
                options=ocp.CheckpointManagerOptions(max_to_keep=2, create=True, enable_async_checkpointing=False),
            )
        return self._opened

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        """Save `state` as `step` (replacing one there); raises `NonFiniteState` instead of saving NaNs."""
        host = jax.device_get(state)  # fetched once for both checks
        bad = first_non_finite(host)
        if bad is not None:
            raise NonFiniteState(f"the state's {bad} is not finite")
        meta = {**meta, CHECKSUM: state_checksum(host)}
        ocp = _orbax()
        self._manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
            force=True,
        )
        self._manager.wait_until_finished()

    def steps(self) -> list[int]:
        """Finished checkpoints, newest first (a write cut short is never listed: orbax renames a
        checkpoint into place only once it is complete)."""
        self._manager.reload()
        return sorted(self._manager.all_steps(), reverse=True)

    def restore(self, abstract_state: Any, step: int) -> tuple[Any, dict[str, Any]]:
        """Restore `step` into the structure, shapes, dtypes and shardings of `abstract_state`, verified
        against its checksum (raises on any damage)."""
        ocp = _orbax()
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()),
        )
        state, meta = restored["state"], dict(restored["meta"])
        if CHECKSUM in meta and state_checksum(state) != meta[CHECKSUM]:
            raise ValueError("its data does not match the checksum written with it")
        return state, meta

    def restore_intact(self, abstract_state: Any) -> Restored | None:
        """The newest checkpoint that restores and verifies, with the damaged newer ones it passed over;
        None when there is no checkpoint at all. Raises `DamagedCheckpoints` when none is intact."""
        damaged: list[tuple[int, str]] = []
        with _quiet_failures(damaged):
            for step in self.steps():
                try:
                    state, meta = self.restore(abstract_state, step)
                except Exception as error:  # noqa: BLE001 - any failure to read a checkpoint means it is damaged
                    damaged.append((step, _one_line(error)))
                    continue
                for bad, _ in damaged:  # the run will write these steps again
                    shutil.rmtree(self._directory / str(bad), ignore_errors=True)
                self._manager.reload()
                return Restored(state, meta, step, damaged)
        if damaged:
            raise DamagedCheckpoints(damaged)
        return None

    def close(self) -> None:
        if self._opened is not None:
            self._opened.close()


class DamagedCheckpoints(Exception):
    def __init__(self, damaged: list[tuple[int, str]]):
        self.damaged = damaged
        super().__init__("; ".join(f"step {step}: {why}" for step, why in damaged))


@contextlib.contextmanager
def _quiet_failures(damaged: list) -> Iterator[None]:
    """While checkpoints are tried: a damaged one fails in many places at once (orbax logs each unreadable
    file; its other reads end in 'Exception ignored' tracebacks when collected, and tensorstore's threads
    print tracebacks when they deliver them to orbax's event loop, already closed). The one line the run
    prints says it all: all of that is silenced, for a moment longer when a checkpoint was damaged."""
    loggers = [logging.getLogger(name) for name in ("absl", "asyncio")]
    levels = [logger.level for logger in loggers]
    saved = sys.unraisablehook, threading.excepthook, sys.stderr
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    sys.unraisablehook = lambda unraisable: None
    threading.excepthook = lambda args: None
    sys.stderr = io.StringIO()
    try:
        yield
    finally:
        if damaged:
            time.sleep(0.5)  # the failed reads still in flight finish
        gc.collect()  # and their coroutines are finalised, while their tracebacks are still silenced
        sys.unraisablehook, threading.excepthook, sys.stderr = saved
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    first = text[0].split(" See full TensorStore details")[0][:160] if text else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def abstract_like(tree: Any) -> Any:
    """ShapeDtypeStructs (with shardings where known) describing `tree`, for a restore target."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), tree
    )

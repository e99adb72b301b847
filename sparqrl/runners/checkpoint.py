"""Checkpoints of the whole vmapped training state with orbax, plus a small JSON of host-side facts.

Every checkpoint's meta carries a CRC-32 of the state's bytes and is written only for a finite state, so
a restore can tell an intact checkpoint from a damaged one (a truncated or altered data file, bad
metadata) and a run never resumes from NaNs. `restore_intact` takes the newest intact checkpoint.

A reader (eval, export, compare, load) opens the folder read-only: it creates nothing and passes a damaged
checkpoint over without deleting it (deleting stays with the writer, a resume). Neither follows a link:
the folder and everything in it is checked before each restore and each save, so orbax never reads
through one, nor deletes an old step that is one (with several threads, its deletion would empty the
folder the link points to).
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

from sparqrl.runfiles import check_no_links

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
        crc = zlib.crc32(np.ascontiguousarray(leaf).reshape(-1).view(np.uint8), crc)  # (its buffer: no copy)
    return crc


def first_non_finite(state: Any) -> str | None:
    """The path of the first float leaf holding a NaN or an infinity, or None."""
    for path, leaf in jax.tree_util.tree_leaves_with_path(jax.device_get(state)):
        leaf = np.asarray(leaf)
        if np.issubdtype(leaf.dtype, np.inexact) and not np.isfinite(leaf).all():
            return jax.tree_util.keystr(path)
    return None


def import_orbax() -> Any:
    """orbax.checkpoint, imported when a checkpoint is first written or read (or by a run's prefetch, while it
    trains): its ~0.25 s import would otherwise delay every run's first progress line (BENCHMARKS.md, "Start
    fast")."""
    import orbax.checkpoint as ocp

    return ocp


class Checkpointer:
    """Keeps the last two checkpoints in `directory`; each holds `state` and `meta` (JSON). `read_only`:
    a reader's, which never creates, writes or deletes anything. `finite`: only a finite state is saved (a
    meta run's strategy state holds infinities and NaNs by design: a best fitness not yet seen, a failed member).
    `asynchronous`: each save is written in the background while the run goes on (`save`)."""

    def __init__(self, directory: Path, read_only: bool = False, finite: bool = True, asynchronous: bool = False):
        self._directory = directory.absolute()
        self._read_only = read_only
        self._finite = finite
        self._asynchronous = asynchronous and not read_only
        if not read_only:
            self._check_links()
            self._directory.mkdir(parents=True, exist_ok=True)  # a folder that cannot be made fails here, as before
        self._opened: Any = None  # orbax's CheckpointManager, made on first use
        self._pending: int | None = None  # the step an asynchronous save is writing

    @property
    def _manager(self) -> Any:
        if self._opened is None:
            ocp = import_orbax()
            options = (ocp.CheckpointManagerOptions(read_only=True, create=False, save_interval_steps=0,
                                                    enable_async_checkpointing=False) if self._read_only else
                       ocp.CheckpointManagerOptions(max_to_keep=2, create=True,
                                                    enable_async_checkpointing=self._asynchronous))
            self._opened = ocp.CheckpointManager(self._directory, options=options)
        return self._opened

    def _check_links(self) -> None:
        """The folder and every step, file and folder in it is no link (`sparqrl.runfiles.LinkRefused`)."""
        check_no_links(self._directory.parent, [self._directory.name])

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        """Save `state` as `step` (replacing one there); raises `NonFiniteState` instead of saving NaNs.
        `asynchronous`: returns once orbax holds its own copy of the state, which it writes in the background
        (a checkpoint is listed only once complete, as always); the next save, `wait` or `close` waits for
        that write first, and raises what failed it."""
        self.wait()
        host = jax.device_get(state)  # fetched once for both checks
        bad = first_non_finite(host) if self._finite else None
        if bad is not None:
            raise NonFiniteState(f"the state's {bad} is not finite")
        meta = {**meta, CHECKSUM: state_checksum(host)}
        self._check_links()  # orbax replaces this step and deletes the oldest
        ocp = import_orbax()
        failed: list[str] = []
        with _quiet_failures(failed):  # a failed write (a full disk) is the exception raised here, in one line
            try:
                self._manager.save(
                    step,
                    args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
                    force=True,
                )
                if not self._asynchronous:
                    self._manager.wait_until_finished()
            except Exception as error:
                failed.append(_one_line(error))
                raise
        if self._asynchronous:
            self._pending = step

    def wait(self) -> int | None:
        """Wait until the asynchronous save in flight is written (raising what failed it, in one line as
        `save`); the step it wrote, or None when none was in flight."""
        step, self._pending = self._pending, None
        if step is None:
            return None
        failed: list[str] = []
        with _quiet_failures(failed):
            try:
                self._manager.wait_until_finished()
            except Exception as error:
                failed.append(_one_line(error))
                raise
        return step

    def steps(self) -> list[int]:
        """Finished checkpoints, newest first (a write cut short is never listed: orbax renames a
        checkpoint into place only once it is complete)."""
        if self._read_only and not self._directory.is_dir():
            return []  # a run stopped before its first checkpoint
        self.wait()
        self._check_links()
        self._manager.reload()
        return sorted(self._manager.all_steps(), reverse=True)

    def restore(self, abstract_state: Any, step: int) -> tuple[Any, dict[str, Any]]:
        """Restore `step` into the structure, shapes, dtypes and shardings of `abstract_state`, verified
        against its checksum (raises on any damage)."""
        ocp = import_orbax()
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()),
        )
        state, meta = restored["state"], dict(restored["meta"])
        if CHECKSUM in meta and state_checksum(state) != meta[CHECKSUM]:
            raise ValueError("its data does not match the checksum written with it")
        return state, meta

    def restore_intact(self, abstract_state: Any) -> Restored | None:
        """The newest checkpoint that restores and verifies, with the damaged newer ones it passed over
        (a writer deletes them: the run writes those steps again); None when there is no checkpoint at all.
        Raises `DamagedCheckpoints` when none is intact."""
        damaged: list[tuple[int, str]] = []
        layouts: list[str | None] = []  # per damaged step: how its stored layout differs from the state's, or None
        with _quiet_failures(damaged):
            for step in self.steps():
                try:
                    state, meta = self.restore(abstract_state, step)
                except Exception as error:  # noqa: BLE001 - any failure to read a checkpoint means it is damaged
                    damaged.append((step, _one_line(error)))
                    layouts.append(self._layout_difference(step, abstract_state))
                    continue
                if not self._read_only:
                    for bad, _ in damaged:
                        shutil.rmtree(self._directory / str(bad), ignore_errors=True)
                    self._manager.reload()
                return Restored(state, meta, step, damaged)
        if damaged and all(layouts):
            raise IncompatibleCheckpoints(layouts[0])
        if damaged:
            raise DamagedCheckpoints(damaged)
        return None

    def _layout_difference(self, step: int, abstract_state: Any) -> str | None:
        """How checkpoint `step`'s stored arrays (names and shapes, from orbax's metadata) differ from
        `abstract_state`'s, or None when they match or cannot be read (then the checkpoint is damaged)."""
        try:
            stored = import_orbax().StandardCheckpointer().metadata(self._directory / str(step) / "state").item_metadata
            have = {leaf.name: tuple(leaf.shape) for leaf in jax.tree.leaves(stored.tree)}
        except Exception:  # noqa: BLE001 - unreadable metadata: damage, not another layout
            return None
        return layout_difference(have, leaf_shapes(abstract_state))

    def close(self) -> None:
        """Waits for a save in flight (raising what failed it), then closes."""
        try:
            self.wait()
        finally:
            if self._opened is not None:
                self._opened.close()


def leaf_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    """Each array leaf's dotted path (orbax's name for it: `learner.params.Dense_0.kernel`) and shape."""
    def name(key: Any) -> str:
        for attr in ("name", "key", "idx"):  # GetAttrKey, DictKey / FlattenedIndexKey, SequenceKey
            if hasattr(key, attr):
                return str(getattr(key, attr))
        return str(key)

    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {".".join(name(k) for k in path): tuple(leaf.shape) for path, leaf in leaves}


def layout_difference(stored: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]]) -> str | None:
    """One phrase on how a checkpoint's arrays differ from the state this version builds, or None."""
    missing, extra = sorted(set(expected) - set(stored)), sorted(set(stored) - set(expected))
    if missing or extra:
        first = f"it lacks {missing[0]!r}" if missing else f"it holds {extra[0]!r}, which this version has no place for"
        return f"{len(missing)} arrays missing and {len(extra)} unknown ({first})"
    shapes = [k for k in sorted(expected) if stored[k] != expected[k]]
    if shapes:
        return f"{len(shapes)} arrays of other shapes ({shapes[0]!r}: {stored[shapes[0]]}, expected {expected[shapes[0]]})"
    return None


class IncompatibleCheckpoints(Exception):
    """Every checkpoint reads, but holds another state layout than this version builds (a run folder made by
    another sparqrl version whose state for this algorithm changed): it cannot resume; the message says how."""


class DamagedCheckpoints(Exception):
    def __init__(self, damaged: list[tuple[int, str]]):
        self.damaged = damaged
        super().__init__("; ".join(f"step {step}: {why}" for step, why in damaged))


@contextlib.contextmanager
def _quiet_failures(failed: list) -> Iterator[None]:
    """While checkpoints are tried or one is written: a damaged one, or a write to a full disk, fails in
    many places at once (orbax logs each failed file; its other reads and writes end in 'Exception ignored'
    tracebacks when collected, and tensorstore's threads print tracebacks when they deliver them to orbax's
    event loop, already closed). The one line the run prints says it all: all of that is silenced, for a
    moment longer when something failed (`failed` not empty), until the failed coroutines are collected."""
    saved = sys.unraisablehook, threading.excepthook, sys.stderr
    sys.unraisablehook = lambda unraisable: None
    threading.excepthook = lambda args: None
    sys.stderr = io.StringIO()
    try:
        with _quiet_logs():
            try:
                yield
            finally:
                if failed:  # (a full collection costs 0.05-0.3 s with JAX loaded: never after a clean write)
                    time.sleep(0.5)  # the failed reads and writes still in flight finish
                    gc.collect()  # and their coroutines are finalised, while their tracebacks are still silenced
    finally:
        sys.unraisablehook, threading.excepthook, sys.stderr = saved


@contextlib.contextmanager
def _quiet_logs() -> Iterator[None]:
    """orbax's threads log each failed read or write with its traceback (the absl and asyncio loggers); the
    exception orbax then raises carries the cause, which the run reports in one line."""
    loggers = [logging.getLogger(name) for name in ("absl", "asyncio")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    first = text[0].split(" See full TensorStore details")[0][:160] if text else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__

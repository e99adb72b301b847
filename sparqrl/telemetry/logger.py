"""Per-chunk metrics to `metrics.csv` (one row per chunk per seed) and to scalar writers (mean over seeds):
TensorBoard always, W&B with `--wandb` (`sparqrl.telemetry.wandb_log`), each given the same values at the same
env step. metrics.csv is never written through a link (`sparqrl.runfiles`); the run folder checked
`tensorboard/` when it claimed it."""

from __future__ import annotations

import csv
import io
import itertools
import math
import os
import socket
import struct
import time
from pathlib import Path
from typing import IO, Any, Protocol, Sequence

import numpy as np

from sparqrl.runfiles import open_nofollow, write_atomic

FIRST_COLUMNS = ["chunk", "env_step", "seed", "wall_time_s", "episode_return", "episodes", "eval_return"]


def _truncate_csv(path: Path, last_chunk: int) -> None:
    """Keep only whole rows up to `last_chunk`: on resume, later rows are recomputed, never duplicated,
    and a row cut short by a kill or a full disk is dropped. Rewritten whole or not at all."""
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return
    header, body = rows[0], rows[1:]
    kept = [row for row in body if len(row) == len(header) and row[0].isdigit() and int(row[0]) <= last_chunk]
    text = io.StringIO(newline="")
    csv.writer(text).writerows([header, *kept])
    write_atomic(path, text.getvalue())


class ScalarWriter(Protocol):
    """Where a chunk's scalars go besides metrics.csv: {tag ("train/NAME", "eval/NAME"): mean over seeds}."""

    def scalars(self, step: int, values: dict[str, float]) -> None: ...
    def close(self) -> None: ...


_FILE_IDS = itertools.count()  # event files of one process and second differ by it (a resume in-process)


def _crc32c_table() -> list[int]:
    """CRC-32C (Castagnoli; reflected polynomial 0x82F63B78): the remainder of each byte value."""
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table.append(crc)
    return table


_CRC32C = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
    """The masked CRC-32C of a TFRecord's length and data fields (the record format's own rotation and offset)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tf_record(data: bytes) -> bytes:
    """One record of an event file (TFRecord): length (uint64), its masked CRC, the data, the data's masked CRC,
    all little-endian."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


class TensorBoardWriter:
    """The TensorBoard event file in `folder`, made at the first scalars (a run that fails its checks, or
    `--help`, never imports TensorBoard's modules); `purge_step`: events from this step on (written before an
    interruption) are dropped.

    Written with the `tensorboard` package's protos (`Event`, `Summary`), which import neither torch nor
    TensorFlow (tensorboardX imports torch wherever it is installed, 4.4 s on a GPU machine, issue 33, and
    TensorBoard's `EventFileWriter` TensorFlow), framed as TFRecords here (`tf_record`): the package's own
    `RecordWriter` is reached through `tensorboard.summary`, whose import (0.19 s of CPU on the 2-core machine,
    at the first chunk, while training waited for the host) brings its summary ops. Each chunk's event is handed
    to the OS at once, as metrics.csv's rows are (a live TensorBoard is never behind), and synced to disk once, at
    `close`: an fsync per chunk cost 0.3 s of 50 chunks on the loaded 2-core CPU."""

    def __init__(self, folder: Path, purge_step: int | None = None):
        self._folder, self._purge_step = folder, purge_step
        self._file: IO[bytes] | None = None  # the event file, opened at the first scalars

    def scalars(self, step: int, values: dict[str, float]) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=tag, simple_value=value) for tag, value in values.items()])
        self._write(step, summary=summary)

    def _write(self, step: int, **fields: Any) -> None:
        from tensorboard.compat.proto.event_pb2 import Event

        if self._file is None:
            self._file = self._open()
        self._file.write(tf_record(Event(wall_time=time.time(), step=step, **fields).SerializeToString()))
        self._file.flush()

    def _open(self) -> IO[bytes]:
        """A new event file (named as TensorBoard's own writer names them), begun as every event file is; with
        `purge_step`, a session start there, which tells TensorBoard to drop the events logged from it on."""
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        self._folder.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_FILE_IDS)}"
        file = open_nofollow(self._folder / name, "wb")
        step = self._purge_step or 0
        file.write(tf_record(Event(wall_time=time.time(), step=step, file_version="brain.Event:2").SerializeToString()))
        if self._purge_step is not None:
            start = Event(wall_time=time.time(), step=step, session_log=SessionLog(status=SessionLog.START))
            file.write(tf_record(start.SerializeToString()))
        return file

    def close(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            file.flush()
            os.fsync(file.fileno())
            file.close()


def chunk_scalars(per_seed: dict[str, np.ndarray]) -> dict[str, float]:
    """A chunk's scalars for the writers: each metric's mean over seeds, under "eval/" or "train/"; metrics
    with no value this chunk (NaN for every seed) left out."""
    out = {}
    for name, values in per_seed.items():
        values = np.asarray(values, np.float64)
        if not np.all(np.isnan(values)):
            out[f"{'eval' if name.startswith('eval') else 'train'}/{name}"] = float(np.nanmean(values))
    return out


class RunLogger:
    """Writes `metrics.csv` and a TensorBoard event file in `out`, and hands the same scalars to `writers`.

    `resume_chunk`: the chunk of the checkpoint a resumed run starts after; rows and events beyond it
    (written before the interruption) are dropped, so the logs equal those of an uninterrupted run.
    """

    def __init__(self, out: Path, resume_chunk: int | None = None, resume_step: int | None = None,
                 writers: Sequence[ScalarWriter] = ()):
        self.csv_path = out / "metrics.csv"
        if resume_chunk is not None and self.csv_path.exists():
            _truncate_csv(self.csv_path, resume_chunk)
        self._columns: list[str] | None = None
        if self.csv_path.exists() and self.csv_path.stat().st_size > 0:
            with self.csv_path.open(newline="") as f:
                self._columns = next(csv.reader(f), None)
        self.writers: list[ScalarWriter] = [TensorBoardWriter(out / "tensorboard", resume_step), *writers]

    def log(self, chunk: int, env_step: int, wall_time_s: float, per_seed: dict[str, np.ndarray]) -> None:
        """`per_seed`: metric name -> [seeds] values (NaN where a seed has no value this chunk)."""
        seeds = len(next(iter(per_seed.values())))
        if self._columns is None:
            extra = sorted(k for k in per_seed if k not in FIRST_COLUMNS)
            self._columns = FIRST_COLUMNS + extra
            with open_nofollow(self.csv_path, "w") as f:
                csv.writer(f).writerow(self._columns)
        fixed = {"chunk": chunk, "env_step": env_step, "wall_time_s": round(wall_time_s, 3)}
        # column by column (a row per seed: 4096 seeds made this loop 12 s of a run when it indexed per value)
        columns = [range(seeds) if c == "seed" else [fixed[c]] * seeds if c in fixed
                   else _fmt_all(per_seed[c]) if c in per_seed else [""] * seeds for c in self._columns]
        with open_nofollow(self.csv_path, "a") as f:
            csv.writer(f).writerows(zip(*columns))
        scalars = chunk_scalars(per_seed)
        for writer in self.writers:
            writer.scalars(env_step, scalars)

    def close(self) -> None:
        """Closes every writer, also after one of them failed (the first failure is raised)."""
        failure = None
        for writer in self.writers:
            try:
                writer.close()
            except Exception as error:  # noqa: BLE001 - the others still close
                failure = failure or error
        if failure is not None:
            raise failure


def _fmt_all(values: Any) -> list[str]:
    """Each value of a [seeds] array as metrics.csv holds it (6 significant digits, NaN empty), through Python
    floats (NumPy's scalars are slow to index)."""
    return ["" if math.isnan(v) else f"{v:.6g}" for v in np.asarray(values, np.float64).tolist()]


def read_metrics(csv_path: Path, only: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """metrics.csv as arrays: chunk, env_step, wall_time_s [chunks]; every other column [chunks, seeds]
    (NaN where empty; a chunk not yet written whole left out); `only`: just those columns (those the file has).
    {} when the file does not exist yet. Read column by column, keeping no row: a container kept per row
    (DictReader's dicts) made Python's garbage collector scan everything JAX holds, again and again (1.5 s at
    4096 seeds x 50 chunks)."""
    if not csv_path.exists():
        return {}
    with csv_path.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader, [])
        named = {name: [] for name in header if name == "seed" or only is None or name in only}
        where = [(header.index(name), column) for name, column in named.items()]
        for row in reader:
            for i, column in where:
                column.append(row[i] if i < len(row) and row[i] else "nan")
    if not named.get("seed"):
        return {}
    seeds = 1 + int(np.nanmax(np.asarray(named["seed"], np.float64)))
    chunks = len(named["seed"]) // seeds
    out: dict[str, np.ndarray] = {}
    for name, column in named.items():
        if name != "seed":
            values = np.asarray(column[: chunks * seeds], np.float64).reshape(chunks, seeds)
            out[name] = values[:, 0] if name in ("chunk", "env_step", "wall_time_s") else values
    for name in ("chunk", "env_step"):
        if name in out:
            out[name] = out[name].astype(np.int64)
    return out

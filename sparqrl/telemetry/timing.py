"""Where a run's wall time goes: summary.json's `time_s` (issue 33: everything around training, measured per run).

Each second of a session is the host's, spent on one thing at a time: compiling, waiting for training chunks,
evaluating, writing checkpoints, or the rest (logging, progress, the picture, the run folder). Work the device
does while the host does something else (the next chunk runs while the host logs or evaluates) is counted
where the host was, so the parts add up to the wall time.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Callable, Iterator

PARTS = ("training", "evaluation", "checkpoints")  # timed by `TimeSplit.part`; compile has its own clock


def process_age_s() -> float | None:
    """Seconds since this process started (Linux's /proc), or None where that cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 (starttime), in clock ticks since boot
        return max(time.clock_gettime(time.CLOCK_BOOTTIME) - started, 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class TimeSplit:
    """A session's wall time by part. `compile_clock`: the session's compile seconds so far (a part's time
    leaves out what was compiled inside it, such as the evaluation program at the first evaluation)."""

    def __init__(self, compile_clock: Callable[[], float]):
        self._compile_clock = compile_clock
        self._startup = process_age_s()  # the process's life before the session: Python, imports, checks
        self._start = time.perf_counter()
        self._spent = dict.fromkeys(PARTS, 0.0)

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        start, compiled = time.perf_counter(), self._compile_clock()
        try:
            yield
        finally:
            self._spent[name] += time.perf_counter() - start - (self._compile_clock() - compiled)

    def seconds(self) -> dict[str, float | None]:
        """{startup, compile, training, evaluation, checkpoints, rest, total}: `total` is the process's age
        now (the session's wall time when the start cannot be read; `startup` is then None)."""
        session = time.perf_counter() - self._start
        compile_s = self._compile_clock()
        rest = session - compile_s - sum(self._spent.values())
        total = session + (self._startup or 0.0)
        parts = {"startup": self._startup, "compile": compile_s, **self._spent, "rest": rest, "total": total}
        return {k: None if v is None else round(v, 3) for k, v in parts.items()}

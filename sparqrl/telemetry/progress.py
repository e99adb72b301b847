"""Progress: a live bar on a terminal; complete lines elsewhere (CI, `> log.txt`, nohup), where a bar
would be redrawn into a truncated mess."""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def make_progress(enabled: bool, *, terminal: bool | None = None) -> Any:
    """A rich bar when stdout is a terminal, else `LineProgress`; nothing shown when not `enabled`.
    Both take `add_task(description, total=, sps=, ret=)` and `update(task, completed=, sps=, ret=)`."""
    if enabled and not (sys.stdout.isatty() if terminal is None else terminal):
        return LineProgress()
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("env steps"),
        TextColumn("{task.fields[sps]:>10,.0f} steps/s"),
        TextColumn("return {task.fields[ret]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        disable=not enabled,
        transient=False,
    )


class LineProgress:
    """One complete line at the session's first progress (its first chunk: the run is seen to train as soon
    as it does), then each time the run passes another `every` of its env steps, and at its end:
    `ppo CartPole-v1: 250,000/500,000 env steps (50%), return 87.3, 120,433 steps/s, ETA 0:00:02`."""

    def __init__(self, every: float = 0.05, stream: Any = None):
        self.marks = round(1 / every)  # a line at each of these marks of the run
        self.stream = stream
        self._tasks: list[dict[str, Any]] = []

    def __enter__(self) -> "LineProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def add_task(self, description: str, total: int, **fields: Any) -> int:
        self._tasks.append({"description": description, "total": max(int(total), 1),
                            "start": None, "mark": 0, **fields})
        return len(self._tasks) - 1

    def update(self, task: int, completed: int | None = None, **fields: Any) -> None:
        t = self._tasks[task]
        t.update(fields)
        if completed is None:
            return
        now = time.perf_counter()
        mark = completed * self.marks // t["total"]
        if t["start"] is None:  # the first update sets where this session starts (a resume: not 0)
            t["start"], t["mark"] = (completed, now), mark - 1  # (so its first progress passes a mark)
            return
        if completed <= t["start"][0] or (mark <= t["mark"] and completed < t["total"]):
            return
        t["mark"] = mark
        fraction = completed / t["total"]
        done, began = completed - t["start"][0], now - t["start"][1]
        eta = (t["total"] - completed) * began / done if done > 0 else float("nan")
        eta_text = "-" if eta != eta else time.strftime("%H:%M:%S", time.gmtime(eta))
        print(f"{t['description']}: {completed:,}/{t['total']:,} env steps ({fraction:.0%}), return {t.get('ret', '-')}, "
              f"{t.get('sps', 0.0):,.0f} steps/s, ETA {eta_text}", file=self.stream or sys.stdout, flush=True)

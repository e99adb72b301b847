"""The learning curve `returns.png`: mean and spread over seeds against env steps; the helpers every
picture a run writes shares (returns.png, sweep.png, fitness.png, learned.png)."""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from sparqrl.runfiles import write_atomic


def pyplot() -> Any:
    """matplotlib.pyplot drawing to files only (never a display), imported when a picture is drawn: a
    quarter of a second the run's start need not wait for."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def finish_axes(ax: Any, xlabel: str | None = None, ylabel: str | None = None, title: str | None = None, *,
                legend: bool = True) -> None:
    """The axes' labels and title (those given), a light grid and the legend."""
    for text, setter in ((xlabel, ax.set_xlabel), (ylabel, ax.set_ylabel), (title, ax.set_title)):
        if text is not None:
            setter(text)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend()


def save_figure(fig: Any, path: Path) -> None:
    """Lay out, write in the format `path`'s extension names (PNG without one; whole or not at all, never
    through a link: `runfiles.write_atomic`) and free the figure."""
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format=path.suffix.lower().lstrip(".") or "png", dpi=110)
    pyplot().close(fig)
    write_atomic(path, image.getvalue())


def _curve(steps: list[str], values: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and spread of a metrics.csv column's values by env step (empty cells left out)."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for step, value in zip(steps, values):
        if value:
            by_step[int(step)].append(float(value))
    at = np.array(sorted(by_step))
    mean = np.array([np.mean(by_step[s]) for s in at])
    std = np.array([np.std(by_step[s]) for s in at])
    return at, mean, std


def _read_columns(csv_path: Path, names: tuple[str, ...]) -> dict[str, list[str]]:
    """metrics.csv's columns `names` (those it has), as text. Row by row, keeping no row: a list kept per row
    (DictReader's dicts too) made Python's garbage collector scan everything JAX holds, again and again,
    1.5 s at 4096 seeds x 50 chunks."""
    with csv_path.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader, [])
        where = {name: header.index(name) for name in names if name in header}
        columns: dict[str, list[str]] = {name: [] for name in where}
        for row in reader:
            for name, i in where.items():
                columns[name].append(row[i] if i < len(row) else "")
    return columns


def plot_returns(csv_path: Path, png_path: Path, title: str) -> None:
    columns = _read_columns(csv_path, ("env_step", "episode_return", "eval_return"))
    fig, ax = pyplot().subplots(figsize=(7, 4.2))
    for column, label in (("episode_return", "training episodes"), ("eval_return", "evaluation (deterministic)")):
        steps, mean, std = _curve(columns.get("env_step", ()), columns.get(column, ()))
        if len(steps):
            ax.plot(steps, mean, label=label, marker="o" if column == "eval_return" else None)
            ax.fill_between(steps, mean - std, mean + std, alpha=0.25)
    finish_axes(ax, "env steps per seed", "episode return", title)
    save_figure(fig, png_path)

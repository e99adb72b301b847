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


def _curve(rows: list[dict[str, str]], column: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    by_step: dict[int, list[float]] = defaultdict(list)
    for row in rows:
        if row.get(column):
            by_step[int(row["env_step"])].append(float(row[column]))
    steps = np.array(sorted(by_step))
    mean = np.array([np.mean(by_step[s]) for s in steps])
    std = np.array([np.std(by_step[s]) for s in steps])
    return steps, mean, std


def plot_returns(csv_path: Path, png_path: Path, title: str) -> None:
    with csv_path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    fig, ax = pyplot().subplots(figsize=(7, 4.2))
    for column, label in (("episode_return", "training episodes"), ("eval_return", "evaluation (deterministic)")):
        steps, mean, std = _curve(rows, column)
        if len(steps):
            ax.plot(steps, mean, label=label, marker="o" if column == "eval_return" else None)
            ax.fill_between(steps, mean - std, mean + std, alpha=0.25)
    finish_axes(ax, "env steps per seed", "episode return", title)
    save_figure(fig, png_path)

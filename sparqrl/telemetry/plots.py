"""The learning curve `returns.png`: mean and spread over seeds against env steps; the helpers every
picture a run writes shares (returns.png, sweep.png, fitness.png, learned.png)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from sparqrl.runfiles import write_atomic
from sparqrl.telemetry.logger import read_metrics


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


def _curve(steps: np.ndarray, values: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and spread over seeds of a metrics.csv column [chunks, seeds] by env step (empty cells left out)."""
    if values is None:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    logged = ~np.isnan(values).all(axis=1)
    kept = values[logged]
    return steps[logged], np.nanmean(kept, axis=1), np.nanstd(kept, axis=1)


def plot_returns(csv_path: Path, png_path: Path, title: str) -> None:
    columns = read_metrics(csv_path, only=("env_step", "episode_return", "eval_return"))
    fig, ax = pyplot().subplots(figsize=(7, 4.2))
    for column, label in (("episode_return", "training episodes"), ("eval_return", "evaluation (deterministic)")):
        steps, mean, std = _curve(columns.get("env_step", np.zeros(0)), columns.get(column))
        if len(steps):
            ax.plot(steps, mean, label=label, marker="o" if column == "eval_return" else None)
            ax.fill_between(steps, mean - std, mean + std, alpha=0.25)
    finish_axes(ax, "env steps per seed", "episode return", title)
    save_figure(fig, png_path)

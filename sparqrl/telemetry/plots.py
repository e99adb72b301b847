"""The learning curve `returns.png`: mean and spread over seeds against env steps."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import numpy as np


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
    import matplotlib  # imported here: a quarter of a second the run's start need not wait for

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    with csv_path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for column, label in (("episode_return", "training episodes"), ("eval_return", "evaluation (deterministic)")):
        steps, mean, std = _curve(rows, column)
        if len(steps):
            ax.plot(steps, mean, label=label, marker="o" if column == "eval_return" else None)
            ax.fill_between(steps, mean - std, mean + std, alpha=0.25)
    ax.set_xlabel("env steps per seed")
    ax.set_ylabel("episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)

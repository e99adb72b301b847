"""What a run shows and leaves behind: progress bar, metrics.csv, TensorBoard, returns.png, summary."""

from sparqrl.telemetry.logger import RunLogger
from sparqrl.telemetry.plots import plot_returns
from sparqrl.telemetry.progress import make_progress

__all__ = ["RunLogger", "make_progress", "plot_returns"]

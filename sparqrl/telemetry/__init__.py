"""What a run shows and leaves behind: progress bar, metrics.csv, TensorBoard (and W&B with --wandb,
`wandb_log`), returns.png, summary, energy and CO2 (codecarbon, offline)."""

from sparqrl.telemetry.energy import (
    ENERGY_META_KEYS,
    EnergyMeter,
    carbon_intensity,
    known_countries,
    validate_country,
)
from sparqrl.telemetry.logger import RunLogger
from sparqrl.telemetry.plots import plot_returns
from sparqrl.telemetry.progress import make_progress

__all__ = [
    "ENERGY_META_KEYS",
    "EnergyMeter",
    "RunLogger",
    "carbon_intensity",
    "known_countries",
    "make_progress",
    "plot_returns",
    "validate_country",
]

"""Runners drive algorithms: `anakin` runs everything on device in jitted chunks."""

from sparqrl.runners.anakin import RunConfig, RunInterrupted, evaluate_saved, resume, train

__all__ = ["RunConfig", "RunInterrupted", "evaluate_saved", "resume", "train"]

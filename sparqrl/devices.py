"""Spreading seeds over a CPU's cores: XLA runs one CPU "device" per process unless told before JAX is
imported (`--xla_force_host_platform_device_count`), and the on-device runner shards the seed axis
over as many devices as divide the seed count (a sweep's settings x seeds; a meta run's population,
`meta.run.population_devices`). The `sparqrl` command decides this before importing JAX
(`sparqrl.entry`); from Python, set the flag yourself before the first `import jax`:

    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"   # e.g. 2 cores
    from sparqrl.runners import RunConfig, train

This module imports nothing heavy: it runs before JAX is imported.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

FLAG = "--xla_force_host_platform_device_count"
CHOICE_ENV = "SPARQRL_SEED_SPREAD"  # what the command decided, for summary.json
# Measured (BENCHMARKS.md, "Seeds over cores", 2 cores): spreading was faster from 2 seeds on (1.22x at 2,
# 1.44x at 4, 2.19x at 8, 1.87x at 64), so one seed per device is enough.
MIN_SEEDS_PER_DEVICE = 1
META_POPSIZE = 32  # `sparqrl meta`'s default --popsize (MetaConfig.popsize; not imported: JAX is not loaded yet)


def cpu_devices_for(seeds: int, cores: int) -> int:
    """The CPU devices to spread `seeds` over: the most that divide the seeds, at most one per core, with
    at least MIN_SEEDS_PER_DEVICE seeds each (1: do not spread; a 1-seed run is never slowed)."""
    best = 1
    for devices in range(2, cores + 1):
        if seeds % devices == 0 and seeds // devices >= MIN_SEEDS_PER_DEVICE:
            best = devices
    return best


def _option(argv: list[str], flag: str, field: str | None) -> str | None:
    """The value of `--flag V`, `--flag=V` or `--set field=V` (the last one given; field None: a flag only,
    as meta's --set items are the inner config's)."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
        elif field and arg == "--set" and i + 1 < len(argv) and argv[i + 1].startswith(field + "="):
            value = argv[i + 1].split("=", 1)[1]
    return value


def _settings(argv: list[str]) -> int:
    """The number of settings of a `sweep` command line: the grid's product times the random samples."""
    count = 1
    for i, arg in enumerate(argv[:-1]):
        if arg == "--grid":
            count *= len([v for v in argv[i + 1].partition("=")[2].split(",") if v.strip()]) or 1
    if "--random" in argv:
        count *= int(_option(argv, "--samples", "samples") or 16)
    return count


def _run_of(argv: list[str]) -> tuple[str, int] | None:
    """(env, members to split) of the `train`, `sweep` or `meta` command in argv (a resumed run's from its
    config.json), or None: a train run's seeds, a sweep's settings x seeds, a meta run's population (its
    members' inner seeds stay together, `meta.run.population_fitness`). None where the work runs elsewhere:
    over Ray workers (`--workers`, `--ray-address`), or one M-FOS learner (`--trainer ppo`)."""
    if not argv or argv[0] not in ("train", "sweep", "meta"):
        return None
    if argv[0] != "train" and ({"--workers", "--ray-address"} & {a.split("=", 1)[0] for a in argv}):
        return None
    if argv[0] == "meta":
        return _meta_run_of(argv)
    if "--resume" in argv:
        i = argv.index("--resume")
        try:
            data = json.loads((Path(argv[i + 1]) / "config.json").read_text())
            return str(data["run"]["env"]), int(data["run"]["seeds"]) * len(data.get("sweep") or [None])
        except (IndexError, OSError, ValueError, KeyError, TypeError):
            return None
    try:
        seeds = int(_option(argv, "--seeds", "seeds") or 1)
        return _option(argv, "--env", "env") or "CartPole-v1", seeds * (_settings(argv) if argv[0] == "sweep" else 1)
    except ValueError:
        return None  # the command's own parsing reports the bad value


def _meta_run_of(argv: list[str]) -> tuple[str, int] | None:
    """(env, popsize) of a `meta` command line (a resumed run's from its config.json), or None."""
    try:
        if "--resume" in argv:
            data = json.loads((Path(argv[argv.index("--resume") + 1]) / "config.json").read_text())["meta"]
            env, popsize, trainer = str(data["env"]), int(data["popsize"]), str(data.get("trainer", "es"))
        else:
            env = _option(argv, "--env", None) or "CartPole-v1"
            popsize = int(_option(argv, "--popsize", None) or META_POPSIZE)
            trainer = _option(argv, "--trainer", None) or "es"
    except (IndexError, OSError, ValueError, KeyError, TypeError):
        return None  # the command's own parsing reports it
    return None if trainer == "ppo" else (env, popsize)


def spread_seeds(argv: list[str]) -> None:
    """Before JAX is imported: on a CPU with several cores, give XLA one device per core for a device
    run with enough seeds. A user's own XLA_FLAGS device count, or a platform other than the CPU
    chosen with JAX_PLATFORMS, is left alone."""
    run = _run_of(argv)
    flags = os.environ.get("XLA_FLAGS", "")
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if run is None or run[0].startswith("gym:") or FLAG in flags or (platforms and "cpu" not in platforms):
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    devices = cpu_devices_for(run[1], cores)
    if devices > 1:
        os.environ["XLA_FLAGS"] = f"{flags} {FLAG}={devices}".strip()
        what = "population members" if argv[0] == "meta" else "seeds"
        os.environ[CHOICE_ENV] = f"{devices} CPU devices (auto: {run[1]} {what} over {cores} cores)"


def seed_spread(devices_used: int) -> str:
    """How the seeds were spread, for summary.json."""
    return os.environ.get(CHOICE_ENV) or f"{devices_used} device(s)"

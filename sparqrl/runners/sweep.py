"""`sparqrl sweep`: many settings of the traced hyperparameters x seeds, trained as ONE compiled program.

A sweep is an on-device run whose members are settings x seeds (`anakin`): setting s's seed k is member
s * seeds + k and gets seed k's key, so it ends exactly where `sparqrl train` with that setting and
the same seeds would. Settings come from a grid (`--grid lr=1e-4,3e-4`, the product of every --grid in
order) and/or random samples (`--random lr=log:1e-5:1e-2 --samples 64`, drawn from `--seed`); only
fields in the algorithm's `TRACED` may vary, as the others fix shapes or loop counts. Besides a run's
files, a sweep writes sweep.csv, sweep.png and best.json (a config `sparqrl train ALGO --load-config`
runs). It lives beside the runner it drives rather than in `meta/`: it needs none of evosax.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import json
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from sparqrl import config as cfg
from sparqrl.algos.base import traced_fields, with_hparams

Setting = dict[str, float]
SCALES = ("log", "lin")
MAX_SETTINGS = 65_536


def _field(algo_config: Any, name: str, flag: str) -> str:
    """`name` if it is a traced field of the config; else a one-line error that says why not."""
    traced = traced_fields(algo_config)
    names = [f.name for f in dataclasses.fields(algo_config)]
    if name in traced:
        return name
    if name in names:
        cfg.fail(flag, name, f"is static (it fixes shapes, loop counts or the program's structure) and cannot "
                             f"vary inside one program: sweep it with separate runs; the fields a sweep varies "
                             f"are {', '.join(traced)}")
    cfg.fail(flag, name, f"is not a field of {type(algo_config).__module__.split('.')[-2]}'s config"
                         f"{cfg.close_matches(name, names)}; the fields a sweep varies are {', '.join(traced)}")


def _split(item: str, flag: str) -> tuple[str, str]:
    name, sep, values = item.partition("=")
    cfg.require(bool(sep) and bool(name.strip()) and bool(values.strip()), flag, item, "must look like field=values")
    return name.strip(), values.strip()


def _number(text: str, flag: str, item: str) -> float:
    try:
        value = float(text)
    except ValueError:
        cfg.fail(flag, item, f"{text!r} is not a number")
    cfg.require(math.isfinite(value), flag, item, f"{text!r} is not a finite number")
    return value


def parse_grid(algo_config: Any, items: Sequence[str]) -> list[Setting]:
    """The settings of `--grid field=v1,v2,...` items: the product of every field's values, in order."""
    axes: dict[str, list[float]] = {}
    for item in items:
        name, text = _split(item, "--grid")
        name = _field(algo_config, name, "--grid")
        cfg.require(name not in axes, "--grid", item, f"repeats the field {name!r}")
        axes[name] = [_number(v.strip(), "--grid", item) for v in text.split(",") if v.strip()]
        cfg.require(bool(axes[name]), "--grid", item, "needs at least one value")
    count = math.prod(map(len, axes.values()))  # before the product is built: 100 values x 8 fields is 10^16
    cfg.require(count <= MAX_SETTINGS, "--grid", f"{count:,} settings", f"must give <= {MAX_SETTINGS:,}")
    return [dict(zip(axes, values)) for values in itertools.product(*axes.values())]


def parse_random(algo_config: Any, items: Sequence[str], samples: int, seed: int) -> list[Setting]:
    """`samples` settings drawn from `--random field=log|lin:low:high` items (log: uniform in log-space)."""
    cfg.require(1 <= samples <= MAX_SETTINGS, "--samples", samples, f"must be in [1, {MAX_SETTINGS:,}]")
    ranges: dict[str, tuple[str, float, float]] = {}
    for item in items:
        name, text = _split(item, "--random")
        name = _field(algo_config, name, "--random")
        cfg.require(name not in ranges, "--random", item, f"repeats the field {name!r}")
        parts = text.split(":")
        cfg.require(len(parts) == 3 and parts[0] in SCALES, "--random", item,
                    "must look like field=log:low:high or field=lin:low:high")
        low, high = (_number(p, "--random", item) for p in parts[1:])
        cfg.require(low < high, "--random", item, "needs low < high")
        cfg.require(parts[0] == "lin" or low > 0, "--random", item, "a log range needs low > 0")
        ranges[name] = (parts[0], low, high)
    rng = np.random.default_rng(seed)
    draws = {name: rng.uniform(*(np.log([lo, hi]) if scale == "log" else (lo, hi)), size=samples)
             for name, (scale, lo, hi) in ranges.items()}
    return [{name: float(np.exp(d[i]) if ranges[name][0] == "log" else d[i]) for name, d in draws.items()}
            for i in range(samples)]


def make_settings(algo_config: Any, grid: Sequence[str], random: Sequence[str], samples: int | None,
                  seed: int) -> list[Setting]:
    """Every setting of a sweep: the grid's, each combined with every random sample when both are given."""
    cfg.require(bool(grid) or bool(random), "sweep", "", "needs --grid field=v1,v2,... or --random field=log:low:high")
    cfg.require(samples is None or bool(random), "--samples", samples, "needs --random")
    grid_settings = parse_grid(algo_config, grid) if grid else [{}]
    random_settings = parse_random(algo_config, random, 16 if samples is None else samples, seed) if random else [{}]
    both = set(grid_settings[0]) & set(random_settings[0])
    cfg.require(not both, "--random", ", ".join(sorted(both)), "is also given by --grid")
    settings = [{**g, **r} for g in grid_settings for r in random_settings]
    cfg.require(len(settings) <= MAX_SETTINGS, "sweep", f"{len(settings):,} settings", f"must be <= {MAX_SETTINGS:,}")
    return settings


# ---- outputs -------------------------------------------------------------------------------------


def setting_returns(final_per_member: np.ndarray, settings: list[Setting]) -> np.ndarray:
    """[settings, seeds] final returns from the members' [settings * seeds]."""
    return np.asarray(final_per_member).reshape(len(settings), -1)


def sweep_csv(settings: list[Setting], returns: np.ndarray) -> str:
    """One row per setting: its index, the swept values, the final return's mean and std over seeds."""
    fields = list(settings[0])
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["setting", *fields, "return_mean", "return_std", "seeds"])
    for i, (setting, row) in enumerate(zip(settings, returns)):
        writer.writerow([i, *(repr(setting[f]) for f in fields), repr(float(row.mean())), repr(float(row.std())),
                         row.size])
    return out.getvalue()


def best_setting(settings: list[Setting], returns: np.ndarray) -> int:
    """The setting with the highest mean final return (the first of equals)."""
    return int(np.argmax(returns.mean(axis=1)))


def best_json(algo_name: str, algo_config: Any, run: Any, setting: Setting, returns: np.ndarray) -> str:
    """config.json's layout with the best setting applied: `sparqrl train ALGO --load-config best.json`."""
    return json.dumps({"algo": algo_name, "run": cfg.to_dict(run), "config": cfg.to_dict(with_hparams(algo_config, setting)),
                       "setting": setting, "return_mean": float(returns.mean()), "return_std": float(returns.std())},
                      indent=2, sort_keys=True)


def plot_sweep(settings: list[Setting], returns: np.ndarray, png_path: Path, title: str) -> None:
    """sweep.png: per swept field, each setting's final return (mean and std over seeds) against its value."""
    from sparqrl.telemetry.plots import finish_axes, pyplot, save_figure

    fields = list(settings[0])
    fig, axes = pyplot().subplots(1, len(fields), figsize=(4.5 * len(fields), 3.8), squeeze=False)
    mean, std = returns.mean(axis=1), returns.std(axis=1)
    for ax, field in zip(axes[0], fields):
        values = np.array([s[field] for s in settings])
        ax.errorbar(values, mean, yerr=std, fmt="o", alpha=0.75, capsize=3)
        if values.min() > 0 and values.max() / values.min() >= 10:
            ax.set_xscale("log")
        finish_axes(ax, field, "final return (mean ± std over seeds)", legend=False)
    fig.suptitle(title)
    save_figure(fig, png_path)


def write_outputs(rundir: Any, final_per_member: np.ndarray, *, algo_name: str, algo_config: Any, run: Any,
                  settings: list[Setting]) -> dict[str, Any]:
    """Write sweep.csv, sweep.png and best.json into the run folder; the summary's sweep fields: beside the
    summary's `seeds` (per setting, as `--seeds`), the number of `settings` and of `members` (settings x seeds,
    the length of `final_return_per_seed`, member s * seeds + k), so that no count reads as another."""
    returns = setting_returns(final_per_member, settings)
    best = best_setting(settings, returns)
    rundir.write_text("sweep.csv", sweep_csv(settings, returns))
    rundir.write_text("best.json", best_json(algo_name, algo_config, run, settings[best], returns[best]))
    plot_sweep(settings, returns, rundir.claim("sweep.png"),
               f"{algo_name} on {run.env}: {len(settings)} settings x {run.seeds} seed(s)")
    return {"settings": len(settings), "members": returns.size, "swept": list(settings[0]), "best_setting": best,
            "best": settings[best], "best_return_mean": float(returns[best].mean()),
            "best_return_std": float(returns[best].std())}

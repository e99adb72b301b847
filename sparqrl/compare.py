"""`sparqrl compare DIR... [--out compare.png]`: the learning curves of several runs (or a sweep's
settings) on shared axes, and a table of their final return, throughput, wall time and energy.

    rows = compare(["runs/a", "runs/b", "runs/sweep"], out="compare.png")
    print(format_table(rows))

A train run is one curve and one row; a sweep (`sparqrl sweep`) is one curve and one row per setting,
over that setting's seeds. Every curve is the mean over seeds with a ± std band against env steps per
seed, of the same metric for all: the deterministic evaluation return when every run logged it at two
chunks or more (the default `eval_every` does), else the training episodes' return. Mixing the two
on one axis would compare a greedy policy with an exploring one.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from sparqrl import config as cfg
from sparqrl.argparsing import OneLineParser
from sparqrl.extras import need_installed
from sparqrl.runners.rundir import CONFIG, SUMMARY, is_meta_config, open_run_dir, os_reason, saved_sweep
from sparqrl.stats import (DEFAULT_REPS, DEFAULT_SEED, MIN_RUNS, WHAT, Stats, check_options, estimate, figure,
                           format_stats, normalized, parse_normalize)
from sparqrl.telemetry.logger import read_metrics

DEFAULT_OUT = "compare.png"
METRICS = "metrics.csv"
# What each curve metric is called on the y axis.
CURVE_LABELS = {"eval_return": "evaluation return (deterministic policy)",
                "episode_return": "training episode return"}
MIN_EVAL_POINTS = 2  # fewer evaluations than this are a point, not a curve


class Curve(NamedTuple):
    """A learning curve over seeds: `steps`, `mean`, `std` are [points] (chunks where any seed has a value)."""

    metric: str
    steps: np.ndarray
    mean: np.ndarray
    std: np.ndarray


@dataclasses.dataclass(frozen=True)
class Row:
    """One compared run, or one setting of a compared sweep."""

    label: str
    """The folder's name (with enough of its parents to tell equal names apart); a sweep's setting adds
    its values (`sweep: lr=0.001`)."""
    path: Path
    algo: str
    env: str
    seeds: int
    """Seeds of the run, or of the setting."""
    return_mean: float | None
    """Mean over seeds of each seed's final evaluation return (summary.json); None while unfinished."""
    return_std: float | None
    env_steps_per_s: float | None
    """Env steps of all seeds (a sweep's: of all its members) per second, compilation excluded."""
    wall_time_s: float | None
    energy_kwh: float | None
    """None when the run did not measure it (or is unfinished)."""
    setting: dict[str, float] | None
    """The swept values of a sweep's row; None for a train run."""
    curve: Curve
    final_returns: tuple[float, ...] | None = None
    """Each seed's final evaluation return (summary.json's final_return_per_seed); None while unfinished or
    when the summary predates that field."""

    @property
    def finished(self) -> bool:
        return self.return_mean is not None


@dataclasses.dataclass(frozen=True)
class _Folder:
    """What compare reads of one run folder."""

    path: Path
    algo: str
    env: str
    seeds: int
    sweep: list[dict[str, float]] | None
    summary: dict[str, Any] | None
    metrics: dict[str, np.ndarray]


# ---- reading -------------------------------------------------------------------------------------


def _read_folder(path: Path) -> _Folder:
    """The run or sweep in `path`; a one-line error for anything else."""
    cfg.require(path.is_dir(), "DIR", str(path), "must be the folder of a sparqrl run or sweep (no such folder)")
    try:
        data = json.loads((path / CONFIG).read_text())
    except (OSError, ValueError):
        data = None
    cfg.require(not is_meta_config(data), "DIR", str(path),
                "is a meta run's folder: its own plots are fitness.png and learned.png (compare takes train and "
                "sweep runs)")
    _, algo, _, run = open_run_dir(path, field="DIR", trust=None, pbt=True)  # no env is built: nothing imported
    try:
        sweep = saved_sweep(path)
    except cfg.ConfigError:
        cfg.fail("DIR", str(path), f"holds a damaged {CONFIG} (its sweep settings are not a list of settings)")
    summary = None
    if (path / SUMMARY).is_file():
        try:
            summary = json.loads((path / SUMMARY).read_text())
            if sweep is not None or "final_return_per_seed" in summary:  # the rows' per-seed final returns
                np.asarray(summary["final_return_per_seed"], np.float64).reshape(len(sweep or [None]), run.seeds)
        except (OSError, ValueError, KeyError, TypeError) as error:
            cfg.fail("DIR", str(path), f"holds a damaged {SUMMARY} ({type(error).__name__}: {error})")
        cfg.require(isinstance(summary, dict), "DIR", str(path), f"holds a damaged {SUMMARY} (not a JSON object)")
    try:
        metrics = read_metrics(path / METRICS)
    except (OSError, ValueError, KeyError) as error:
        cfg.fail("DIR", str(path), f"holds a damaged {METRICS} ({type(error).__name__}: {error})")
    cfg.require(bool(metrics) and len(metrics["env_step"]) > 0, "DIR", str(path),
                "is a run still in progress (or stopped) before its first logged chunk: no metrics to compare yet")
    members = run.seeds * (len(sweep) if sweep else 1)
    cfg.require(metrics["episode_return"].shape[1] == members, "DIR", str(path),
                f"holds a {METRICS} with {metrics['episode_return'].shape[1]} members where its {CONFIG} has {members}")
    return _Folder(path, algo, run.env, run.seeds, sweep, summary, metrics)


def _has_eval_curve(folder: _Folder) -> bool:
    evals = folder.metrics.get("eval_return")
    return evals is not None and int(np.sum(~np.all(np.isnan(evals), axis=1))) >= MIN_EVAL_POINTS


def curve_of(metrics: dict[str, np.ndarray], metric: str, members: slice = slice(None)) -> Curve:
    """Mean and std over the seeds `members` of `metric` ([chunks, seeds] in `metrics`) per chunk, at the
    chunks where at least one of them has a value."""
    values = metrics[metric][:, members]
    logged = ~np.all(np.isnan(values), axis=1)
    values = values[logged]
    return Curve(metric, metrics["env_step"][logged], np.nanmean(values, axis=1), np.nanstd(values, axis=1))


def _labels(paths: Sequence[Path]) -> list[str]:
    """Each folder's name, with as many of its parent folders as it takes to tell it from the others."""
    parts = [p.resolve().parts for p in paths]

    def suffix(i: int, depth: int) -> str:
        return "/".join(parts[i][-depth:])

    labels = []
    for i, own in enumerate(parts):
        depth = 1
        while depth < len(own) and any(suffix(j, depth) == suffix(i, depth) for j in range(len(parts)) if j != i):
            depth += 1
        labels.append(suffix(i, depth))
    return labels


def _setting_label(setting: dict[str, float]) -> str:
    return ", ".join(f"{name}={value:g}" for name, value in setting.items())


def _optional(summary: dict[str, Any] | None, key: str) -> float | None:
    value = (summary or {}).get(key)
    return float(value) if cfg.is_number(value) else None


def _rows(folder: _Folder, label: str, metric: str) -> list[Row]:
    """The table rows and curves of one folder: one for a train run, one per setting for a sweep."""
    summary = folder.summary
    shared = dict(path=folder.path, algo=folder.algo, env=folder.env, seeds=folder.seeds,
                  env_steps_per_s=_optional(summary, "env_steps_per_s"), wall_time_s=_optional(summary, "wall_time_s"),
                  energy_kwh=_optional(summary, "energy_kwh"))
    suffix = "" if summary is not None else " (unfinished)"
    # sweep member s * seeds + k is setting s's seed k (sparqrl.runners.sweep)
    finals = (np.asarray(summary["final_return_per_seed"], np.float64).reshape(-1, folder.seeds)
              if summary is not None and "final_return_per_seed" in summary else None)
    if folder.sweep is None:
        return [Row(label=label + suffix, return_mean=_optional(summary, "final_return_mean"),
                    return_std=_optional(summary, "final_return_std"), setting=None,
                    curve=curve_of(folder.metrics, metric),
                    final_returns=None if finals is None else tuple(map(float, finals[0])), **shared)]
    rows = []
    for s, setting in enumerate(folder.sweep):
        members = slice(s * folder.seeds, (s + 1) * folder.seeds)
        rows.append(Row(label=f"{label}: {_setting_label(setting)}{suffix}",
                        return_mean=None if finals is None else float(finals[s].mean()),
                        return_std=None if finals is None else float(finals[s].std()), setting=dict(setting),
                        curve=curve_of(folder.metrics, metric, members),
                        final_returns=None if finals is None else tuple(map(float, finals[s])), **shared))
    return rows


def load_rows(run_dirs: Sequence[str | Path]) -> list[Row]:
    """The rows of `run_dirs` (train runs and sweeps), every curve of the same metric (module docstring)."""
    cfg.require(len(run_dirs) > 0, "DIR", list(run_dirs), "give at least one run or sweep folder")
    paths = [Path(d) for d in run_dirs]
    seen: dict[Path, str] = {}
    for path in paths:
        cfg.require(path.resolve() not in seen, "DIR", str(path), f"is given twice (as {seen.get(path.resolve())})")
        seen[path.resolve()] = str(path)
    folders = [_read_folder(p) for p in paths]
    metric = "eval_return" if all(_has_eval_curve(f) for f in folders) else "episode_return"
    return [row for folder, label in zip(folders, _labels(paths)) for row in _rows(folder, label, metric)]


# ---- the table -----------------------------------------------------------------------------------


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s"


def _cell(value: float | None, fmt: Any) -> str:
    return "-" if value is None else fmt(value)


def table_cells(row: Row) -> list[str]:
    """The row's cells as the table prints them ("-": not measured, or the run is unfinished)."""
    final = "-" if not row.finished else f"{row.return_mean:.1f} ± {row.return_std:.1f}"
    return [row.label, row.algo, row.env, str(row.seeds), final, _cell(row.env_steps_per_s, "{:,.0f}".format),
            _cell(row.wall_time_s, _duration), _cell(row.energy_kwh, "{:.3g}".format)]


HEADER = ["run", "algo", "env", "seeds", "final return", "env steps/s", "wall time", "energy kWh"]
LEFT = 3  # the first columns (text) align left, the numbers right


def format_table(rows: Sequence[Row]) -> str:
    """The rows as aligned text, with a note when a sweep's rows share its program's figures."""
    cells = [HEADER, *(table_cells(r) for r in rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) if i < LEFT else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))).rstrip()
             for line in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if any(r.setting is not None for r in rows):
        lines.append("(a sweep's settings are trained in one program: their env steps/s, wall time and energy "
                     "are the whole sweep's)")
    return "\n".join(lines)


# ---- the picture ---------------------------------------------------------------------------------


def _check_out(out: str | Path) -> Path:
    """`out` must name an image file matplotlib writes, in an existing writable folder; an existing file
    there is replaced (as plotting tools do), a folder never."""
    from matplotlib.backend_bases import FigureCanvasBase

    path = Path(out)
    cfg.require(not path.is_dir(), "--out", str(out), "is a folder; name the image file to write (e.g. compare.png)")
    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    cfg.require(path.suffix.lower().lstrip(".") in formats, "--out", str(out),
                f"must end in an image format's extension: {', '.join('.' + f for f in formats)}")
    folder = path.parent
    cfg.require(folder.is_dir(), "--out", str(out), f"cannot be written: its folder {folder} does not exist")
    cfg.require(os.access(folder, os.W_OK | os.X_OK), "--out", str(out), f"cannot be written: {folder} is read-only")
    return path


def title_of(rows: Sequence[Row]) -> str:
    envs = list(dict.fromkeys(r.env for r in rows))
    algos = list(dict.fromkeys(r.algo for r in rows))
    if len(envs) > 1:
        return f"different environments: {', '.join(envs)} (each return on its own scale)"
    return f"{' vs '.join(algos) if len(algos) <= 3 else f'{len(algos)} algorithms'} on {envs[0]}"


def plot_curves(ax: Any, rows: Sequence[Row]) -> None:
    """One line (mean over seeds) with a ± std band per row, labelled by the row (and its env when the
    rows' environments differ)."""
    colors = None
    if len(rows) > 10:  # beyond the default cycle's 10 colours: a sweep's settings in order along viridis
        from matplotlib import colormaps

        colors = colormaps["viridis"](np.linspace(0, 0.95, len(rows)))
    several_envs = len({r.env for r in rows}) > 1
    for i, row in enumerate(rows):
        color = None if colors is None else colors[i]
        label = f"{row.label} ({row.env})" if several_envs else row.label
        steps, mean, std = row.curve.steps, row.curve.mean, row.curve.std
        (line,) = ax.plot(steps, mean, label=label, color=color, marker="o" if len(steps) < 12 else None,
                          markersize=3)
        ax.fill_between(steps, mean - std, mean + std, alpha=0.2, color=line.get_color())


def draw(rows: Sequence[Row], out: Path) -> None:
    """The curves of `rows` on shared axes, written to `out` whole or not at all."""
    from sparqrl.telemetry.plots import finish_axes, pyplot

    fig, ax = pyplot().subplots(figsize=(8, 4.8))
    plot_curves(ax, rows)
    metric = rows[0].curve.metric
    finish_axes(ax, "env steps per seed", f"{CURVE_LABELS[metric]}, mean ± std over seeds", title_of(rows),
                legend=False)
    ax.legend(fontsize="small" if len(rows) > 6 else None, ncol=math.ceil(len(rows) / 16))
    write_figure(fig, out)


def write_figure(fig: Any, out: Path) -> None:
    """`fig` written to `out` whole or not at all (a one-line error naming `out` when it cannot be)."""
    from sparqrl.telemetry.plots import save_figure

    tmp = out.with_name(f".{out.stem}.tmp{out.suffix}")  # keeps the extension: matplotlib's format
    try:
        save_figure(fig, tmp)
        os.replace(tmp, out)
    except OSError as error:
        cfg.fail("--out", str(out), f"cannot be written: {os_reason(error)}")
    finally:
        tmp.unlink(missing_ok=True)


def compare(run_dirs: Sequence[str | Path], out: str | Path | None = None) -> list[Row]:
    """The rows of `run_dirs` (train runs and sweeps; see `Row`), their curves drawn to `out` when given.

    Every input is checked before anything is written: a folder that is not a train or sweep run, a run
    without metrics yet, `out` a folder or not an image file name are one-line `ConfigError`s."""
    path = _check_out(out) if out is not None else None
    rows = load_rows(run_dirs)
    if path is not None:
        draw(rows, path)
    return rows


# ---- rliable statistics (sparqrl.stats) ----------------------------------------------------------


def stats_image(out: str | Path) -> Path:
    """Where `--stats` draws: beside the curves, compare.png -> compare-stats.png."""
    path = Path(out)
    return path.with_name(f"{path.stem}-stats{path.suffix}")


def _method(row: Row, one_task: bool) -> str:
    """The row's method: the row itself on one task; across tasks its algorithm (a sweep's: and setting)."""
    if one_task:
        return row.label
    return row.algo if row.setting is None else f"{row.algo}: {_setting_label(row.setting)}"


def _checked_returns(row: Row) -> np.ndarray:
    """The row's per-seed final returns [seeds], which `--stats` needs finished, finite and 2 or more."""
    cfg.require(row.finished, "DIR", str(row.path), "is unfinished: --stats needs each seed's final return")
    cfg.require(row.final_returns is not None, "DIR", str(row.path),
                f"has no final_return_per_seed in its {SUMMARY} (a run of an older sparqrl): --stats needs each "
                "seed's final return")
    returns = np.asarray(row.final_returns, np.float64)
    cfg.require(len(returns) >= MIN_RUNS, "DIR", str(row.path),
                f"has {len(returns)} seed{'s' if len(returns) != 1 else ''}{' per setting' if row.setting else ''}: "
                f"--stats's bootstrap intervals need {MIN_RUNS} or more (train with --seeds 5, say)")
    cfg.require(bool(np.all(np.isfinite(returns))), "DIR", str(row.path),
                f"holds a non-finite final return in its {SUMMARY}")
    return returns


def score_dict(rows: Sequence[Row], normalize: Mapping[str, tuple[float, float]]
               ) -> tuple[dict[str, np.ndarray], list[str]]:
    """rliable's scores of `rows`, method -> final returns [seeds, tasks], and the tasks (environments).

    On one environment every row is a method. Returns on several environments compare only once
    normalised, so `normalize` ({env: (MIN, MAX)}) must name each; then the rows of one algorithm (a
    sweep's: of one setting) are one method, with one run per environment and as many seeds on each
    (rliable's [runs, tasks] arrays). An environment `normalize` names that no row has is an error."""
    tasks = list(dict.fromkeys(r.env for r in rows))
    for env in normalize:
        cfg.require(env in tasks, "--normalize", env, f"is no environment of the compared runs ({', '.join(tasks)})")
    for env in tasks:
        cfg.require(len(tasks) == 1 or env in normalize, "--normalize", sorted(normalize),
                    f"must give every environment's MIN,MAX when the runs are on several ({', '.join(tasks)}): "
                    f"add --normalize {env}=MIN,MAX")
    by_method: dict[str, dict[str, Row]] = {}
    for row in rows:
        runs = by_method.setdefault(_method(row, len(tasks) == 1), {})
        if row.env in runs:
            cfg.fail("DIR", str(row.path), f"is a second {_method(row, False)} run on {row.env} (beside "
                     f"{runs[row.env].path}): across environments an algorithm (a sweep's setting) is one method, "
                     "one run per environment")
        runs[row.env] = row
    scores = {}
    for method, runs in by_method.items():
        first = next(iter(runs.values()))
        for env in tasks:
            cfg.require(env in runs, "DIR", str(first.path),
                        f"has no run of {method} on {env} beside it: every method needs a run on every environment")
            cfg.require(runs[env].seeds == first.seeds, "DIR", str(runs[env].path),
                        f"has {runs[env].seeds} seeds where {first.path} has {first.seeds}: one method's runs need "
                        "as many seeds on every environment")
        returns = [_checked_returns(runs[env]) for env in tasks]
        scores[method] = np.stack([normalized(r, normalize[env]) if env in normalize else r
                                   for r, env in zip(returns, tasks)], axis=1)
    return scores, tasks


def compare_stats(rows: Sequence[Row], normalize: Mapping[str, tuple[float, float]] | None = None,
                  reps: int = DEFAULT_REPS, seed: int = DEFAULT_SEED) -> Stats:
    """rliable's statistics of the rows' final returns (`score_dict`, `sparqrl.stats.estimate`): the same
    rows, reps and seed give the same numbers."""
    scores, tasks = score_dict(rows, normalize or {})
    return estimate(scores, tasks, bool(normalize), reps, seed)


def draw_stats(stats: Stats, out: str | Path) -> None:
    """The picture of `stats` (`sparqrl.stats.figure`), written to `out` whole or not at all."""
    write_figure(figure(stats), _check_out(out))


def _stats_options(args: Any) -> dict[str, Any] | None:
    """`compare_stats`'s keywords from --stats's flags, checked; None without --stats."""
    for flag, value in (("--normalize", args.normalize), ("--reps", args.reps),
                        ("--bootstrap-seed", args.bootstrap_seed)):
        cfg.require(args.stats or value is None, flag, value, "is an option of --stats: add --stats")
    if not args.stats:
        return None
    need_installed("rliable", WHAT)
    options = dict(normalize=parse_normalize(args.normalize or []),
                   reps=DEFAULT_REPS if args.reps is None else args.reps,
                   seed=DEFAULT_SEED if args.bootstrap_seed is None else args.bootstrap_seed)
    check_options(options["reps"], options["seed"])
    return options


def run_cli(argv: list[str]) -> int:
    parser = OneLineParser(prog="sparqrl compare", description=(
        "Learning curves (mean ± std over seeds) of runs and sweeps on shared axes, and a table of final "
        "return, env steps/s, wall time and energy; with --stats, rliable's statistics of the final returns."))
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="output folder of a train run or of a sweep")
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help=f"image to write (default: {DEFAULT_OUT}; an existing file is replaced)")
    group = parser.add_argument_group("rliable statistics (needs the rliable extra: pip install 'sparqrl[rliable]')")
    group.add_argument("--stats", action="store_true", help=(
        "also print and draw (beside --out: compare-stats.png) the interquartile mean, mean and median of each "
        "run's per-seed final returns with 95%% stratified bootstrap intervals, performance profiles and the "
        "probability of improvement of each run over the first (2 or more seeds per run)"))
    group.add_argument("--normalize", action="append", metavar="ENV=MIN,MAX", help=(
        "score (return - MIN) / (MAX - MIN) on ENV; needed for every environment when the runs are on several, "
        "whose runs of one algorithm (a sweep's: one setting) then make one method (repeatable)"))
    group.add_argument("--reps", type=int, metavar="N", help=f"bootstrap resamples (default {DEFAULT_REPS:,})")
    group.add_argument("--bootstrap-seed", type=int, metavar="SEED",
                       help=f"seed of the resampling (default {DEFAULT_SEED}): the same seed, the same numbers")
    args = parser.parse_args(argv)
    options = _stats_options(args)
    path = _check_out(args.out)
    stats_path = _check_out(stats_image(path)) if options is not None else None
    rows = load_rows(args.dirs)
    stats = compare_stats(rows, **options) if options is not None else None  # every input checked before writing
    draw(rows, path)
    if stats is not None:
        draw_stats(stats, stats_path)
    print(format_table(rows))
    print(f"curves ({CURVE_LABELS[rows[0].curve.metric]}): {args.out}")
    if stats is not None:
        print(format_stats(stats))
        print(f"statistics: {stats_path}")
    return 0

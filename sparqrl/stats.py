"""rliable statistics of compared runs' final returns (`sparqrl compare --stats`): the interquartile mean,
mean and median with stratified bootstrap confidence intervals, performance profiles and the probability
of improvement (Agarwal et al. 2021, "Deep RL at the Edge of the Statistical Precipice", NeurIPS), each
computed by rliable's own functions (`rliable.library`, `rliable.metrics`; the `rliable` extra), and one
picture of them.

Scores are rliable's `score_dict`: a method's name -> its final returns [runs, tasks], a run being a seed
and a task an environment; raw returns on one task, or normalised (return - MIN) / (MAX - MIN) by bounds
the user gives per task (`normalized`), which is what makes several tasks' returns comparable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence

import numpy as np

from sparqrl import config as cfg
from sparqrl.extras import need

WHAT = "sparqrl compare --stats"
DEFAULT_REPS = 1000
"""Bootstrap resamples of every estimate: enough for stable 95 % percentile intervals of a handful of runs,
few enough that two runs' statistics take about 2 s of CPU (BENCHMARKS.md). The cost grows linearly with
them: rliable's resampling is a Python loop, and its own default of 50,000 for intervals would take 50 times
as long."""
MIN_REPS, MAX_REPS = 100, 1_000_000
DEFAULT_SEED = 0
MIN_RUNS = 2  # one run resamples to itself: no interval
CONFIDENCE = 0.95
PROFILE_POINTS = 51
AGGREGATES = ("IQM", "mean", "median")


class Interval(NamedTuple):
    """A point estimate and its confidence interval [low, high]."""

    point: float
    low: float
    high: float


@dataclasses.dataclass(frozen=True)
class Stats:
    """rliable's estimates for each method (in the order given; the first is the reference of
    `improvement`)."""

    scores: dict[str, np.ndarray]
    """rliable's score_dict: method -> final returns [runs, tasks] (normalised where `normalized`)."""
    tasks: list[str]
    normalized: bool
    aggregates: dict[str, dict[str, Interval]]
    """method -> "IQM", "mean", "median" -> the estimate with its stratified bootstrap interval."""
    taus: np.ndarray
    """[PROFILE_POINTS] the score thresholds of the performance profiles."""
    profiles: dict[str, np.ndarray]
    """method -> [taus] the fraction of its runs (on all tasks) that score above each threshold."""
    profile_cis: dict[str, np.ndarray]
    """method -> [2, taus] the profile's lower and upper interval bounds."""
    improvement: dict[tuple[str, str], Interval]
    """(X, Y) -> P(X > Y), the probability that a run of X scores above a run of Y on a task, averaged
    over tasks: every method X after the first against the first, Y."""
    reps: int
    seed: int


def parse_normalize(items: Sequence[str]) -> dict[str, tuple[float, float]]:
    """`--normalize ENV=MIN,MAX` items as {env: (min, max)}: finite, MAX > MIN, each env once."""
    bounds: dict[str, tuple[float, float]] = {}
    for item in items:
        env, _, values = item.rpartition("=")
        try:
            low, high = (float(v) for v in values.split(","))
        except ValueError:
            low = high = math.nan
        cfg.require(bool(env) and math.isfinite(low) and math.isfinite(high) and high > low, "--normalize", item,
                    "must be ENV=MIN,MAX: an environment and the scores that normalise to 0 and 1, finite, with "
                    "MAX > MIN (e.g. CartPole-v1=0,500)")
        cfg.require(env not in bounds, "--normalize", item, f"gives {env} a second time")
        bounds[env] = (low, high)
    return bounds


def normalized(returns: np.ndarray, bounds: tuple[float, float]) -> np.ndarray:
    """`returns` mapped so that MIN is 0 and MAX is 1 (`bounds` = (MIN, MAX))."""
    low, high = bounds
    return (returns - low) / (high - low)


def check_options(reps: Any, seed: Any) -> None:
    cfg.require(cfg.is_int(reps) and MIN_REPS <= reps <= MAX_REPS, "--reps", reps,
                f"must be an integer from {MIN_REPS:,} to {MAX_REPS:,} (bootstrap resamples)")
    cfg.require(cfg.is_int(seed) and 0 <= seed < 2**32, "--bootstrap-seed", seed, "must be an integer in [0, 2**32)")


@contextlib.contextmanager
def _global_seed(seed: int) -> Iterator[None]:
    """NumPy's global generator seeded with `seed` inside the block and put back as it was after it:
    rliable's bootstraps draw their resamples from it (`np.random.choice` in
    `StratifiedBootstrap.update_indices`) whatever `random_state` they are given."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def aggregate_function(metrics: Any) -> Callable[[np.ndarray], np.ndarray]:
    """scores [runs, tasks] -> [IQM, mean, median] by rliable's `metrics` (the order of `AGGREGATES`)."""

    def aggregate(scores: np.ndarray) -> np.ndarray:
        return np.array([metrics.aggregate_iqm(scores), metrics.aggregate_mean(scores),
                         metrics.aggregate_median(scores)])

    return aggregate


def profile_thresholds(scores: Mapping[str, np.ndarray], normalized_scores: bool) -> np.ndarray:
    """[PROFILE_POINTS] thresholds from a little below the lowest score to a little above the highest
    (normalised: 0 to 1 at least), so that every profile starts at 1 and ends at 0."""
    values = np.concatenate([s.ravel() for s in scores.values()])
    low, high = float(values.min()), float(values.max())
    if normalized_scores:
        low, high = min(low, 0.0), max(high, 1.0)
    margin = 0.05 * (high - low) if high > low else 1.0  # every run scored the same: a step in the middle
    return np.linspace(low - margin, high + margin, PROFILE_POINTS)


def estimate(scores: Mapping[str, np.ndarray], tasks: Sequence[str], normalized_scores: bool,
             reps: int = DEFAULT_REPS, seed: int = DEFAULT_SEED) -> Stats:
    """rliable's interval estimates, performance profiles and probabilities of improvement of `scores`
    (method -> [runs >= 2, tasks]), each bootstrap resampled `reps` times from NumPy's global generator
    seeded with `seed` (and left as it was): the same scores, reps and seed give the same numbers."""
    check_options(reps, seed)
    library, metrics = need("rliable.library", WHAT), need("rliable.metrics", WHAT)
    scores = {method: np.asarray(s, np.float64) for method, s in scores.items()}
    with _global_seed(seed):
        points, cis = library.get_interval_estimates(scores, aggregate_function(metrics), reps=reps,
                                                     confidence_interval_size=CONFIDENCE)
    taus = profile_thresholds(scores, normalized_scores)
    with _global_seed(seed):
        profiles, profile_cis = library.create_performance_profile(scores, taus, reps=reps,
                                                                   confidence_interval_size=CONFIDENCE)
    methods = list(scores)
    pairs = {(x, methods[0]): [scores[x], scores[methods[0]]] for x in methods[1:]}
    with _global_seed(seed):
        improvement, improvement_cis = library.get_interval_estimates(
            pairs, metrics.probability_of_improvement, reps=reps, confidence_interval_size=CONFIDENCE)
    return Stats(
        scores=scores, tasks=list(tasks), normalized=normalized_scores,
        aggregates={m: {name: Interval(float(points[m][i]), float(cis[m][0, i]), float(cis[m][1, i]))
                        for i, name in enumerate(AGGREGATES)} for m in methods},
        taus=taus, profiles={m: np.asarray(profiles[m]) for m in methods},
        profile_cis={m: np.asarray(profile_cis[m]) for m in methods},
        improvement={pair: Interval(float(improvement[pair]), *map(float, np.ravel(improvement_cis[pair])))
                     for pair in pairs},
        reps=reps, seed=seed)


# ---- text and picture ----------------------------------------------------------------------------


def _score_name(stats: Stats) -> str:
    return "normalised score" if stats.normalized else "final return"


def format_stats(stats: Stats) -> str:
    """The estimates as aligned text: a table of IQM, mean and median per method, then P(X > Y)."""
    number = "{:.3f}".format if stats.normalized else "{:.1f}".format

    def cell(interval: Interval) -> str:
        return f"{number(interval.point)} [{number(interval.low)}, {number(interval.high)}]"

    what = ("final returns normalised as (return - MIN) / (MAX - MIN)" if stats.normalized
            else "final returns (each seed's mean over its final evaluation episodes)")
    cells = [["method", "runs x tasks", *AGGREGATES]]
    cells += [[m, f"{s.shape[0]} x {s.shape[1]}", *(cell(stats.aggregates[m][a]) for a in AGGREGATES)]
              for m, s in stats.scores.items()]
    widths = [max(len(line[i]) for line in cells) for i in range(len(cells[0]))]
    lines = [f"rliable statistics of the {what} on {', '.join(stats.tasks)}: estimate [{CONFIDENCE:.0%} stratified "
             f"bootstrap interval] ({stats.reps:,} resamples, seed {stats.seed})"]
    lines += ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))).rstrip()
              for line in cells]
    lines.insert(2, "  ".join("-" * w for w in widths))
    for (x, y), p in stats.improvement.items():
        lines.append(f"P({x} > {y}) = {p.point:.3f} [{p.low:.3f}, {p.high:.3f}]")
    return "\n".join(lines)


def figure(stats: Stats) -> Any:
    """One figure: the IQM, mean and median with their intervals (one panel each), the performance
    profiles (rliable's `plot_utils.plot_performance_profiles`) and P(X > first method)."""
    from sparqrl.telemetry.plots import pyplot

    plt = pyplot()  # the file-only backend, before rliable's plot_utils imports pyplot
    plot_utils = need("rliable.plot_utils", WHAT)
    methods = list(stats.scores)
    colors = {m: f"C{i % 10}" for i, m in enumerate(methods)}
    bottom = ["profile", "profile", "improvement"] if stats.improvement else ["profile"] * 3
    fig, axes = plt.subplot_mosaic([list(AGGREGATES), bottom], figsize=(12, 4 + 0.3 * len(methods)),
                                   height_ratios=[1, 1.6])
    for i, name in enumerate(AGGREGATES):
        ax = axes[name]
        for row, m in enumerate(methods):
            est = stats.aggregates[m][name]
            ax.barh(row, est.high - est.low, left=est.low, height=0.6, color=colors[m], alpha=0.6)
            ax.vlines(est.point, row - 0.3, row + 0.3, color="k")
        ax.set_yticks(range(len(methods)), methods if i == 0 else [""] * len(methods), fontsize="small")
        ax.invert_yaxis()
        ax.set_title(name)
        ax.set_xlabel(_score_name(stats), fontsize="small")
        ax.grid(alpha=0.3, axis="x")
    plot_utils.plot_performance_profiles(
        stats.profiles, stats.taus, performance_profile_cis=stats.profile_cis, ax=axes["profile"], colors=colors,
        xlabel=f"{_score_name(stats)} τ", ylabel="fraction of runs with score > τ", labelsize="medium",
        ticklabelsize="small", legend=True, legendsize="small")
    if stats.improvement:
        ax = axes["improvement"]
        for row, ((x, y), p) in enumerate(stats.improvement.items()):
            ax.barh(row, p.high - p.low, left=p.low, height=0.6, color=colors[x], alpha=0.6)
            ax.vlines(p.point, row - 0.3, row + 0.3, color="k")
        ax.set_yticks(range(len(stats.improvement)), [f"{x} > {y}" for x, y in stats.improvement], fontsize="small")
        ax.invert_yaxis()
        ax.axvline(0.5, color="grey", linestyle=":")
        ax.set_xlim(0, 1)
        ax.set_xlabel("P(X > Y)", fontsize="small")
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle(f"{CONFIDENCE:.0%} stratified bootstrap intervals ({stats.reps:,} resamples) on "
                 f"{', '.join(stats.tasks)}", fontsize="medium")
    return fig

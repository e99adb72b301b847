"""docs/results.md and its learning-curve pictures, generated from the committed results of the reproduction
suite (benchmarks/results/*.csv, benchmarks/results/curves/*.csv, written by benchmarks/repro.py), so the page
and the data never disagree (tests/test_repro.py regenerates the page and compares).

    .venv/bin/python benchmarks/results_page.py                    # docs/results.md and docs/results/*.png
    .venv/bin/python benchmarks/results_page.py --page OUT.md --no-plots

Statistics over an entry's seeds, each seed's final return being its deterministic policy's mean over its final
evaluation episodes: the mean with a 95 % percentile bootstrap interval, and the interquartile mean (IQM, the mean
of the middle half: Agarwal et al. 2021) where there are 4 seeds or more. The bootstrap is NumPy's, seeded, so the
page is the same on every machine: `sparqrl.stats` computes the same estimates through rliable, an optional extra
that the docs build and the tests do not install.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import repro  # noqa: E402  (benchmarks/ is not a package: the entries' table lives beside this file)

PAGE = repro.ROOT / "docs" / "results.md"
PLOTS = repro.ROOT / "docs" / "results"
RESAMPLES = 10_000
CONFIDENCE = 0.95
MIN_IQM_SEEDS = 4
"""Below 4 seeds the middle half is all of them but none: the IQM would repeat the mean."""


def iqm(x: np.ndarray) -> float:
    """The mean of the middle half of `x` (a quarter of the values, rounded down, cut from each end), as
    rliable's `aggregate_iqm` (scipy's trim_mean at 0.25)."""
    cut = int(0.25 * x.size)
    return float(np.sort(x)[cut:x.size - cut].mean())


def bootstrap_mean(x: np.ndarray, seed: int = 0) -> tuple[float, float, float]:
    """The mean of `x` [seeds] and its 95 % percentile bootstrap interval (RESAMPLES resamples of the seeds)."""
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(RESAMPLES, x.size))].mean(axis=1)
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(x.mean()), float(low), float(high)


def read_results(results: Path) -> dict[str, list[dict]]:
    """entry (or peer) name -> its rows in the suites' results CSVs and peers.csv."""
    rows: dict[str, list[dict]] = {}
    for stem in (*repro.SUITES, "peers"):
        path = results / f"{stem}.csv"
        if path.exists():
            for row in csv.DictReader(path.open(newline="")):
                rows.setdefault(row["entry"], []).append(row)
    return rows


def verdict(entry: repro.Entry, high: float) -> str:
    """'below' when the whole interval of ours lies under the reference's (its value less its published ±)."""
    ref = entry.reference
    if ref is None:
        return ""
    return " **below**" if high < ref.value - (ref.spread or 0.0) else ""


def ours_cells(entry: repro.Entry, rows: list[dict]) -> tuple[str, str]:
    """(mean [95 % CI] and the per-seed returns, IQM) of an entry's recorded seeds."""
    x = np.array([float(r["final_return"]) for r in rows])
    if x.size == 1:
        return f"{x[0]:.1f} (1 seed)", "–"
    mean, low, high = bootstrap_mean(x)
    cell = f"{mean:.1f} [{low:.1f}, {high:.1f}]{verdict(entry, high)}"
    return cell, f"{iqm(x):.1f}" if x.size >= MIN_IQM_SEEDS else "–"


def peer_line(peer: repro.Peer, entry: repro.Entry, rows: list[dict] | None, note: int) -> str:
    """A peer's row under the entry it is beside: its seeds' statistics (no reference verdict), or its command."""
    if rows:
        cell, middle = ours_cells(dataclasses.replace(entry, reference=None), rows)
        budget, recorded = f"{int(rows[0]['budget']):,}", f"{rows[0]['commit']}, {rows[0]['date'][:10]}"
    else:
        cell, middle, budget, recorded = f"not run yet: `{peer.command}`", "–", f"{entry.steps:,}", "–"
    return (f"| {peer.name} (peer: {peer.label}) | {entry.algo} on {entry.env} | {budget} | "
            f"{len(rows) if rows else entry.seeds} | {cell} | {middle} | – ({note}) | {recorded} |")


def peer_lines(entry: repro.Entry, results: dict[str, list[dict]], notes: list[str], machines: list[str]) -> list[str]:
    """The rows of the peers shown beside `entry`; their notes and machines added to the table's."""
    lines = []
    for peer in (p for p in repro.PEERS if p.beside == entry.name):
        notes.append(f"Peer {peer.name}: {peer.label}, hyperparameters from {peer.source}. What differs: "
                     f"{peer.differs}.")
        rows = results.get(peer.name)
        if rows and rows[0]["machine"] not in machines:
            machines.append(rows[0]["machine"])
        lines.append(peer_line(peer, entry, rows, len(notes)))
    return lines


def family_table(entries: list[repro.Entry], results: dict[str, list[dict]]) -> list[str]:
    """The family's table (a peer's rows under the entry they are beside), then its numbered notes (a reference's
    source and what differs, each said once) and the machines its results were recorded on."""
    notes: list[str] = []
    lines = ["| entry | env | budget | seeds | ours: mean [95 % CI] | ours: IQM | reference | recorded |",
             "|---|---|---:|---:|---|---:|---|---|"]
    machines: list[str] = []
    for e in entries:
        note = (f"{e.reference.source}. What differs: {e.differs}." if e.reference
                else f"No reference recorded. {e.differs}.")
        if note not in notes:
            notes.append(note)
        ref = f"{e.reference.text() if e.reference else 'not recorded'} ({notes.index(note) + 1})"
        rows = results.get(e.name)
        if rows:
            cell, middle = ours_cells(e, rows)
            budget, recorded = f"{int(rows[0]['budget']):,}", f"{rows[0]['commit']}, {rows[0]['date'][:10]}"
            if rows[0]["machine"] not in machines:
                machines.append(rows[0]["machine"])
        else:
            cell = "not run yet" + (f": {e.note}" if e.note else "")
            middle, budget, recorded = "–", f"{e.steps:,}", "–"
        lines.append(f"| {e.name} | {e.algo} on {e.env} | {budget} | {e.seeds} | {cell} | {middle} | {ref} | "
                     f"{recorded} |")
        lines += peer_lines(e, results, notes, machines)
    lines += ["", *(f"{i}. {n}" for i, n in enumerate(notes, 1))]
    if machines:
        lines += ["", "Recorded on: " + "; ".join(machines) + "."]
    return lines


def families(entries: tuple[repro.Entry, ...]) -> dict[tuple[str, str], list[repro.Entry]]:
    """(suite, family) -> its entries, in the table's order; the CI slice left out."""
    out: dict[tuple[str, str], list[repro.Entry]] = {}
    for e in entries:
        if e.default:
            out.setdefault((e.suite, e.family), []).append(e)
    return out


def plotted(results: dict[str, list[dict]], curves: Path) -> list[str]:
    """The entries with recorded results and a curve, in the table's order."""
    return [e.name for e in repro.ENTRIES if e.default and e.name in results and (curves / f"{e.name}.csv").exists()]


def page_text(results_dir: Path) -> str:
    results = read_results(results_dir)
    lines = [
        "<!-- Generated by benchmarks/results_page.py from benchmarks/results/: edit those, not this page. -->",
        "# Results",
        "",
        "Standard tasks at the budgets the literature reports, run by the reproduction suite "
        "(`benchmarks/repro.py`) through the `sparqrl train` command, beside the published figure and its source. "
        "Ours: each seed's final return is its deterministic policy's mean over 10 evaluation episodes at the end "
        "of training; over seeds, the mean with a 95 % percentile bootstrap interval, and the interquartile mean "
        "(IQM) where there are 4 seeds or more. **below** marks an interval entirely under the reference's "
        "value less its published ±. A reference is given only where the figure at that budget is known from its "
        "source; where the protocols differ (see *what differs*) the comparison is a rough one.",
        "",
        "```bash",
        ".venv/bin/python benchmarks/repro.py --suite cpu --list              # the entries",
        "nice -n 15 .venv/bin/python benchmarks/repro.py --suite cpu --only ppo-cartpole",
        ".venv/bin/python benchmarks/results_page.py                         # this page, from the CSVs",
        "```",
        "",
    ]
    for (suite, family), entries in families(repro.ENTRIES).items():
        lines += [f"## {family} ({suite.upper()} suite)", "", *family_table(entries, results), ""]
    names = plotted(results, results_dir / "curves")
    if names:
        lines += ["## Learning curves", "",
                  "Mean episode return of the training episodes finished in each logged chunk (thin: each seed; "
                  "thick: their mean), against env steps per seed; dashed: the reference value.", ""]
        lines += [f"![{n}](results/{n}.png)" for n in names] + [""]
    return "\n".join(lines)


def plot(entry: repro.Entry, curve_csv: Path, png: Path) -> None:
    """The entry's learning curves with its reference as a horizontal line, and the mean curve of each peer beside
    it whose curve is recorded (in the same folder)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = np.genfromtxt(curve_csv, delimiter=",", skip_header=1, ndmin=2)
    steps, returns = data[:, 0], data[:, 1:]
    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=100)
    for i in range(returns.shape[1]):
        ax.plot(steps, returns[:, i], lw=0.6, alpha=0.5, color="C0")
    with np.errstate(all="ignore"):
        ax.plot(steps, np.nanmean(returns, axis=1), lw=2, color="C0", label="sparqrl")
    for i, peer in enumerate(p for p in repro.PEERS if p.beside == entry.name):
        peer_csv = curve_csv.with_name(f"{peer.name}.csv")
        if peer_csv.exists():
            theirs = np.genfromtxt(peer_csv, delimiter=",", skip_header=1, ndmin=2)
            with np.errstate(all="ignore"):
                ax.plot(theirs[:, 0], np.nanmean(theirs[:, 1:], axis=1), lw=1.5, color=f"C{i + 1}", label=peer.label)
    if entry.reference is not None:
        ax.axhline(entry.reference.value, ls="--", color="C3", label="reference")
    ax.set(title=f"{entry.algo} on {entry.env}", xlabel="env steps per seed", ylabel="episode return")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, metadata={"Software": None})
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", type=Path, default=repro.RESULTS)
    p.add_argument("--page", type=Path, default=PAGE)
    p.add_argument("--plots", type=Path, default=PLOTS)
    p.add_argument("--no-plots", action="store_true", help="write the page only")
    args = p.parse_args()
    args.page.parent.mkdir(parents=True, exist_ok=True)
    args.page.write_text(page_text(args.results))
    if not args.no_plots:
        by_name = {e.name: e for e in repro.ENTRIES}
        for name in plotted(read_results(args.results), args.results / "curves"):
            plot(by_name[name], args.results / "curves" / f"{name}.csv", args.plots / f"{name}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())

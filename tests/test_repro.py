"""The reproduction suite's machinery (issue 37 item 6): its CI slice writes the results CSV and a curve through
the `sparqrl train` command; the results page is what benchmarks/results_page.py makes of the committed CSVs.
Returns are not tested here: that is what the suite records."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import repro  # noqa: E402
import results_page  # noqa: E402


def test_smoke_slice_writes_results_and_curve(tmp_path):
    out = tmp_path / "results"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "repro.py"), "--only", "smoke", "--out", str(out),
                           "--runs", str(tmp_path / "runs")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = list(csv.DictReader((out / "cpu.csv").open(newline="")))
    assert [(r["entry"], r["seed"]) for r in rows] == [("smoke", "0")]
    assert np.isfinite(float(rows[0]["final_return"]))
    assert 0 < int(rows[0]["budget"]) <= 10_000 and float(rows[0]["wall_time_s"]) > 0
    assert rows[0]["commit"] and rows[0]["date"] and rows[0]["machine"]
    with (out / "curves" / "smoke.csv").open(newline="") as f:
        curve = list(csv.reader(f))
    assert curve[0] == ["env_step", "seed_0"]
    steps = [int(r[0]) for r in curve[1:]]
    assert len(steps) >= 2 and steps == sorted(set(steps)) and steps[-1] <= 10_000
    assert any(r[1] for r in curve[1:])


def test_rerun_replaces_only_its_entry(tmp_path):
    path = tmp_path / "cpu.csv"
    row = {"budget": 1, "wall_time_s": 1, "commit": "c", "date": "d", "machine": "m"}
    repro.replace_rows(path, "a", [{**row, "entry": "a", "seed": 0, "final_return": 1}])
    repro.replace_rows(path, "b", [{**row, "entry": "b", "seed": s, "final_return": 2} for s in range(2)])
    repro.replace_rows(path, "a", [{**row, "entry": "a", "seed": 0, "final_return": 3}])
    rows = list(csv.DictReader(path.open(newline="")))
    assert [(r["entry"], r["seed"], r["final_return"]) for r in rows] == [("a", "0", "3"), ("b", "0", "2"),
                                                                           ("b", "1", "2")]


def test_curve_one_row_per_chunk(tmp_path):
    metrics = tmp_path / "metrics.csv"
    metrics.write_text("chunk,env_step,seed,episode_return\n1,10,0,1.5\n1,10,1,\n2,20,1,4\n2,20,0,3\n")
    assert repro.curve(metrics, 2) == [["10", "1.5", ""], ["20", "3", "4"]]


def test_unknown_entry_is_refused():
    with pytest.raises(SystemExit, match="unknown cpu entries nope"):
        repro.select("cpu", "ppo-cartpole,nope")


def test_statistics():
    x = np.array([5.0, 1.0, 4.0, 2.0, 3.0, 100.0])
    assert results_page.iqm(x) == pytest.approx(3.5)  # the middle half: 2, 3, 4, 5
    mean, low, high = results_page.bootstrap_mean(x)
    assert mean == pytest.approx(x.mean()) and x.min() <= low < mean < high <= x.max()
    assert results_page.bootstrap_mean(x) == (mean, low, high)  # seeded: the page is the same everywhere


def test_page_is_generated_from_the_committed_results(tmp_path):
    page = tmp_path / "results.md"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "results_page.py"), "--page", str(page),
                           "--no-plots"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    committed = (ROOT / "docs" / "results.md").read_text()
    assert page.read_text() == committed, "docs/results.md is stale: run .venv/bin/python benchmarks/results_page.py"
    for picture in re.findall(r"\]\((results/[^)]+\.png)\)", committed):
        assert (ROOT / "docs" / picture).is_file(), picture


def test_peer_rows_beside_their_entry(tmp_path):
    peer = repro.PEERS[0]
    lines = results_page.page_text(tmp_path).splitlines()  # nothing recorded: the peer's command is shown
    at = next(i for i, line in enumerate(lines) if line.startswith(f"| {peer.beside} |"))
    assert lines[at + 1].startswith(f"| {peer.name} (peer: {peer.label}) |") and f"`{peer.command}`" in lines[at + 1]
    row = {"budget": 300_000, "wall_time_s": 1, "commit": "sb3 2.9.2", "date": "2026-11-28T00:00:00+00:00",
           "machine": "m"}
    repro.replace_rows(tmp_path / "peers.csv", peer.name,
                       [{**row, "entry": peer.name, "seed": s, "final_return": v} for s, v in enumerate((1e3, 3e3))])
    lines = results_page.page_text(tmp_path).splitlines()
    assert "| 2000.0 [1000.0, 3000.0] | – |" in lines[at + 1] and "sb3 2.9.2, 2026-11-28" in lines[at + 1]
    assert any(line.startswith(f"{i}. Peer {peer.name}: ") for i in range(1, 9) for line in lines)


def test_peer_curve_has_the_suites_chunks():
    import peer_sb3_sac

    means = peer_sb3_sac.chunk_means([(1000, 1.0), (2000, 3.0), (3000, 5.0), (6000, 7.0)], 6000, 3)
    assert means == [(2000, 2.0), (4000, 5.0), (6000, 7.0)]  # an episode ending at a chunk's last step is in it
    assert peer_sb3_sac.chunk_means([(5000, 1.0)], 6000, 3)[:2] == [(2000, None), (4000, None)]
    assert peer_sb3_sac.curve_rows([[(10, 1.0), (20, None)], [(10, None), (20, 2.5)]]) == [
        ["10", "1.000", ""], ["20", "", "2.500"]]

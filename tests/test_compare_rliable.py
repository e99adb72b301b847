"""`sparqrl compare --stats`: rliable's statistics of the runs' final returns, checked against rliable's own
functions called here and against plain NumPy, and the command end to end on small synthetic run folders."""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest

from sparqrl import cli
from sparqrl.compare import compare_stats, load_rows, score_dict
from sparqrl.config import ConfigError
from sparqrl.stats import AGGREGATES, estimate, format_stats, parse_normalize

rly = pytest.importorskip("rliable.library")
metrics = pytest.importorskip("rliable.metrics")

REPS = 100
SEED = 7
# Fixed scores [runs, tasks] with ties inside and across methods; "c" has other runs than "a" and "b".
SCORES = {
    "a": np.array([[0.1, 0.5, 0.9], [0.3, 0.5, 0.2], [0.8, 0.4, 0.7], [0.2, 0.6, 0.6], [0.5, 0.1, 0.4]]),
    "b": np.array([[0.4, 0.5, 0.9], [0.6, 0.7, 0.3], [0.9, 0.8, 0.8], [0.2, 0.9, 1.0], [0.7, 0.2, 0.5]]),
    "c": np.array([[0.0, 0.3, 0.2], [1.1, 0.5, 0.4], [0.3, 0.1, -0.2]]),
}
TASKS = ["t0", "t1", "t2"]


@pytest.fixture(scope="module")
def stats():
    return estimate(SCORES, TASKS, True, reps=REPS, seed=SEED)


def test_estimates_are_rlibles_own(stats):
    def aggregate(x):
        return np.array([metrics.aggregate_iqm(x), metrics.aggregate_mean(x), metrics.aggregate_median(x)])

    np.random.seed(SEED)  # rliable resamples from NumPy's global generator
    points, cis = rly.get_interval_estimates(SCORES, aggregate, reps=REPS)
    for method in SCORES:
        for i, name in enumerate(AGGREGATES):
            assert tuple(stats.aggregates[method][name]) == (points[method][i], cis[method][0, i], cis[method][1, i])
    np.random.seed(SEED)
    profiles, profile_cis = rly.create_performance_profile(SCORES, stats.taus, reps=REPS)
    for method in SCORES:
        np.testing.assert_array_equal(stats.profiles[method], profiles[method])
        np.testing.assert_array_equal(stats.profile_cis[method], profile_cis[method])
    np.random.seed(SEED)
    pairs = {("b", "a"): [SCORES["b"], SCORES["a"]], ("c", "a"): [SCORES["c"], SCORES["a"]]}
    improvement, improvement_cis = rly.get_interval_estimates(pairs, metrics.probability_of_improvement, reps=REPS)
    assert list(stats.improvement) == list(pairs)
    for pair in pairs:
        assert tuple(stats.improvement[pair]) == (improvement[pair], *np.ravel(improvement_cis[pair]))
    # every interval holds its estimate and is an interval, not a point
    for interval in [*(i for m in stats.aggregates.values() for i in m.values()), *stats.improvement.values()]:
        assert interval.low <= interval.point <= interval.high and interval.low < interval.high


def test_point_estimates_are_plain_numpy(stats):
    for method, scores in SCORES.items():
        flat = np.sort(scores.ravel())
        cut = len(flat) // 4  # the interquartile mean: the middle half of all run-task scores
        task_means = scores.mean(axis=0)
        expected = {"IQM": flat[cut:len(flat) - cut].mean(), "mean": task_means.mean(), "median": np.median(task_means)}
        for name in AGGREGATES:
            assert stats.aggregates[method][name].point == pytest.approx(expected[name], abs=1e-12)
        fraction_above = np.array([np.mean(scores > tau) for tau in stats.taus])
        np.testing.assert_allclose(stats.profiles[method], fraction_above)
        assert stats.profiles[method][0] == 1 and stats.profiles[method][-1] == 0
    for (x, y), p in stats.improvement.items():
        per_task = [np.mean([(u > v) + 0.5 * (u == v) for u in SCORES[x][:, t] for v in SCORES[y][:, t]])
                    for t in range(len(TASKS))]
        assert p.point == pytest.approx(np.mean(per_task), abs=1e-12)


def test_the_seed_fixes_the_numbers_and_numpy_is_left_as_it_was(stats):
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    again = estimate(SCORES, TASKS, True, reps=REPS, seed=SEED)
    assert np.array_equal(np.random.get_state()[1], before)
    assert again.aggregates == stats.aggregates and again.improvement == stats.improvement
    other = estimate(SCORES, TASKS, True, reps=REPS, seed=SEED + 1)
    assert other.aggregates != stats.aggregates
    assert {m: {n: i.point for n, i in a.items()} for m, a in other.aggregates.items()} == \
           {m: {n: i.point for n, i in a.items()} for m, a in stats.aggregates.items()}
    text = format_stats(stats)
    assert "P(b > a) = " in text and f"{REPS} resamples, seed {SEED}" in text
    assert re.search(r"^c +3 x 3 ", text, re.M)


# ---- the command on synthetic run folders ----------------------------------------------------------


def fake_run(path, env, finals, algo="ppo", sweep=None):
    """A finished run folder (a sweep's when `sweep` lists its settings) whose seeds' final returns are
    `finals` [settings, seeds] or [seeds], written as sparqrl writes one."""
    finals = np.asarray(finals, np.float64)
    seeds = finals.shape[-1]
    members = finals.ravel()
    path.mkdir(parents=True)
    config = {"algo": algo, "config": {}, "run": {"env": env, "seeds": seeds}, **({"sweep": sweep} if sweep else {})}
    (path / "config.json").write_text(json.dumps(config))
    (path / "sparqrl-run.json").write_text(json.dumps({"format": 1, "files": ["config.json", "metrics.csv",
                                                                              "summary.json"]}))
    lines = ["chunk,env_step,seed,wall_time_s,episode_return,episodes,eval_return"]
    lines += [f"{chunk},{chunk * 1000},{m},{chunk},{r / (3 - chunk)},5,{r / (3 - chunk)}" for chunk in (1, 2)
              for m, r in enumerate(members)]
    (path / "metrics.csv").write_text("\n".join(lines) + "\n")
    (path / "summary.json").write_text(json.dumps({
        "algo": algo, "env": env, "seeds": seeds, "final_return_mean": members.mean(),
        "final_return_std": members.std(), "final_return_per_seed": members.tolist(), "env_steps_per_s": 1000.0,
        "wall_time_s": 2.0}))
    return path


RETURNS = {"a": [310.0, 290.0, 350.0, 200.0], "b": [400.0, 380.0, 350.0, 420.0],
           "ppo-cart": [310.0, 290.0, 350.0], "ppo-acro": [-90.0, -120.0, -85.0],
           "dqn-cart": [480.0, 500.0, 500.0], "dqn-acro": [-80.0, -150.0, -70.0]}


@pytest.fixture
def runs(tmp_path):
    folder = tmp_path / "runs"
    return {
        "a": fake_run(folder / "a", "CartPole-v1", RETURNS["a"]),
        "b": fake_run(folder / "b", "CartPole-v1", RETURNS["b"]),
        "sweep": fake_run(folder / "sweep", "CartPole-v1", [[100.0, 150.0], [300.0, 350.0]],
                          sweep=[{"lr": 1e-3}, {"lr": 1e-4}]),
        "ppo-cart": fake_run(folder / "ppo-cart", "CartPole-v1", RETURNS["ppo-cart"]),
        "ppo-acro": fake_run(folder / "ppo-acro", "Acrobot-v1", RETURNS["ppo-acro"]),
        "dqn-cart": fake_run(folder / "dqn-cart", "CartPole-v1", RETURNS["dqn-cart"], algo="dqn"),
        "dqn-acro": fake_run(folder / "dqn-acro", "Acrobot-v1", RETURNS["dqn-acro"], algo="dqn"),
        "one": fake_run(folder / "one", "CartPole-v1", [500.0]),
    }


def run(capsys, *argv):
    code = cli.main(["compare", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_command_prints_and_draws_the_statistics_of_the_runs(runs, tmp_path, capsys):
    out = tmp_path / "compare.png"
    dirs = [runs["a"], runs["b"], runs["sweep"]]
    code, printed, _ = run(capsys, *dirs, "--out", out, "--stats", "--reps", 100, "--bootstrap-seed", 3)
    assert code == 0
    expected = compare_stats(load_rows(dirs), reps=100, seed=3)
    assert format_stats(expected) in printed and f"statistics: {tmp_path / 'compare-stats.png'}" in printed
    assert list(expected.scores) == ["a", "b", "sweep: lr=0.001", "sweep: lr=0.0001"]
    np.testing.assert_array_equal(expected.scores["a"], np.array(RETURNS["a"])[:, None])  # raw returns, [4, 1]
    np.testing.assert_array_equal(expected.scores["sweep: lr=0.0001"], [[300.0], [350.0]])
    assert expected.aggregates["b"]["mean"].point == pytest.approx(np.mean(RETURNS["b"]))
    assert not expected.normalized and "P(b > a) = 0.969" in printed  # 15.5 of 16 pairs (a tie counts half)
    for name in ("compare.png", "compare-stats.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = pytest.importorskip("matplotlib.image").imread(tmp_path / "compare-stats.png")
    assert pixels.shape[0] > 300 and np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0).shape[0] > 50
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compare-stats.png", "compare.png", "runs"]
    # the same command, the same numbers; without --stats, no statistics
    assert run(capsys, *dirs, "--out", out, "--stats", "--reps", 100, "--bootstrap-seed", 3)[1] == printed
    plain = run(capsys, runs["a"], "--out", tmp_path / "plain.png")[1]
    assert "rliable" not in plain and not (tmp_path / "plain-stats.png").exists()


def test_several_environments_are_one_method_per_algorithm_on_normalised_scores(runs, tmp_path, capsys):
    bounds = ["CartPole-v1=0,500", "Acrobot-v1=-500,0"]
    dirs = [runs["ppo-cart"], runs["ppo-acro"], runs["dqn-cart"], runs["dqn-acro"]]
    rows = load_rows(dirs)
    scores, tasks = score_dict(rows, parse_normalize(bounds))
    assert tasks == ["CartPole-v1", "Acrobot-v1"] and list(scores) == ["ppo", "dqn"]
    for method in scores:
        expected = [np.array(RETURNS[f"{method}-cart"]) / 500, (np.array(RETURNS[f"{method}-acro"]) + 500) / 500]
        np.testing.assert_allclose(scores[method], np.stack(expected, axis=1))  # [seeds, tasks]
    code, printed, _ = run(capsys, *dirs, "--stats", "--reps", 100, "--normalize", bounds[0], "--normalize",
                           bounds[1], "--out", tmp_path / "c.png")
    assert code == 0
    assert format_stats(compare_stats(rows, parse_normalize(bounds), reps=100)) in printed
    assert re.search(r"^dqn +3 x 2 +0\.\d{3} \[", printed, re.M) and "P(dqn > ppo) = " in printed
    # one method's runs with other seed counts on two environments are no [runs, tasks] array
    with pytest.raises(ConfigError, match="ppo-acro' is not allowed: has 3 seeds where .*a has 4"):
        compare_stats(load_rows([runs["a"], runs["ppo-acro"]]), parse_normalize(bounds), reps=100)


@pytest.mark.parametrize("case, message", [
    ("one seed", r"DIR='.*one' is not allowed: has 1 seed: --stats's bootstrap intervals need 2 or more"),
    ("unknown task", r"--normalize='Pong-v5' is not allowed: is no environment of the compared runs \(CartPole-v1\)"),
    ("bad bounds", r"--normalize='CartPole-v1=500,0' is not allowed: must be ENV=MIN,MAX"),
    ("unnormalised", r"--normalize=\[\] is not allowed: must give every environment's MIN,MAX .* add --normalize "
                     r"CartPole-v1=MIN,MAX"),
    ("same method twice", r"DIR='.*b' is not allowed: is a second ppo run on CartPole-v1"),
    ("missing task", r"DIR='.*dqn-cart' is not allowed: has no run of dqn on Acrobot-v1"),
    ("no --stats", r"--reps=200 is not allowed: is an option of --stats: add --stats"),
    ("few reps", r"--reps=10 is not allowed: must be an integer from 100"),
    ("unfinished", r"DIR='.*b' is not allowed: is unfinished: --stats needs each seed's final return"),
    ("older summary", r"DIR='.*b' is not allowed: has no final_return_per_seed in its summary.json"),
    ("non-finite", r"DIR='.*b' is not allowed: holds a non-finite final return in its summary.json"),
    ("stats image a folder", r"--out='.*compare-stats.png' is not allowed: is a folder"),
    ("no rliable", r"^sparqrl: error: sparqrl compare --stats needs rliable, which is not installed: "
                   r"pip install 'sparqrl\[rliable\]'"),
])
def test_bad_input_is_one_line_and_writes_nothing(runs, tmp_path, capsys, monkeypatch, case, message):
    a, b, out = runs["a"], runs["b"], tmp_path / "compare.png"
    normalize = ["--normalize", "CartPole-v1=0,500", "--normalize", "Acrobot-v1=-500,0"]
    argv = {
        "one seed": [a, runs["one"], "--stats"],
        "unknown task": [a, b, "--stats", "--normalize", "Pong-v5=-21,21"],
        "bad bounds": [a, b, "--stats", "--normalize", "CartPole-v1=500,0"],
        "unnormalised": [a, runs["ppo-acro"], "--stats"],
        "same method twice": [a, b, runs["ppo-acro"], "--stats", *normalize],
        "missing task": [runs["ppo-cart"], runs["ppo-acro"], runs["dqn-cart"], "--stats", *normalize],
        "no --stats": [a, b, "--reps", "200"],
        "few reps": [a, b, "--stats", "--reps", "10"],
        "unfinished": [a, b, "--stats"],
        "older summary": [a, b, "--stats"],
        "non-finite": [a, b, "--stats"],
        "stats image a folder": [a, b, "--stats"],
        "no rliable": [a, b, "--stats"],
    }[case]
    if case == "unfinished":
        (b / "summary.json").unlink()
    if case in ("older summary", "non-finite"):
        summary = json.loads((b / "summary.json").read_text())
        if case == "older summary":
            del summary["final_return_per_seed"]
        else:
            summary["final_return_per_seed"][1] = float("nan")
        (b / "summary.json").write_text(json.dumps(summary))
    if case == "stats image a folder":
        (tmp_path / "compare-stats.png").mkdir()
    if case == "no rliable":
        for module in ("rliable", "rliable.library", "rliable.metrics", "rliable.plot_utils"):
            monkeypatch.setitem(sys.modules, module, None)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code, _, err = run(capsys, *argv, "--out", out)
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("sparqrl: error: "), err
    assert re.search(message, err), err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before

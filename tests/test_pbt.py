"""`sparqrl pbt`: the exploit/explore step against a NumPy loop, the flags' one-line errors, the default ranges
from the config's checks, a tiny run through the command (pbt.csv, best/ that `eval` and `--resume` take) and
a resumed run equal to an uninterrupted one."""

import csv
import json
import math

import jax
import numpy as np
import pytest

import sparqrl
from sparqrl.algos import ppo
from sparqrl.envs import make_env
from sparqrl.runners import RunConfig, RunInterrupted, pbt
from tests.conftest import run_cli

# ---- the exploit/explore step ---------------------------------------------------------------------


def reference_step(scores, values, draws, low, high, log_scale, resample_prob):
    """Truncation selection and explore, member by member (Jaderberg et al. 2017), in float64."""
    members, fields = values.shape
    q = max(1, members // 4)
    ranked = [-math.inf if math.isnan(s) else float(s) for s in scores]
    order = sorted(range(members), key=lambda i: (-ranked[i], i))
    top, bottom = order[:q], order[members - q:]
    parents, new = list(range(members)), np.array(values, np.float64)
    for b in bottom:
        donor = top[min(int(draws.donor[b] * q), q - 1)]
        if ranked[donor] <= ranked[b]:
            continue
        parents[b] = donor
        for f in range(fields):
            lo, hi, u = float(low[f]), float(high[f]), float(draws.value[b, f])
            if draws.resample[b, f] < resample_prob:
                value = (math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo))) if log_scale[f]
                         else lo + u * (hi - lo))
            else:
                value = float(values[donor, f]) * (0.8 if draws.up[b, f] < 0.5 else 1.2)
            new[b, f] = min(max(value, lo), hi)
    return np.array(parents), new


@pytest.mark.parametrize("members", [4, 6, 11])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exploit_explore_matches_numpy(members, seed):
    rng = np.random.default_rng(seed)
    fields = 3
    low, high = np.array([1e-4, 0.0, -1.0], np.float32), np.array([1e-2, 1.0, 1.0], np.float32)
    log_scale = np.array([True, False, False])
    values = np.stack([rng.uniform(lo, hi, members) for lo, hi in zip(low, high)], -1).astype(np.float32)
    scores = rng.normal(size=members).astype(np.float32)
    scores[rng.integers(members)] = np.nan  # a member without a finished episode ranks last
    scores[-1] = scores[0]  # ties are broken by index
    draws = pbt.draw(jax.random.PRNGKey(seed), members, fields)
    step = jax.jit(lambda s, v, d: pbt.exploit_explore(s, v, d, low, high, log_scale, 0.25))
    parents, new = jax.device_get(step(scores, values, draws))
    want_parents, want = reference_step(scores, values, jax.device_get(draws), low, high, log_scale, 0.25)
    np.testing.assert_array_equal(parents, want_parents)
    np.testing.assert_allclose(new, want, rtol=1e-5, atol=1e-7)
    assert (new >= low).all() and (new <= high).all()
    copied = parents != np.arange(members)
    assert copied.any() and copied.sum() <= max(1, members // 4)  # only the bottom quarter copies
    np.testing.assert_array_equal(new[~copied], values[~copied])  # the others keep their values


def test_equal_scores_copy_no_one():
    """A donor must score strictly higher: a population of equal scores (or none) stays as it is."""
    values = np.ones((8, 2), np.float32)
    draws = pbt.draw(jax.random.PRNGKey(0), 8, 2)
    step = jax.jit(lambda s: pbt.exploit_explore(s, values, draws, np.zeros(2), np.full(2, 2.0), np.array([False] * 2),
                                                 0.25))
    for scores in (np.zeros(8, np.float32), np.full(8, np.nan, np.float32)):
        parents, new = step(scores)
        np.testing.assert_array_equal(parents, np.arange(8))
        np.testing.assert_array_equal(new, values)


# ---- flags and ranges -----------------------------------------------------------------------------


def test_default_ranges_come_from_the_config_and_its_checks():
    config = ppo.Config().validate(make_env("CartPole-v1"))
    settings = pbt.make_pbt_config(config, make_env("CartPole-v1"), 100, "lr,gae_lambda", (),
                                   4, None)
    (lr_low, lambda_low), (lr_high, lambda_high) = settings.low, settings.high
    assert (lr_low, lr_high) == pytest.approx((config.lr / 10, config.lr * 10))
    assert lambda_low == pytest.approx(config.gae_lambda / 10)
    assert 1 - 1e-9 <= lambda_high <= 1.0  # gae_lambda must be in [0, 1]: the range stops where the check does
    assert settings.interval == 10  # a tenth of the run


SMALL = ["--env", "CartPole-v1", "--steps", "1024", "--set", "num_envs=4", "--set", "num_steps=32",
         "--eval-episodes", "2", "--no-progress", "--no-energy"]


@pytest.mark.parametrize("flags, says", [
    (["--fields", "lrr"], "--fields='lrr' is not allowed: is not a field of ppo's config"),
    (["--fields", "lr,num_envs"], "--fields='num_envs' is not allowed: is static"),
    (["--fields", "lr", "--population", "3"], "--population=3 is not allowed: must be an integer >= 4"),
    (["--fields", "lr", "--interval", "9"], "--interval=9 is not allowed: must be in [1, 8]"),
    (["--fields", "lr", "--range", "gae_lambda=0.5:0.9"], "names a field not in --fields"),
    (["--fields", "gae_lambda", "--range", "gae_lambda=0.5:1.5"], "gae_lambda=1.5 fails the config's own checks"),
    (["--fields", "lr", "--env", "gym:CartPole-v1"], "PBT runs on the device"),
    (["--fields", "lr", "--seeds", "2"], "seeds=2 is not allowed: must be 1 for pbt"),
    ([], "--fields='' is not allowed: is needed"),
])
def test_bad_flags_are_one_line_and_write_nothing(tmp_path, capsys, flags, says):
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "pbt", "ppo", *SMALL, "--out", str(out), *flags)
    assert code == 2
    assert says in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


# ---- runs -----------------------------------------------------------------------------------------

FLAGS = ["--fields", "lr,ent_coef", "--population", "4", "--interval", "2"]


def read_csv(path):
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_command_writes_pbt_csv_and_a_best_run_that_eval_and_resume_take(tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, err = run_cli(capsys, "pbt", "ppo", *SMALL, *FLAGS, "--out", str(out))
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["population"] == 4 and summary["intervals"] == 4 and summary["exploits"] > 0
    rows = read_csv(out / "pbt.csv")
    assert len(rows) == 4 * 4 and list(rows[0]) == ["interval", "env_step", "member", "lr", "ent_coef", "score",
                                                    "parent"]
    assert [int(r["env_step"]) for r in rows[::4]] == [256, 512, 768, 1024]
    for row in rows:  # every value within its range
        for name, (low, high) in summary["ranges"].items():
            assert low <= float(row[name]) <= high
    # a member that copied trains the next interval with the donor's values perturbed (x0.8 / x1.2) or resampled
    copies = [r for r in rows if r["parent"] != r["member"]]
    assert copies and all(int(r["interval"]) < 3 for r in copies)  # no exploit after the last interval
    assert (out / "pbt.png").stat().st_size > 0
    best = out / "best"
    best_summary = json.loads((best / "summary.json").read_text())
    assert best_summary["pbt_member"] == summary["best_member"]
    assert summary["final_return_per_seed"][summary["best_member"]] == max(summary["final_return_per_seed"])
    config = json.loads((best / "config.json").read_text())
    assert config["run"]["seeds"] == 1
    assert config["config"]["lr"] == pytest.approx(best_summary["hparams"]["lr"])
    code, stdout, err = run_cli(capsys, "eval", str(best))
    assert code == 0, err
    assert json.loads(stdout)["return_mean"] == pytest.approx(best_summary["final_return_mean"])
    code, stdout, err = run_cli(capsys, "train", "--resume", str(best))
    assert code == 0 and "finished run" in err
    agent = sparqrl.load(best)
    assert agent.act(np.zeros(4, np.float32)) in (0, 1)
    code, stdout, err = run_cli(capsys, "pbt", "--resume", str(out))
    assert code == 0 and "finished PBT run" in err
    for command in (["eval", str(out)], ["train", "--resume", str(out)]):  # the population's is not a train run
        code, _, err = run_cli(capsys, *command)
        assert code == 2 and "is a PBT run's folder" in err and len(err.strip().splitlines()) == 1, err


def test_resume_equals_an_uninterrupted_run(tmp_path):
    config = ppo.Config(total_timesteps=1024, num_envs=4, num_steps=32)
    base = dict(env="CartPole-v1", eval_episodes=2, progress=False, energy=False, checkpoint_every=1,
                checkpoint_interval_s=0.0)
    whole = pbt.train("ppo", config, RunConfig(out=str(tmp_path / "whole"), **base), fields="lr,ent_coef",
                      population=4, interval=2)

    def stop_after_two(chunks, _):
        if chunks == 2:
            raise KeyboardInterrupt

    with pytest.raises(RunInterrupted):
        pbt.train("ppo", config, RunConfig(out=str(tmp_path / "cut"), **base), fields="lr,ent_coef", population=4,
                  interval=2, on_chunk=stop_after_two)
    resumed = pbt.resume(tmp_path / "cut")
    assert whole["exploits"] > 0
    assert (tmp_path / "cut" / "pbt.csv").read_text() == (tmp_path / "whole" / "pbt.csv").read_text()
    for key in ("final_return_per_seed", "best_member", "best_hparams", "best_return_mean"):
        assert resumed[key] == whole[key], key
    drop = ("wall_time_s",)
    rows = [[{k: v for k, v in r.items() if k not in drop} for r in read_csv(tmp_path / name / "metrics.csv")]
            for name in ("whole", "cut")]
    assert rows[0] == rows[1]

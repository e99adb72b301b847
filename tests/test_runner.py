import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from sparqrl import cli
from sparqrl.algos import dqn, ppo
from sparqrl.config import ConfigError
from sparqrl.runners import RunConfig, RunInterrupted, evaluate_saved, resume, train
from sparqrl.runners.anakin import chunk_bounds, load_state, make_driver, prepare, run_keys

SUMMARY_KEYS = {
    "algo", "env", "steps", "seeds", "final_return_mean", "final_return_std", "wall_time_s",
    "env_steps_per_s", "steady_env_steps_per_s", "compile_time_s", "device",
}

SMALL = {
    "ppo": ppo.Config(total_timesteps=6 * 512),
    "dqn": dqn.Config(total_timesteps=3000, learning_starts=500, buffer_size=1000, batch_size=32,
                      epsilon_anneal_time=2000, target_update_interval=100),
}


def small_run(out: Path, **kw) -> RunConfig:
    base = dict(env="CartPole-v1", seeds=2, out=str(out), chunks=6, checkpoint_every=1, checkpoint_interval_s=0.0,
                eval_every=2,
                eval_episodes=3, progress=False)
    return RunConfig(**{**base, **kw})


def test_chunk_bounds_cover_all_updates():
    assert chunk_bounds(10, 3) == [3, 7, 10]
    assert chunk_bounds(2, 5) == [1, 2]
    b = chunk_bounds(976, 50)
    assert b[-1] == 976 and len(b) == 50 and all(x < y for x, y in zip(b, b[1:]))


def test_a_seeds_keys_do_not_depend_on_the_seed_count():
    """docs/compiled-training.md, "Reproducibility": seed k of `--seeds 2` has the training and evaluation keys of
    seed k of `--seeds 4` (JAX's default threefry splits a key by index)."""
    few, more = run_keys(7, 2, 2), run_keys(7, 4, 4)
    for a, b in zip(few, more):
        np.testing.assert_array_equal(jax.random.key_data(a), jax.random.key_data(b)[:2])
    assert not np.array_equal(jax.random.key_data(more[0])[2], jax.random.key_data(more[0])[0])


def test_run_leaves_everything_behind(tmp_path):
    summary = train("ppo", SMALL["ppo"], small_run(tmp_path / "run"))
    out = tmp_path / "run"
    for name in ("summary.json", "metrics.csv", "returns.png", "config.json", "checkpoint"):
        assert (out / name).exists(), name
    assert any((out / "tensorboard").glob("events.out.tfevents.*"))
    saved = json.loads((out / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(saved) and saved == json.loads(json.dumps(summary))
    assert saved["steps"] == 6 * 512 and saved["seeds"] == 2
    assert saved["steady_env_steps_per_s"] > 0  # (6 chunks: chunks 2-6 over the time they took)
    lines = (out / "metrics.csv").read_text().strip().splitlines()
    assert len(lines) == 1 + 6 * 2  # header + one row per chunk per seed
    assert "episode_return" in lines[0] and "eval_return" in lines[0]
    # `sparqrl eval DIR` reproduces the final evaluation from the checkpoint alone
    code = cli.main(["eval", str(out)])
    assert code == 0
    again = evaluate_saved(out)
    assert again["return_per_seed"] == saved["final_return_per_seed"]
    # resuming a finished run says so, exits 0 and changes nothing (no recompile, no doubled times)
    files = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}
    assert cli.main(["train", "--resume", str(out)]) == 0
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()} == files


def test_the_evaluation_program_is_built_at_the_first_evaluation(tmp_path):
    """Training starts without waiting for the evaluation program (the first progress lines do not wait for
    it: `start` compiles it on a thread); the first evaluation takes it, once, and its wait counts in
    compile_time_s."""
    run = small_run(tmp_path / "run", compile_cache=False)
    module, config, env = prepare("ppo", SMALL["ppo"], run)
    driver = make_driver("ppo", module, config, env, run)
    driver.build()
    built = driver.compile_time_s
    driver.start(driver.init_state(), 0, None)
    state, _ = driver.run_chunk(0)
    assert built > 0 and driver.compile_time_s == built
    first = driver.evaluate(state)
    with_evaluation = driver.compile_time_s
    assert first.shape == (2, 3) and with_evaluation > built
    np.testing.assert_array_equal(driver.evaluate(state), first)
    assert driver.compile_time_s == with_evaluation


def test_a_due_evaluation_starts_before_the_next_chunk_is_queued(tmp_path):
    """After a chunk whose evaluation is due (eval_every=2: chunk 2, index 1), the evaluation program is called
    before the next chunk is queued, so the devices run it first rather than behind that chunk; what it returns
    equals the evaluation of the same state called afterwards. No evaluation is started where none is due."""
    run = small_run(tmp_path / "run", compile_cache=False)
    module, config, env = prepare("ppo", SMALL["ppo"], run)
    driver = make_driver("ppo", module, config, env, run)
    driver.build()
    driver.start(driver.init_state(), 0, None)
    state, _ = driver.run_chunk(0)
    driver.evaluate(state)  # the program built (the first evaluation takes it from its build)
    calls = []
    program, launch = driver._evaluate, driver._launch
    driver._evaluate = lambda *args: calls.append("evaluate") or program(*args)
    driver._launch = lambda *args: calls.append("launch") or launch(*args)
    state, _ = driver.run_chunk(1)
    assert calls == ["evaluate", "launch"]
    started = driver.evaluate(state)
    driver._evaluate = program
    np.testing.assert_array_equal(started, driver.evaluate(state))
    calls.clear()
    driver._evaluate = lambda *args: calls.append("evaluate") or program(*args)
    driver.run_chunk(2)
    assert calls == ["launch"]
    driver.close()


def test_overwrite_replaces_only_a_run_and_only_its_files(tmp_path):
    """A user's folder is never replaced, even with --overwrite; a run is replaced only with it, and only
    the files the run wrote go (a file the user put beside them stays)."""
    users = tmp_path / "thesis"
    users.mkdir()
    (users / "thesis.txt").write_text("important")
    for overwrite in (False, True):
        with pytest.raises(ConfigError, match="not a sparqrl run"):
            train("ppo", SMALL["ppo"], small_run(users, overwrite=overwrite))
    assert [p.name for p in users.iterdir()] == ["thesis.txt"]

    out = tmp_path / "run"
    train("ppo", SMALL["ppo"], small_run(out, chunks=2, eval_every=0))
    (out / "notes.txt").write_text("mine")
    before = {p.name for p in out.iterdir()}
    with pytest.raises(ConfigError, match="out=.*--overwrite"):
        train("ppo", SMALL["ppo"], small_run(out, chunks=2))
    with pytest.raises(ConfigError, match="lr"):  # a bad new run deletes nothing
        train("ppo", dataclasses.replace(SMALL["ppo"], lr=-1.0), small_run(out, chunks=2, overwrite=True))
    assert {p.name for p in out.iterdir()} == before
    train("ppo", SMALL["ppo"], small_run(out, chunks=3, eval_every=0, overwrite=True))
    assert (out / "notes.txt").read_text() == "mine"
    assert json.loads((out / "config.json").read_text())["run"]["chunks"] == 3


def _interrupt_at(chunk):
    def hook(done, metrics):
        if done == chunk:
            raise KeyboardInterrupt

    return hook


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_resume_equals_uninterrupted_run(tmp_path, algo):
    whole = train(algo, SMALL[algo], small_run(tmp_path / "whole"))
    with pytest.raises(RunInterrupted, match="--resume"):
        train(algo, SMALL[algo], small_run(tmp_path / "cut", checkpoint_every=2), on_chunk=_interrupt_at(3))
    resumed = resume(tmp_path / "cut")
    assert resumed["final_return_per_seed"] == whole["final_return_per_seed"]
    state_a = load_state(tmp_path / "whole")[-1]
    state_b = load_state(tmp_path / "cut")[-1]
    for a, b in zip(jax.tree.leaves(state_a), jax.tree.leaves(state_b), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    def rows(name):  # every metric of every chunk and seed, wall time left out
        lines = (tmp_path / name / "metrics.csv").read_text().strip().splitlines()
        return [line.split(",")[:3] + line.split(",")[4:] for line in lines]

    assert rows("cut") == rows("whole")


def test_seeds_are_sharded_over_devices(tmp_path):
    """With two host devices the seed axis is split over both, and the numbers do not change."""
    code = (
        "import json, sys\n"
        "from sparqrl.algos import ppo\n"
        "from sparqrl.runners import RunConfig, train\n"
        "s = train('ppo', ppo.Config(total_timesteps=4*512), RunConfig(seeds=4, out=sys.argv[1], chunks=2,"
        " eval_episodes=2, progress=False))\n"
        "print(json.dumps(s))\n"
    )
    results = {}
    for devices in (1, 2):
        env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}
        proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / f"d{devices}")], env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        results[devices] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results[1]["devices_used"] == 1 and results[2]["devices_used"] == 2
    np.testing.assert_allclose(results[1]["final_return_per_seed"], results[2]["final_return_per_seed"], rtol=1e-5)


def test_ctrl_c_leaves_a_resumable_run(tmp_path):
    """A real SIGINT to the command line: exit 130, a checkpoint, and `--resume` finishes the run.

    2,000 chunks of one PPO update each: the run lasts seconds after the signal is sent even on a
    loaded machine (with 200 it could end before the signal arrived and exit 0)."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "sparqrl.cli", "train", "ppo", "--steps", str(2000 * 512), "--out", str(out),
           "--chunks", "2000", "--checkpoint-every", "100000", "--eval-every", "0", "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.csv"
    import time

    deadline = time.time() + 300
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 3):
        time.sleep(0.2)
    proc.send_signal(2)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "--resume" in err
    assert any((out / "checkpoint").iterdir())
    assert not (out / "summary.json").exists()
    done = subprocess.run([sys.executable, "-m", "sparqrl.cli", "train", "--resume", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2000 * 512
    chunks = [int(line.split(",")[0]) for line in metrics.read_text().strip().splitlines()[1:]]
    assert chunks == list(range(1, 2001))


def test_one_chunk_and_many_give_identical_parameters(tmp_path):
    """Chunks only decide where the host loop looks in: the trained parameters do not change."""
    config = ppo.Config(total_timesteps=8 * 512)
    one = train("ppo", config, small_run(tmp_path / "one", chunks=1, eval_every=0))
    many = train("ppo", config, small_run(tmp_path / "many", chunks=8, eval_every=0))
    assert one["steady_env_steps_per_s"] is None and many["steady_env_steps_per_s"] > 0  # (no steady state in 1 chunk)
    for a, b in zip(jax.tree.leaves(load_state(tmp_path / "one")[-1]), jax.tree.leaves(load_state(tmp_path / "many")[-1]),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_cached_compilation_gives_identical_results(tmp_path):
    """The second run of a configuration takes every program from the persistent compilation cache and the
    traced-program store (it adds no entry to either) and computes the same metrics; --no-compile-cache
    neither reads nor writes them."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "JAX_PLATFORMS": "cpu"}
    cache, store = tmp_path / "cache" / "sparqrl" / "xla", tmp_path / "cache" / "sparqrl" / "programs"
    base = [sys.executable, "-m", "sparqrl.cli", "train", "ppo", "--steps", str(4 * 512), "--chunks", "2",
            "--eval-episodes", "2", "--no-progress", "--no-energy"]
    entries, stored = [], []
    for name, extra, loaded in (("first", [], 0), ("second", [], 3), ("uncached", ["--no-compile-cache"], 0)):
        proc = subprocess.run([*base, "--out", str(tmp_path / name), *extra], env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads((tmp_path / name / "summary.json").read_text())["programs_loaded"] == loaded
        entries.append(sorted(p.name for p in cache.iterdir()))
        stored.append(sorted(p.name for p in store.iterdir()))
    assert entries[0] and entries[1] == entries[0] == entries[2]
    assert len(stored[0]) == 3 and stored[1] == stored[0] == stored[2]

    def rows(name):
        lines = (tmp_path / name / "metrics.csv").read_text().strip().splitlines()
        return [line.split(",")[:3] + line.split(",")[4:] for line in lines]

    assert rows("first") == rows("second") == rows("uncached")

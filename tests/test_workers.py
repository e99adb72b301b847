"""Sweeps and meta-evolution over Ray workers (issue 35 item 4, `sparqrl.runners.workers`): the settings or the
population split into contiguous slices, one Ray task each, gathered in order; each member's result equal to the
single-process run's; a slice whose worker died run again; bad flags one line before anything is written.

The runs share one local Ray instance of this process (2 CPUs, loopback), as `--workers 2` starts one."""

from __future__ import annotations

import dataclasses
import os
import sys

import jax
import numpy as np
import pytest

from conftest import RAY_SERIAL, fitness_rows, meta_checkpoint, run_cli

pytest.importorskip("ray")

from sparqrl.algos import ppo  # noqa: E402
from sparqrl.meta import run as meta_run  # noqa: E402
from sparqrl.runners import RunConfig, train  # noqa: E402
from sparqrl.runners.anakin import load_state  # noqa: E402
from sparqrl.runners.workers import Pool, Workers, gpu_share, slices  # noqa: E402

PPO = ppo.Config(total_timesteps=4 * 32, num_envs=4, num_steps=32, num_minibatches=1, update_epochs=1,
                 hidden=(16, 16))
INNER = ("num_envs=4", "num_steps=16", "num_minibatches=1", "update_epochs=1", "hidden=16,16")


def test_slices_are_contiguous_in_order_and_at_most_two_shapes():
    assert slices(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert slices(4, 2) == [(0, 2), (2, 4)] and slices(3, 8) == [(0, 1), (1, 2), (2, 3)] and slices(5, 1) == [(0, 5)]


def test_workers_take_a_gpu_each_or_equal_shares_that_fit():
    assert gpu_share(0, 4) == 0 and gpu_share(8, 4) == 1 and gpu_share(4, 4) == 1
    assert gpu_share(1, 2) == 0.5 and gpu_share(2, 3) == 0.5 and gpu_share(2, 5) == pytest.approx(1 / 3)


@pytest.mark.parametrize("args, message", [
    (["sweep", "ppo", "--grid", "lr=1e-4,1e-3", "--workers", "0"],
     "--workers=.?0.? is not allowed: must be a positive"),
    (["sweep", "ppo", "--grid", "lr=1e-4", "--workers", "2", "--ray-address", "127.0.0.1:1"],
     "workers=2 is not allowed: starts a local Ray instance"),
    (["sweep", "ppo", "--grid", "lr=1e-4", "--ray-address", "127.0.0.1:1"],
     "ray_address=.127.0.0.1:1.: nothing answers at"),
    (["meta", "lpo", "--workers", "0"], "workers=0 is not allowed: must be an integer from 1"),
    (["meta", "lpo", "--workers", "2", "--ray-address", "auto"], "workers=2 is not allowed: starts a local Ray"),
    (["meta", "mfos", "--trainer", "ppo", "--workers", "2"], "trainer ppo trains one meta-policy"),
])
def test_bad_worker_flags_are_one_line_errors_before_anything_is_written(tmp_path, capsys, args, message):
    out = tmp_path / "never"
    code, _, err = run_cli(capsys, *args, "--out", str(out), "--no-progress", "--no-energy")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert pytest.importorskip("re").search(message, err), err
    assert not out.exists()


@pytest.fixture(scope="module")
def ray_instance():
    """A local Ray instance on loopback with 2 CPUs for the module's runs (`worker_session` then uses it)."""
    from sparqrl.runners.actors import ray_session

    with ray_session(None, 2):
        yield


@RAY_SERIAL
def test_sweep_over_two_workers_equals_the_single_process_sweep(tmp_path, ray_instance):
    """Two settings x 2 seeds, a setting per worker: sweep.csv, best.json and the returns equal the single-process
    sweep's, the final state to float rounding; summary.json records the workers."""
    def run(name):
        return RunConfig(env="CartPole-v1", seeds=2, out=str(tmp_path / name), chunks=1, eval_every=0,
                         eval_episodes=2, progress=False, energy=False)

    settings = [{"lr": 1e-4}, {"lr": 1e-3}]
    alone = train("ppo", PPO, run("alone"), settings=settings)
    spread = train("ppo", PPO, run("spread"), settings=settings, workers=Workers(count=2))
    assert spread["workers"] == 2 and spread["slices"] == 2 and "workers" not in alone
    assert spread["final_return_per_seed"] == alone["final_return_per_seed"]
    for name in ("sweep.csv", "best.json"):
        a, b = ((tmp_path / d / name).read_text().replace(d, "OUT") for d in ("alone", "spread"))
        assert a == b, name
    # The final state to float rounding: one 4-member program against two 2-member ones is another layout (the
    # issue's identity holds for equal slice shapes); one CI run found 9 of 128 weights an ulp apart (1e-7 relative)
    # with sweep.csv, best.json and the returns still identical.
    for a, b in zip(*(jax.tree.leaves(load_state(tmp_path / d)[-1]) for d in ("alone", "spread")), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-9)


@RAY_SERIAL
def test_meta_over_two_workers_equals_the_single_process_run(tmp_path, ray_instance):
    """A population of 4 in slices of 2: fitness.csv, the strategy state and the evolved parameters equal the
    single-process run's."""
    def config(name):
        return meta_run.MetaConfig(task="lpo", popsize=4, seeds=1, steps=64, generations=1, out=str(tmp_path / name),
                                   energy=False, progress=False, set=INNER)

    alone = meta_run.train_meta(config("alone"))
    prepared = meta_run.prepare(config("spread"))
    spread = meta_run.run_meta(prepared, meta_run.start_meta_dir(prepared), resuming=False, workers=Workers(count=2))
    assert spread["workers"] == 2 and "workers" not in alone
    assert fitness_rows(tmp_path / "alone") == fitness_rows(tmp_path / "spread")
    jax.tree.map(np.testing.assert_array_equal, meta_checkpoint(tmp_path / "alone")[0],
                 meta_checkpoint(tmp_path / "spread")[0])
    for name in ("best_meta_params.npz", meta_run.BEST_MEMBER_FILE):
        assert (tmp_path / "alone" / name).read_bytes() == (tmp_path / "spread" / name).read_bytes(), name


@dataclasses.dataclass(frozen=True)
class DiesOnce:
    """A slice job whose worker process dies (as if its node went away) the first time it runs slice `die_on`."""

    marker: str  # a file: present once the worker has died
    die_on: int
    key: str = "dies-once"
    compile_cache: bool = False

    def build(self):
        return None

    def run(self, built, index):
        if index == self.die_on and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(1)
        return np.full(2, index)


@RAY_SERIAL
def test_a_slice_whose_worker_died_is_run_again_and_gathered_in_order(tmp_path, ray_instance):
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the job's class travels with it
    job = DiesOnce(str(tmp_path / "died"), die_on=1)
    pool = Pool(2)
    try:
        results = pool.map([(job, (i,)) for i in range(3)])
    finally:
        pool.close()
    assert (tmp_path / "died").exists()  # the worker did die
    assert [r.tolist() for r in results] == [[0, 0], [1, 1], [2, 2]]

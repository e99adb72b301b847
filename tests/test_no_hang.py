"""No command hangs (issue 30 item 6): every on-device algorithm, a sweep and a meta run with more seeds (or
members) than devices, spread over 2 forced CPU devices, through the `sparqrl` command under a timeout; and the
cause of the hang that layout had (a batched LAPACK QR in a vmapped orthogonal init) kept out of every
algorithm's init program."""

from __future__ import annotations

import jax
import pytest
from bounded_runs import run_bounded

from sparqrl.algos import get_algorithm
from sparqrl.envs import make_env

ENVS = {"ppo": "CartPole-v1", "dqn": "CartPole-v1", "impala": "CartPole-v1", "td3": "Pendulum-v1",
        "sac": "Pendulum-v1"}
ALGOS = tuple(ENVS)
# Runs that take a few learning steps: --steps and --set items per algorithm. The networks keep their default
# sizes: jaxlib splits a batched QR over the thread pool (the hang) only when its matrices are large enough.
TINY = {
    "ppo": ("256", ["num_envs=4", "num_steps=32", "num_minibatches=1", "update_epochs=1"]),
    "impala": ("256", ["num_envs=4", "num_steps=32"]),
    "dqn": ("256", ["num_envs=4", "learning_starts=64", "batch_size=16"]),
    "td3": ("128", ["learning_starts=64", "batch_size=16", "hidden=16,16"]),  # initialised without a QR
    "sac": ("128", ["learning_starts=64", "batch_size=16"]),
}
DEVICES = 2
QUIET = ["--no-progress", "--no-energy", "--chunks", "2", "--eval-episodes", "2"]


def sets(items: list[str]) -> list[str]:
    return [word for item in items for word in ("--set", item)]


@pytest.mark.parametrize("algo", ALGOS)
def test_train_with_more_seeds_than_devices_finishes(algo, tmp_path):
    steps, settings = TINY[algo]
    summary = run_bounded(["train", algo, "--env", ENVS[algo], "--seeds", str(2 * DEVICES), "--steps", steps,
                           *sets(settings), *QUIET], tmp_path / algo, DEVICES)
    assert summary["devices_used"] == DEVICES


def test_sweep_with_more_members_than_devices_finishes(tmp_path):
    steps, settings = TINY["dqn"]
    summary = run_bounded(["sweep", "dqn", "--grid", "lr=1e-3,5e-4", "--seeds", str(DEVICES), "--steps", steps,
                           *sets(settings), *QUIET], tmp_path / "sweep", DEVICES)
    assert summary["devices_used"] == DEVICES


def test_meta_with_more_members_than_devices_finishes(tmp_path):
    """DQN's inner trainings: the population's gather once hung on the QR of their init."""
    steps, settings = TINY["dqn"]
    summary = run_bounded(["meta", "hparams", "--algo", "dqn", "--fields", "lr", "--popsize", str(2 * DEVICES),
                           "--seeds", "1", "--generations", "1", "--steps", steps, *sets(settings),
                           "--no-progress", "--no-energy"], tmp_path / "meta", DEVICES)
    assert summary["devices_used"] == DEVICES


def qr_operands(jaxpr: jax.extend.core.Jaxpr) -> list[tuple[int, ...]]:
    """The operand shapes of every QR in `jaxpr` and the programs nested in it (loop bodies, custom rules)."""
    shapes = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "qr":
            shapes.append(tuple(eqn.invars[0].aval.shape))
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    shapes += qr_operands(sub.jaxpr)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    shapes += qr_operands(sub)
    return shapes


@pytest.mark.parametrize("algo", ALGOS)
def test_vmapped_init_runs_no_batched_qr(algo):
    """jaxlib's CPU QR of a batch blocks an intra-op pool thread until the batch's parts, queued on the same
    pool, are done: one such QR per device took both threads of a 2-core pool and the run hung. Each
    orthogonal kernel of a vmapped (here nested: settings x seeds) init must be one unbatched [m, n] QR."""
    module = get_algorithm(algo)
    env = make_env(ENVS[algo])
    init = module.make_algorithm(module.Config().validate(env), env).init
    keys = jax.random.split(jax.random.PRNGKey(0), (2, 3))
    shapes = qr_operands(jax.make_jaxpr(jax.vmap(jax.vmap(init)))(keys).jaxpr)
    assert shapes or algo == "td3"  # TD3 initialises as PyTorch does: no QR
    assert all(len(shape) == 2 for shape in shapes), shapes

"""A3C: its actors' gradient against A2C's learner, the learner's drop of stale gradients, the refusals, and learning
gym:CartPole-v1 with two Ray actors through the command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from conftest import RAY_SERIAL
from sparqrl import cli
from sparqrl.algos import a2c, a3c
from sparqrl.algos.base import Step
from sparqrl.config import ConfigError
from sparqrl.envs import host_spec, make_env
from sparqrl.runners import RunConfig, sebulba
from sparqrl.runners.actors import Fragment, quantized_copy
from sparqrl.runners.gradients import GradientActor, GradientDriver, Gradients, make_gradient_learner
from sparqrl.runners.session import concrete

T, N = 5, 4


def random_fragment(seed: int, shape: tuple[int, ...] = (T, N)) -> Step:
    """A CartPole fragment [*shape] as a host actor sends it (no values), with terminations and truncations."""
    rng = np.random.default_rng(seed)
    obs, next_obs = rng.normal(size=(2, *shape, 4)).astype(np.float32)
    kind = rng.choice(3, size=shape, p=[0.8, 0.1, 0.1])
    return Step(obs, rng.integers(0, 2, size=shape).astype(np.int32), rng.normal(size=shape).astype(np.float32),
                next_obs, kind == 1, kind == 2, rng.normal(-0.7, 0.1, size=shape).astype(np.float32),
                np.ones(shape, np.float32))


@pytest.mark.parametrize("optimizer", ["rmsprop", "adam"])
def test_the_actors_gradient_is_the_one_a2cs_learner_steps_on(optimizer):
    """The same fragment: A3C's actor-side gradient (under the learner's published policy), applied by A3C's
    learner, moves the parameters and optimizer state exactly as A2C's learner moves them in its one step on that
    fragment, and the loss terms are A2C's."""
    spec = host_spec("gym:CartPole-v1")
    config = a3c.Config(num_envs=N, num_steps=T, total_timesteps=400, optimizer=optimizer, ent_coef=0.01)
    al = a2c.make_actor_learner(a2c.Config(**{f: getattr(config, f) for f in ("num_envs", "num_steps",
                                "total_timesteps", "optimizer", "ent_coef")}), spec)
    gl = a3c.make_gradient_learner(config, spec)
    learner = al.init(jax.random.PRNGKey(1))._replace(key=a3c.train.GRADIENT_KEY)  # (orders A2C's one minibatch)
    steps = random_fragment(0)
    expected, expected_metrics = jax.jit(al.learn)(learner, steps)
    grads, metrics = jax.jit(gl.gradient)(al.policy(learner), steps)
    applied = jax.jit(gl.apply)(learner, grads)
    assert any(float(np.abs(g).max()) > 0 for g in jax.tree.leaves(grads))
    for got, want in ((applied.params, expected.params), (applied.opt_state, expected.opt_state)):
        jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7),
                     got, want)
    assert int(applied.gradient_steps) == 1 and int(applied.env_steps) == T * N
    assert {k: float(v) for k, v in metrics.items()} == pytest.approx({k: float(v) for k, v in
                                                                      expected_metrics.items()}, rel=1e-6)
    moved = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))), learner.params, applied.params)
    assert all(jax.tree.leaves(moved))


class NoStop:
    def check(self) -> None:
        pass


class ScriptedPool:
    """A pool that hands the driver the messages it was given, in order (no actors, no Ray)."""

    backend, restarts, failures = "scripted", 0, []

    def __init__(self, messages: list[Fragment]):
        self.messages, self.submitted = list(messages), []

    def next(self) -> Fragment:
        return self.messages.pop(0)

    def submit(self, actor_id: int, copy: object) -> None:
        self.submitted.append(actor_id)

    def publish(self, copy: object) -> object:
        return copy

    def close(self) -> None:
        pass


def test_a_stale_gradient_is_dropped_and_counted_a_fresh_one_applied(tmp_path):
    """The learner at version 5 with --max-lag 1: a gradient computed on version 3 is dropped, counted
    (stale_gradients_dropped) and its actor asked again; one computed on version 5 is applied, one optimizer step,
    and nothing else moves the parameters."""
    run = RunConfig(env="gym:CartPole-v1", out=str(tmp_path / "run"), max_lag=1, seeds=1, progress=False,
                    energy=False)
    config = a3c.Config(num_envs=N, num_steps=T, total_timesteps=4_000)
    p = sebulba.Prepared("a3c", config, run)
    driver = GradientDriver(p, "a3c", run)
    driver.build()
    learner = driver.init_state()
    gl = make_gradient_learner(driver.spec)
    policy = p.policy_fn(learner)
    one = jax.vmap(gl.gradient)
    stale, fresh = (jax.device_get(one(policy, jax.tree.map(lambda x: x[None], random_fragment(s)))) for s in (1, 2))
    expected = jax.device_get(jax.vmap(gl.apply)(learner, fresh[0]))
    before = jax.device_get(learner)
    no_episodes = (np.zeros((T, 1, N), np.float32), np.zeros((T, 1, N), bool))
    messages = [Fragment(0, 0, 0, 3, Gradients(*stale), *no_episodes, 0.0),
                Fragment(0, 0, 1, 5, Gradients(*fresh), *no_episodes, 0.0)]
    driver.learner.start(learner)
    driver.updates_done, driver._stop, driver._pool_start = 5, NoStop(), 0.0
    driver.pool = ScriptedPool(messages)
    driver._copy_ref = driver._publish()
    driver.bounds = [6]
    after, per_seed = driver.run_chunk(0)
    after = concrete(after)  # (the learner's state, fetched where used)
    assert driver.pool.messages == [] and driver.pool.submitted == [0, 0]  # each freed slot refilled
    assert per_seed["stale_gradients_dropped"].tolist() == [1.0] and driver.updates_done == 6
    assert int(np.asarray(after.gradient_steps)[0]) == 1
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-9),
                 after.params, expected.params)
    assert any(bool(np.any(a != b)) for a, b in zip(jax.tree.leaves(after.params), jax.tree.leaves(before.params)))
    assert per_seed["policy_loss"][0] == pytest.approx(float(fresh[1]["policy_loss"][0]))


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_a_version_carries_the_fp32_params_once_and_actors_act_with_the_learner_s_quantization(tmp_path, precision):
    """Each published version is the fp32 params alone (not also a quantized copy of them, fp32 by default); a
    gradient actor makes from them the same acting copy the learner makes for other actors."""
    run = RunConfig(env="gym:CartPole-v1", out=str(tmp_path / "run"), seeds=2, actor_precision=precision,
                    progress=False, energy=False)
    p = sebulba.Prepared("a3c", a3c.Config(num_envs=N, num_steps=T, total_timesteps=4_000), run)
    driver = GradientDriver(p, "a3c", run)
    driver.build()
    state = driver.init_state()
    driver.learner.start(state)
    copy = driver.learner.policy_copy(3)
    policy = jax.device_get(p.policy_fn(state))
    assert copy.stacks == () and copy.features is None and copy.aux is None
    assert copy.nbytes == sum(x.nbytes for x in jax.tree.leaves(policy)) == sum(
        x.nbytes for x in jax.tree.leaves(copy.params))
    made = GradientActor(driver.spec, 0, 0)._acting_copy(copy)
    expected = quantized_copy(3, policy, p.al.acting, p.paths, precision, run.quant_granularity, copy.env_steps)
    assert made._replace(stacks=()) == expected._replace(stacks=())
    for got, want in zip(made.stacks, expected.stacks, strict=True):
        assert (got.precision, got.activation) == (want.precision, want.activation) == (precision, want.activation)
        for a, b in zip(jax.tree.leaves(got[2:]), jax.tree.leaves(want[2:]), strict=True):
            np.testing.assert_array_equal(a, b)


def test_on_device_a3c_is_refused_naming_a2c(tmp_path, capsys):
    """A JAX environment has no actors to send gradients: one line that names A2C, before the folder is written."""
    out = tmp_path / "run"
    code = cli.main(["train", "a3c", "--env", "CartPole-v1", "--out", str(out), "--no-progress", "--no-energy"])
    error = capsys.readouterr().err.strip()
    assert code == 2 and not out.exists()
    assert error.count("\n") == 0 and "sparqrl train a2c --env CartPole-v1" in error and "gym:NAME" in error


@pytest.mark.parametrize("field, value", [("normalize_obs", True), ("normalize_reward", True), ("sparse", "rigl")])
def test_what_an_actor_cannot_compute_its_gradient_with_is_refused(field, value):
    with pytest.raises(ConfigError, match=f"^{field}=.* must be .* for a3c: its actors") as error:
        a3c.Config(**{field: value}).validate(make_env("CartPole-v1"))
    assert "\n" not in str(error.value)


def test_central_inference_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="^inference='central' .* must be actor for a3c"):
        from sparqrl.runners import train
        train("a3c", a3c.Config(), RunConfig(env="gym:CartPole-v1", out=str(tmp_path / "run"), inference="central"))
    assert not (tmp_path / "run").exists()


LEARN_STEPS = 120_000
LEARN_THRESHOLD = 200.0


@RAY_SERIAL
def test_a3c_learns_cartpole_with_two_ray_actors(tmp_path):
    """`sparqrl train a3c --env gym:CartPole-v1 --actors 2 --seeds 2` (Ray actors computing gradients, the learner
    applying them as they arrive): every seed's greedy return >= LEARN_THRESHOLD after LEARN_STEPS env steps."""
    out = tmp_path / "run"
    argv = ["train", "a3c", "--env", "gym:CartPole-v1", "--actors", "2", "--seeds", "2", "--steps", str(LEARN_STEPS),
            "--out", str(out), "--no-progress", "--no-energy"]
    done = subprocess.run([str(Path(sys.executable).with_name("sparqrl")), *argv], capture_output=True, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    print(f"\nsparqrl {' '.join(argv)}: per seed {summary['final_return_per_seed']}, "
          f"{summary['stale_gradients_dropped']} stale gradients dropped, {summary['wall_time_s']:.0f} s")
    assert summary["backend"] == "ray" and summary["actor_restarts"] == 0, summary["actor_failures"]
    assert min(summary["final_return_per_seed"]) >= LEARN_THRESHOLD, summary["final_return_per_seed"]

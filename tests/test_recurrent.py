"""Recurrent policies (`--set memory=lstm|gru`, issue 36 item 4): the state reset at episode starts and carried
across fragments, the learner's re-run of a fragment against a step-by-step unroll, PPO's minibatches by
environment, the one-line refusals, and learning on a task that needs memory (MemoryChain-bsuite)."""

from __future__ import annotations

from typing import get_args

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import train_as_users_do
from sparqrl.algos import ppo
from sparqrl.algos.base import RecurrentAct, on_device
from sparqrl.algos.config import MemoryCell
from sparqrl.algos.impala import train as impala_train
from sparqrl.algos.ppo import train as ppo_train
from sparqrl.algos.recurrent import env_minibatches, fragment_outputs
from sparqrl.config import ConfigError
from sparqrl.envs import make_env
from sparqrl.nets.memory import CELLS, RecurrentActorCritic, reset_carry

ENV = "MemoryChain-bsuite"  # 6-step episodes: the only informative observation is the first (the context bit)


def test_memory_choices_are_the_cells():
    assert set(get_args(MemoryCell)) == {"none", *CELLS}


def acted_fragments(make_actor_learner, config, env, updates=2):
    """The fragments `on_device` acts in `updates` updates (the learner swapped for one that only returns them),
    the learner's policy params and the runner state after them."""
    al = make_actor_learner(config, env)
    al = al._replace(learn=lambda learner, steps: (learner, {"steps": steps}))
    algo = on_device(al, env, config.num_steps, updates)
    state = algo.init(jax.random.PRNGKey(3))
    fragments, update = [], jax.jit(algo.update)
    for _ in range(updates):
        state, metrics = update(state)
        fragments.append(metrics["steps"])
    return al, fragments, state


def step_by_step(network, params, obs, done, carry):
    """A plain Python loop: the network on each step [N] in turn, the carry reset after an episode ends.
    Returns the carries before each step [T, N, ...], raw [T, N, A] and values [T, N]."""
    carries, raws, values = [], [], []
    apply = jax.jit(network.apply)
    for t in range(obs.shape[0]):
        carries.append(carry)
        raw, value, carry = apply(params, obs[t], carry)
        raws.append(raw)
        values.append(value)
        carry = reset_carry(carry, done[t])
    stack = lambda xs: jax.tree.map(lambda *x: jnp.stack(x), *xs)  # noqa: E731
    return stack(carries), jnp.stack(raws), jnp.stack(values), carry


@pytest.mark.parametrize("memory, make_actor_learner", [("lstm", ppo_train.make_actor_learner),
                                                        ("gru", impala_train.make_actor_learner)])
def test_rerun_matches_acting_and_a_step_by_step_unroll(memory, make_actor_learner):
    env = make_env(ENV)
    config_type = ppo.Config if make_actor_learner is ppo_train.make_actor_learner else impala_train.Config
    config = config_type(num_envs=4, num_steps=16, total_timesteps=4 * 16 * 2, hidden=(16,), memory=memory,
                         memory_size=8)
    al, fragments, state = acted_fragments(make_actor_learner, config, env)
    params = al.policy(state.learner).params
    network = al.acting.network
    assert isinstance(network, RecurrentActorCritic)
    first = fragments[0]
    done = np.asarray(first.terminated | first.truncated)
    assert done[:-1].any(), "the fragment must hold an episode start to test the reset"
    carries, raw, values, after = step_by_step(network, params, jnp.asarray(first.obs), jnp.asarray(done),
                                               jax.tree.map(lambda c: c[0], first.memory))
    # the actor's stored states are the step-by-step unroll's, zero right after an episode ended
    for stored, expected in zip(jax.tree.leaves(first.memory), jax.tree.leaves(carries)):
        np.testing.assert_allclose(stored, expected, atol=1e-5)
        assert np.all(np.asarray(stored)[1:][done[:-1]] == 0)
        assert np.abs(np.asarray(stored)[1:][~done[:-1]]).sum() > 0
    # carried across fragments: the next fragment starts from the state the last step left
    for nxt, expected in zip(jax.tree.leaves(fragments[1].memory), jax.tree.leaves(after)):
        np.testing.assert_allclose(nxt[0], expected, atol=1e-5)
    # the learner's re-run from the fragment's first state: the same policy and values as acted step by step
    dist, rerun_values, next_values = jax.jit(fragment_outputs, static_argnums=0)(
        network, params, jnp.asarray(first.obs), jnp.asarray(first.next_obs), first)
    np.testing.assert_allclose(dist.log_prob(first.action), first.extra, atol=1e-5)  # the behaviour log-probs
    np.testing.assert_allclose(dist.logits, jax.nn.log_softmax(raw), atol=1e-5)
    np.testing.assert_allclose(rerun_values, values, atol=1e-5)
    going_on = ~done[:-1]
    np.testing.assert_allclose(np.asarray(next_values)[:-1][going_on], np.asarray(values)[1:][going_on], atol=1e-5)


def test_ppo_minibatches_take_whole_environments():
    t, n, m = 5, 6, 3
    ids = jnp.broadcast_to(jnp.arange(n)[None], (t, n))
    batch = {"env": ids, "time": jnp.broadcast_to(jnp.arange(t)[:, None], (t, n)), "carry": jnp.ones((t, n, 2)) * ids[..., None]}
    out = env_minibatches(batch, jax.random.PRNGKey(0), m)
    assert out["env"].shape == (m, t, n // m) and out["carry"].shape == (m, t, n // m, 2)
    env = np.asarray(out["env"])
    assert np.all(env == env[:, :1])  # each column one environment at every step, in time order
    assert np.all(np.asarray(out["time"]) == np.arange(t)[None, :, None])
    assert sorted(env[:, 0].reshape(-1)) == list(range(n))
    np.testing.assert_array_equal(np.asarray(out["carry"])[..., 0], env)


def test_refusals_are_one_line():
    env = make_env(ENV)
    with pytest.raises(ConfigError, match="memory"):
        ppo.Config(memory="rnn").validate(env)
    with pytest.raises(ConfigError, match="memory_size"):
        ppo.Config(memory="gru", memory_size=0).validate(env)
    with pytest.raises(ConfigError, match="sparse"):
        ppo.Config(memory="lstm", sparse="set", sparsity=0.5).validate(env)
    with pytest.raises(ConfigError, match="num_minibatches.*whole environments"):
        ppo.Config(memory="lstm", num_envs=6, num_minibatches=4, num_steps=8).validate(env)
    ppo.Config(memory="lstm", num_envs=8, num_minibatches=4, num_steps=8).validate(env)


def test_recurrent_policy_refuses_single_observation_acting():
    env = make_env(ENV)
    algo = ppo_train.make_algorithm(ppo.Config(memory="gru", memory_size=4, num_envs=4, num_steps=8,
                                               total_timesteps=64), env)
    assert isinstance(algo.act, RecurrentAct) and isinstance(algo.sample, RecurrentAct)
    with pytest.raises(ConfigError, match="memory.*recurrent"):
        algo.act(None, jnp.zeros(env.observation_shape), jax.random.PRNGKey(0))


# The smallest budget that separates them with margin on every seed (benchmarks/history.md, "Recurrent policies").
MEMORY_TASK = ("num_envs=8", "num_steps=16", "hidden=32", "memory_size=32")


@pytest.mark.parametrize("algo", ["ppo", "impala"])
def test_memory_beats_feed_forward_on_memory_chain(tmp_path, algo):
    """The context is shown only at an episode's first steps and asked at its end: a feed-forward policy scores
    0 in expectation (±1 at random); a recurrent one must remember the bit."""
    steps = 12_000
    # IMPALA with Adam, with which this budget was measured: 93 updates are too few for its default RMSProp,
    # whose mean square starts at 1 as TF1's (the first steps are lr x g; benchmarks/history.md, 2026-11-28 night)
    task = MEMORY_TASK + (("optimizer=adam",) if algo == "impala" else ())
    feed_forward = train_as_users_do(tmp_path / "ff", algo, ENV, steps=steps, sets=task)
    recurrent = train_as_users_do(tmp_path / "lstm", algo, ENV, steps=steps, sets=task + ("memory=lstm",))
    ff_train, rec_train = late_training_return(tmp_path / "ff", steps), late_training_return(tmp_path / "lstm", steps)
    print(f"training returns, last quarter: feed-forward {ff_train}, lstm {rec_train}; evaluation: feed-forward "
          f"{feed_forward['final_return_per_seed']}, lstm {recurrent['final_return_per_seed']}")
    assert all(r >= 0.9 for r in recurrent["final_return_per_seed"])
    assert all(r > f + 0.5 for r, f in zip(rec_train, ff_train))


def late_training_return(out, steps):
    """Each seed's mean return of the training episodes that finished in the run's last quarter (metrics.csv):
    some hundred episodes, so a feed-forward policy's chance score stays near 0 (10 evaluation episodes of a
    coin flip do not)."""
    import csv

    with (out / "metrics.csv").open(newline="") as f:
        rows = [row for row in csv.DictReader(f) if int(row["env_step"]) > 0.75 * steps and float(row["episodes"]) > 0]
    seeds = sorted({int(row["seed"]) for row in rows})
    total = {s: sum(float(r["episode_return"]) * float(r["episodes"]) for r in rows if int(r["seed"]) == s) for s in seeds}
    count = {s: sum(float(r["episodes"]) for r in rows if int(r["seed"]) == s) for s in seeds}
    return [total[s] / count[s] for s in seeds]


def test_a_recurrent_run_evaluates_exports_and_refuses_single_observations(tmp_path, capsys):
    import json

    import sparqrl
    from conftest import run_cli

    run = tmp_path / "run"
    sets = ("memory=gru", "memory_size=4", "num_envs=4", "num_steps=16", "hidden=8")
    code, _, err = run_cli(capsys, "train", "ppo", "--env", ENV, "--steps", "256", "--out", str(run), "--no-progress",
                           "--no-energy", *[w for item in sets for w in ("--set", item)])
    assert code == 0, err
    code, out, err = run_cli(capsys, "eval", str(run), "--episodes", "3")
    assert code == 0, err
    code, out, err = run_cli(capsys, "export", str(run), "--out", str(tmp_path / "policy.onnx"))
    assert code == 0, err
    report = json.loads(out)
    assert set(report["inputs"]) == {"obs", "state_h"} and set(report["outputs"]) == {"action", "next_state_h"}
    assert report["check_fp32"]["steps"] > 1 and report["check_fp32"]["agreement"] == 1.0
    with pytest.raises(ConfigError, match="memory.*recurrent"):
        sparqrl.load(run).act(np.zeros(3, np.float32))

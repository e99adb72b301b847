"""DQN's n-step target (`nstep`): against a NumPy loop on a hand-made replay (episode ends inside windows,
truncation, fragment ends, Double DQN; uniform and prioritized windows), short runs on device and on the
actor-learner runner (whose fragments no window joins), and the one-line refusals of what it does not support."""

from __future__ import annotations

import csv
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import run_cli
from sparqrl.algos import dqn
from sparqrl.algos.base import Step, make_train_fn
from sparqrl.algos.dqn import train as dqn_train
from sparqrl.config import ConfigError
from sparqrl.envs import Discrete, make_env
from sparqrl.envs.gym_env import HostSpec, host_spec
from sparqrl.nets.modules import QNetwork
from sparqrl.runners import sebulba

GAMMA, T, N, SLOTS, NSTEP = 0.9, 9, 3, 6, 3


def _hand_made_steps():
    """T env steps of N envs: obs[t, e] = (t, e, noise...) names its step; a termination, two truncations and
    a step both terminated and truncated (which counts as terminated) lie where windows reach them."""
    rng = np.random.default_rng(0)
    obs = np.concatenate([np.stack(np.meshgrid(np.arange(T), np.arange(N), indexing="ij"), -1),
                          rng.normal(size=(T, N, 2))], -1).astype(np.float32)
    terminated, truncated = np.zeros((T, N), bool), np.zeros((T, N), bool)
    terminated[4, 0] = truncated[7, 0] = truncated[5, 1] = True
    terminated[6, 2] = truncated[6, 2] = True
    return dict(obs=obs, action=rng.integers(0, 2, size=(T, N)).astype(np.int32),
                reward=rng.normal(size=(T, N)).astype(np.float32),
                next_obs=rng.normal(size=(T, N, 4)).astype(np.float32), terminated=terminated, truncated=truncated)


def _np_nstep_target(steps, t0, e, q_target, q_online, double, ends=()):
    """y = Σ_k γ^k r_k up to the window's end or its first episode end; a termination does not bootstrap, a
    truncation, a fragment's end (`ends`: its last steps) or the window's end bootstraps from that step's next_obs
    with γ^(k+1). q_target / q_online [T, N, A]: the networks' values of every step's next_obs."""
    y, discount = 0.0, 1.0
    for k in range(NSTEP):
        t = t0 + k
        y += discount * steps["reward"][t, e]
        discount *= GAMMA
        if steps["terminated"][t, e]:
            return y
        if steps["truncated"][t, e] or t in ends or k == NSTEP - 1:
            values = q_target[t, e]
            chooser = q_online[t, e] if double else values
            return y + discount * values[int(np.argmax(chooser))]
    raise AssertionError("unreachable")


def _config(**changes):
    """The hand-made replay's config, resolved for the device runner as `make_algorithm` resolves it."""
    return dqn.Config(num_envs=N, buffer_size=SLOTS * N, batch_size=256, nstep=NSTEP, gamma=GAMMA,
                      hidden=(16,), **changes).for_runner(on_device=True)


@pytest.mark.parametrize("prioritized, ends", [(False, ()), (False, (5, 8)), (True, ()), (True, (5, 8))])
def test_nstep_target_matches_numpy_on_a_hand_made_replay(prioritized, ends):
    """Stored row by row as on device (ends ()), or as the actor-learner runner stores two fragments, steps 0-5
    and 6-8, each with its last step marked (`sebulba.end_fragment`); drawn uniformly or by priority."""
    steps = _hand_made_steps()
    priority = np.random.default_rng(1).uniform(0.5, 2.0, size=(T, N)).astype(np.float32)
    fragments = [Step(**steps, extra=None, priority=priority)]
    if ends:
        bounds = [0, *[t + 1 for t in ends]]
        fragments = [sebulba.end_fragment(jax.tree.map(lambda x: x[a:b], fragments[0]))
                     for a, b in zip(bounds, bounds[1:])]
    config = _config(prioritized=prioritized)
    buffer = dqn_train._init_replay(config, dqn_train._example_transition((4,)), config.buffer_size)
    for fragment in fragments:  # T > SLOTS rows: the ring has overwritten its oldest three
        for t in range(fragment.reward.shape[0]):
            buffer = dqn_train._store(config, False, buffer, jax.tree.map(lambda x: jnp.asarray(x[t]), fragment))
    drawn = dqn_train._draw_windows(config, buffer, jax.random.key(3), jnp.int32(1))
    t0 = np.asarray(drawn.batch.obs[:, 0]).astype(int)
    env = np.asarray(drawn.batch.obs[:, 1]).astype(int)
    # Windows start at every step whose window lies in the ring (steps 3..8), never past the newest.
    assert set(t0) == {3, 4, 5, 6} and set(env) == {0, 1, 2}
    np.testing.assert_array_equal(np.asarray(drawn.batch.action), steps["action"][t0, env])
    if prioritized:  # P ∝ (p + ε)^α of the window's start, over the windows that can be drawn
        w = (priority + config.priority_epsilon) ** config.priority_exponent
        probs = w[t0, env] / w[3:7].sum()
        is_weights = (len(w[3:7].ravel()) * probs) ** -config.importance_exponent
        np.testing.assert_allclose(np.asarray(drawn.weights), is_weights / is_weights.max(), rtol=1e-4)
        np.testing.assert_array_equal(np.asarray(drawn.slots), t0 % SLOTS * N + env)
    else:
        assert drawn.weights is None and drawn.slots is None

    network = QNetwork(2, (4,), (16,), "relu")
    params = network.init(jax.random.key(0), jnp.zeros(4))
    target_params = network.init(jax.random.key(1), jnp.zeros(4))

    q_target, q_online = (np.asarray(network.apply(p, steps["next_obs"])) for p in (target_params, params))
    targets = {}
    for double in (False, True):
        cfg = dataclasses.replace(config, double_dqn=double)
        got = np.asarray(jax.jit(lambda b: dqn_train.td_target(cfg, network, params, target_params, b))(drawn.batch))
        want = np.array([_np_nstep_target(steps, t, e, q_target, q_online, double, ends)
                         for t, e in zip(t0, env)], np.float32)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"double={double}")
        targets[double] = got
    assert np.any(targets[True] != targets[False])  # Double DQN's online network picks other actions somewhere


@pytest.mark.parametrize("prioritized", [False, True])
def test_nstep_runs_on_device_with_windows_of_every_env(prioritized):
    """A short run: the replay's slots are rows of N envs' steps with `truncated` kept (prioritized: with a weight
    per (slot, env)), it reports transitions, and gradient steps follow the same env-step schedule as one-step
    DQN (learning waits for n rows)."""
    cartpole = make_env("CartPole-v1")
    config = dqn.Config(total_timesteps=1_200, num_envs=4, buffer_size=500, batch_size=16, learning_starts=8,
                        train_interval=3, target_update_interval=100, hidden=(32, 32), nstep=3, prioritized=prioritized)
    assert config.learning_start_step == 16  # batch_size, above nstep·num_envs (12)
    assert dataclasses.replace(config, batch_size=4).learning_start_step == 12  # a window of every env
    state, metrics = jax.jit(make_train_fn(dqn.make_algorithm(config, cartpole)))(jax.random.key(0))
    buffer = state.learner.buffer
    storage = buffer.buffer.storage if prioritized else buffer.storage
    assert storage.obs.shape == (125, 4, 4) and storage.truncated.shape == (125, 4)
    if prioritized:  # a weight per (slot, env): the full ring has one for every window start
        assert buffer.weights.shape == (500,) and np.all(np.asarray(buffer.weights) > 0)
        assert 0 < float(np.min(metrics["is_weight_min"])) < 1
    assert int(state.learner.gradient_steps) == config.num_gradient_steps
    np.testing.assert_array_equal(np.asarray(metrics["buffer_size"])[[0, -1]], [4, 500])
    loss = np.asarray(metrics["loss"])
    assert np.all(loss[:3] == 0.0) and np.all(np.isfinite(loss)) and np.all(loss[4:] > 0.0)


@pytest.mark.parametrize("changes,pattern", [
    ({"nstep": 0}, r"nstep=0 .*> 0"),
    ({"nstep": 2.5}, r"nstep=2.5 .*integer"),
    ({"nstep": 4, "buffer_size": 30, "batch_size": 16}, r"nstep=4 .*buffer_size // num_envs \(3\)"),
    ({"nstep": 4, "total_timesteps": 30}, r"nstep=4 .*total_timesteps // num_envs \(3\)"),
    ({"nstep_delay_fraction": 1.5}, r"nstep_delay_fraction=1.5 .*\[0, 1\]"),
    ({"nstep_delay_fraction": -0.1}, r"nstep_delay_fraction=-0.1 .*\[0, 1\]"),
    ({"nstep_delay_fraction": "soon"}, r"nstep_delay_fraction='?soon'? .*a number"),
    ({"sparse": "rlx2", "sparsity": 0.8, "buffer_size": 20, "batch_size": 16},
     r"nstep=3 .*buffer_size // num_envs \(2\)"),  # rlx2's n = 3, checked once resolved
])
def test_bad_nstep_is_refused_before_tracing(changes, pattern):
    config = dataclasses.replace(dqn.Config(), **changes)
    with pytest.raises(ConfigError, match=pattern):
        dqn.make_algorithm(config, make_env("CartPole-v1"))


@pytest.mark.parametrize("env,sets", [
    ("CartPole-v1", ["nstep=0"]),
    ("CartPole-v1", ["nstep=400"]),  # above total_timesteps // num_envs (200)
    ("gym:CartPole-v1", ["nstep=0"]),  # the actor-learner runner checks it too
    ("CartPole-v1", ["nstep_delay_fraction=2"]),
])
def test_bad_nstep_is_one_line_and_exit_2(capsys, tmp_path, env, sets):
    sets = [arg for s in sets for arg in ("--set", s)]
    code, _, err = run_cli(capsys, "train", "dqn", "--env", env, "--steps", "2000", *sets, "--no-progress",
                           "--no-energy", "--out", str(tmp_path / "run"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and sets[1].split("=")[0] + "=" in err, err


def test_nstep_is_refused_with_atari_stacked_frames():
    breakout = HostSpec("gym:ALE/Breakout-v5", (84, 84, 4), Discrete(4), 100)
    with pytest.raises(ConfigError, match=r"nstep=3 .*stacked frames"):
        dqn.make_actor_learner(dqn.Config(nstep=3), breakout)


def _fragments(count, t, n, seed):
    """`count` fragments [t, n] as different actors would send them: obs and next_obs (fragment, step, env, 0 / 1)
    name where they come from; one time limit inside each fragment, random actor priorities."""
    rng = np.random.default_rng(seed)
    index = np.stack(np.meshgrid(np.arange(t), np.arange(n), indexing="ij"), -1).astype(np.float32)
    truncated = np.zeros((t, n), bool)
    truncated[1, 0] = True
    return [Step(obs=np.concatenate([np.full((t, n, 1), f, np.float32), index, np.zeros((t, n, 1), np.float32)], -1),
                 action=rng.integers(0, 2, size=(t, n)).astype(np.int32), reward=np.ones((t, n), np.float32),
                 next_obs=np.concatenate([np.full((t, n, 1), f, np.float32), index, np.ones((t, n, 1), np.float32)], -1),
                 terminated=np.zeros((t, n), bool), truncated=truncated, extra=np.zeros((t, n), np.float32),
                 priority=rng.uniform(0.1, 2.0, size=(t, n)).astype(np.float32))
            for f in range(count)]


@pytest.mark.parametrize("prioritized", [False, True])
def test_host_runner_windows_never_join_two_fragments(prioritized):
    """The actor-learner runner stores fragments in arrival order (here three, as from different actors): it marks
    each one's last step truncated (`sebulba._learn_fragment`: DQN `joins_fragments` with nstep > 1), so every
    window bootstraps from an observation of the fragment it starts in; the learner fed the same fragments
    directly (as on device, where consecutive fragments are the same envs' steps) has windows that cross."""
    config = dqn.Config(num_envs=2, nstep=3, total_timesteps=1_000, buffer_size=100, batch_size=64,
                        learning_starts=500, hidden=(16,), prioritized=prioritized)
    al = dqn.make_actor_learner(config, host_spec("gym:CartPole-v1"))
    assert al.joins_fragments and not dqn.make_actor_learner(dataclasses.replace(config, nstep=1),
                                                             host_spec("gym:CartPole-v1")).joins_fragments
    t, n = 4, 2
    fragments = _fragments(3, t, n, seed=0)
    learn = jax.jit(sebulba._learn_fragment(al))
    seeds = jax.vmap(al.init)(jax.random.split(jax.random.key(0), 1))
    learn_direct = jax.jit(al.learn)
    direct = al.init(jax.random.key(0))
    for fragment in fragments:
        seeds, _ = learn(seeds, jax.tree.map(lambda x: x[:, None], fragment))  # [T, S=1, N]
        direct, _ = learn_direct(direct, fragment)
    buffer = jax.tree.map(lambda x: x[0], seeds.buffer)
    rows = buffer.buffer if prioritized else buffer
    stored = np.asarray(rows.storage.truncated)[:3 * t].reshape(3, t, n)
    expected = np.stack([f.truncated for f in fragments])
    expected[:, -1] = True
    np.testing.assert_array_equal(stored, expected)
    if prioritized:  # the actors' priorities, one per (row, env): the window starting there
        want = (np.concatenate([f.priority for f in fragments]).reshape(-1) + config.priority_epsilon) ** 0.6  # α
        np.testing.assert_allclose(np.asarray(buffer.weights)[:3 * t * n], want, rtol=1e-5)

    resolved = config.for_runner(on_device=False)
    for replay_buffer, joined in ((buffer, False), (direct.buffer, True)):
        draws = [dqn_train._draw_windows(resolved, replay_buffer, jax.random.key(k), jnp.int32(1)) for k in range(4)]
        start = np.concatenate([np.asarray(d.batch.obs) for d in draws])  # s_0: (fragment, step, env, 0)
        boot = np.concatenate([np.asarray(d.batch.next_obs) for d in draws])  # s'_m: (fragment, step, env, 1)
        assert np.any(start[:, 0] != boot[:, 0]) == joined
        if not joined:  # a window starting at a fragment's last step bootstraps from that step
            last = start[:, 1] == t - 1
            assert last.any() and np.all(boot[last, 1] == t - 1)


def test_nstep_trains_on_the_actor_learner_runner(capsys, tmp_path):
    """`sparqrl train dqn --env gym:... --set nstep=3` with two actors' fragments in one replay, prioritized."""
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "dqn", "--env", "gym:CartPole-v1", "--steps", "2000", "--actors", "2",
                           "--backend", "inline", "--set", "nstep=3", "--set", "learning_starts=200", "--set",
                           "batch_size=32", "--set", "hidden=32,32", "--eval-episodes", "1", "--no-progress",
                           "--no-energy", "--out", str(out))
    assert code == 0, err
    assert json.loads((out / "config.json").read_text())["config"]["nstep"] == 3
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert float(rows[-1]["loss"]) > 0 and 0 < float(rows[-1]["is_weight_min"]) < 1


# ---- RLx2's delayed multi-step target (sparse=rlx2) ----------------------------------------------------------------


def test_nstep_resolves_by_runner_method_and_stacked_frames():
    """None: 3 with RLx2's delay (0.1 of the gradient steps) for sparse=rlx2; otherwise 3 without a delay, on device
    (the device default, with lr 5e-4 annealed and a 100,000 replay) and on the actor-learner runner (Ape-X's); 1
    with Atari's stacked frames, where an unset nstep is no error; values set are kept."""
    device = dqn.Config().for_runner(on_device=True)
    assert (device.nstep, device.nstep_delay_fraction) == (3, 0.0)
    host = dqn.Config().for_runner(on_device=False)
    assert (host.nstep, host.nstep_delay_fraction) == (3, 0.0)
    assert dqn.Config().for_runner(on_device=False, stacked=True).nstep == 1
    assert dqn.Config(nstep=1).for_runner(on_device=False).nstep == 1
    assert dqn.make_actor_learner(dqn.Config(), host_spec("gym:CartPole-v1")).joins_fragments  # n = 3 windows
    rlx2 = dqn.Config(sparse="rlx2", sparsity=0.8)
    for on_device in (True, False):
        resolved = rlx2.for_runner(on_device)
        assert (resolved.nstep, resolved.nstep_delay_fraction) == (3, 0.1)
        assert resolved.nstep_delay == int(0.1 * resolved.num_gradient_steps) > 0
    assert rlx2.for_runner(False, stacked=True).nstep == 1
    assert dataclasses.replace(rlx2, nstep=5, nstep_delay_fraction=0.5).for_runner(True).nstep_delay_fraction == 0.5
    assert dataclasses.replace(rlx2, nstep=5).for_runner(True).nstep == 5
    dense = dqn.Config(nstep=3).for_runner(True)
    assert (dense.nstep, dense.nstep_delay_fraction, dense.nstep_delay) == (3, 0.0, 0)
    breakout = HostSpec("gym:ALE/Breakout-v5", (84, 84, 4), Discrete(4), 100)
    assert not dqn.make_actor_learner(dqn.Config(sparse="rlx2", sparsity=0.8), breakout).joins_fragments


@pytest.mark.parametrize("prioritized", [False, True])
def test_delayed_target_is_one_step_until_the_delay(prioritized):
    """Gradient steps 1 .. d − 1 (1-based, as RLx2's code and td3/sac count) regress on the one-step target
    r_0 + γ(1 − terminated_0)·Q'(s'_0), step d on the n-step one: the same windows and terms as without a delay
    (to float rounding: a traced horizon fuses otherwise)."""
    steps = _hand_made_steps()
    priority = np.random.default_rng(1).uniform(0.5, 2.0, size=(T, N)).astype(np.float32)
    config = _config(prioritized=prioritized, nstep_delay_fraction=0.5, total_timesteps=3_000, learning_starts=0,
                     train_interval=N)
    delay = config.nstep_delay
    assert delay == 457  # half of the 1000 − 85 gradient steps (one per update once 256 env steps are stored)
    undelayed = dataclasses.replace(config, nstep_delay_fraction=0.0)
    buffer = dqn_train._init_replay(config, dqn_train._example_transition((4,)), config.buffer_size)
    step = Step(**steps, extra=None, priority=priority)
    for t in range(T):
        buffer = dqn_train._store(config, False, buffer, jax.tree.map(lambda x: jnp.asarray(x[t]), step))
    key = jax.random.key(3)
    draw = jax.jit(dqn_train._draw_windows, static_argnums=0)
    before, at = draw(config, buffer, key, jnp.int32(delay - 1)), draw(config, buffer, key, jnp.int32(delay))
    assert int(before.batch.n_active) == 1 and int(at.batch.n_active) == NSTEP
    t0 = np.asarray(before.batch.obs[:, 0]).astype(int)
    env = np.asarray(before.batch.obs[:, 1]).astype(int)
    np.testing.assert_allclose(np.asarray(before.batch.terms.reward_sum), steps["reward"][t0, env], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(before.batch.terms.boot_index), 0)
    np.testing.assert_allclose(np.asarray(before.batch.terms.boot_discount),
                               GAMMA * (1.0 - steps["terminated"][t0, env]), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(before.batch.next_obs), steps["next_obs"][t0, env])
    want = draw(undelayed, buffer, key, jnp.int32(1))
    for got, expected in zip(jax.tree.leaves(at.batch.terms) + [at.batch.obs, at.batch.next_obs],
                             jax.tree.leaves(want.batch.terms) + [want.batch.obs, want.batch.next_obs]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-6, atol=1e-6)  # rounding only
    assert np.any(np.asarray(at.batch.terms.boot_index) > 0)  # the n-step windows reach past their first step


def test_rlx2_logs_the_horizon_switching_at_the_delay():
    """A short sparse=rlx2 run on device, one gradient step per update: "nstep" is 0 before learning, 1 for
    gradient steps 1 .. d − 1, 3 from step d on; the Q-network keeps its sparsity."""
    config = dqn.Config(total_timesteps=1_200, num_envs=4, buffer_size=400, batch_size=16, learning_starts=0,
                        train_interval=4, target_update_interval=100, hidden=(32, 32), sparse="rlx2", sparsity=0.8)
    delay = config.for_runner(True).nstep_delay
    assert delay == 29  # 0.1 of 297 gradient steps (updates 3 .. 299: learning waits for n rows of 4 envs)
    _, metrics = jax.jit(make_train_fn(dqn.make_algorithm(config, make_env("CartPole-v1"))))(jax.random.key(0))
    grad = np.asarray(metrics["gradient_steps"])
    horizon = np.asarray(metrics["nstep"])
    taken = np.cumsum(grad)
    np.testing.assert_array_equal(horizon[grad == 0], 0.0)
    np.testing.assert_array_equal(horizon[(grad == 1) & (taken < delay)], 1.0)
    np.testing.assert_array_equal(horizon[(grad == 1) & (taken >= delay)], 3.0)
    assert np.sum(horizon == 1.0) == delay - 1


# ---- run folders of an older sparqrl --------------------------------------------------------------------------------


def _stop_at(chunk):
    def hook(done, metrics):
        if done == chunk:
            raise KeyboardInterrupt

    return hook


def test_a_folder_from_before_per_runner_values_resumes_with_the_one_step_target(tmp_path):
    """A folder written before config.json recorded the per-runner values says `"nstep": null` (and prioritized
    null, exploration "auto", nstep_delay_fraction null): its device run used n = 1, where an unset nstep now
    means 3. Resumed, it goes on with n = 1 and ends as the same run uninterrupted."""
    from sparqrl.runners import RunConfig, RunInterrupted, resume, train
    from sparqrl.runners.rundir import open_run_dir

    config = dqn.Config(total_timesteps=3000, learning_starts=500, lr=2.5e-4, anneal_lr=False, buffer_size=1000,
                        batch_size=32, epsilon_anneal_time=2000, target_update_interval=100, nstep=1)

    def run(name, **kw):
        return RunConfig(env="CartPole-v1", seeds=2, out=str(tmp_path / name), chunks=4, checkpoint_every=1,
                         checkpoint_interval_s=0.0, eval_episodes=3, progress=False, energy=False, **kw)

    whole = train("dqn", config, run("whole"))
    with pytest.raises(RunInterrupted):
        train("dqn", config, run("old"), on_chunk=_stop_at(2))
    saved = json.loads((tmp_path / "old" / "config.json").read_text())
    assert saved["config"]["nstep"] == 1  # today's folders record the value used
    saved["config"].update(nstep=None, prioritized=None, exploration="auto", nstep_delay_fraction=None)
    (tmp_path / "old" / "config.json").write_text(json.dumps(saved))
    assert open_run_dir(tmp_path / "old")[2].nstep == 1
    assert dqn.Config(nstep=None).as_saved_run("gym:CartPole-v1").nstep is None  # (the host runner: 3, then and now)
    resumed = resume(tmp_path / "old")
    assert resumed["final_return_per_seed"] == whole["final_return_per_seed"]

    def rows(name):  # every metric of every chunk and seed (the losses too), wall time left out
        return [{k: v for k, v in row.items() if k != "wall_time_s"}
                for row in csv.DictReader((tmp_path / name / "metrics.csv").open())]

    assert rows("old") == rows("whole")

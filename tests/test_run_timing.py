"""Where a run's time goes (summary.json's `time_s`) and checkpoints written in the background (issue 33, item 5)."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

from sparqrl.algos import ppo
from sparqrl.runners import RunConfig, train
from sparqrl.runners.checkpoint import Checkpointer
from sparqrl.telemetry.timing import TimeSplit, process_age_s


def test_a_part_leaves_out_what_was_compiled_inside_it():
    compiled = {"s": 0.0}
    times = TimeSplit(lambda: compiled["s"])
    with times.part("evaluation"):
        time.sleep(0.2)
        compiled["s"] += 0.15  # 0.15 s of the part compiled (the evaluation program, at the first evaluation)
    with times.part("training"):
        time.sleep(0.02)
    got = times.seconds()
    assert got["compile"] == 0.15 and 0.04 <= got["evaluation"] < 0.15 and 0.01 <= got["training"] < 0.5
    assert got["checkpoints"] == 0.0
    parts = sum(got[k] for k in ("startup", "compile", "training", "evaluation", "checkpoints", "rest"))
    assert parts == pytest.approx(got["total"], abs=0.01)


def test_the_process_age_grows_with_the_clock():
    first = process_age_s()
    time.sleep(0.05)
    second = process_age_s()
    assert first is not None and first > 0 and 0.0 <= second - first < 1.0


def test_an_asynchronous_save_is_waited_for_only_by_the_next_save(tmp_path, monkeypatch):
    """The run goes on while orbax writes (here: held inside its final rename until released); the next save,
    `wait` or `close` waits for the write first."""
    import threading

    from orbax.checkpoint._src.path import atomicity

    release, finalizing = threading.Event(), threading.Event()
    for cls in (atomicity.AtomicRenameTemporaryPath, atomicity.CommitFileTemporaryPath):
        async def held(self, *a, _original=cls.finalize, **k):
            finalizing.set()
            release.wait(timeout=60)
            return await _original(self, *a, **k)
        monkeypatch.setattr(cls, "finalize", held)
    checkpointer = Checkpointer(tmp_path / "checkpoint", asynchronous=True)
    state = {"w": np.arange(6, dtype=np.float32)}
    try:
        start = time.perf_counter()
        checkpointer.save(1, state, {"chunks_done": 1})
        assert time.perf_counter() - start < 30 and not (tmp_path / "checkpoint" / "1").exists()  # not written yet
        assert finalizing.wait(timeout=60)
        release.set()
        assert checkpointer.wait() == 1 and (tmp_path / "checkpoint" / "1").is_dir()
        assert checkpointer.wait() is None
        checkpointer.save(2, {"w": state["w"] + 1}, {"chunks_done": 2})
    finally:
        release.set()
        checkpointer.close()  # waits for step 2
    reader = Checkpointer(tmp_path / "checkpoint", read_only=True)
    try:
        import jax

        assert reader.steps() == [2, 1]
        restored = reader.restore_intact({"w": jax.ShapeDtypeStruct((6,), np.float32)})
        assert restored.step == 2 and np.array_equal(np.asarray(restored.state["w"]), state["w"] + 1)
    finally:
        reader.close()


def test_the_summary_says_where_the_time_went(tmp_path):
    run = RunConfig(env="CartPole-v1", seeds=2, out=str(tmp_path / "run"), chunks=4, checkpoint_every=1,
                    checkpoint_interval_s=0.0, eval_every=2, eval_episodes=2, progress=False, energy=False)
    summary = train("ppo", ppo.Config(total_timesteps=4 * 512), run)
    times = summary["time_s"]
    assert set(times) == {"startup", "compile", "training", "evaluation", "checkpoints", "rest", "total"}
    assert all(times[k] > 0 for k in ("startup", "compile", "training", "evaluation", "checkpoints"))
    assert times["compile"] == pytest.approx(summary["compile_time_s"], abs=0.01)
    parts = sum(times[k] for k in ("startup", "compile", "training", "evaluation", "checkpoints", "rest"))
    assert parts == pytest.approx(times["total"], abs=0.01) and times["rest"] > -0.01
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["time_s"] == times
    steps = sorted(int(p.name) for p in (tmp_path / "run" / "checkpoint").iterdir() if p.name.isdigit())
    assert steps == [3, 4]  # every chunk saved, the last written before summary.json: max_to_keep 2


def test_the_init_and_evaluation_programs_compile_beside_the_chunk_program(tmp_path, monkeypatch):
    """`AnakinDriver.build` traces the chunk program first (on the state's shapes) and, once it is lowered, before it
    compiles, starts a thread that builds the init program and then the evaluation program (issue 33: the init's
    build, before the chunk's, delayed training on the 2-core CPU); training starts from that init program and the
    first evaluation uses that evaluation program."""
    import threading

    from sparqrl.runners.anakin import AnakinDriver

    built_on, started_with_chunk = {}, []
    init, evaluation, start = (AnakinDriver._init_then_evaluation, AnakinDriver._evaluation_program,
                               AnakinDriver._start_side_builds)

    def recorded(name, original):
        def build(self):
            built_on[name] = threading.current_thread().name
            return original(self)
        return build

    def starting(self):  # (first called on the main thread, between the chunk's lowering and its compile)
        started_with_chunk.append(hasattr(self, "_chunk"))
        start(self)

    monkeypatch.setattr(AnakinDriver, "_init_then_evaluation", recorded("init", init))
    monkeypatch.setattr(AnakinDriver, "_evaluation_program", recorded("evaluate", evaluation))
    monkeypatch.setattr(AnakinDriver, "_start_side_builds", starting)
    run = RunConfig(env="CartPole-v1", out=str(tmp_path / "run"), chunks=2, eval_episodes=2, progress=False,
                    energy=False)
    summary = train("ppo", ppo.Config(total_timesteps=2 * 512), run)
    assert started_with_chunk[0] is False
    assert built_on == {"init": "sparqrl-init-compile", "evaluate": "sparqrl-eval-compile"}
    assert summary["final_return_mean"] > 0


def test_tensorboard_events_reach_the_file_at_each_chunk_and_are_synced_once(tmp_path, monkeypatch):
    """Each chunk's event is handed to the OS at once (a reader sees it before `close`); the file is synced to
    disk once, at `close`, not at every chunk (an fsync per chunk: 0.3 s of 50 chunks on the loaded CPU)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from sparqrl.telemetry.logger import TensorBoardWriter

    def points() -> list[float]:
        events = EventAccumulator(str(tmp_path / "tb"))
        events.Reload()
        return [e.value for e in events.Scalars("train/loss")]

    syncs, fsync = [], os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (syncs.append(fd), fsync(fd))[1])
    writer = TensorBoardWriter(tmp_path / "tb")
    for step in range(5):
        writer.scalars(step, {"train/loss": float(step)})
        assert points() == [float(s) for s in range(step + 1)]
    assert syncs == []
    writer.close()
    assert len(syncs) == 1 and points() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_an_evaluation_stops_when_its_longest_episode_ends_with_the_same_returns():
    """`base.evaluate` steps until every episode has ended (issue 33, item 5): the returns equal those of running
    all `max_episode_steps` steps with the same keys (a reference written here), seeds vmapped, under jit."""
    import jax
    import jax.numpy as jnp

    from sparqrl.algos import base
    from sparqrl.envs import make_env

    env = make_env("CartPole-v1")
    algo = ppo.make_algorithm(ppo.Config(), env)

    def every_step(params, key, episodes):
        reset_key, step_key = jax.random.split(key)
        obs, state = jax.vmap(env.reset)(jax.random.split(reset_key, episodes))

        def step(carry, key):
            obs, state, total, alive = carry
            act_keys = jax.random.split(key, episodes + 1)
            action = jax.vmap(algo.act, in_axes=(None, 0, 0))(params, obs, act_keys[1:])
            out = jax.vmap(env.step)(jax.random.split(act_keys[0], episodes), state, action)
            total = total + jnp.where(alive, out.reward, 0.0)
            return (out.obs, out.state, total, alive & ~(out.terminated | out.truncated)), None

        init = (obs, state, jnp.zeros(episodes), jnp.ones(episodes, bool))
        (_, _, total, _), _ = jax.lax.scan(step, init, jax.random.split(step_key, env.max_episode_steps))
        return total

    keys = jax.random.split(jax.random.PRNGKey(3), 2)
    params = jax.vmap(lambda k: algo.policy(algo.init(k)))(keys)  # untrained: short episodes
    ours = jax.jit(jax.vmap(lambda p, k: base.evaluate(env, algo.act, p, k, 6)))(params, keys)
    reference = jax.jit(jax.vmap(lambda p, k: every_step(p, k, 6)))(params, keys)
    assert np.asarray(ours).max() < env.max_episode_steps  # the loop stopped early
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(reference))

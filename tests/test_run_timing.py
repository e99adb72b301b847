"""Where a run's time goes (summary.json's `time_s`) and checkpoints written in the background (issue 33, item 5)."""

from __future__ import annotations

import json
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

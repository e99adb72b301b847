"""Frames stored once (sparqrl.replay.frames): every observation and next observation rebuilt exactly from the
ring, the frames a fragment writes counted, overwritten frames detected; and the stacking it relies on holds
for Atari's preprocessing."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from sparqrl.replay import frames

K, H, W = 4, 3, 2


def _streams(rng: np.random.Generator, n: int, steps: int, end_prob: float):
    """n environments of a frame-stacking env (K frames; a fresh stack repeats its first frame K times, as
    FrameStackObservation pads): obs, next_obs [steps, n, H, W, K] uint8, done [steps, n]."""
    obs = np.zeros((steps, n, H, W, K), np.uint8)
    next_obs = np.zeros_like(obs)
    done = rng.random((steps, n)) < end_prob
    for e in range(n):
        stack = np.repeat(rng.integers(0, 256, (H, W, 1), dtype=np.uint8), K, axis=-1)
        for t in range(steps):
            obs[t, e] = stack
            stack = np.concatenate([stack[..., 1:], rng.integers(0, 256, (H, W, 1), dtype=np.uint8)], axis=-1)
            next_obs[t, e] = stack
            if done[t, e]:
                stack = np.repeat(rng.integers(0, 256, (H, W, 1), dtype=np.uint8), K, axis=-1)
    return obs, next_obs, done


@pytest.mark.parametrize("T", [1, 2, 7])
def test_fragments_rebuild_every_observation_and_write_each_frame_once(T):
    rng = np.random.default_rng(T)
    N, fragments = 3, 4
    ring = frames.init(10_000, (H, W))
    add = jax.jit(frames.add_fragment)
    kept = []
    for f in range(fragments):  # two "actors" whose fragments interleave, each its own environments
        obs, next_obs, done = _streams(rng, N, T, end_prob=0.3)
        before = int(ring.written)
        ring, refs = add(ring, obs, next_obs, done)
        # T N newest frames, K N first stacks, K per episode end before the last step
        assert int(ring.written) - before == T * N + K * N + K * int(done[:-1].sum())
        assert refs.shape == (T, N, K + 1) and refs.dtype == np.int32
        kept.append((obs, next_obs, refs))
    for obs, next_obs, refs in kept:
        np.testing.assert_array_equal(np.asarray(frames.stacks(ring, refs[..., :K])), obs)
        np.testing.assert_array_equal(np.asarray(frames.stacks(ring, refs[..., 1:])), next_obs)
        assert np.asarray(frames.valid(ring, refs)).all()


def test_overwritten_frames_are_detected_and_the_rest_still_rebuild():
    rng = np.random.default_rng(0)
    T, N = 5, 2
    per_fragment = T * N + K * N  # no episode ends below
    ring = frames.init(2 * per_fragment + 10, (H, W))  # two fragments and the newest frames of the first
    kept = []
    for _ in range(3):
        obs, next_obs, done = _streams(rng, N, T, end_prob=0.0)
        ring, refs = frames.add_fragment(ring, obs, next_obs, done)
        kept.append((obs, refs))
    first, last = kept[0], kept[-1]
    ok = np.asarray(frames.valid(ring, first[1]))
    # The first fragment's starting stacks are overwritten: only its last step, whose obs and next_obs are
    # frames that step 0 to 4 added, is intact.
    assert ok.tolist() == [[False] * N] * (T - 1) + [[True] * N]
    np.testing.assert_array_equal(np.asarray(frames.stacks(ring, first[1][..., :K]))[ok], first[0][ok])
    assert np.asarray(frames.valid(ring, last[1])).all()
    np.testing.assert_array_equal(np.asarray(frames.stacks(ring, last[1][..., :K])), last[0])


def test_the_ring_size_for_a_million_atari_transitions():
    size = frames.frames_for(1_000_000, fragment_steps=100, stack=4)
    assert size * 84 * 84 / 2 ** 30 < 7.5  # GiB of frames


def test_atari_stacks_shift_by_one_frame_and_continue_into_the_next_step():
    """What `add_fragment` relies on, on Breakout's preprocessing: next_obs = obs shifted by one frame plus a
    new one, and the next obs is next_obs unless the step ended an episode (a training env: lives end them)."""
    pytest.importorskip("ale_py")
    from sparqrl.envs import HostVecEnv

    env = HostVecEnv("gym:ALE/Breakout-v5", 2)
    obs = env.reset(seed=1)
    rng = np.random.default_rng(1)
    ends = 0
    for _ in range(400):
        out = env.step(rng.integers(0, 4, 2))
        np.testing.assert_array_equal(out.final_obs[..., :-1], obs[..., 1:])
        done = out.terminated | out.truncated
        np.testing.assert_array_equal(out.obs[~done], out.final_obs[~done])
        ends += int(done.sum())
        obs = out.obs
    env.close()
    assert ends > 0

"""Stacked frames stored once: the frame ring behind a replay of image observations (Atari).

An Atari observation is the last K frames [H, W, K] (`sparqrl.envs.atari`), and a step's next observation
shares K - 1 of them, so storing `obs` and `next_obs` whole keeps each frame 2K times: 56 kB a transition at
84x84x4 uint8, 56 GB for a million. Here each frame is stored once, in a ring of uint8 frames [F, H, W], and a
transition keeps K + 1 frame numbers instead of its observations: those of obs (oldest first) and the newest
frame of next_obs (next_obs = numbers 1..K). A million transitions then take 84 * 84 B * (1 + the frames a
fragment's starts and resets add) + 20 B each: 7.6 GB with 100-step fragments, 10.2 GB with 10-step ones.

What gets written, per fragment [T, N] of N environments' T steps in order (`add_fragment`):
- the K frames of each environment's first observation (its stack cannot be taken from anything stored
  before: fragments of several actors arrive interleaved);
- the newest frame of every next_obs (T N frames);
- the K frames of the observation that starts a new episode after a step that ended one (where `done`; the
  pre-reset frames are in next_obs, whose newest frame was written above).
A fragment thus writes T N + K N (1 + its episode ends, not counting the last step's) frames. Nothing assumes
how the environment pads a fresh stack. What it relies on, true of `FrameStackObservation` (tested on Breakout
in `tests/test_frames.py`): next_obs[t] = obs[t] shifted by one frame plus one new frame, and obs[t + 1] =
next_obs[t] unless step t ended an episode.

Frame numbers are absolute (0, 1, ... in writing order; slot = number % F), and each slot remembers the
number of the frame in it, so a transition whose frames the ring has overwritten is detected (`valid`), never
silently rebuilt from newer frames. Everything is jit- and vmap-safe: the frames a fragment writes are a
fixed set of candidates, the unused ones dropped by the scatter.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from sparqrl.config import positive


@flax.struct.dataclass
class FrameRing:
    """frames  uint8 [F, H, W]; numbers  int32 [F]: the absolute number of the frame in each slot (-1: empty);
    written  int32 []: frames written so far (the next frame's number)."""

    frames: jax.Array
    numbers: jax.Array
    written: jax.Array

    @property
    def capacity(self) -> int:
        return self.frames.shape[0]


def init(capacity: int, frame_shape: tuple[int, int]) -> FrameRing:
    """An empty ring of `capacity` frames of `frame_shape` [H, W]."""
    positive("capacity", capacity)
    return FrameRing(jnp.zeros((capacity, *frame_shape), jnp.uint8), jnp.full((capacity,), -1, jnp.int32),
                     jnp.zeros((), jnp.int32))


def frames_for(transitions: int, fragment_steps: int, stack: int, episode_ends: float = 0.01) -> int:
    """A ring size that holds the frames of `transitions` transitions written in fragments of `fragment_steps`
    steps, with up to `episode_ends` episodes ending per step (Atari's lives: ~0.01)."""
    return int(transitions * (1.0 + stack / fragment_steps + stack * episode_ends)) + 1


def add_fragment(ring: FrameRing, obs: jax.Array, next_obs: jax.Array, done: jax.Array
                 ) -> tuple[FrameRing, jax.Array]:
    """Write a fragment's new frames; returns the ring and each step's frame numbers int32 [T, N, K + 1].

    obs, next_obs: uint8 [T, N, H, W, K], each environment's steps in order (next_obs: before any reset);
    done: bool [T, N], step t ended an episode (terminated or truncated).
    """
    obs, next_obs, done = jnp.asarray(obs), jnp.asarray(next_obs), jnp.asarray(done, bool)
    T, N = done.shape
    K = obs.shape[-1]
    newest = next_obs[..., -1]  # [T, N, H, W]
    starts = jnp.moveaxis(obs[0], -1, 1)  # [N, K, H, W]
    resets = jnp.moveaxis(obs[1:], -1, 2)  # [T - 1, N, K, H, W]: used where done[t] for obs[t + 1]

    # Candidates in writing order: the starts, then per step its newest frame and (if it ended an episode)
    # the next observation's stack. Unused candidates get no number and are dropped.
    used_resets = jnp.broadcast_to(done[:-1, :, None], (T - 1, N, K))
    mask = jnp.concatenate([
        jnp.ones((N * K,), bool),
        jnp.concatenate([jnp.ones((T - 1, N), bool)[..., None], used_resets], axis=-1).reshape(-1),
        jnp.ones((N,), bool),
    ])
    values = jnp.concatenate([
        starts.reshape((N * K,) + starts.shape[2:]),
        jnp.concatenate([newest[:-1, :, None], resets], axis=2).reshape((-1,) + newest.shape[2:]),
        newest[-1],
    ])
    order = jnp.cumsum(mask.astype(jnp.int32)) - 1
    numbers = jnp.where(mask, ring.written + order, -1)
    slots = jnp.where(mask, numbers % ring.capacity, ring.capacity)  # out of range: dropped
    ring = FrameRing(ring.frames.at[slots].set(values, mode="drop"),
                     ring.numbers.at[slots].set(numbers, mode="drop"),
                     ring.written + jnp.sum(mask, dtype=jnp.int32))

    # The numbers of each step's frames, in the same order as above.
    start_numbers = numbers[:N * K].reshape(N, K)
    middle = numbers[N * K:-N].reshape(T - 1, N, K + 1)
    new_numbers = jnp.concatenate([middle[..., 0], numbers[-N:][None]], axis=0)  # [T, N]
    reset_numbers = middle[..., 1:] if T > 1 else jnp.zeros((1, N, K), jnp.int32)  # [max(T - 1, 1), N, K]

    def step(current: jax.Array, t: jax.Array) -> tuple[jax.Array, jax.Array]:
        refs = jnp.concatenate([current, new_numbers[t][:, None]], axis=-1)  # obs, then next_obs's newest
        following = jnp.where(done[t][:, None], reset_numbers[jnp.minimum(t, reset_numbers.shape[0] - 1)], refs[:, 1:])
        return following, refs

    _, refs = jax.lax.scan(step, start_numbers, jnp.arange(T))
    return ring, refs


def stacks(ring: FrameRing, numbers: jax.Array) -> jax.Array:
    """The observations [..., H, W, K'] of frame numbers [..., K'] (obs: refs[..., :K]; next_obs: refs[..., 1:])."""
    return jnp.moveaxis(ring.frames[numbers % ring.capacity], -3, -1)


def valid(ring: FrameRing, numbers: jax.Array) -> jax.Array:
    """bool [...]: every frame of numbers [..., K'] is still in the ring (not overwritten by newer frames)."""
    return jnp.all(ring.numbers[numbers % ring.capacity] == numbers, axis=-1)

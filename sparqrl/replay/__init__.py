"""On-device replay buffers as pure functions over typed states: uniform (the names below),
prioritized (`sparqrl.replay.prioritized`), n-step windows, RLx2's dynamic capacity, and stacked image
frames stored once (`sparqrl.replay.frames`: DQN's replay on Atari)."""

from __future__ import annotations

from sparqrl.replay import prioritized
from sparqrl.replay.prioritized import PrioritizedBuffer, PrioritizedSample, PrioritizedState, make_prioritized_buffer
from sparqrl.replay.uniform import (
    BufferState,
    UniformBuffer,
    add,
    can_sample,
    gather,
    init,
    make_uniform_buffer,
    sample,
    sample_slots,
)

__all__ = [
    "BufferState", "PrioritizedBuffer", "PrioritizedSample", "PrioritizedState", "UniformBuffer", "add",
    "can_sample", "gather", "init", "make_prioritized_buffer", "make_uniform_buffer", "prioritized", "sample",
    "sample_slots",
]

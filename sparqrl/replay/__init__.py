"""On-device replay buffers as pure functions over typed states (uniform now; n-step, RLx2 later)."""

from __future__ import annotations

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
    "BufferState", "UniformBuffer", "add", "can_sample", "gather", "init", "make_uniform_buffer",
    "sample", "sample_slots",
]

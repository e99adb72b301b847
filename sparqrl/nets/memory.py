"""Recurrent policies (`--set memory=lstm|gru`): an LSTM or GRU cell after the actor's torso, shared by the actor
and critic heads, and the pure functions that act with it step by step and re-run it over a fragment.

Why one cell for both heads: the learner must re-run each fragment from the state the actor held at its start
(truncated BPTT over the fragment, IMPALA's and OpenAI Five's scheme). With one cell that state is all an actor
carries; a critic with its own cell would have to be stepped by every actor too.

The carry convention, the same while acting and when re-running: `reset_carry(carry, done)` right after an env
step whose episode ended, so the carry an env holds before step t (`Step.memory[t]`) is the initial state at an
episode's first step. Re-running a fragment from `Step.memory[0]` then resets before step t where step t-1
ended (`sequence_resets`), the same `where(done, init, carry)` in the same place of the computation.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from sparqrl.nets.modules import MLP, as_images, dense, network_torso, orthogonal

CELLS = {"lstm": nn.OptimizedLSTMCell, "gru": nn.GRUCell}
"""The cells `memory` names; the carry is (c, h) for the LSTM, h for the GRU, each [..., memory_size]."""


class Memory(NamedTuple):
    """The recurrent state's shape: which cell and how many units."""

    kind: str  # a key of CELLS
    size: int

    def init(self, batch_shape: tuple[int, ...]) -> Any:
        """The initial (all-zero) carry of `batch_shape` envs: what every episode starts from."""
        zeros = jnp.zeros((*batch_shape, self.size), jnp.float32)
        return (zeros, zeros) if self.kind == "lstm" else zeros


def reset_carry(carry: Any, reset: jax.Array) -> Any:
    """`where(reset, init, carry)`: the initial (zero) state for envs whose `reset` [...] is true."""
    return jax.tree.map(lambda c: jnp.where(reset[..., None], jnp.zeros_like(c), c), carry)


def sequence_resets(terminated: jax.Array, truncated: jax.Array) -> jax.Array:
    """[T, B]: whether step t starts a new episode inside the fragment (step t-1 ended it); step 0 never resets
    (the stored carry was already reset by the actor)."""
    done = jnp.logical_or(terminated, truncated)
    return jnp.concatenate([jnp.zeros_like(done[:1]), done[:-1]], axis=0)


class RecurrentActorCritic(nn.Module):
    """The actor's torso ('MLP_0', a CNN or the user's 'Torso_0'), then the cell ('Memory_0') whose output h feeds
    the actor head ('Dense_0': logits or the Gaussian mean, gain 0.01) and the critic (an MLP 'MLP_1' of `hidden`
    on h, then 'Dense_1'). Continuous actions add the state-independent 'log_std' (as `ActorCritic`).

    __call__(obs [B, *obs_shape] or flat [B, d], carry [B, size] or None for the initial state)
        -> (raw [B, action_dim], value [B], carry); extra leading axes are batch axes."""

    action_dim: int
    discrete: bool
    obs_shape: tuple[int, ...]
    memory: str
    memory_size: int
    hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"
    torso: str = "auto"
    actor_network: str | None = None

    @nn.compact
    def __call__(self, obs: jax.Array, carry: Any = None) -> tuple[jax.Array, jax.Array, Any]:
        torso = network_torso(self.obs_shape, self.hidden, self.activation, self.torso, self.actor_network, 0)
        features = torso(as_images(torso, obs, self.obs_shape))
        if carry is None:
            carry = Memory(self.memory, self.memory_size).init(features.shape[:-1])
        # orthogonal recurrent kernels through `nets.modules.orthogonal`: never a batched QR (see there)
        cell = CELLS[self.memory](self.memory_size, recurrent_kernel_init=orthogonal(1.0), name="Memory_0")
        carry, h = cell(carry, features)
        raw = dense(self.action_dim, gain=0.01)(h)
        if not self.discrete:
            self.param("log_std", nn.initializers.zeros, (self.action_dim,))
        value = dense(1, gain=1.0)(MLP(tuple(self.hidden), self.activation, obs_ndim=1, name="MLP_1")(h))[..., 0]
        return raw, value, carry


def unroll(network: nn.Module, params: Any, carry: Any, x: jax.Array, reset: jax.Array
           ) -> tuple[jax.Array, jax.Array, Any]:
    """The network re-run over a sequence as the actor stepped it: x [T, B, ...] from `carry` [B, ...] (the state
    before step 0), resetting before each step where `reset` [T, B] (`sequence_resets`).
    Returns raw [T, B, A], values [T, B] and the carries after each step [T, B, ...] (before any reset)."""

    def step(carry: Any, inputs: tuple[jax.Array, jax.Array]) -> tuple[Any, tuple[jax.Array, jax.Array, Any]]:
        x_t, reset_t = inputs
        raw, value, carry = network.apply(params, x_t, reset_carry(carry, reset_t))
        return carry, (raw, value, carry)

    _, out = jax.lax.scan(step, carry, (x, reset))
    return out


def first(memory: Any) -> Any:
    """The carry before a fragment's first step from the per-step carries `Step.memory` [T, B, ...]."""
    return jax.tree.map(lambda c: c[0], memory)

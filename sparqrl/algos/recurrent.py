"""The actor-critic learners' side of recurrent policies (`--set memory=lstm|gru`, `sparqrl.nets.memory`): a
fragment re-run from the state its actor held before its first step (`Step.memory[0]`), with the resets where
episodes ended inside it, so the learner sees the sequences exactly as acted (truncated BPTT over the fragment;
IMPALA and OpenAI Five send the initial state with each fragment, PureJaxRL's and CleanRL's recurrent PPO
re-run it likewise). PPO's minibatches take whole environments' sequences (`env_minibatches`), not steps.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from sparqrl.algos.actor_critic import distribution
from sparqrl.nets.distributions import Categorical, DiagGaussian
from sparqrl.nets.memory import RecurrentActorCritic, first, sequence_resets, unroll


def log_std_of(params: Any) -> jax.Array | None:
    """The Gaussian's state-independent log-std in the network's parameters; None for discrete actions."""
    return params["params"].get("log_std")


def sequence_outputs(network: RecurrentActorCritic, params: Any, memory: Any, x: jax.Array, reset: jax.Array
                     ) -> tuple[Categorical | DiagGaussian, jax.Array, Any]:
    """The policy's distribution [T, B], the values [T, B] and the carries after each step [T, B, ...] of the
    network re-run over observed inputs x [T, B, *obs] from the per-step states `memory` [T, B, ...] (only the
    first step's is read), resetting where `reset` [T, B] (`nets.memory.sequence_resets`)."""
    raw, values, carries = unroll(network, params, first(memory), x, reset)
    return distribution(raw, log_std_of(params)), values, carries


def fragment_outputs(network: RecurrentActorCritic, params: Any, x: jax.Array, next_x: jax.Array, steps: Any
                     ) -> tuple[Categorical | DiagGaussian, jax.Array, jax.Array]:
    """(distribution, V(x), V(next_x)) [T, N] of a fragment (`Step` with `memory`): the re-run over x, and each
    step's next observation next_x[t] (pre-reset: a truncated episode's final one) through the cell from the
    state after step t. Where the episode goes on that is step t+1's value; at the fragment's end it is the
    bootstrap value; after a termination it is unused."""
    dist, values, carries = sequence_outputs(network, params, steps.memory, x,
                                             sequence_resets(steps.terminated, steps.truncated))
    _, next_values, _ = network.apply(params, next_x, carries)
    return dist, values, next_values


def env_minibatches(batch: Any, key: jax.Array, num_minibatches: int) -> Any:
    """A fragment's leaves [T, N, ...] as [num_minibatches, T, N / num_minibatches, ...]: the environments
    shuffled and split, each minibatch whole sequences a recurrent network can re-run."""
    n = jax.tree.leaves(batch)[0].shape[1]
    permutation = jax.random.permutation(key, n)

    def split(x: jax.Array) -> jax.Array:
        x = x[:, permutation].reshape((x.shape[0], num_minibatches, n // num_minibatches, *x.shape[2:]))
        return jnp.swapaxes(x, 0, 1)

    return jax.tree.map(split, batch)

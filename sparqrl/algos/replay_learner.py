"""The gradient steps of a replay learner, written once for DQN and the off-policy loop (TD3, SAC).

An update takes as many gradient steps as its env steps made due (`run`); each step (`gradient_step`)

1. draws a batch from the replay (`Replay.draw`: uniform or prioritized items (`draw_items`), with DQN's
   stacked frames rebuilt, or the off-policy loop's n-step windows with their return terms);
2. hands it to the algorithm's targets, loss and optimizer (`Replay.update`), which reports its metrics
   and, with prioritized replay, the batch's |δ| under the parameters the step started from;
3. sets the drawn items' priorities to |δ| + ε_p, as PER (Schaul et al. 2016, arXiv 1511.05952); 0 for
   items whose frames were overwritten, so they are never drawn again;
4. adds its metrics to the update's running sums (`means` reads them out).

The algorithm supplies the draw and the update; this module the loop, the priorities and the sums.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from sparqrl import replay
from sparqrl.replay import prioritized

Metrics = dict[str, tuple[jax.Array, jax.Array]]
"""name -> (value, weight) of one gradient step; the update reports sum(value·weight) / sum(weight)."""


class Drawn(NamedTuple):
    """A batch of B items drawn from the replay."""

    batch: Any  # what the algorithm's update reads, leaves [B, ...]
    weights: jax.Array | None = None  # float32 [B], importance weights; None: uniform and unweighted
    slots: jax.Array | None = None  # int32 [B], prioritized replay's drawn slots, whose priorities the step sets
    intact: jax.Array | None = None  # bool [B], stacked frames: False where a frame was overwritten


class Stepped(NamedTuple):
    """What the algorithm's update of one gradient step returns."""

    agent: Any
    metrics: Metrics
    td_abs: jax.Array | None = None  # float32 [B], |δ| of the batch: the new priorities (prioritized replay)


class Priorities(NamedTuple):
    """How prioritized replay turns |δ| into priorities: (|δ| + epsilon)^exponent."""

    epsilon: Any  # float, ε_p
    exponent: Any  # float, α_p


class Replay(NamedTuple):
    """What an algorithm supplies (pure functions; bind what they read besides their arguments).

    draw(buffer, key, iteration) -> Drawn                   iteration: int32 [], 1-based count of gradient steps
    update(agent, drawn, iteration, key) -> Stepped         key: None when `update_draws` is False
    """

    draw: Callable[[Any, jax.Array, jax.Array], Drawn]
    update: Callable[[Any, Drawn, jax.Array, jax.Array | None], Stepped]
    metric_names: tuple[str, ...]
    update_draws: bool = True
    """Whether the update draws random numbers: then each step's key is split into the draw's and the
    update's; else (DQN) the draw takes the step's key whole."""
    priorities: Priorities | None = None  # set with prioritized replay


class Carry(NamedTuple):
    """What the gradient steps of one update carry."""

    agent: Any
    buffer: Any
    gradient_steps: jax.Array  # int32 [], taken so far: the next step's iteration is this + 1
    sums: dict[str, jax.Array]  # float32 [] per metric, sum of value·weight
    weights: dict[str, jax.Array]  # float32 [] per metric, sum of weight
    weight_min: jax.Array  # float32 [], smallest importance weight drawn (1 if none)


def start(spec: Replay, agent: Any, buffer: Any, gradient_steps: jax.Array) -> Carry:
    """The carry of an update that has taken no gradient step yet."""
    zeros = {k: jnp.zeros((), jnp.float32) for k in spec.metric_names}
    return Carry(agent, buffer, gradient_steps, zeros, dict(zeros), jnp.ones((), jnp.float32))


def draw_items(buffer: Any, key: jax.Array, batch_size: int, importance_exponent: Any = None) -> Drawn:
    """B = batch_size items: uniformly from a `replay.BufferState`, or (importance_exponent β given) from a
    `replay.PrioritizedState` with P(i) ∝ p_i and their normalised importance weights (n·P(i))^−β."""
    if importance_exponent is None:
        return Drawn(replay.sample(buffer, key, batch_size))
    drawn = prioritized.sample(buffer, key, batch_size, importance_exponent)
    return Drawn(drawn.items, drawn.importance_weights, drawn.slots)


def reprioritize(priorities: Priorities, buffer: Any, drawn: Drawn, td_abs: jax.Array) -> Any:
    """The buffer with the drawn items' priorities set to |δ| + ε_p (0 where their frames were overwritten)."""
    priority = td_abs + priorities.epsilon
    if drawn.intact is not None:
        priority = jnp.where(drawn.intact, priority, 0.0)  # never drawn again
    return prioritized.update_priorities(buffer, drawn.slots, priority, priorities.exponent)


def gradient_step(spec: Replay, carry: Carry, key: jax.Array) -> Carry:
    """One gradient step on a batch drawn from the carry's buffer (see the module docstring)."""
    iteration = carry.gradient_steps + 1
    draw_key, update_key = jax.random.split(key) if spec.update_draws else (key, None)
    drawn = spec.draw(carry.buffer, draw_key, iteration)
    agent, metrics, td_abs = spec.update(carry.agent, drawn, iteration, update_key)
    buffer = carry.buffer
    if spec.priorities is not None:
        buffer = reprioritize(spec.priorities, buffer, drawn, td_abs)
    names = spec.metric_names
    sums = {k: carry.sums[k] + metrics[k][0] * metrics[k][1] for k in names}
    weights = {k: carry.weights[k] + jnp.asarray(metrics[k][1], jnp.float32) for k in names}
    weight_min = carry.weight_min if drawn.weights is None else jnp.minimum(carry.weight_min, jnp.min(drawn.weights))
    return Carry(agent, buffer, iteration, sums, weights, weight_min)


def run(spec: Replay, carry: Carry, num_grad: jax.Array, key: jax.Array, max_steps: int,
        unroll: bool = False) -> Carry:
    """Take `num_grad` (<= max_steps, static) gradient steps, the i-th with the i-th of `max_steps` keys
    split from `key`.

    A loop of num_grad iterations (zero when none is due), not a scan of gated slots: vmapped over seeds,
    a cond whose untaken branch returns the networks copied them at every call (measured with DQN's
    3 x 2048 network: ~15 ms per env step on CPU; `sparqrl.algos.dqn.train.update_target`). `unroll`: all
    `max_steps` steps as straight-line code, the due ones kept by a select (a CNN's gradient in any loop or
    cond body is several times slower on XLA's CPU)."""
    keys = jax.random.split(key, max_steps)
    if unroll:
        for i in range(max_steps):
            stepped = gradient_step(spec, carry, keys[i])
            carry = jax.tree.map(lambda new, old: jnp.where(i < num_grad, new, old), stepped, carry)
        return carry
    return jax.lax.fori_loop(0, num_grad, lambda i, c: gradient_step(spec, c, keys[i]), carry)


def means(carry: Carry) -> dict[str, jax.Array]:
    """Each metric's weighted mean over the update's gradient steps (0 when it took none)."""
    return {k: carry.sums[k] / jnp.maximum(carry.weights[k], 1.0) for k in carry.sums}

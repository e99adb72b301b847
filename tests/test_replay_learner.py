"""The replay learner's gradient steps (`sparqrl.algos.replay_learner`), shared by DQN, TD3 and SAC."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparqrl.algos import replay_learner as rl
from sparqrl.replay import prioritized


def _stand_in(update_draws: bool = True) -> rl.Replay:
    """A replay learner whose 'agent' is a float: each step's result depends on its draw, key and iteration."""

    def draw(buffer, key, iteration):
        return rl.Drawn(jax.random.uniform(key))

    def update(agent, drawn, iteration, key):
        noise = jax.random.uniform(key) if update_draws else 0.0
        new = agent * 0.5 + drawn.batch + noise
        odd = (iteration % 2).astype(jnp.float32)
        return rl.Stepped(new, {"agent": (new, jnp.ones(())), "iteration": (iteration.astype(jnp.float32), odd)})

    return rl.Replay(draw, update, ("agent", "iteration"), update_draws=update_draws)


def _run(spec, num_grad, unroll, gradient_steps=0):
    start = rl.start(spec, jnp.float32(1.0), (), jnp.int32(gradient_steps))
    return jax.jit(lambda: rl.run(spec, start, jnp.int32(num_grad), jax.random.key(4), 3, unroll))()


@pytest.mark.parametrize("update_draws", [True, False])
def test_the_steps_match_a_python_loop_with_the_loops_keys(update_draws):
    """Step i draws with the i-th of max_steps keys (split in two when the update draws too)."""
    spec = _stand_in(update_draws)
    keys = jax.random.split(jax.random.key(4), 3)
    for num_grad in (0, 1, 3):
        agent, values = 1.0, []
        for i in range(num_grad):
            draw_key, update_key = jax.random.split(keys[i]) if update_draws else (keys[i], None)
            noise = float(jax.random.uniform(update_key)) if update_draws else 0.0
            agent = agent * 0.5 + float(jax.random.uniform(draw_key)) + noise
            values.append(agent)
        carry = _run(spec, num_grad, unroll=False, gradient_steps=5)
        np.testing.assert_allclose(float(carry.agent), agent, rtol=1e-6)
        assert int(carry.gradient_steps) == 5 + num_grad
        means = rl.means(carry)
        np.testing.assert_allclose(float(means["agent"]), np.mean(values) if values else 0.0, rtol=1e-6)
        odd = [it for it in range(6, 6 + num_grad) if it % 2]  # iterations 6, 7, 8: weight 1 on odd ones only
        assert float(means["iteration"]) == (np.mean(odd) if odd else 0.0)


def test_unrolled_gradient_steps_equal_the_loop():
    """The straight-line gradient steps (a CNN learner on CPU) take exactly the due steps, with the loop's keys."""
    spec = _stand_in()
    for num_grad in (0, 1, 2, 3):
        loop, unrolled = _run(spec, num_grad, unroll=False), _run(spec, num_grad, unroll=True)
        np.testing.assert_allclose(float(unrolled.agent), float(loop.agent), rtol=1e-6)
        assert int(unrolled.gradient_steps) == int(loop.gradient_steps) == num_grad
        assert float(unrolled.weights["agent"]) == float(loop.weights["agent"]) == num_grad


def test_prioritized_steps_set_the_drawn_priorities_and_track_the_smallest_weight():
    """|δ| + ε_p, raised to α_p, on the drawn slots; 0 where the frames were overwritten; min IS weight kept."""
    capacity, batch, eps, alpha = 8, 4, 0.1, 0.5
    buffer = prioritized.init(jnp.zeros((), jnp.float32), capacity)
    buffer = prioritized.add(buffer, jnp.arange(capacity, dtype=jnp.float32), jnp.arange(1.0, capacity + 1.0), alpha)
    intact = jnp.array([True, False, True, True])

    def draw(buf, key, iteration):
        drawn = rl.draw_items(buf, key, batch, importance_exponent=1.0)
        return drawn._replace(intact=intact)

    def update(agent, drawn, iteration, key):
        return rl.Stepped(agent, {}, td_abs=drawn.batch * 2.0)  # items are their slot numbers: |δ| = 2·slot

    spec = rl.Replay(draw, update, (), update_draws=False, priorities=rl.Priorities(eps, alpha))
    key = jax.random.key(1)
    carry = rl.gradient_step(spec, rl.start(spec, (), buffer, jnp.int32(0)), key)
    drawn = rl.draw_items(buffer, key, batch, importance_exponent=1.0)
    slots = np.asarray(drawn.slots)
    expected = np.asarray(buffer.weights).copy()
    for j in range(batch):
        expected[slots[j]] = (2.0 * slots[j] + eps) ** alpha if bool(intact[j]) else 0.0
    np.testing.assert_allclose(np.asarray(carry.buffer.weights), expected, rtol=1e-6)
    assert float(carry.weight_min) == pytest.approx(float(np.min(drawn.weights)))
    assert float(carry.weight_min) < 1.0

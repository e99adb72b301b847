"""Evolution strategies on evosax 0.3: convergence on a quadratic (maximised), presets, fitness shaping,
and the one-line errors for bad input."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparqrl.config import ConfigError
from sparqrl.meta import STRATEGIES, centered_ranks, make_strategy, member_keys, pair_ranks, z_score

DIMS = 10
TARGET = jnp.linspace(-1.0, 1.0, DIMS)


def quadratic(population: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Fitness to maximise: −|x − target|², best 0 at the target; aux: the distance."""
    del key
    distance = jnp.sum(jnp.square(population - TARGET), axis=-1)
    return -distance, distance


def evolve(strategy, generations: int, seed: int = 0, fitness_fn=quadratic):
    state = strategy.init(jax.random.key(seed))

    @jax.jit
    def run(state, keys):
        return jax.lax.scan(lambda s, k: strategy.generation(fitness_fn, k, s), state, keys)

    return run(state, jax.random.split(jax.random.key(seed + 1), generations))


@pytest.mark.parametrize("name,overrides,generations", [
    ("open_es", {}, 300),
    ("open_es", {"fitness_shaping": "centered_rank", "lr": 0.03}, 300),
    ("snes", {}, 150),
])
def test_strategy_maximises_a_quadratic(name, overrides, generations):
    strategy = make_strategy(name, 32, DIMS, **overrides)
    state, out = evolve(strategy, generations)
    start = float(jnp.sum(jnp.square(TARGET)))  # the zero-mean start's distance (~3.9)
    center = strategy.center(state)
    final = float(jnp.sum(jnp.square(center - TARGET)))
    assert final < 0.05 * start, (name, final, start)
    mean_fitness = np.asarray(out.metrics.mean_fitness)
    assert mean_fitness[-10:].mean() > mean_fitness[:10].mean() + 0.5 * start  # fitness rose by a clear margin
    # Best so far is tracked on the maximisation scale and never decreases.
    best = np.asarray(out.metrics.best_fitness)
    assert np.all(np.diff(best) >= 0) and best[-1] <= 0.0 and best[-1] > -0.05 * start
    best_solution, best_fitness = strategy.best(state)
    np.testing.assert_allclose(float(best_fitness), -float(jnp.sum(jnp.square(best_solution - TARGET))), rtol=1e-4)
    np.testing.assert_allclose(np.asarray(out.aux[-1]), -np.asarray(out.fitness[-1]))


def test_cma_es_and_simple_ga_improve():
    for name, generations in (("cma_es", 30), ("simple_ga", 60)):
        strategy = make_strategy(name, 16, DIMS)
        state, out = evolve(strategy, generations)
        mean_fitness = np.asarray(out.metrics.mean_fitness)
        assert mean_fitness[-5:].mean() > mean_fitness[:5].mean() + 1.0, name
        assert float(jnp.sum(jnp.square(strategy.center(state) - TARGET))) < 1.0, name


def test_minimising_would_go_the_other_way():
    """The wrapper negates fitness for evosax: passing the negated objective must move away."""
    strategy = make_strategy("open_es", 32, DIMS)
    state, _ = evolve(strategy, 100, fitness_fn=lambda p, k: (-quadratic(p, k)[0], ()))
    assert float(jnp.sum(jnp.square(strategy.center(state) - TARGET))) > float(jnp.sum(jnp.square(TARGET)))


def test_pytree_solution_and_deterministic_generations():
    solution = {"w": jnp.zeros((2, 3)), "b": jnp.zeros(4)}
    strategy = make_strategy("open_es", 8, solution)
    assert strategy.num_dims == 10 and strategy.popsize == 8
    state = strategy.init(jax.random.key(0))
    population, _ = strategy.ask(jax.random.key(1), state)
    assert population["w"].shape == (8, 2, 3) and population["b"].shape == (8, 4)
    # Antithetic: member i and i + P/2 are mirrored around the (zero) mean.
    np.testing.assert_allclose(np.asarray(population["w"][:4]), -np.asarray(population["w"][4:]), atol=1e-7)
    fitness_fn = lambda p, k: (-(jnp.sum(p["w"] ** 2, axis=(1, 2)) + jnp.sum((p["b"] - 1) ** 2, axis=1)), ())  # noqa: E731
    step = jax.jit(partial(strategy.generation, fitness_fn))
    a, out_a = step(jax.random.key(2), state)
    b, out_b = step(jax.random.key(2), state)
    np.testing.assert_array_equal(np.asarray(out_a.fitness), np.asarray(out_b.fitness))
    c, out_c = step(jax.random.key(3), state)
    assert not np.array_equal(np.asarray(out_a.fitness), np.asarray(out_c.fitness))
    assert strategy.center(a)["b"].shape == (4,)


def test_open_es_preset():
    strategy = make_strategy("open_es", 4, 3)
    state = strategy.init(jax.random.key(0))
    np.testing.assert_allclose(float(state.std), 0.04)  # σ_init of the 0.0.4 port
    np.testing.assert_array_equal(np.asarray(state.mean), 0.0)  # zero-mean start
    assert strategy.antithetic
    lr = strategy.algorithm.optimizer  # Adam(lr 0.01 decaying to 0.001): the first step moves by ~lr
    grad = jnp.array([1.0, -1.0, 0.5])
    updates, _ = lr.update(grad, lr.init(jnp.zeros(3)), jnp.zeros(3))
    np.testing.assert_allclose(np.asarray(updates), -0.01 * np.sign(grad), rtol=1e-3)


def test_fitness_shaping_helpers():
    f = jnp.array([3.0, -1.0, 10.0, 0.0])
    np.testing.assert_allclose(np.asarray(centered_ranks(f)), [1 / 6, -0.5, 0.5, -1 / 6], atol=1e-6)
    np.testing.assert_allclose(np.asarray(z_score(f)), (np.asarray(f) - 3.0) / np.std(np.asarray(f)), rtol=1e-5)
    # Pairs are (0, 2) and (1, 3): 10 beats 3, 0 beats -1.
    np.testing.assert_array_equal(np.asarray(pair_ranks(f)), [0.0, 0.0, 1.0, 1.0])
    np.testing.assert_array_equal(np.asarray(pair_ranks(jnp.array([1.0, jnp.nan, 1.0, 2.0]))), [0.5, 0.0, 0.5, 1.0])
    keys = member_keys(jax.random.key(0), 6, antithetic=True)
    np.testing.assert_array_equal(jax.random.key_data(keys[:3]), jax.random.key_data(keys[3:]))
    keys = member_keys(jax.random.key(0), 6, antithetic=False)
    assert len({tuple(np.asarray(jax.random.key_data(k))) for k in keys}) == 6


def test_pair_rank_shaping_moves_toward_the_better_mirror():
    strategy = make_strategy("open_es", 16, DIMS, fitness_shaping="pair_rank", lr=0.05)
    state, out = evolve(strategy, 60)
    assert np.asarray(out.metrics.mean_fitness)[-5:].mean() > np.asarray(out.metrics.mean_fitness)[:5].mean() + 1.0


def test_bad_input_is_a_one_line_config_error():
    def message(**kwargs):
        with pytest.raises(ConfigError) as error:
            make_strategy(**kwargs)
        text = str(error.value)
        assert "\n" not in text
        return text

    text = message(name="openes", popsize=8, solution=3)
    assert all(name in text for name in STRATEGIES) and "close matches: open_es" in text
    text = message(name="open_es", popsize=33, solution=3)
    assert "popsize=33" in text and "antithetic" in text and "32 or 34" in text
    assert "even" in message(name="open_es", popsize=33, solution=3, antithetic=False)
    make_strategy("snes", 33, 3)  # odd is fine without antithetic sampling
    make_strategy("simple_ga", 33, 3)
    assert "sigma" in message(name="open_es", popsize=8, solution=3, sigmaa=0.1)
    assert "must be > 0" in message(name="open_es", popsize=8, solution=3, sigma=-1.0)
    assert "z_score" in message(name="open_es", popsize=8, solution=3, fitness_shaping="ranks")
    assert "unknown setting 'lr'" in message(name="cma_es", popsize=8, solution=3, lr=0.1)
    assert "antithetic" in message(name="open_es", popsize=8, solution=3, antithetic=False, fitness_shaping="pair_rank")
    assert "popsize=1" in message(name="snes", popsize=1, solution=3)
    assert "lr_limit" in message(name="open_es", popsize=8, solution=3, lr=0.001, lr_limit=0.01)

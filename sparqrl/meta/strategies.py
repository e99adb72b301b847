"""Evolution strategies by name, on evosax 0.3: OpenES (default), SNES, CMA-ES, SimpleGA.

Specifications: `purejaxrl_dpo_evosax.md` §8 (the evosax 0.3 API) and `meta_mfos_act.md` §7 (presets
that port the evosax 0.0.4 / 0.1.x defaults the LPO, ACT and pax runs used) and §8.1 item 2.

**Fitness is maximised here.** evosax 0.3 always minimises (its `tell` tracks the best member by
argmin of the raw fitness and every fitness-shaping function ranks low = good); there is no maximise
flag any more (reference §8.2). `Strategy.tell` therefore hands evosax −fitness and turns every
number it reports back into the maximisation scale, so callers pass returns as they are.

A `Strategy` is a pytree: the evosax algorithm object (which fixes shapes, population size and the
optax transforms) is static, its `params` are leaves. Its methods are pure (state in, state out) and
jittable, so a whole generation (ask → vmapped inner trainings → tell) is one compiled program and
many generations can run in `lax.scan`:

    strategy = make_strategy("open_es", popsize=64, solution=lpo_init())
    state = strategy.init(key, lpo_init())              # centred on the PPO-clip start
    state, out = jax.jit(partial(strategy.generation, fitness_fn))(key, state)
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from evosax.algorithms import CMA_ES, SNES, Open_ES, SimpleGA
from evosax.algorithms.base import EvolutionaryAlgorithm
from evosax.algorithms.population_based.base import PopulationBasedAlgorithm
from evosax.core.fitness_shaping import (
    centered_rank_fitness_shaping_fn,
    identity_fitness_shaping_fn,
    standardize_fitness_shaping_fn,
    weights_fitness_shaping_fn,
)
from flax import struct

from sparqrl.config import ConfigError, close_matches, is_int, is_number

PyTree = Any
FitnessFn = Callable[[PyTree, jax.Array], tuple[jax.Array, PyTree]]
"""fitness_fn(population, key) -> (fitness [P] to maximise, aux pytree of per-member metrics)."""

STRATEGIES = ("open_es", "snes", "cma_es", "simple_ga")
DEFAULT_STRATEGY = "open_es"


# --------------------------------------------------------------------------------------------------
# Fitness shaping, maximisation scale (higher fitness in -> higher shaped value out)
# --------------------------------------------------------------------------------------------------


def centered_ranks(fitness: jax.Array) -> jax.Array:
    """Centred ranks in [−0.5, 0.5], the best member +0.5 (Salimans et al. 2017). evosax's own
    `centered_rank_fitness_shaping_fn`, applied in its minimisation convention. fitness: [P]."""
    return -centered_rank_fitness_shaping_fn(None, -fitness, None, None)


def z_score(fitness: jax.Array) -> jax.Array:
    """(f − mean f) / std f over the population (LPO's and ACT's shaping, reference §5.3, §3.3 of
    meta_mfos_act.md). evosax's own `standardize_fitness_shaping_fn`. fitness: [P]."""
    return -standardize_fitness_shaping_fn(None, -fitness, None, None)


def pair_ranks(fitness: jax.Array) -> jax.Array:
    """Antithetic pair rank (groove's TA-LPO rule, meta_mfos_act.md §4.1, §8.1 item 2): within each
    antithetic pair (member i and member i + P/2, the order evosax's OpenES samples them in) the
    better member gets 1 and the worse 0; a tie gives 0.5 each; a NaN fitness counts as worst.

    Written here because evosax 0.3 has no pair-wise shaping (its shaping functions rank the whole
    population). fitness: [P], P even.
    """
    fitness = jnp.where(jnp.isnan(fitness), -jnp.inf, fitness)
    first, second = jnp.split(fitness, 2, axis=-1)
    first_score = jnp.where(first > second, 1.0, jnp.where(first < second, 0.0, 0.5))
    return jnp.concatenate([first_score, 1.0 - first_score], axis=-1)


def _pair_rank_fitness_shaping_fn(population: Any, fitness: jax.Array, state: Any, params: Any) -> jax.Array:
    # evosax convention: raw fitness is minimised and a lower shaped value is better.
    return -pair_ranks(-fitness)


_SHAPING_FNS: dict[str, Callable[..., jax.Array]] = {
    "z_score": standardize_fitness_shaping_fn,
    "centered_rank": centered_rank_fitness_shaping_fn,
    "pair_rank": _pair_rank_fitness_shaping_fn,
    "weights": weights_fitness_shaping_fn,  # SNES/CMA-ES: rank -> recombination weight in params
    "identity": identity_fitness_shaping_fn,
}


def member_keys(key: jax.Array, popsize: int, antithetic: bool) -> jax.Array:
    """One key per member for its inner training; with `antithetic`, member i and i + P/2 (an
    antithetic pair) share a key, so both mirrored perturbations meet the same task and seeds
    (antithetic task sampling, meta_mfos_act.md §4.1). Returns [P] keys."""
    if not antithetic:
        return jax.random.split(key, popsize)
    half = jax.random.split(key, popsize // 2)
    return jnp.concatenate([half, half])


# --------------------------------------------------------------------------------------------------
# Presets
# --------------------------------------------------------------------------------------------------

PRESETS: dict[str, dict[str, Any]] = {
    # The evosax 0.0.4 OpenES defaults the LPO, ACT and pax runs used, ported to 0.3 (meta_mfos_act.md
    # §7 and §3.3): Adam(lr 0.01 decaying ×0.999 per generation to 0.001, β1 0.99, β2 0.999, eps 1e-8),
    # σ 0.04 decaying ×0.999 to 0.01, antithetic sampling, z-scored fitness, zero-mean start.
    "open_es": {
        "lr": 0.01, "lr_decay": 0.999, "lr_limit": 0.001,
        "sigma": 0.04, "sigma_decay": 0.999, "sigma_limit": 0.01,
        "antithetic": True, "fitness_shaping": "z_score",
    },
    # evosax 0.3 defaults (meta_mfos_act.md §7): natural-gradient step sgd(1.0), initial σ 1.0,
    # rank-weight shaping.
    "snes": {"lr": 1.0, "sigma": 1.0, "fitness_shaping": "weights"},
    # evosax 0.3 defaults (§7): elite ratio 0.5 with negative weights, initial σ 1.0. CMA-ES's update
    # uses its shaped fitness as recombination weights, so no other shaping is offered.
    "cma_es": {"sigma": 1.0},
    # Elite ratio 0.5 (as LPO and ACT used, purejaxrl_dpo_evosax.md §5.3). The reference gives no
    # mutation σ or crossover rate: these are the evosax 0.0.x SimpleGA defaults (σ 0.07 decaying
    # ×0.999 to 0.01, crossover rate 0.5); evosax 0.3's own are σ 1.0 and no crossover.
    "simple_ga": {
        "sigma": 0.07, "sigma_decay": 0.999, "sigma_limit": 0.01,
        "crossover_rate": 0.5, "elite_ratio": 0.5, "fitness_shaping": "identity",
    },
}

_SHAPINGS_ALLOWED = {
    "open_es": ("z_score", "centered_rank", "pair_rank", "identity"),
    "snes": ("weights", "centered_rank", "z_score"),
    "cma_es": ("weights",),
    "simple_ga": ("identity", "centered_rank", "z_score"),
}


def _check_override(name: str, field: str, value: Any) -> None:
    """One-line ConfigError for a bad override value (checked on the host, before tracing)."""

    def bad(allowed: str) -> None:
        raise ConfigError(f"{field}={value!r} is not allowed for strategy {name}: {allowed}")

    if field == "antithetic":
        if not isinstance(value, bool):
            bad("must be true or false")
    elif field == "fitness_shaping":
        if value not in _SHAPINGS_ALLOWED[name]:
            bad(f"must be one of {', '.join(_SHAPINGS_ALLOWED[name])}")
    else:
        if not is_number(value) or not math.isfinite(value):
            bad("must be a finite number")
        if field in ("lr", "sigma") and value <= 0:
            bad("must be > 0")
        if field in ("lr_limit", "sigma_limit") and value < 0:
            bad("must be >= 0")
        if field in ("lr_decay", "sigma_decay") and not 0 < value <= 1:
            bad("must be in (0, 1]")
        if field == "crossover_rate" and not 0 <= value <= 1:
            bad("must be in [0, 1]")
        if field == "elite_ratio" and not 0 < value <= 1:
            bad("must be in (0, 1]")


def _decaying(init: float, decay: float, limit: float, field: str) -> optax.Schedule:
    """init · decay^generation, floored at `limit` (evosax 0.0.x/0.1.x `lrate_decay`/`sigma_decay`)."""
    if decay == 1.0:
        # optax treats end_value as an upper bound when decay_rate >= 1: use a constant instead.
        return optax.constant_schedule(init)
    if limit > init:
        raise ConfigError(f"{field}_limit={limit!r} is not allowed: must be <= {field}={init!r}")
    return optax.exponential_decay(init, transition_steps=1, decay_rate=decay, end_value=limit)


# --------------------------------------------------------------------------------------------------
# The wrapper
# --------------------------------------------------------------------------------------------------


class TellMetrics(NamedTuple):
    """What one generation reports, on the maximisation scale (scalars)."""

    generation: jax.Array  # generations told so far, this one included
    mean_fitness: jax.Array  # mean over the population (NaN members ignored)
    std_fitness: jax.Array  # population spread
    best_fitness_in_generation: jax.Array
    best_fitness: jax.Array  # best raw fitness seen so far


class GenerationOutput(NamedTuple):
    """What `Strategy.generation` returns next to the new state."""

    metrics: TellMetrics
    fitness: jax.Array  # [P] raw fitness of this generation's members
    aux: PyTree  # fitness_fn's per-member metrics


@struct.dataclass
class Strategy:
    """An evosax 0.3 algorithm and its parameters, with pure ask/tell on the maximisation scale.

    Build it with `make_strategy`. The state is evosax's own state dataclass (a pytree).
    """

    params: Any  # evosax Params (pytree leaves: traced)
    algorithm: EvolutionaryAlgorithm = struct.field(pytree_node=False)
    name: str = struct.field(pytree_node=False)
    antithetic: bool = struct.field(pytree_node=False)

    @property
    def popsize(self) -> int:
        return self.algorithm.population_size

    @property
    def num_dims(self) -> int:
        return self.algorithm.num_dims

    @property
    def is_population_based(self) -> bool:
        return isinstance(self.algorithm, PopulationBasedAlgorithm)

    def init(self, key: jax.Array, mean: PyTree | None = None) -> Any:
        """The initial state, centred on `mean` (default: zeros, the reference's zero-mean start; the meta
        tasks pass their own start, e.g. `lpo_init()`, the PPO-clip start).

        SimpleGA keeps a population, not a mean: it starts as P copies of `mean`, not yet evaluated.
        """
        if mean is None:
            mean = jax.tree.map(jnp.zeros_like, self.algorithm.solution)
        if self.is_population_based:
            population = jax.tree.map(lambda x: jnp.broadcast_to(x, (self.popsize, *jnp.shape(x))), mean)
            unevaluated = jnp.full((self.popsize,), jnp.inf)  # evosax scale: worst possible
            return self.algorithm.init(key, population, unevaluated, self.params)
        return self.algorithm.init(key, mean, self.params)

    def ask(self, key: jax.Array, state: Any) -> tuple[PyTree, Any]:
        """Sample a population: a pytree like the solution with a leading [P] axis on every leaf."""
        return self.algorithm.ask(key, state, self.params)

    def tell(self, key: jax.Array, population: PyTree, fitness: jax.Array, state: Any) -> tuple[Any, TellMetrics]:
        """Update the state with the population's fitness [P] (higher is better; NaN = failed)."""
        state, _ = self.algorithm.tell(key, population, -fitness, state, self.params)
        valid = ~jnp.isnan(fitness)
        metrics = TellMetrics(
            generation=jnp.asarray(state.generation_counter),
            mean_fitness=jnp.nanmean(fitness),
            std_fitness=jnp.nanstd(fitness),
            best_fitness_in_generation=jnp.max(jnp.where(valid, fitness, -jnp.inf)),
            best_fitness=-state.best_fitness,
        )
        return state, metrics

    def generation(self, fitness_fn: FitnessFn, key: jax.Array, state: Any) -> tuple[Any, GenerationOutput]:
        """ask → fitness_fn(population, key) → tell, as one pure function (jit it with `fitness_fn`
        closed over; `lax.scan` it over generation keys)."""
        key_ask, key_eval, key_tell = jax.random.split(key, 3)
        population, state = self.ask(key_ask, state)
        fitness, aux = fitness_fn(population, key_eval)
        state, metrics = self.tell(key_tell, population, fitness, state)
        return state, GenerationOutput(metrics=metrics, fitness=fitness, aux=aux)

    def center(self, state: Any) -> PyTree:
        """The solution to use now: the distribution mean (OpenES, SNES, CMA-ES), or the best member
        of the last evaluated population (SimpleGA)."""
        if self.is_population_based:
            return self.algorithm.get_best_solution(state)
        return self.algorithm.get_mean(state)

    def best(self, state: Any) -> tuple[PyTree, jax.Array]:
        """(best solution seen so far, its fitness on the maximisation scale); NaN leaves and −inf
        before the first `tell`."""
        return self.algorithm._unravel_solution(state.best_solution), -state.best_fitness


def make_strategy(name: str, popsize: int, solution: int | PyTree, **overrides: Any) -> Strategy:
    """Build an evolution strategy by name with the reference's presets (see `PRESETS`).

    Args:
      name: one of `STRATEGIES` ("open_es" is the default of `sparqrl meta`).
      popsize: population size P (even for open_es: evosax's OpenES needs it, and antithetic
        sampling pairs each perturbation with its mirror).
      solution: the number of dimensions, or an example pytree of meta-parameters (its structure
        and shapes; the population comes back in this structure).
      overrides: preset fields to change: open_es lr, lr_decay, lr_limit, sigma, sigma_decay,
        sigma_limit, antithetic, fitness_shaping; snes lr, sigma, fitness_shaping; cma_es sigma;
        simple_ga sigma, sigma_decay, sigma_limit, crossover_rate, elite_ratio, fitness_shaping.
    Raises:
      ConfigError (one line) for an unknown name or override, a bad value, or a population that is
      too small or odd where it must be even. Nothing is traced before these checks.
    """
    if name not in PRESETS:
        raise ConfigError(
            f"strategy={name!r} is not allowed: must be one of {', '.join(STRATEGIES)}{close_matches(name, STRATEGIES)}"
        )
    for field, value in overrides.items():
        if field not in PRESETS[name]:
            raise ConfigError(
                f"unknown setting {field!r} for strategy {name}: allowed are {', '.join(PRESETS[name])}"
                f"{close_matches(field, PRESETS[name])}"
            )
        _check_override(name, field, value)
    settings = {**PRESETS[name], **overrides}
    if not is_int(popsize) or popsize < 2:
        raise ConfigError(f"popsize={popsize!r} is not allowed: must be an integer >= 2")
    antithetic = bool(settings.get("antithetic", False))
    if name == "open_es" and popsize % 2:
        why = "with antithetic sampling (each perturbation is paired with its mirror)" if antithetic else (
            "for open_es (evosax 0.3's OpenES requires it even without antithetic sampling)"
        )
        raise ConfigError(f"popsize={popsize} is not allowed: must be even {why}; use {popsize - 1} or {popsize + 1}")
    if settings.get("fitness_shaping") == "pair_rank" and not antithetic:
        raise ConfigError("fitness_shaping='pair_rank' is not allowed: needs antithetic=True (it ranks mirrored pairs)")

    if is_int(solution):
        if solution < 1:
            raise ConfigError(f"num_dims={solution!r} is not allowed: must be >= 1")
        solution = jnp.zeros((solution,), jnp.float32)
    shaping = _SHAPING_FNS[settings.get("fitness_shaping", "weights")]

    algorithm: EvolutionaryAlgorithm
    if name == "open_es":
        lr = _decaying(settings["lr"], settings["lr_decay"], settings["lr_limit"], "lr")
        algorithm = Open_ES(
            population_size=popsize,
            solution=solution,
            use_antithetic_sampling=antithetic,
            optimizer=optax.adam(lr, b1=0.99, b2=0.999, eps=1e-8),
            std_schedule=_decaying(settings["sigma"], settings["sigma_decay"], settings["sigma_limit"], "sigma"),
            fitness_shaping_fn=shaping,
        )
        params = algorithm.default_params
    elif name == "snes":
        algorithm = SNES(popsize, solution, optimizer=optax.sgd(settings["lr"]), fitness_shaping_fn=shaping)
        params = algorithm.default_params.replace(std_init=jnp.asarray(settings["sigma"], jnp.float32))
    elif name == "cma_es":
        algorithm = CMA_ES(popsize, solution)
        params = algorithm.default_params.replace(std_init=jnp.asarray(settings["sigma"], jnp.float32))
    else:
        algorithm = SimpleGA(
            popsize,
            solution,
            std_schedule=_decaying(settings["sigma"], settings["sigma_decay"], settings["sigma_limit"], "sigma"),
            fitness_shaping_fn=shaping,
        )
        algorithm.elite_ratio = settings["elite_ratio"]
        params = algorithm.default_params.replace(crossover_rate=settings["crossover_rate"])
    return Strategy(params=params, algorithm=algorithm, name=name, antithetic=antithetic)

"""Meta tasks: what `sparqrl meta TASK` evolves, each a pair of pure functions (DESIGN, "A meta task is
a pure function"; reference `meta_mfos_act.md` §8.1 item 1):

    init(key) -> genome                         the start of the search (a pytree)
    fitness(genome, key) -> (scalar, metrics)   trains an inner learner from scratch, returns a number to
                                                maximise and a flat dict of scalar metrics

`fitness` is jittable and vmappable over genomes and keys, so the outer loop (`sparqrl.meta.run`) runs
population x inner seeds as one compiled program.

Tasks:
  value-loss  the learned value loss of PPO (`objectives.ValueLossParams`, started at L2), fitness the mean
              episode return over the whole inner run (PureJaxRL walkthrough, `purejaxrl_dpo_evosax.md` §6)
  lpo         the LPO drift network of PPO (`objectives.LPOParams`, started at PPO-clip), fitness the final
              return: the mean return of episodes finished in the last 10 % of updates (§5.4)
  hparams     the traced hyperparameters of any algorithm (`Config.TRACED`), started at the config's
              values, searched in log space (positive fields) or logit space (fields in [0, 1])
  mfos        an M-FOS meta-policy in a matrix game against a learning opponent (`sparqrl.meta.mfos`)
  act         an adversarial cheap-talk adversary against PPO victims (`sparqrl.meta.act`)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from sparqrl.algos import get_algorithm
from sparqrl.algos.base import EPISODE_COUNT, EPISODE_RETURN_SUM, make_hparams_train_fn, make_train_fn, traced_fields
from sparqrl.algos.ppo import objectives
from sparqrl.config import ConfigError, close_matches, fail

TASKS = ("value-loss", "lpo", "hparams", "mfos", "act")
FITNESS = ("lifetime", "final")
FINAL_FRACTION = 0.1
"""`final` fitness: the episodes finished in this last fraction of the inner run's updates (at least one)."""


class MetaTask(NamedTuple):
    """A meta task: pure `init` and `fitness`, and the static facts the outer loop reports."""

    name: str
    init: Callable[[jax.Array], Any]
    fitness: Callable[[Any, jax.Array], tuple[jax.Array, dict[str, jax.Array]]]
    env_steps: int
    """Inner env steps of one `fitness` call (one member, one seed)."""
    algo: str
    inner_config: Any
    """The inner algorithm's resolved config (recorded in config.json)."""
    describe_genome: Callable[[Any], dict[str, float]] | None = None
    """genome -> readable values (hparams: field -> value), for best_hparams.json; None for networks."""
    columns: tuple[str, ...] = ("lifetime_return", "final_return")
    """The fitness metrics written to fitness.csv and TensorBoard (their population mean per generation)."""
    final_evaluation: Callable[[Any, jax.Array], dict[str, Any]] | None = None
    """(centre genome, key) -> entries added to summary.json at the end of the run (mfos: each side's return)."""


# --------------------------------------------------------------------------------------------------
# Fitness from the inner run's metrics
# --------------------------------------------------------------------------------------------------


def lifetime_return(metrics: dict[str, jax.Array]) -> jax.Array:
    """Mean over the run's updates of each update's mean episode return (updates in which no episode
    finished are skipped): the reference's mean of `returned_episode_returns` over the whole run, which
    rewards learning fast (§6). metrics: [num_updates] per key. NaN if no episode ever finished."""
    count, total = metrics[EPISODE_COUNT], metrics[EPISODE_RETURN_SUM]
    per_update = total / jnp.maximum(count, 1.0)
    finished = count > 0
    return jnp.where(jnp.any(finished), jnp.sum(jnp.where(finished, per_update, 0.0)) /
                     jnp.maximum(jnp.sum(finished), 1), jnp.nan)


def final_return(metrics: dict[str, jax.Array], fraction: float = FINAL_FRACTION) -> jax.Array:
    """Mean return of the episodes finished in the last `fraction` of the updates (at least the last
    update). NaN if none finished there (the strategy counts NaN as the worst fitness)."""
    updates = metrics[EPISODE_COUNT].shape[0]
    last = max(1, int(math.ceil(updates * fraction)))
    count = jnp.sum(metrics[EPISODE_COUNT][-last:])
    total = jnp.sum(metrics[EPISODE_RETURN_SUM][-last:])
    return jnp.where(count > 0, total / jnp.maximum(count, 1.0), jnp.nan)


FITNESS_FNS = {"lifetime": lifetime_return, "final": final_return}


def _score(metrics: dict[str, jax.Array], fitness: str) -> tuple[jax.Array, dict[str, jax.Array]]:
    value = FITNESS_FNS[fitness](metrics)
    return value, {"lifetime_return": lifetime_return(metrics), "final_return": final_return(metrics)}


# --------------------------------------------------------------------------------------------------
# PPO with a learned rule (value-loss, lpo)
# --------------------------------------------------------------------------------------------------


def _ppo_learned_task(name: str, env: Any, config: Any, fitness: str, field: str, rule: str,
                      init: Callable[[jax.Array], Any], slot: str) -> MetaTask:
    from sparqrl.algos import ppo

    config = dataclasses.replace(config, **{field: rule})
    config = config.validate(env)
    # Built once on the host, so a bad inner config is a one-line error before anything is traced.
    ppo.make_algorithm(config, env, objectives.MetaParams(**{slot: init(None)}))

    def fitness_fn(genome: Any, key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        algo = ppo.make_algorithm(config, env, objectives.MetaParams(**{slot: genome}))
        _, metrics = make_train_fn(algo)(key)
        return _score(metrics, fitness)

    return MetaTask(name=name, init=init, fitness=fitness_fn, env_steps=config.num_updates * config.batch_size,
                    algo="ppo", inner_config=config)


def make_value_loss_task(env: Any, config: Any, fitness: str = "lifetime") -> MetaTask:
    """Evolve PPO's value loss: genome `ValueLossParams` (the L2 start), PPO with value_loss 'learned'.

    config: the inner PPO config (its value_loss is replaced). fitness: 'lifetime' (default, §6) or 'final'."""
    return _ppo_learned_task("value-loss", env, config, fitness, "value_loss", "learned", objectives.value_loss_init,
                             "value_loss")


def make_lpo_task(env: Any, config: Any, fitness: str = "final") -> MetaTask:
    """Evolve PPO's drift: genome `LPOParams` (the PPO-clip start), PPO with objective 'lpo' (any gymnax
    or brax env, discrete or continuous actions). fitness: 'final' (default, §5.4) or 'lifetime'."""
    return _ppo_learned_task("lpo", env, config, fitness, "objective", "lpo", objectives.lpo_init, "lpo")


# --------------------------------------------------------------------------------------------------
# Hyperparameters of any algorithm (hparams)
# --------------------------------------------------------------------------------------------------

UNIT_FIELDS = ("gamma", "gae_lambda", "tau", "epsilon_start", "epsilon_finish")
"""Fields that must lie in [0, 1]: searched in logit space, value = sigmoid(logit(start) + g)."""
UNIT_MARGIN = 1e-4
"""A start of exactly 0 or 1 (e.g. gamma 1, tau 1) is moved this far inside, so its logit is finite."""


class FieldMap(NamedTuple):
    """How genome entry g maps to a field's value: 'log' start * exp(g), 'logit' sigmoid(logit(start) + g),
    'linear' start + g * scale (fields that may be <= 0, e.g. SAC's target_entropy_per_dim)."""

    name: str
    kind: str
    start: float
    scale: float = 1.0


def field_maps(config: Any, fields: tuple[str, ...]) -> tuple[FieldMap, ...]:
    """The map of each field; the genome's zero is the config's own values (except for a [0, 1]-field
    that starts at exactly 0 or 1, which starts UNIT_MARGIN inside)."""
    maps = []
    for name in fields:
        start = float(getattr(config, name))
        if name in UNIT_FIELDS:
            maps.append(FieldMap(name, "logit", min(max(start, UNIT_MARGIN), 1.0 - UNIT_MARGIN)))
        elif start > 0:
            maps.append(FieldMap(name, "log", start))
        else:
            maps.append(FieldMap(name, "linear", start, max(abs(start), 1.0)))
    return tuple(maps)


def genome_values(maps: tuple[FieldMap, ...], genome: jax.Array) -> dict[str, jax.Array]:
    """genome [F] -> field -> value (float32 scalars, valid by construction)."""
    values = {}
    for i, m in enumerate(maps):
        g = genome[i]
        if m.kind == "log":
            values[m.name] = m.start * jnp.exp(g)
        elif m.kind == "logit":
            values[m.name] = jax.nn.sigmoid(math.log(m.start / (1.0 - m.start)) + g)
        else:
            values[m.name] = m.start + g * m.scale
    return {k: v.astype(jnp.float32) for k, v in values.items()}


def parse_fields(config: Any, fields: str) -> tuple[str, ...]:
    """'lr,clip_eps' -> ('lr', 'clip_eps'); '' -> every traced field. Unknown names: one-line error."""
    allowed = traced_fields(config)
    names = tuple(f.strip() for f in fields.split(",") if f.strip()) if fields else allowed
    for name in names:
        if name not in allowed:
            fail("fields", name, f"must be traced fields of {type(config).__module__.split('.')[-2]}: "
                 f"{', '.join(allowed)}{close_matches(name, allowed)}")
    if len(set(names)) != len(names):
        fail("fields", fields, "names a field twice")
    if not names:
        fail("fields", fields, "must name at least one field")
    return names


def make_hparams_task(algo_name: str, env: Any, config: Any, fields: tuple[str, ...], fitness: str = "final"
                      ) -> MetaTask:
    """Evolve the traced hyperparameters `fields` of `algo_name` (genome: float32 [F], zero = the config's
    values). The inner run is `make_train(config, env)(key, hparams)` of that algorithm."""
    module = get_algorithm(algo_name)
    config = config.validate(env)
    maps = field_maps(config, fields)
    train = make_hparams_train_fn(module.make_algorithm, config, env)
    algo = module.make_algorithm(config, env)  # host checks, static facts

    def init(key: jax.Array | None) -> jax.Array:
        del key
        return jnp.zeros((len(maps),), jnp.float32)

    def fitness_fn(genome: jax.Array, key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        _, metrics = train(key, genome_values(maps, genome))
        return _score(metrics, fitness)

    def describe(genome: Any) -> dict[str, float]:
        return {k: float(v) for k, v in genome_values(maps, jnp.asarray(genome)).items()}

    return MetaTask(name="hparams", init=init, fitness=fitness_fn,
                    env_steps=algo.num_updates * algo.env_steps_per_update, algo=algo_name, inner_config=config,
                    describe_genome=describe)


def check_task(task: str) -> None:
    if task not in TASKS:
        raise ConfigError(f"task={task!r} is not allowed: must be one of {', '.join(TASKS)}{close_matches(task, TASKS)}")

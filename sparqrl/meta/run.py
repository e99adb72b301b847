"""The outer loop of `sparqrl meta`: an evolution strategy over a meta task's inner trainings.

One generation is ONE compiled program: ask -> fitness of population x inner seeds (vmapped) -> tell
(`generation_program`); with several devices, two: the population split over them, the host gathering the
fitness before tell, so that no program waits for another device. The host
loop around it is the session of every run (`sparqrl.runners.session`: lock, checkpoints, Ctrl-C, failed
writes, progress, energy) with one generation per chunk (`MetaDriver`); it writes fitness.csv, TensorBoard
scalars and a checkpoint after every generation (`MetaRecords`); `--resume DIR` goes on from the checkpoint
and ends bit-identical to an uninterrupted run (the strategy state is saved exactly, and generation g's key
is fold_in(seed, g)).

A run's folder (`sparqrl.runners.rundir`: manifest, `--overwrite` replaces only a sparqrl run):

  config.json          the meta config and the inner algorithm's resolved config
  fitness.csv          generation, mean, best of the generation, std, best so far, ...
  tensorboard/         the same scalars
  checkpoint/          the strategy state and running totals after each generation (the session's, orbax
                       with a checksum; an older sparqrl's checkpoint.npz is converted on --resume)
  best_meta_params.npz the strategy's centre (ES mean; SimpleGA: its best member): what
                       `--objective lpo:DIR` / `--value-loss learned:DIR` read
  best_member_params.npz  the best single member seen (its fitness is a noisy maximum)
  best_hparams.json    (hparams) the centre's and the best member's hyperparameters, as --set items, and the
                       inner config with the centre's values (`sparqrl train ALGO --load-config` runs it)
  fitness.png, learned.png, summary.json
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sparqrl import config as cfg, npzsafe
from sparqrl.algos import get_algorithm
from sparqrl.algos.ppo import objectives
from sparqrl.meta import tasks as meta_tasks
from sparqrl.meta.config import DEFAULT_ENV, DEFAULT_GENERATIONS, TASK_GENERATIONS, MetaConfig
from sparqrl.meta.strategies import (PRESETS, STRATEGIES, GenerationOutput, Strategy, make_strategy,
                                     member_keys)
from sparqrl.runfiles import open_nofollow, write_atomic
from sparqrl.runners.session import WholeChunks
from sparqrl.trust import NOTHING, Trust, require_trusted

CHECKPOINT = "checkpoint.npz"
"""Where a meta run of an older sparqrl kept its checkpoint (`convert_old_checkpoint`)."""
MAX_TOTALS_BYTES = 1 << 20
"""Bound on checkpoint.npz's running totals (a short JSON text) read from a folder."""
FITNESS_CSV = "fitness.csv"
BEST_MEMBER_FILE = "best_member_params.npz"
BEST_HPARAMS_FILE = "best_hparams.json"
FITNESS_COLUMNS = ["generation", "mean_fitness", "best_fitness", "std_fitness", "best_so_far", "median_fitness"]
"""fitness.csv's first columns; the task's own metrics (`MetaTask.columns`), env_steps and wall_time_s follow."""


# --------------------------------------------------------------------------------------------------
# Building a run: every check before anything is compiled or written
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Prepared:
    config: MetaConfig
    task: meta_tasks.MetaTask
    strategy: Strategy
    env: Any


MAX_MEMBERS = 65_536
MAX_FINAL_SEEDS = 1024
"""act's final evaluation trains its victims in one program after the whole run: 1,024 per side measure a mean
return to well under one point, and `check_memory`'s estimate (a lower bound) is not trusted further (65,536
CartPole victims passed it and ran out of memory at the end)."""
"""Bound on popsize and seeds, as on a train run's seeds; memory bounds their product (`check_memory`)."""
FINAL_EVALUATION = 0x7FFFFFFF
"""fold_in index of the final evaluation's key (no generation reaches it)."""
TASK_OPTIONS = {"mfos": ("game", "opponent", "trainer", "games"),
                "act": ("mode", "adversary", "n_dims", "victim", "final_seeds")}
"""Options that only one task reads: another task refuses them instead of ignoring them."""


DEFAULT_SEEDS = 2
"""Inner seeds per member where the task has no number of its own."""


def task_defaults(config: MetaConfig) -> MetaConfig:
    """`config` with what the command left unset (0 or empty) taken from its task's own settings, those its
    documented results were reached with (`mfos.ES_DEFAULTS` for the es trainer, `act.ES_DEFAULTS`: inner seeds,
    and open_es's sigma, lr and shaping, whose presets port other papers' runs), so the plain command reproduces
    them. The result is what config.json records, so a resumed run keeps them whatever later defaults become."""
    from sparqrl.meta import act, mfos

    own = {"mfos": mfos.ES_DEFAULTS, "act": act.ES_DEFAULTS}.get(config.task, {})
    if config.strategy != "open_es":
        own = {"seeds": own["seeds"]} if "seeds" in own else {}
    own = {"seeds": DEFAULT_SEEDS, **own}
    return dataclasses.replace(config, **{name: value for name, value in own.items() if not getattr(config, name)})


def strategy_overrides(config: MetaConfig) -> dict[str, Any]:
    """The strategy preset fields the meta config changes."""
    preset = PRESETS.get(config.strategy, {})
    overrides: dict[str, Any] = {}
    if "fitness_shaping" in preset:
        if config.fitness_shaping:
            overrides["fitness_shaping"] = config.fitness_shaping
        elif config.strategy != "cma_es":
            overrides["fitness_shaping"] = "centered_rank"
    elif config.fitness_shaping and config.fitness_shaping != "weights":
        cfg.fail("fitness_shaping", config.fitness_shaping, f"strategy {config.strategy} uses its own (weights)")
    if "antithetic" in preset:
        overrides["antithetic"] = config.antithetic
    for name in ("sigma", "lr"):
        value = getattr(config, name)
        if value:
            cfg.require(name in preset, name, value, f"strategy {config.strategy} has no {name}")
            overrides[name] = float(value)
    return overrides


def inner_config(config: MetaConfig, module: Any) -> Any:
    """The inner algorithm's config: its defaults (value-loss: PureJaxRL's walkthrough, num_steps 64),
    --set overrides, --steps."""
    base = module.Config()
    if config.task == "value-loss":
        base = dataclasses.replace(base, num_steps=64)
    if config.task == "act":
        from sparqrl.meta import act

        base = dataclasses.replace(base, **act.victim_defaults(config.env, config.victim))
    inner = cfg.override(base, cfg.parse_set(config.set))
    if config.steps:
        inner = dataclasses.replace(inner, total_timesteps=config.steps)
    cfg.check_numbers(inner)
    return inner


def prepare(config: MetaConfig) -> Prepared:
    """Check the meta config and build its task and strategy; one-line ConfigError for any bad input, the
    population's memory included."""
    prepared = _prepare(config)
    check_memory(prepared)
    return prepared


def check_memory(prepared: Prepared) -> None:
    """popsize x seeds inner trainings (and act's final_seeds victims) must fit the devices' memory: one
    training traced (never compiled or run), the values its program holds at the top level (its loop's carry,
    its stacked metrics) summed, times the trainings of a generation. A lower bound of what XLA needs, so only
    what cannot fit is refused, before anything is written (else XLA's out-of-memory traceback after the
    folder was)."""
    from sparqrl.runners.session import device_name, memory_bytes

    config, task = prepared.config, prepared.task
    if not isinstance(prepared.strategy, Strategy):  # M-FOS's PPO trainer: one learner
        return
    jaxpr = jax.make_jaxpr(task.fitness)(task.init(None), jax.random.PRNGKey(0)).jaxpr
    one = sum(math.prod(v.aval.shape) * v.aval.dtype.itemsize for e in jaxpr.eqns for v in e.outvars
              if hasattr(v.aval, "shape"))
    need, have = one * config.popsize * config.seeds, memory_bytes()
    cfg.require(need <= have, "popsize", config.popsize, f"with {config.seeds} seed(s): a generation's "
                f"{config.popsize * config.seeds:,} inner trainings need over {need / 2**30:,.1f} GiB, more than the "
                f"{have / 2**30:,.1f} GiB of memory of {device_name()}; lower popsize, seeds or the inner num_envs")
    if config.task == "act":  # its final evaluation trains final_seeds victims at once, after the whole run
        cfg.require(one * config.final_seeds <= have, "final_seeds", config.final_seeds, f"the final evaluation's "
                    f"{config.final_seeds:,} victims need over {one * config.final_seeds / 2**30:,.1f} GiB, more than "
                    f"the {have / 2**30:,.1f} GiB of memory of {device_name()}")


def _prepare(config: MetaConfig) -> Prepared:
    from sparqrl.envs import make_env
    from sparqrl.telemetry import validate_country, wandb_log

    meta_tasks.check_task(config.task)
    cfg.check_numbers(config)
    cfg.check_path("out", config.out)
    if config.strategy not in STRATEGIES:
        cfg.fail("strategy", config.strategy,
                 f"must be one of {', '.join(STRATEGIES)}{cfg.close_matches(config.strategy, STRATEGIES)}")
    for name in ("generations", "popsize", "seeds"):
        value, least = getattr(config, name), 1 if name == "popsize" else 0
        cfg.require(cfg.is_int(value) and value >= least, name, value,
                    "must be an integer >= 0 (0: the task's own)" if least == 0 else "must be an integer >= 1")
    config = dataclasses.replace(config, generations=config.generations
                                 or TASK_GENERATIONS.get(config.task, DEFAULT_GENERATIONS))
    for name in ("popsize", "seeds"):  # before the strategy is built: some hold popsize-long arrays
        cfg.require(getattr(config, name) <= MAX_MEMBERS, name, getattr(config, name), f"must be <= {MAX_MEMBERS:,} "
                    "(each is a whole inner training per generation)")
    cfg.require(config.steps >= 0, "steps", config.steps, "must be >= 0 (0: the inner config's own)")
    if config.fitness:
        cfg.require(config.task != "mfos", "fitness", config.fitness, "mfos's fitness is the meta-agent's return")
        cfg.one_of("fitness", config.fitness, meta_tasks.FITNESS)
    cfg.require(config.sigma >= 0 and math.isfinite(config.sigma), "sigma", config.sigma, "must be >= 0")
    cfg.require(config.lr >= 0 and math.isfinite(config.lr), "lr", config.lr, "must be >= 0")
    if config.task != "hparams":
        cfg.require(config.algo == "ppo", "algo", config.algo, f"task {config.task} evolves part of ppo: must be ppo")
        cfg.require(not config.fields, "fields", config.fields, "is for the hparams task only")
    cfg.require(config.games >= 0, "games", config.games, "must be >= 0 (0: the trainer's default)")
    for task, names in TASK_OPTIONS.items():
        for name in names if config.task != task else ():
            value = getattr(config, name)
            cfg.require(value == getattr(MetaConfig, name), name, value, f"is an option of task {task} only")
    if config.energy:
        validate_country(config.country, "country")
    wandb_log.validate(config.wandb, config.wandb_mode)
    if config.wandb is not None:
        wandb_log.check_installed()
    if config.task == "mfos":
        return _prepare_mfos(config)
    if config.task == "act":
        from sparqrl.meta import act

        config = task_defaults(config)
        inner = inner_config(config, get_algorithm("ppo"))
        cfg.require(cfg.is_int(config.final_seeds) and 1 <= config.final_seeds <= MAX_FINAL_SEEDS, "final_seeds",
                    config.final_seeds, f"must be an integer from 1 to {MAX_FINAL_SEEDS:,} (victims of the final "
                    "evaluation, trained at once)")
        task = act.make_task(config.env, config.mode, config.adversary, config.n_dims, inner, config.fitness_kind,
                             config.final_seeds)
        strategy = make_strategy(config.strategy, config.popsize, task.init(None), **strategy_overrides(config))
        return Prepared(config=config, task=task, strategy=strategy, env=config.env)
    config = task_defaults(config)
    module = get_algorithm(config.algo)
    inner = inner_config(config, module)
    env = make_env(config.env)
    if config.task == "value-loss":
        task = meta_tasks.make_value_loss_task(env, inner, config.fitness_kind)
    elif config.task == "lpo":
        task = meta_tasks.make_lpo_task(env, inner, config.fitness_kind)
    else:
        fields = meta_tasks.parse_fields(inner, config.fields)
        task = meta_tasks.make_hparams_task(config.algo, env, inner, fields, config.fitness_kind)
    strategy = make_strategy(config.strategy, config.popsize, task.init(None), **strategy_overrides(config))
    return Prepared(config=config, task=task, strategy=strategy, env=env)


def _prepare_mfos(config: MetaConfig) -> Prepared:
    """mfos: the env is the matrix game (--env is not used), the inner config the meta-game's and trainer's."""
    from sparqrl.meta import mfos

    cfg.require(config.env == DEFAULT_ENV, "env", config.env, "is not used by mfos: choose the game with --game")
    cfg.require(not config.steps, "steps", config.steps, "is not used by mfos: a meta-episode is 100 meta-steps")
    cfg.one_of("trainer", config.trainer, mfos.TRAINERS)
    games = config.games or mfos.DEFAULT_GAMES[config.trainer]
    overrides = cfg.parse_set(config.set)
    for name in TASK_OPTIONS["mfos"]:
        cfg.require(name not in overrides, "set", f"{name}={overrides.get(name)}", f"use --{name} instead")
    lr = {"lr": mfos.SELF_PLAY_LR} if config.opponent == mfos.SELF else {}
    inner = cfg.override(mfos.MfosConfig(game=config.game, opponent=config.opponent, trainer=config.trainer,
                                         games=games, hidden=mfos.DEFAULT_HIDDEN[config.trainer], **lr), overrides)
    task = mfos.make_task(inner)
    if config.trainer == "ppo":
        for name in ("seeds", "popsize"):  # one learner: a generation's steps are its --games meta-episodes
            value = getattr(config, name)
            cfg.require(value in (1, getattr(MetaConfig, name)), name, value, "is for trainer es (ppo trains one "
                        "meta-policy on --games games per meta-episode)")
        for name in ("strategy", "sigma", "lr", "fitness_shaping", "antithetic"):  # the evolution strategy's options
            value = getattr(config, name)
            cfg.require(value == getattr(MetaConfig, name), name, value, "is for trainer es (ppo's own settings: "
                        "--set lr=..., --set clip_eps=..., ...)")
        config = dataclasses.replace(config, seeds=1, popsize=1)
        strategy: Any = mfos.make_trainer(task)
    else:
        config = task_defaults(config)
        strategy = make_strategy(config.strategy, config.popsize, task.init(None), **strategy_overrides(config))
    return Prepared(config=config, task=task, strategy=strategy, env=task.inner_config.game)


# --------------------------------------------------------------------------------------------------
# The generation program
# --------------------------------------------------------------------------------------------------


def population_fitness(task: meta_tasks.MetaTask, strategy: Strategy, seeds: int, devices: int = 1
                       ) -> Callable[[Any, jax.Array], tuple[jax.Array, dict[str, jax.Array]]]:
    """`(population [P], key) -> (fitness [P], metrics [P])`: each member trained on `seeds` inner seeds
    (antithetic pairs share their seeds), its fitness the mean over seeds (NaN seeds skipped); with `first`
    (traced), population [p] is members first..first+p-1 of the whole, with their keys. With
    `devices` > 1 the population axis is split over that many devices (shard_map; no collective), each device's
    fitness left there."""

    def members(population: Any, keys: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        per_seed = jax.vmap(jax.vmap(task.fitness, in_axes=(None, 0)), in_axes=(0, 0))(population, keys)
        fitness, metrics = per_seed  # [p, S]
        return jnp.nanmean(fitness, axis=1), jax.tree.map(lambda m: jnp.nanmean(m, axis=1), metrics)

    if devices > 1:
        mesh = Mesh(np.array(jax.devices()[:devices]), ("pop",))
        split = jax.shard_map(members, mesh=mesh, in_specs=(PartitionSpec("pop"), PartitionSpec("pop")),
                              out_specs=PartitionSpec("pop"), check_vma=False)
        whole = NamedSharding(mesh, PartitionSpec())

        def members(population: Any, keys: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
            # what the split takes (ask's population, the members' keys) is computed whole on every device: left
            # to GSPMD, their concatenations were split too, with all-to-alls between the devices
            return split(*jax.lax.with_sharding_constraint((population, keys), whole))

    def evaluate(population: Any, key: jax.Array, first: jax.Array | None = None
                 ) -> tuple[jax.Array, dict[str, jax.Array]]:
        keys = member_keys(key, strategy.popsize, strategy.antithetic)
        if first is not None:  # a slice of the population from member `first` on (`runners.workers`): its keys
            keys = jax.lax.dynamic_slice_in_dim(keys, first, jax.tree.leaves(population)[0].shape[0])
        return members(population, jax.vmap(lambda k: jax.random.split(k, seeds))(keys))

    return evaluate


class SplitGeneration(NamedTuple):
    """A generation whose population is split over several devices, as two programs with the host between
    them (`generation_program`): nothing inside a program waits for another device."""

    train: Callable  # (key, state) -> ((key_tell, population, state), (fitness [P], metrics [P]))
    tell: Callable  # (key_tell, population, state, fitness [P], metrics [P]) -> (state, GenerationOutput)


def generation_program(task: meta_tasks.MetaTask, strategy: Strategy, seeds: int, devices: int = 1
                       ) -> Callable[[jax.Array, Any], tuple[Any, Any]] | SplitGeneration:
    """`(key, state) -> (state, GenerationOutput)`: ask -> population x seeds inner trainings -> tell; or,
    for a trainer of its own (M-FOS's PPO), its `generation`. Compile it with `compile_generation`.

    With `devices` > 1, a `SplitGeneration`: ask and the members' trainings, each device's members its own and
    its fitness left there (no collective); the host gathers the fitness; tell runs whole on one device, as in a
    one-device run. In one program, GSPMD gathered the fitness and partitioned tell's sums over the devices: the
    strategy's state then rounded differently from a one-device run's (by up to 0.018 after 2 generations of a
    tiny `hparams` run, whose fitness was equal bit for bit), and a device that reached a collective first waited
    there inside the program (where a device once hung, its partner stuck in a batched QR:
    `nets.modules.orthogonal`)."""
    if not isinstance(strategy, Strategy):
        return strategy.generation
    evaluate = population_fitness(task, strategy, seeds, devices)
    if devices == 1:
        return lambda key, state: strategy.generation(evaluate, key, state)

    def train(key: jax.Array, state: Any) -> tuple[tuple[jax.Array, Any, Any], tuple[jax.Array, Any]]:
        key_ask, key_eval, key_tell = jax.random.split(key, 3)  # as `Strategy.generation` splits it
        population, state = strategy.ask(key_ask, state)
        return (key_tell, population, state), evaluate(population, key_eval)

    def tell(key_tell: jax.Array, population: Any, state: Any, fitness: jax.Array, aux: Any) -> tuple[Any, Any]:
        state, metrics = strategy.tell(key_tell, population, fitness, state)
        return state, GenerationOutput(metrics=metrics, fitness=fitness, aux=aux)

    return SplitGeneration(train, tell)


def compile_generation(generation: Callable[[jax.Array, Any], tuple[Any, Any]] | SplitGeneration, key: jax.Array,
                       state: Any) -> Callable[[jax.Array, Any], tuple[Any, Any]]:
    """`generation` (`generation_program`'s) compiled ahead of time for `key`'s and `state`'s shapes (`state` may
    be abstract): `(key, state) -> (state, GenerationOutput)`."""
    if not isinstance(generation, SplitGeneration):
        return jax.jit(generation).lower(key, state).compile()
    train = jax.jit(generation.train).lower(key, state).compile()
    on_one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    carried, trained = jax.eval_shape(generation.train, key, state)
    tell = jax.jit(generation.tell).lower(*jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=on_one), (*carried, *trained))).compile()

    def run(key: jax.Array, state: Any) -> tuple[Any, Any]:
        carried, trained = jax.device_get(train(key, jax.device_get(state)))  # the host waits, no device does
        return tell(*carried, *trained)

    return run


@dataclasses.dataclass(frozen=True)
class FitnessSlices:
    """A Ray worker's job (`runners.workers.Job`): the fitness of a slice of a generation's population, by
    `population_fitness` from the slice's first member on (the keys are the whole population's, sliced), over the
    worker's devices. Its programs are cached in the worker's XLA persistent compilation cache."""

    config: MetaConfig  # a prepared one (`Prepared.config`)
    compile_cache: bool = True

    @property
    def key(self) -> Any:
        return ("meta", self.config)

    def build(self) -> dict[str, Any]:
        return {"prepared": _prepare(self.config), "programs": {}}  # (memory: the driver checked the population)

    def run(self, built: dict[str, Any], population: Any, key: np.ndarray, first: np.ndarray) -> Any:
        prepared, size = built["prepared"], len(jax.tree.leaves(population)[0])
        devices = population_devices(size)
        if devices not in built["programs"]:  # jit: compiled once per slice shape
            built["programs"][devices] = jax.jit(population_fitness(prepared.task, prepared.strategy,
                                                                    prepared.config.seeds, devices))
        return jax.device_get(built["programs"][devices](population, key, first))


def worker_fitness(prepared: Prepared, pool: Any) -> Callable[[Any, jax.Array], tuple[jax.Array, Any]]:
    """`population_fitness`'s `(population [P], key) -> (fitness [P], metrics [P])`, each contiguous slice of the
    population a task of `pool` (`runners.workers.Pool`), called back from inside the generation program (ask and
    tell stay in it, as in a single-process run)."""
    from sparqrl.runners.workers import slices

    config = prepared.config
    job, local = FitnessSlices(config), population_fitness(prepared.task, prepared.strategy, config.seeds)
    parts = slices(config.popsize, pool.workers)

    def on_host(population: Any, key: np.ndarray) -> Any:
        results = pool.map([(job, (jax.tree.map(lambda x: x[a:b], population), key, np.int32(a))) for a, b in parts])
        return jax.tree.map(lambda *xs: np.concatenate(xs), *results)

    def evaluate(population: Any, key: jax.Array) -> tuple[jax.Array, Any]:
        return jax.pure_callback(on_host, jax.eval_shape(local, population, key), population, key)

    return evaluate


def check_workers(prepared: Prepared, workers: Any) -> None:
    """Workers need a population (an evolution strategy's): M-FOS's PPO trainer trains one learner."""
    cfg.require(workers is None or isinstance(prepared.strategy, Strategy), "workers",
                getattr(workers, "count", None) or getattr(workers, "address", None),
                "spreads an evolution strategy's population: trainer ppo trains one meta-policy (use --trainer es)")


def generation_key(seed: int, generation: int) -> jax.Array:
    """Generation g's key depends on the seed and g only, so a resumed run draws the same keys."""
    return jax.random.fold_in(jax.random.PRNGKey(seed), generation)


def init_state(prepared: Prepared) -> Any:
    key = jax.random.fold_in(jax.random.PRNGKey(prepared.config.seed), 0x1A17)
    return prepared.strategy.init(key, prepared.task.init(key))


def population_devices(popsize: int) -> int:
    """The most devices (of those present) that divide the population evenly. On the CPU that is one unless
    XLA_FLAGS forces several host devices (the `sparqrl` command does on a multi-core CPU: `sparqrl.devices`).
    A member's keys and its inner trainings' shapes do not depend on it (`generation_program`)."""
    return max(d for d in range(1, jax.device_count() + 1) if popsize % d == 0)


# --------------------------------------------------------------------------------------------------
# Checkpoints: the session's (orbax, checksummed); a folder of an older sparqrl held checkpoint.npz
# --------------------------------------------------------------------------------------------------


def convert_old_checkpoint(rundir: Any, prepared: Prepared) -> None:
    """A meta run written before meta runs were sessions of the one host loop kept its checkpoint in
    checkpoint.npz (strategy state, generations done, running totals). Its content becomes the run's
    checkpoint, as the session writes it (with the checksum), then the npz goes; one that is not a meta
    checkpoint of this run is a one-line ConfigError, and nothing is changed."""
    from sparqrl.runners.checkpoint import Checkpointer

    path = rundir.path / CHECKPOINT
    if not path.is_file() or (rundir.path / "checkpoint").exists():
        return
    state, generation, totals = load_checkpoint(path, init_state(prepared))
    checkpointer = Checkpointer(rundir.claim("checkpoint"), finite=False)
    try:
        checkpointer.save(generation, state, {**totals, "chunks_done": generation, "updates_done": generation})
    finally:
        checkpointer.close()
    path.unlink()


def load_checkpoint(path: Path, like: Any) -> tuple[Any, int, dict[str, Any]]:
    """(state, generations done, running totals); the state's structure, shapes and dtypes are those of
    `like` (a fresh state), else a one-line ConfigError."""
    leaves, treedef = jax.tree.flatten(like)
    expected = {f"leaf_{i:04d}": (tuple(np.shape(leaf)), np.asarray(leaf).dtype) for i, leaf in enumerate(leaves)}

    def check(headers: dict[str, npzsafe.Header]) -> None:  # from the headers: no array is read before this
        found = {name: (h.shape, h.dtype) for name, h in headers.items() if name not in ("generation", "totals")}
        if found != expected:
            cfg.fail("resume", str(path.parent), f"holds a {path.name} of another strategy or task")
        scalar = {name: h.dtype.kind for name, h in headers.items() if h.shape == () and h.nbytes <= MAX_TOTALS_BYTES}
        if scalar.get("generation", "") not in tuple("iu") or scalar.get("totals") != "U":
            raise npzsafe.NpzError("its generation or totals are not those of a meta checkpoint")

    try:
        data = npzsafe.read_npz(path, check)
        generation = int(data["generation"])
        totals = json.loads(str(data["totals"]))
        if generation < 0 or not isinstance(totals, dict):
            raise ValueError("a negative generation or totals that are not a mapping")
    except cfg.ConfigError:
        raise
    except (OSError, ValueError) as error:
        cfg.fail("resume", str(path.parent), f"holds a damaged {path.name} ({type(error).__name__}: {error})")
    return jax.tree.unflatten(treedef, [jnp.asarray(data[name]) for name in expected]), generation, totals


def _truncate_rows(path: Path, generations: int) -> None:
    """Keep fitness.csv's whole rows up to `generations` (rows after the checkpoint are recomputed)."""
    if not path.exists():
        return
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return
    kept = [r for r in rows[1:] if len(r) == len(rows[0]) and r[0].isdigit() and int(r[0]) <= generations]
    text = io.StringIO(newline="")
    csv.writer(text).writerows([rows[0], *kept])
    write_atomic(path, text.getvalue())


# --------------------------------------------------------------------------------------------------
# The run folder
# --------------------------------------------------------------------------------------------------


def _config_json(prepared: Prepared) -> str:
    return json.dumps({"meta": cfg.to_dict(prepared.config), "inner": {"algo": prepared.task.algo,
                       "config": cfg.to_dict(prepared.task.inner_config)}}, indent=2, sort_keys=True)


def start_meta_dir(prepared: Prepared) -> Any:
    """A new run folder (`rundir.new_run_dir`: --overwrite replaces only a sparqrl run's files)."""
    from sparqrl.runners.rundir import new_run_dir

    return new_run_dir(prepared.config.out, prepared.config.overwrite, _config_json(prepared))


def open_meta_dir(path: str, trust: Trust = NOTHING) -> tuple[Any, MetaConfig]:
    """The meta run in `path` and its saved config, whose env's module must be one `trust` names
    (`sparqrl.trust`: a run folder is data)."""
    from sparqrl.runners.rundir import CONFIG, RunDir, read_manifest

    out = Path(path)
    cfg.require(out.is_dir(), "resume", path, "must be the output folder of a meta run (no such folder)")
    held = read_manifest(out)
    cfg.require(held is not None and (out / CONFIG).is_file(), "resume", path, "must be the output folder of a meta run")
    try:
        data = json.loads((out / CONFIG).read_text())
        config = cfg.from_dict(MetaConfig, data["meta"], str(out / CONFIG))
    except cfg.ConfigError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as error:
        cfg.fail("resume", path, f"is not a meta run, or its config.json is damaged ({type(error).__name__})")
    torsos = [(k, v) for k, v in cfg.parse_set(config.set).items() if k.endswith("network") and v.lower() != "none"]
    require_trusted(trust, out / CONFIG, env=config.env, uploads=config.wandb is not None and config.wandb_mode == "online",
                    networks=torsos)  # the inner config's own torsos (--set network=MODULE:ATTR)
    return RunDir(out, held[1]), config


# --------------------------------------------------------------------------------------------------
# The host loop
# --------------------------------------------------------------------------------------------------


def _save_best(rundir: Any, prepared: Prepared, state: Any) -> None:
    strategy, task = prepared.strategy, prepared.task
    center = jax.device_get(strategy.center(state))
    best, _ = strategy.best(state)
    best = jax.device_get(best)
    objectives.save_meta_params(rundir.claim(objectives.META_PARAMS_FILE), center)
    if np.all(np.isfinite(np.concatenate([np.ravel(x) for x in jax.tree.leaves(best)]))):
        objectives.save_meta_params(rundir.claim(BEST_MEMBER_FILE), best)
    if task.describe_genome is not None:
        values = task.describe_genome(center)
        # config.json's layout too, so that `sparqrl train ALGO --load-config best_hparams.json` runs it
        inner = dataclasses.replace(task.inner_config, **values)
        data = {"algo": task.algo, "hparams": values, "set": [f"{k}={v:.6g}" for k, v in values.items()],
                "config": cfg.to_dict(inner), "run": {"env": prepared.config.env}}
        if np.all(np.isfinite(np.asarray(best))):
            data["best_member"] = task.describe_genome(best)
        rundir.write_text(BEST_HPARAMS_FILE, json.dumps(data, indent=2))


def csv_columns(task: meta_tasks.MetaTask) -> list[str]:
    return [*FITNESS_COLUMNS, *task.columns, "env_steps", "wall_time_s"]


def _nanmean(values: np.ndarray) -> float:
    return float(np.nanmean(values)) if np.any(np.isfinite(values)) else math.nan


def generation_values(metrics: Any, fitness: np.ndarray, aux: dict[str, np.ndarray]) -> dict[str, float]:
    """A generation's fitness.csv values (all but its number, env steps and time): the strategy's metrics,
    the median of the members' finite fitness, the task's own metrics averaged over members."""
    finite = fitness[np.isfinite(fitness)]
    return {
        "mean_fitness": float(metrics.mean_fitness),
        "best_fitness": float(metrics.best_fitness_in_generation),
        "std_fitness": float(metrics.std_fitness),
        "best_so_far": float(metrics.best_fitness),
        "median_fitness": float(np.median(finite)) if finite.size else math.nan,
        **{name: _nanmean(np.asarray(values)) for name, values in aux.items()},
    }


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    return str(value)


class MetaDriver(WholeChunks):
    """A meta run as a `sparqrl.runners.session.Driver`: one generation per chunk and per "update", the env
    steps of all its inner trainings counted as one member's (the progress bar counts them all)."""

    members = 1
    member_names = ["the population"]
    startup_s = 0.0

    def __init__(self, prepared: Prepared, pool: Any = None):
        """`pool`: a `runners.workers.Pool` whose workers compute the population's fitness; None: this process."""
        config, task = prepared.config, prepared.task
        self.prepared, self.pool = prepared, pool
        self.bounds = list(range(1, config.generations + 1))
        self.env_steps_per_update = task.env_steps * config.popsize * config.seeds
        self.devices = population_devices(config.popsize)
        self.compile_time_s = 0.0
        self.compute_s = 0.0  # this session's time in the generation program
        self.generations_run = 0  # this session's
        self._program: Any = None
        self._state: Any = None

    def _shapes(self) -> Any:
        return jax.eval_shape(lambda: init_state(self.prepared))

    def abstract_state(self) -> Any:
        sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), self._shapes())

    def build(self) -> None:
        """Compile ahead of time, so compile time is measured apart from the generations."""
        start = time.perf_counter()
        config, strategy = self.prepared.config, self.prepared.strategy
        if self.pool is None:
            generation = generation_program(self.prepared.task, strategy, config.seeds, self.devices)
        else:
            evaluate = worker_fitness(self.prepared, self.pool)
            generation = lambda key, state: strategy.generation(evaluate, key, state)  # noqa: E731
        # placed by the program(s): its population may be split over devices (`population_devices`)
        self._program = compile_generation(generation, generation_key(config.seed, 0), self._shapes())
        self.compile_time_s += time.perf_counter() - start

    def init_state(self) -> Any:
        return init_state(self.prepared)

    def start(self, state: Any, updates_done: int, stop: Any) -> None:
        self._state = jax.device_get(state)  # a restored state is committed to one device; the program places it

    def run_chunk(self, chunk: int) -> tuple[Any, dict[str, Any]]:
        """Generation `chunk` (0-based); its values: fitness.csv's columns but the generation, env steps, time."""
        start = time.perf_counter()
        self._state, output = self._program(generation_key(self.prepared.config.seed, chunk), self._state)
        metrics, fitness, aux = jax.device_get((output.metrics, output.fitness, output.aux))
        self.compute_s += time.perf_counter() - start
        self.generations_run += 1
        return self._state, generation_values(metrics, np.asarray(fitness), aux)

    def restore_meta(self, meta: dict[str, Any]) -> None:
        done = int(meta["chunks_done"])
        cfg.require(done <= len(self.bounds), "generations", len(self.bounds),
                    f"must be >= the {done} generations the run in {self.prepared.config.out} has done")

    def close(self) -> None:
        pass


class MetaRecords:
    """A meta run's records (`sparqrl.runners.session.Records`): fitness.csv and TensorBoard's meta/ scalars
    per generation, the best meta-parameters after each, the plots and summary at the end."""

    resume_command = "sparqrl meta --resume"
    finite = False  # a member's training may fail (NaN fitness, skipped); the strategy state holds infinities

    def __init__(self, prepared: Prepared, driver: MetaDriver):
        self.prepared, self.driver = prepared, driver
        self.columns = csv_columns(prepared.task)
        self.rundir: Any = None
        self.csv_path: Path | None = None
        self.writers: list[Any] = []  # `sparqrl.telemetry.logger.ScalarWriter`s: TensorBoard's, W&B's

    def label(self) -> str:
        return f"meta {self.prepared.config.task} {run_label(self.prepared.config)}"

    def done_text(self, updates: int) -> str:
        return f"generation {updates}"

    def open(self, rundir: Any, chunks_done: int, updates_done: int, resuming: bool) -> None:
        from sparqrl.telemetry.logger import TensorBoardWriter  # (TensorBoard's modules: imported by a run only)
        from sparqrl.telemetry.wandb_log import WandbWriter

        self.csv_path = rundir.claim(FITNESS_CSV)
        _truncate_rows(self.csv_path, chunks_done)  # rows after the checkpoint are recomputed
        if not self.csv_path.exists() or self.csv_path.stat().st_size == 0:
            with open_nofollow(self.csv_path, "w") as f:
                csv.writer(f).writerow(self.columns)
        purge_step = chunks_done + 1 if chunks_done else None  # generations after the checkpoint are redone
        self.writers = [TensorBoardWriter(rundir.claim("tensorboard"), purge_step)]
        config = self.prepared.config
        if config.wandb is not None:
            rundir.claim("wandb")
            self.writers.append(WandbWriter(rundir.path, config.wandb, config.wandb_mode, lambda: rundir.files))
        self.rundir = rundir

    def chunk(self, chunk: int, env_step: int, elapsed: Callable[[], float], state: Any,
              per_seed: dict[str, Any]) -> str:
        row = {"generation": chunk + 1, **per_seed, "env_steps": env_step, "wall_time_s": round(elapsed(), 3)}
        assert self.csv_path is not None
        with open_nofollow(self.csv_path, "a") as f:
            csv.writer(f).writerow([_fmt(row[c]) for c in self.columns])
        scalars = {f"meta/{name}": float(row[name]) for name in self.columns[1:-2] if math.isfinite(row[name])}
        for writer in self.writers:
            writer.scalars(chunk + 1, scalars)
        _save_best(self.rundir, self.prepared, state)
        return f"{row['mean_fitness']:.4g}"

    def finish(self, rundir: Any, state: Any, totals: Any) -> dict[str, Any]:
        from sparqrl.meta.plots import plot_fitness, plot_learned

        config, task, strategy = self.prepared.config, self.prepared.task, self.prepared.strategy
        summary = self._summary(totals)
        if task.final_evaluation is not None:
            if config.progress:  # it compiles and runs after the bar's 100 % (mfos: ~14 s on a CPU)
                from sparqrl.runners.session import notify

                notify(f"final evaluation of the evolved centre ({config.task}): compiling and running it")
            summary.update(task.final_evaluation(strategy.center(state), generation_key(config.seed, FINAL_EVALUATION)))
        trained_by = ("PPO" if not isinstance(strategy, Strategy) else
                      f"{config.strategy}, population {config.popsize} x {config.seeds} seeds")
        assert self.csv_path is not None
        plot_fitness(self.csv_path, rundir.claim("fitness.png"),
                     f"meta {config.task} on {run_label(config)} ({trained_by})")
        plot_learned(self.prepared, jax.device_get(strategy.center(state)), rundir.claim("learned.png"), summary)
        return summary

    def _summary(self, totals: Any) -> dict[str, Any]:
        from sparqrl.runners.session import device_name

        config, driver = self.prepared.config, self.driver
        ran, compute_s = driver.generations_run, driver.compute_s
        assert self.csv_path is not None
        best_fitness, final_mean = _fitness_summary(self.csv_path)
        return {
            "task": config.task,
            "env": run_label(config),
            "algo": self.prepared.task.algo,
            "strategy": config.strategy,
            "generations": config.generations,
            "popsize": config.popsize,
            "seeds": config.seeds,
            "steps": self.prepared.task.env_steps,
            "fitness": config.fitness_kind,
            "best_fitness": best_fitness,
            "final_mean_fitness": final_mean,
            "wall_time_s": totals.wall_time_s,
            "compile_time_s": totals.compile_time_s,
            "env_steps": config.generations * driver.env_steps_per_update,
            "env_steps_per_s": ran * driver.env_steps_per_update / compute_s if compute_s > 0 else None,
            "generation_time_s": compute_s / ran if ran else None,
            "device": device_name(),
            "devices_used": driver.devices,
            **({} if driver.pool is None else {"workers": driver.pool.workers}),
            **totals.energy,
        }

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


def run_meta(prepared: Prepared, rundir: Any, *, resuming: bool,
             on_generation: Callable[[int], None] | None = None, workers: Any = None) -> dict[str, Any]:
    """Run (or go on with) the meta run in `rundir`, whose writer's lock this process holds (released at
    the end), as a session of the one host loop (`sparqrl.runners.session`); returns summary.json's content.

    on_generation(g): called after generation g (1-based) is logged and checkpointed (tests stop a run
    there by raising). workers: a checked `runners.workers.Workers` (`check_workers`): the population's fitness
    is computed by Ray workers, a slice each; None: in this process."""
    if workers is None:
        return _run_meta(prepared, rundir, resuming, on_generation, None)
    from sparqrl.runners.workers import worker_session

    with worker_session(workers) as pool:  # first: Ray forks its processes before the session's threads start
        return _run_meta(prepared, rundir, resuming, on_generation, pool)


def _run_meta(prepared: Prepared, rundir: Any, resuming: bool, on_generation: Callable[[int], None] | None,
              pool: Any) -> dict[str, Any]:
    from sparqrl.runners.run_config import RunConfig
    from sparqrl.runners.session import run_session

    config = prepared.config
    driver = MetaDriver(prepared, pool)
    # every generation is checkpointed (one costs far less than a generation), none is evaluated
    run = RunConfig(env=run_label(config), progress=config.progress, energy=config.energy, country=config.country,
                    eval_every=0, checkpoint_every=1, checkpoint_interval_s=0.0)
    hook = None if on_generation is None else (lambda chunks, _values: on_generation(chunks))
    return run_session(rundir, run, "meta", driver, resuming=resuming, on_chunk=hook,
                       records=MetaRecords(prepared, driver))


def run_label(config: MetaConfig) -> str:
    return f"{config.game} vs {config.opponent}" if config.task == "mfos" else config.env


def _fitness_summary(csv_path: Path) -> tuple[float | None, float | None]:
    with csv_path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return None, None
    best = rows[-1]["best_so_far"]
    mean = rows[-1]["mean_fitness"]
    return (float(best) if best else None), (float(mean) if mean else None)


def train_meta(config: MetaConfig, on_generation: Callable[[int], None] | None = None) -> dict[str, Any]:
    """A new meta run: check everything, make the folder, run."""
    prepared = prepare(config)
    rundir = start_meta_dir(prepared)
    return run_meta(prepared, rundir, resuming=False, on_generation=on_generation)


def resume_meta(path: str, generations: int | None = None, progress: bool | None = None,
                on_generation: Callable[[int], None] | None = None, trust: Trust = NOTHING,
                energy: bool | None = None, workers: Any = None) -> dict[str, Any]:
    """Go on with the meta run in `path` from its checkpoint (optionally to more `generations`; `progress`,
    `energy`: this session's, None: the run's). `trust`: the modules the command names; the module of a
    `jax:MODULE:ATTR` env the folder names must be among them. `workers`: this session's (`run_meta`)."""
    rundir, config = open_meta_dir(path, trust)
    changes: dict[str, Any] = {"out": str(path)}
    for name, value in (("generations", generations), ("progress", progress), ("energy", energy)):
        if value is not None:
            changes[name] = value
    summary = rundir.path / "summary.json"
    if summary.is_file() and generations in (None, config.generations):
        return json.loads(summary.read_text())  # finished: left as it is
    config = dataclasses.replace(config, **changes)
    rundir.lock()  # the one writer from here on (run_meta releases it)
    try:
        prepared = prepare(config)
        check_workers(prepared, workers)
        convert_old_checkpoint(rundir, prepared)
        if generations is not None and (rundir.path / "summary.json").exists():
            (rundir.path / "summary.json").unlink()  # no longer finished: more generations follow
        rundir.write_text("config.json", _config_json(prepared))
    except BaseException:
        rundir.release()
        raise
    return run_meta(prepared, rundir, resuming=True, on_generation=on_generation, workers=workers)

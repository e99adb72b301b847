"""`sparqrl pbt`: population-based training (Jaderberg et al. 2017, arXiv 1711.09846) as ONE compiled program.

The members of a population train side by side, vmapped, as a sweep's settings do (`anakin`); their
hyperparameters are traced inputs, so the population's values live in the training state and change
between intervals without compiling again (Flajolet et al. 2022: the population in one JAX program, its
exploit and explore steps array operations). One interval of `--interval` learner updates is one chunk
of the session loop; at the end of each chunk but the last, inside the same compiled program:

  score    each member's mean return over the episodes that ended during the interval (`SCORE`); a member
           with no finished episode ranks below every member with one
  exploit  truncation selection: each member of the bottom quarter (ranked by score, ties by index) picks a
           member of the top quarter uniformly at random and, if that one scored strictly higher, copies its
           learner (network parameters, optimizer state, normaliser, replay buffer) and hyperparameters;
           its environments, their observations and its own random key stay its own
  explore  per field of a member that copied: with probability `RESAMPLE_PROB` a value drawn afresh from the
           field's range (log-uniform where the range is positive, else uniform), otherwise the copied value
           times 0.8 or 1.2 (even odds), clipped to the range

A field's range is `--range FIELD=LOW:HIGH` (both ends must pass the config's own checks) or, by default,
[value / 10, value * 10] around the config's value, narrowed to what the config's checks accept (found by
bisection against the validator: gae_lambda's upper end is 1). The first population is drawn from the ranges
as `sparqrl sweep --random FIELD=log|lin:LOW:HIGH --samples N --seed S` draws its settings: the same seed gives
a random search over the same starting points. The run folder holds a train run's files (metrics.csv per
member), pbt.csv, pbt.png and best/: the member with the best final evaluation as an ordinary run folder
(one seed, its final hyperparameters as its config) that `eval`, `load`, `export` and `--resume` take.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sparqrl import config as cfg, presets
from sparqrl.algos.base import HParams, hparams_of, traced_fields, with_hparams
from sparqrl.envs import is_host_env
from sparqrl.envs.custom import program_key
from sparqrl.runners import anakin, sweep
from sparqrl.runners.checkpoint import Checkpointer
from sparqrl.runners.programs import Program, build_program, run_once_options
from sparqrl.runners.rundir import CONFIG, SUMMARY, RunDir, new_run_dir, open_run_dir
from sparqrl.runners.run_config import RunConfig
from sparqrl.runners.session import (ChunkHook, TrainRecords, check_memory, device_name, finished_summary,
                                     notify, program_store, run_session, use_compile_cache)
from sparqrl.trust import NOTHING, Trust, require_trusted

DEFAULT_POPULATION = 8
MIN_POPULATION = 4
"""The smallest population whose bottom and top quarters are each a member."""
RESAMPLE_PROB = 0.25
"""Explore: the chance that a copied field is drawn afresh from its range instead of perturbed."""
PERTURB = (0.8, 1.2)
"""Explore: the factors a copied field is multiplied by (even odds), as in Jaderberg et al."""
DEFAULT_SPAN = 10.0
"""A field without --range varies within [value / DEFAULT_SPAN, value * DEFAULT_SPAN] (what its checks allow)."""
SCORE = "mean return of the member's episodes that ended in the interval"
BEST = "best"


@dataclasses.dataclass(frozen=True)
class PBTConfig:
    """What a PBT run adds to a train run (config.json's "pbt")."""

    fields: tuple[str, ...]
    """The traced fields the population varies."""
    low: tuple[float, ...]
    """Each field's lowest value."""
    high: tuple[float, ...]
    """Each field's highest value."""
    population: int
    """Members trained side by side."""
    interval: int
    """Learner updates between two exploit/explore steps."""
    resample_prob: float = RESAMPLE_PROB
    """The chance that an explored field is resampled rather than perturbed."""

    def log_scale(self) -> tuple[bool, ...]:
        """Per field: drawn log-uniformly (a positive range) or uniformly."""
        return tuple(lo > 0 for lo in self.low)


# ---- set-up: fields, ranges, population -----------------------------------------------------------


def parse_fields(algo_config: Any, text: str) -> tuple[str, ...]:
    """`--fields lr,ent_coef`: traced fields of the config, each once (unknown or static ones: `sweep._field`)."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    cfg.require(bool(names), "--fields", text, "needs at least one traced field, e.g. --fields lr,ent_coef")
    for name in names:
        sweep._field(algo_config, name, "--fields")
    repeated = sorted({n for n in names if names.count(n) > 1})
    cfg.require(not repeated, "--fields", text, f"repeats {', '.join(repeated)}")
    return names


def parse_ranges(fields: Sequence[str], items: Sequence[str]) -> dict[str, tuple[float, float]]:
    """`--range FIELD=LOW:HIGH` items, for fields among `fields`."""
    ranges: dict[str, tuple[float, float]] = {}
    for item in items:
        name, text = sweep._split(item, "--range")
        cfg.require(name in fields, "--range", item, f"names a field not in --fields ({', '.join(fields)})")
        cfg.require(name not in ranges, "--range", item, f"repeats the field {name!r}")
        parts = text.split(":")
        cfg.require(len(parts) == 2, "--range", item, "must look like field=low:high")
        low, high = (sweep._number(p, "--range", item) for p in parts)
        cfg.require(low < high, "--range", item, "needs low < high")
        ranges[name] = (low, high)
    return ranges


def _accepts(algo_config: Any, env: Any, name: str, value: float) -> bool:
    """Whether the config's own checks accept `value` for the field `name`."""
    try:
        with_hparams(algo_config, {name: value}).validate(env)
    except cfg.ConfigError:
        return False
    return True


def _edge(accepts: Callable[[float], bool], inside: float, outside: float, steps: int = 60) -> float:
    """The accepted value nearest `outside` between an accepted `inside` and a refused `outside` (bisection)."""
    for _ in range(steps):
        middle = (inside + outside) / 2
        if middle in (inside, outside):
            break
        inside, outside = (middle, outside) if accepts(middle) else (inside, middle)
    return inside


def default_range(algo_config: Any, env: Any, name: str) -> tuple[float, float]:
    """[value / 10, value * 10] around the config's value, each end moved in to the last value the config's
    checks accept (a probability's upper end is 1)."""
    value = float(getattr(algo_config, name))
    cfg.require(value > 0, "--range", name, f"must be given for {name} (its value {value:g} is not > 0, so there is no "
                                            f"default range value/{DEFAULT_SPAN:g}..value*{DEFAULT_SPAN:g}): "
                                            f"--range {name}=LOW:HIGH")
    accepts = lambda v: _accepts(algo_config, env, name, v)  # noqa: E731
    ends = []
    for far in (value / DEFAULT_SPAN, value * DEFAULT_SPAN):
        ends.append(far if accepts(far) else _edge(accepts, value, far))
    return ends[0], ends[1]


def make_pbt_config(algo_config: Any, env: Any, num_updates: int, fields: str, ranges: Sequence[str],
                    population: int, interval: int | None) -> PBTConfig:
    """Every check of the PBT flags, on a checked config, before anything is compiled or written."""
    names = parse_fields(algo_config, fields)
    cfg.require(cfg.is_int(population) and population >= MIN_POPULATION, "--population", population,
                f"must be an integer >= {MIN_POPULATION} (a bottom and a top quarter of at least one member each)")
    interval = max(1, num_updates // 10) if interval is None else interval
    cfg.require(cfg.is_int(interval) and 1 <= interval <= num_updates, "--interval", interval,
                f"must be in [1, {num_updates:,}]: learner updates between exploits, at most the run's "
                f"{num_updates:,} updates")
    given = parse_ranges(names, ranges)
    for name, (low, high) in given.items():
        for end in (low, high):
            cfg.require(_accepts(algo_config, env, name, end), "--range", f"{name}={low:g}:{high:g}",
                        f"{name}={end:g} fails the config's own checks (`sparqrl pbt ALGO --help` says what it allows)")
    bounds = [given.get(name) or default_range(algo_config, env, name) for name in names]
    return PBTConfig(names, tuple(b[0] for b in bounds), tuple(b[1] for b in bounds), population, interval)


def initial_values(pbt: PBTConfig, algo_config: Any, seed: int) -> np.ndarray:
    """float32 [population, fields]: the first population, drawn as `sweep --random` draws its settings."""
    items = [f"{name}={'log' if log else 'lin'}:{lo!r}:{hi!r}"
             for name, lo, hi, log in zip(pbt.fields, pbt.low, pbt.high, pbt.log_scale())]
    settings = sweep.parse_random(algo_config, items, pbt.population, seed)
    return np.array([[s[name] for name in pbt.fields] for s in settings], np.float32)


def interval_bounds(num_updates: int, interval: int) -> list[int]:
    """Cumulative updates at the end of each interval (the last may be shorter)."""
    return [min(end, num_updates) for end in range(interval, num_updates + interval, interval)]


# ---- the exploit/explore step ---------------------------------------------------------------------


class Draws(NamedTuple):
    """The uniform [0, 1) numbers one exploit/explore step uses, drawn apart so that a test can replay them."""

    donor: jax.Array  # [M]: which top-quarter member a bottom-quarter member picks (floor(u * quarter))
    up: jax.Array  # [M, F]: < 0.5 multiplies by PERTURB[0], else by PERTURB[1]
    resample: jax.Array  # [M, F]: < resample_prob draws the field afresh
    value: jax.Array  # [M, F]: where in the field's range (log or linear) a fresh value lies


def draw(key: jax.Array, members: int, fields: int) -> Draws:
    keys = jax.random.split(key, 4)
    return Draws(jax.random.uniform(keys[0], (members,)), *(jax.random.uniform(k, (members, fields)) for k in keys[1:]))


def quarter(members: int) -> int:
    """The size of the top and of the bottom quarter."""
    return max(1, members // 4)


def exploit_explore(scores: jax.Array, values: jax.Array, draws: Draws, low: jax.Array, high: jax.Array,
                    log_scale: jax.Array, resample_prob: float) -> tuple[jax.Array, jax.Array]:
    """Truncation selection and perturbation (Jaderberg et al. 2017, section 3.1 and 4.1).

    Args:
      scores: [M], NaN for a member without a score (ranked last); values: [M, F] the members' fields;
      low, high: [F] each field's range; log_scale: bool [F] (fresh values log-uniform, else uniform).
    Returns:
      parents [M] int32 (whose learner and values each member takes: itself unless it copied) and the new
      values [M, F] (a copying member's explored, the others' unchanged).
    """
    members, values = scores.shape[0], jnp.asarray(values)
    q = quarter(members)
    ranked = jnp.where(jnp.isnan(scores), -jnp.inf, scores)
    order = jnp.argsort(-ranked, stable=True)  # best first; equal scores by index
    top, bottom = order[:q], order[members - q:]
    donors = top[jnp.minimum((draws.donor[bottom] * q).astype(jnp.int32), q - 1)]
    own = jnp.arange(members, dtype=jnp.int32)
    parents = own.at[bottom].set(jnp.where(ranked[donors] > ranked[bottom], donors, bottom).astype(jnp.int32))
    copied = values[parents]
    perturbed = jnp.clip(copied * jnp.where(draws.up < 0.5, PERTURB[0], PERTURB[1]), low, high)
    safe_low = jnp.where(log_scale, low, 1.0)  # (no log of a range that is not positive, even unused)
    fresh = jnp.where(log_scale, jnp.exp(jnp.log(safe_low) + draws.value * (jnp.log(jnp.where(log_scale, high, 2.0))
                                                                            - jnp.log(safe_low))),
                      low + draws.value * (high - low))
    explored = jnp.where(draws.resample < resample_prob, jnp.clip(fresh, low, high), perturbed)
    return parents, jnp.where((parents != own)[:, None], explored, values)


# ---- the population's state and programs ----------------------------------------------------------


class History(NamedTuple):
    """Per interval k and member: the values it trained with, its score, and whose learner it took after."""

    values: jax.Array  # float32 [K, M, F]
    score: jax.Array  # float32 [K, M] (0 where `scored` is False)
    scored: jax.Array  # bool [K, M]: an episode ended in the interval
    parent: jax.Array  # int32 [K, M]: itself where it copied no one


class PBTState(NamedTuple):
    """Everything a PBT run checkpoints: the members' training states and hyperparameters, the key of the
    exploit/explore draws, the intervals done and their history (so pbt.csv of a resumed run is whole)."""

    train: Any  # the algorithm's state, [M] leading
    hparams: HParams  # every traced field, [M]
    key: jax.Array
    intervals: jax.Array  # int32 []
    history: History


def pbt_chunk(algo_at: Callable[[HParams], Any], pbt: PBTConfig) -> Callable[..., tuple[PBTState, dict]]:
    """`(state, n, exploit) -> (state, metrics [M])`: n updates of every member (`anakin.chunk_program`), the
    interval's history, then (where `exploit`) the exploit/explore step."""
    train_chunk = anakin.chunk_program(algo_at)
    low, high = jnp.array(pbt.low, jnp.float32), jnp.array(pbt.high, jnp.float32)
    log_scale = jnp.array(pbt.log_scale())

    def run(state: PBTState, n: jax.Array, exploit: jax.Array) -> tuple[PBTState, dict[str, jax.Array]]:
        train, metrics = train_chunk(state.train, state.hparams, n)
        values = jnp.stack([state.hparams[name] for name in pbt.fields], axis=-1)
        scores = metrics["episode_return"]
        key, draw_key = jax.random.split(state.key)
        parents, new_values = exploit_explore(scores, values, draw(draw_key, *values.shape), low, high, log_scale,
                                              pbt.resample_prob)
        own = jnp.arange(pbt.population, dtype=jnp.int32)
        parents, new_values = jnp.where(exploit, parents, own), jnp.where(exploit, new_values, values)
        train = train._replace(learner=jax.tree.map(lambda x: x[parents], train.learner))
        hparams = {**{k: v[parents] for k, v in state.hparams.items()},
                   **{name: new_values[:, i] for i, name in enumerate(pbt.fields)}}
        k, h = state.intervals, state.history
        scored = ~jnp.isnan(scores)
        history = History(h.values.at[k].set(values), h.score.at[k].set(jnp.where(scored, scores, 0.0)),
                          h.scored.at[k].set(scored), h.parent.at[k].set(parents))
        return PBTState(train, hparams, key, k + 1, history), metrics

    return run


def one_device() -> NamedSharding:
    """The whole population on the first device: exploit gathers across members (`devices` never spreads pbt)."""
    return NamedSharding(Mesh(np.array(jax.devices()[:1]), ("seeds",)), PartitionSpec())


class PBTDriver(anakin.QueuedChunks):
    """A PBT run for the shared session loop: a `TrainDriver` whose state is a `PBTState`."""

    def __init__(self, algo_name: str, module: Any, algo_config: Any, env: Any, run: RunConfig, pbt: PBTConfig):
        self.algo_name, self.algo_config, self.env, self.run, self.pbt = algo_name, algo_config, env, run, pbt
        self.algo_at = anakin.algorithm_at(module, algo_config, env)
        self.algo = self.algo_at({})
        self.env_key = program_key(run.env)
        self.describe = (f"pbt {anakin.static_describe(algo_name, algo_config)} env={self.env_key} "
                         f"eval_episodes={run.eval_episodes} {pbt!r}")
        self.bounds = interval_bounds(self.algo.num_updates, pbt.interval)
        self.env_steps_per_update = self.algo.env_steps_per_update
        self.members = pbt.population
        self.member_names = [f"member {i}" for i in range(self.members)]
        self.compile_time_s = 0.0
        self.startup_s = 0.0
        self.programs_loaded = 0
        self.sharding = one_device()
        start = initial_values(pbt, algo_config, run.seed)
        hparams = {name: np.full(self.members, value, np.float32) for name, value in hparams_of(algo_config).items()}
        hparams.update({name: start[:, i] for i, name in enumerate(pbt.fields)})
        self.hparams = jax.device_put({k: jnp.asarray(v) for k, v in hparams.items()}, self.sharding)
        # each member its own seed (a sweep's settings share theirs: here members are not settings)
        self.keys = jax.device_put(jax.random.split(jax.random.PRNGKey(run.seed), self.members), self.sharding)
        self.eval_keys = jax.device_put(anakin.eval_keys(run.seed, self.members), self.sharding)
        self.draw_key = jax.device_put(jax.random.fold_in(jax.random.PRNGKey(run.seed), 0xB7), self.sharding)
        self._said_compiling = False
        self._evaluate: Program | None = None
        self._inflight: anakin.Background | None = None
        self._trips: dict[tuple[int, bool], tuple[jax.Array, ...]] = {}

    def _init_fn(self) -> Callable[[jax.Array, HParams, jax.Array], PBTState]:
        """`(keys [M], hparams [M], key) -> PBTState`: `key`, the exploit/explore draws'."""
        init_train = anakin.init_program(self.algo_at)
        shape = (len(self.bounds), self.members)

        def init(keys: jax.Array, hparams: HParams, key: jax.Array) -> PBTState:
            fields = len(self.pbt.fields)
            history = History(jnp.zeros((*shape, fields), jnp.float32), jnp.zeros(shape, jnp.float32),
                              jnp.zeros(shape, bool), jnp.zeros(shape, jnp.int32))
            return PBTState(init_train(keys, hparams), hparams, key, jnp.zeros((), jnp.int32), history)

        return init

    def abstract_state(self) -> PBTState:
        abstract = jax.eval_shape(self._init_fn(), self.keys, self.hparams, self.draw_key)
        return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=self.sharding), abstract)

    def _build(self, name: str, fn: Callable, *args: Any, options: Any = None) -> Program:
        store = program_store() if self.run.compile_cache and self.env_key is not None else None
        program = build_program(name, fn, args, describe=self.describe, store=store, compiler_options=options,
                                on_compile=self._say_compiling)
        self.programs_loaded += program.loaded
        return program

    def _put(self, value: Any) -> jax.Array:
        return jax.device_put(value, self.sharding)

    def _say_compiling(self) -> None:
        if not self._said_compiling and self.run.progress:
            notify(anakin.compiling_line(self.run.env, self.run.compile_cache, self.env_key is not None))
        self._said_compiling = True

    def build(self) -> None:
        start = time.perf_counter()
        self._init = self._build("pbt-init", self._init_fn(), self.keys, self.hparams, self.draw_key,
                                 options=run_once_options())
        self._chunk = self._build("pbt-chunk", pbt_chunk(self.algo_at, self.pbt), self._init.out_info,
                                  self._put(jnp.int32(1)), self._put(jnp.bool_(True)))
        self.compile_time_s += time.perf_counter() - start

    def init_state(self) -> PBTState:
        return self._init(self.keys, self.hparams, self.draw_key)

    def _place_trips(self, updates: int, last: bool) -> tuple[jax.Array, ...]:
        return self._put(np.int32(updates)), self._put(np.bool_(not last))  # no exploit after the last interval

    def _call_chunk(self, state: PBTState, trips: tuple[jax.Array, ...]) -> tuple[PBTState, Any]:
        return self._chunk(state, *trips)

    def evaluate(self, state: PBTState) -> np.ndarray:
        if self._evaluate is None:
            if self._inflight is not None:
                jax.block_until_ready(self._inflight.result())
            start = time.perf_counter()
            program = anakin.eval_program(self.algo_at, self.env, self.run.eval_episodes)
            self._evaluate = self._build("evaluate", program, self._init.out_info.train, self.hparams, self.eval_keys)
            self.compile_time_s += time.perf_counter() - start
        return np.asarray(self._evaluate(state.train, state.hparams, self.eval_keys))

    def summary(self) -> dict[str, Any]:
        return {"devices_used": 1, "programs_loaded": self.programs_loaded, **self.algo.summary}

    def finish(self, rundir: RunDir, final: np.ndarray) -> dict[str, Any]:
        return {}  # (`PBTRecords.finish` writes PBT's outputs: they need the state)

    def close(self) -> None:
        inflight, self._inflight = self._inflight, None
        if inflight is not None:  # nothing left running into the process's exit
            inflight.wait()


# ---- outputs ---------------------------------------------------------------------------------------


def pbt_rows(pbt: PBTConfig, history: Any, bounds: list[int], env_steps_per_update: int) -> list[list[Any]]:
    """pbt.csv's rows: per interval and member, the values it trained with, its score and its parent."""
    rows = []
    for k, end in enumerate(bounds):
        for m in range(pbt.population):
            score = repr(float(history.score[k, m])) if history.scored[k, m] else ""
            rows.append([k, end * env_steps_per_update, m, *(repr(float(v)) for v in history.values[k, m]), score,
                         int(history.parent[k, m])])
    return rows


def pbt_csv(pbt: PBTConfig, history: Any, bounds: list[int], env_steps_per_update: int) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["interval", "env_step", "member", *pbt.fields, "score", "parent"])
    writer.writerows(pbt_rows(pbt, history, bounds, env_steps_per_update))
    return out.getvalue()


def plot_pbt(pbt: PBTConfig, history: Any, ends: np.ndarray, png_path: Path, title: str) -> None:
    """pbt.png: each member's schedule of every field (a member's line jumps where it copied another) and its
    score at the end of each interval, against env steps; `ends`: each interval's last env step."""
    from sparqrl.telemetry.plots import finish_axes, pyplot, save_figure

    panels = len(pbt.fields) + 1
    fig, axes = pyplot().subplots(1, panels, figsize=(4.5 * panels, 3.8), squeeze=False)
    starts = np.concatenate([[0], ends])
    for i, (ax, name) in enumerate(zip(axes[0], pbt.fields)):
        for m in range(pbt.population):  # each interval's value from its start to its end
            ax.step(starts, np.append(history.values[:, m, i], history.values[-1, m, i]), where="post", alpha=0.7)
        if pbt.log_scale()[i] and pbt.high[i] / pbt.low[i] >= 10:
            ax.set_yscale("log")
        finish_axes(ax, "env step", name, legend=False)
    score = np.where(history.scored, history.score, np.nan)
    for m in range(pbt.population):
        axes[0][-1].plot(ends, score[:, m], marker=".", alpha=0.7)
    finish_axes(axes[0][-1], "env step", "score: interval's mean episode return", legend=False)
    fig.suptitle(title)
    save_figure(fig, png_path)


def write_best(rundir: RunDir, driver: PBTDriver, state: PBTState, member: int, totals: dict[str, float]) -> dict:
    """best/: member `member` as a finished one-seed train run of its final hyperparameters (config.json, its
    checkpoint, summary.json), which `eval`, `load`, `export` and `--resume` take; returns its summary."""
    host = jax.device_get(state)
    final = {name: float(host.hparams[name][member]) for name in traced_fields(driver.algo_config)}
    config = with_hparams(driver.algo_config, final)
    run = dataclasses.replace(driver.run, out=str(rundir.path / BEST), seeds=1, overwrite=False, preset="none")
    data = {"algo": driver.algo_name, "run": cfg.to_dict(run), "config": cfg.to_dict(config)}
    rundir.claim(BEST)
    best = new_run_dir(run.out, True, json.dumps(data, indent=2, sort_keys=True))  # (a best/ a crash left: replaced)
    try:
        updates = driver.bounds[-1]
        member_state = jax.tree.map(lambda x: jnp.asarray(x[member:member + 1]), host.train)
        checkpointer = Checkpointer(best.claim("checkpoint"))
        try:
            checkpointer.save(updates, member_state, {"chunks_done": len(driver.bounds), "updates_done": updates,
                                                      **totals})
        finally:
            checkpointer.close()
        evaluation = anakin.evaluate_saved(best, driver.algo_name, config, run, run.eval_episodes, None)
        summary = {"algo": driver.algo_name, "env": run.env, "steps": updates * driver.env_steps_per_update,
                   "seeds": 1, "final_return_mean": evaluation["return_mean"],
                   "final_return_std": evaluation["return_std"], "final_return_per_seed": evaluation["return_per_seed"],
                   "eval_episodes": run.eval_episodes,
                   "device": device_name(), "pbt_member": member, "hparams": {n: final[n] for n in driver.pbt.fields},
                   **totals}
        best.write_text(SUMMARY, json.dumps(summary, indent=2))
    finally:
        best.release()
    return summary


class PBTRecords(TrainRecords):
    """A train run's records (metrics.csv per member, evaluations, returns.png) and, at the end, pbt.csv,
    pbt.png and best/."""

    resume_command = "sparqrl pbt --resume"
    driver: PBTDriver

    def finish(self, rundir: RunDir, state: PBTState, totals: Any) -> dict[str, Any]:
        summary = super().finish(rundir, state, totals)
        driver, pbt = self.driver, self.driver.pbt
        history = jax.device_get(state.history)
        rundir.write_text("pbt.csv", pbt_csv(pbt, history, driver.bounds, driver.env_steps_per_update))
        plot_pbt(pbt, history, np.array(driver.bounds) * driver.env_steps_per_update, rundir.claim("pbt.png"),
                 f"PBT {driver.algo_name} on {driver.run.env}: {pbt.population} members, every {pbt.interval} updates")
        final = np.asarray(summary["final_return_per_seed"])
        member = int(np.argmax(final))
        best = write_best(rundir, driver, state, member,
                          {"wall_time_s": totals.wall_time_s, "compile_time_s": totals.compile_time_s})
        exploits = int((history.parent != np.arange(pbt.population)).sum())
        return {**summary, "population": pbt.population, "fields": list(pbt.fields), "interval": pbt.interval,
                "intervals": len(driver.bounds), "exploits": exploits, "score": SCORE,
                "ranges": {n: [lo, hi] for n, lo, hi in zip(pbt.fields, pbt.low, pbt.high)},
                "best_member": member, "best_return_mean": best["final_return_mean"], "best_hparams": best["hparams"],
                "best_dir": str(rundir.path / BEST)}


# ---- the run ---------------------------------------------------------------------------------------


def _check_run(run: RunConfig) -> None:
    cfg.require(not is_host_env(run.env), "env", run.env, "PBT runs on the device: a gymnax id, brax:NAME or "
                "jax:MODULE:ATTR (a population of host environments' actor-learner runs is not built)")
    cfg.require(run.seeds == 1, "seeds", run.seeds, "must be 1 for pbt: every member has its own seed "
                "(--population sets how many)")


def train(algo_name: str, algo_config: Any, run: RunConfig, *, fields: str, ranges: Sequence[str] = (),
          population: int = DEFAULT_POPULATION, interval: int | None = None, on_chunk: ChunkHook | None = None) -> dict:
    """A new PBT run; returns its summary (also in `run.out/summary.json`)."""
    _check_run(run)
    use_compile_cache(run.compile_cache)
    module, algo_config, env = anakin.prepare(algo_name, algo_config, run)
    num_updates = module.make_algorithm(algo_config, env).num_updates
    pbt = make_pbt_config(algo_config, env, num_updates, fields, ranges, population, interval)
    driver = PBTDriver(algo_name, module, algo_config, env, run, pbt)
    check_memory(driver.abstract_state(), run)
    if run.preset not in ("auto", "none"):
        notify(presets.describe(run.preset, algo_config, run.env))
    data = {"algo": algo_name, "run": cfg.to_dict(run), "config": cfg.to_dict(algo_config), "pbt": cfg.to_dict(pbt)}
    rundir = new_run_dir(run.out, run.overwrite, json.dumps(data, indent=2, sort_keys=True))
    return run_session(rundir, run, algo_name, driver, resuming=False, on_chunk=on_chunk,
                       records=PBTRecords(run, algo_name, driver))


def saved_pbt(rundir: RunDir) -> PBTConfig | None:
    """The PBT settings of the run opened in `rundir` (its config.json's "pbt", as `open_run_dir` read it), None for
    another kind of run."""
    data = rundir.saved.get("pbt")
    return None if data is None else cfg.from_dict(PBTConfig, data, str(rundir.path / CONFIG))


def resume(out: str | Path, *, progress: bool | None = None, trust: Trust = NOTHING,
           on_chunk: ChunkHook | None = None) -> dict:
    """Continue the PBT run in `out` from its newest intact checkpoint (a finished one: its summary)."""
    rundir, algo_name, algo_config, run = open_run_dir(out, trust=trust, pbt=True)
    pbt = saved_pbt(rundir)
    cfg.require(pbt is not None, "--resume", str(out),
                "is not a PBT run's folder (`sparqrl train --resume` continues it)")
    require_trusted(trust, rundir.path / CONFIG, ray_address=run.ray_address)
    if progress is not None:
        run = dataclasses.replace(run, progress=progress)
    if rundir.finished:
        notify(f"{out} is a finished PBT run ({run.env}, {algo_name}); nothing to do")
        return finished_summary(rundir)
    rundir.lock()
    try:
        use_compile_cache(run.compile_cache)
        module, algo_config, env = anakin.prepare(algo_name, algo_config, run)
        driver = PBTDriver(algo_name, module, algo_config, env, run, pbt)
        return run_session(rundir, run, algo_name, driver, resuming=True, on_chunk=on_chunk,
                           records=PBTRecords(run, algo_name, driver))
    finally:
        rundir.release()

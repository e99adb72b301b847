"""The actor-learner ("Sebulba") runner for host environments (`gym:NAME`): ActorQ on Ray.

    actors  (CPU)     `--actors N` actors (`sparqrl.runners.actors`), each stepping its own seeds × num_envs
                      Gymnasium environments with the newest policy copy it was handed, in the precision
                      `--actor-precision` names; they send `Fragment`s of T env steps tagged with the
                      policy version they were acted with (DQN adds Ape-X's actor-side priorities);
    learner (device)  learns from each fragment as it arrives (one jitted, donated call: the algorithm's
                      `learn` scanned over T, vmapped over seeds) and every `publish_every` updates
                      quantizes its fp32 policy network once and publishes it as the next version.

Back-ends: `inline` runs the actors in this process, one request at a time (deterministic: debugging
and tests); `ray` runs each actor as a Ray actor process with one thread (a local Ray instance started
for the run, or an existing cluster with `--ray-address`). Flow control is by requests in flight
(`--in-flight` per actor): a slow learner slows the actors instead of filling memory.

Faults: an actor that dies (or raises) is replaced and the run goes on, losing at most that actor's
unsent fragments. Ctrl-C / SIGTERM become a flag checked between learner calls: the learner is
checkpointed where it stopped and every process the run started is ended (our Ray actors, and the
local Ray instance). What is saved is the learner's whole state (networks, optimizers, replay buffer,
counters); host simulators cannot be saved, so a resumed run's actors start fresh, reseeded episodes.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sparqrl import config as cfg
from sparqrl.algos import get_algorithm
from sparqrl.algos.base import ActorLearner, forward
from sparqrl.envs import evaluate_host, host_spec
from sparqrl.runners.actors import ActorSpec, Fragment, make_pool, network_paths, quantized_copy, ray_session
from sparqrl.runners.anakin import (
    RunConfig, RunInterrupted, StopRequests, _device_name, chunk_bounds, load_config, start_run_dir,
)
from sparqrl.runners.checkpoint import Checkpointer, abstract_like
from sparqrl.telemetry import EnergyMeter, RunLogger, make_progress, plot_returns


class Prepared:
    """A checked run: the algorithm module, its resolved config, the env spec and the actor-learner."""

    def __init__(self, algo_name: str, algo_config: Any, run: RunConfig):
        module = get_algorithm(algo_name)
        run.validate()
        cfg.require(hasattr(module, "make_actor_learner"), "algo", algo_name,
                    "host environments (gym:NAME) run through the actor-learner runner, which trains dqn, td3 "
                    f"and sac; {algo_name} runs on device environments (gymnax ids, brax:NAME)")
        self.spec = host_spec(run.env)
        self.config = algo_config.validate(self.spec)
        self.al: ActorLearner = module.make_actor_learner(self.config, self.spec)
        self.fragments = self.config.num_updates // run.fragment_steps
        cfg.require(self.fragments >= 1, "fragment_steps", run.fragment_steps,
                    f"must be <= the run's env steps per environment ({self.config.num_updates})")
        # The policy network must be a Dense chain for any precision: checked here, before compiling.
        self.policy_fn = jax.jit(jax.vmap(self.al.policy))
        keys = jax.random.split(jax.random.PRNGKey(run.seed), run.seeds)
        self.learner_shape = jax.eval_shape(jax.vmap(self.al.init), keys)
        policy_shape = jax.eval_shape(jax.vmap(self.al.policy), self.learner_shape)
        one = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), policy_shape)
        self.paths = network_paths(self.al.acting, one, self.spec.observation_shape)


def train(algo_name: str, algo_config: Any, run: RunConfig) -> dict:
    """Train from scratch on a host environment; returns the summary (also in `run.out/summary.json`)."""
    prepared = Prepared(algo_name, algo_config, run)
    out = start_run_dir(algo_name, prepared.config, run)
    return _run(prepared, algo_name, run, out, resuming=False)


def resume(out_dir: str | Path) -> dict:
    out = Path(out_dir)
    algo_name, algo_config, run = load_config(out)
    return _run(Prepared(algo_name, algo_config, run), algo_name, run, out, resuming=True)


def _learn_fragment(al: ActorLearner):
    """(learner [S], steps [T, S, N, ...]) -> (learner, per-seed metrics [S] summed over the T steps)."""

    def one_seed(learner: Any, steps: Any) -> tuple[Any, dict]:
        return jax.lax.scan(al.learn, learner, steps)

    def learn(learner: Any, steps: Any) -> tuple[Any, dict]:
        steps = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), steps)  # [S, T, N, ...]
        learner, metrics = jax.vmap(one_seed)(learner, steps)
        return learner, {k: v.sum(axis=1) for k, v in metrics.items()}

    return learn


def _run(p: Prepared, algo_name: str, run: RunConfig, out: Path, *, resuming: bool) -> dict:
    """One session of a run (fresh or resumed), measured whole by an energy meter (codecarbon's machine
    tracking: local Ray actors included) whose own start-up is left out of wall_time_s."""
    backend = run.resolved_backend
    with ray_session(run.ray_address, run.actors) if backend == "ray" else contextlib.nullcontext():
        meter = EnergyMeter(out, run.country, run.energy).start()
        try:
            return _session(p, algo_name, run, out, meter, resuming=resuming)
        finally:
            meter.stop()  # idempotent and never raises; the normal path has stopped it before the summary


def _session(p: Prepared, algo_name: str, run: RunConfig, out: Path, meter: EnergyMeter, *, resuming: bool) -> dict:
    wall_start = time.perf_counter()
    al, seeds, num_envs, T = p.al, run.seeds, p.al.num_envs, run.fragment_steps
    bounds = chunk_bounds(p.fragments, run.chunks)
    compile_start = time.perf_counter()
    learner = jax.jit(jax.vmap(al.init))(jax.random.split(jax.random.PRNGKey(run.seed), seeds))
    compile_time = time.perf_counter() - compile_start

    # Checkpoints are numbered by learner updates (= policy versions): an interrupt saves the learner
    # exactly where it stopped, which may be inside a chunk.
    checkpointer = Checkpointer(out / "checkpoint")
    done_chunks, updates_done = 0, 0
    timer_names = ("wall_time_s", "compile_time_s", "startup_s", "actor_busy_s", "learner_s", "publish_s", "wait_s")
    prior = dict.fromkeys(timer_names, 0.0) | {"versions": 0, "restarts": 0}
    if resuming:
        learner, saved = checkpointer.restore(abstract_like(learner))
        done_chunks, updates_done = saved["chunks_done"], saved["updates_done"]
        prior = {k: saved[k] for k in prior}
        meter.include_prior(saved)  # the earlier sessions' energy and CO2
    compile_time += prior["compile_time_s"]
    timers = {k: prior[k] for k in timer_names[2:]}
    counts = {"versions": prior["versions"], "lag_sum": 0.0, "fragments": 0, "order_violations": 0}
    logger = RunLogger(out, resume_chunk=done_chunks if resuming else None,
                       resume_step=(bounds[done_chunks - 1] if done_chunks else 0) * T * num_envs + 1 if resuming else None)

    def elapsed() -> float:
        return prior["wall_time_s"] + time.perf_counter() - wall_start

    def meta() -> dict:
        return {"chunks_done": done_chunks, "updates_done": updates_done, "wall_time_s": elapsed(),
                "compile_time_s": compile_time, **timers, "versions": counts["versions"],
                "restarts": prior["restarts"] + pool.restarts, **meter.totals()}

    def publish() -> Any:
        start = time.perf_counter()
        policy = jax.device_get(p.policy_fn(learner))
        env_steps = int(np.asarray(learner.env_steps)[0])
        copy = quantized_copy(updates_done, policy, al.acting, p.paths, run.actor_precision, run.quant_granularity,
                              env_steps)
        ref = pool.publish(copy)
        timers["publish_s"] += time.perf_counter() - start
        counts["versions"] += 1
        counts["nbytes"] = copy.nbytes
        return ref

    def evaluate(episodes: int) -> np.ndarray:
        return _evaluate_seeds(al, run.env, p.policy_fn(learner), episodes, run.seed + 100)

    spec = ActorSpec(algo_name, p.config, run.env, seeds, run.actors, T, run.seed)
    stop = StopRequests()
    pool_start = time.perf_counter()
    pool = None
    learn_fragment = _learn_fragment(al)

    def learn(learner: Any, sums: dict, steps: Any) -> tuple[Any, dict]:
        learner, metrics = learn_fragment(learner, steps)
        return learner, jax.tree.map(jnp.add, sums, metrics)

    learn = jax.jit(learn, donate_argnums=(0, 1))  # donated: the replay buffer is updated in place
    learn_c = None
    progress = make_progress(run.progress)
    eval_returns, saved_at = None, updates_done
    last_seen: dict[tuple[int, int], tuple[int, int]] = {}  # place -> (sequence, version) of its latest fragment
    session_start = (updates_done * T * num_envs, time.perf_counter())
    try:
        pool = make_pool(run.resolved_backend, spec, reseed=updates_done)
        copy_ref = publish()
        for actor_id in range(run.actors):
            for _ in range(run.in_flight):
                pool.submit(actor_id, copy_ref)
        with progress:
            task = progress.add_task(f"{algo_name} {run.env}", total=p.fragments * T * num_envs, sps=0.0, ret="-")
            progress.update(task, completed=updates_done * T * num_envs)
            for chunk in range(done_chunks, len(bounds)):
                sums, ep_sum, ep_count = None, np.zeros(seeds), np.zeros(seeds)
                n = bounds[chunk] - updates_done
                for _ in range(n):
                    stop.check()  # between learner calls only: never with donated buffers in flight
                    t0 = time.perf_counter()
                    frag: Fragment = pool.next()
                    t1 = time.perf_counter()
                    if learn_c is None:  # compiled for the first fragment's shapes
                        # Starting the actors (processes, Ray, their jitted programs) until the first
                        # fragment arrives is set-up, like compilation: kept out of the steps/s rate.
                        timers["startup_s"] += t1 - pool_start
                        shapes = jax.eval_shape(learn_fragment, learner, frag.steps)[1]
                        zero_sums = lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)  # noqa: E731
                        learn_c = learn.lower(learner, zero_sums(), frag.steps).compile()
                        compile_time += time.perf_counter() - t1
                        t0 = t1 = time.perf_counter()
                    if sums is None:
                        sums = zero_sums()
                    learner, sums = learn_c(learner, sums, frag.steps)
                    jax.block_until_ready(sums)
                    t2 = time.perf_counter()
                    timers["wait_s"] += t1 - t0
                    timers["learner_s"] += t2 - t1
                    timers["actor_busy_s"] += frag.busy_s
                    updates_done += 1
                    # Versions must not go back within an actor, in the order it made its fragments
                    # (which Ray may deliver out of order).
                    place = (frag.actor_id, frag.incarnation)
                    seq, version = last_seen.get(place, (-1, -1))
                    counts["order_violations"] += int((frag.sequence - seq) * (frag.version - version) < 0)
                    last_seen[place] = max((seq, version), (frag.sequence, frag.version))
                    counts["lag_sum"] += updates_done - 1 - frag.version
                    counts["fragments"] += 1
                    if updates_done % run.publish_every == 0:
                        copy_ref = publish()
                    pool.submit(frag.actor_id, copy_ref)
                    ep_sum += np.where(frag.episode_done, frag.episode_return, 0.0).sum(axis=(0, 2))
                    ep_count += frag.episode_done.sum(axis=(0, 2))
                per_seed = {k: np.asarray(v) / (n * T) for k, v in jax.device_get(sums).items()}
                per_seed["episode_return"] = np.where(ep_count > 0, ep_sum / np.maximum(ep_count, 1), np.nan)
                per_seed["policy_lag"] = np.full(seeds, counts["lag_sum"] / max(counts["fragments"], 1))
                is_last = chunk == len(bounds) - 1
                if is_last or (run.eval_every and (chunk + 1) % run.eval_every == 0):
                    eval_returns = evaluate(run.eval_episodes)
                    per_seed["eval_return"] = eval_returns.mean(axis=1)
                env_step = updates_done * T * num_envs
                logger.log(chunk + 1, env_step, elapsed(), per_seed)
                rate = (env_step - session_start[0]) * seeds / max(time.perf_counter() - session_start[1], 1e-9)
                ret = per_seed["episode_return"]
                progress.update(task, completed=env_step, sps=rate,
                                ret="-" if np.all(np.isnan(ret)) else f"{np.nanmean(ret):.1f}")
                done_chunks = chunk + 1
                if is_last or done_chunks % run.checkpoint_every == 0:
                    checkpointer.save(updates_done, learner, meta())
                    saved_at = updates_done
    except KeyboardInterrupt:
        if saved_at != updates_done:
            checkpointer.save(updates_done, learner, meta())
        raise RunInterrupted(
            f"interrupted after {updates_done * T * num_envs} env steps per seed; "
            f"checkpoint saved; continue with: sparqrl train --resume {out}"
        ) from None
    finally:
        stop.close()
        if pool is not None:
            pool.close()
        logger.close()
        checkpointer.close()

    if eval_returns is None:  # resumed a run that had already finished
        eval_returns = evaluate(run.eval_episodes)
    wall = elapsed()
    energy = meter.stop()
    final = eval_returns.mean(axis=1)
    steps = p.fragments * T * num_envs
    gradient_steps = int(np.asarray(learner.gradient_steps)[0])  # this session's and earlier ones
    summary = {
        "algo": algo_name,
        "env": run.env,
        "steps": steps,
        "seeds": seeds,
        "final_return_mean": float(final.mean()),
        "final_return_std": float(final.std()),
        "final_return_per_seed": [float(x) for x in final],
        "eval_episodes": run.eval_episodes,
        "wall_time_s": wall,
        "env_steps_per_s": steps * seeds / max(wall - compile_time - timers["startup_s"], 1e-9),
        "compile_time_s": compile_time,
        "device": _device_name(),
        "runner": "sebulba",
        "backend": pool.backend,
        "actors": run.actors,
        "actor_precision": run.actor_precision,
        # env steps (all seeds) per second of one actor's busy time (acting + stepping, not waiting)
        "actor_steps_per_s": steps * seeds / max(timers["actor_busy_s"], 1e-9),
        "learner_updates_per_s": gradient_steps * seeds / max(timers["learner_s"], 1e-9),
        "startup_s": timers["startup_s"],
        "learner_wait_s": timers["wait_s"],
        "publish_s": timers["publish_s"],
        "versions_published": counts["versions"],
        "broadcast_bytes": counts.get("nbytes", 0),
        "policy_lag_mean": counts["lag_sum"] / max(counts["fragments"], 1),
        "version_order_violations": counts["order_violations"],
        "actor_restarts": prior["restarts"] + pool.restarts,
        "actor_failures": [f"actor {f.actor_id} incarnation {f.incarnation}: {f.error}" for f in pool.failures[:10]],
        **energy,
        **al.summary,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_returns(out / "metrics.csv", out / "returns.png", f"{algo_name} on {run.env}, {seeds} seed(s)")
    return summary


def evaluate_saved(out_dir: str | Path, episodes: int | None = None, seed: int | None = None) -> dict:
    """Evaluate the saved policy of a host-environment run: deterministic episodes per seed (fp32)."""
    out = Path(out_dir)
    algo_name, config, run = load_config(out)
    p = Prepared(algo_name, config, run)
    episodes = run.eval_episodes if episodes is None else episodes
    cfg.require(episodes >= 1, "episodes", episodes, "must be >= 1")
    checkpointer = Checkpointer(out / "checkpoint")
    try:
        learner, _ = checkpointer.restore(abstract_like(p.learner_shape))
    finally:
        checkpointer.close()
    per_seed = _evaluate_seeds(p.al, run.env, p.policy_fn(learner), episodes,
                               run.seed + 100 if seed is None else seed).mean(axis=1)
    return {"env": run.env, "episodes_per_seed": episodes, "return_mean": float(per_seed.mean()),
            "return_std": float(per_seed.std()), "return_per_seed": [float(x) for x in per_seed]}


def _evaluate_seeds(al: ActorLearner, env_name: str, params: Any, episodes: int, base_seed: int) -> np.ndarray:
    """[seeds, episodes] deterministic returns of the fp32 policy: seed i's (`params` [seeds, ...]) on host
    envs seeded base_seed + i."""
    acting, obs_ndim = al.acting, len(host_spec(env_name).observation_shape)
    greedy = jax.jit(lambda p, o: acting.to_env(acting.greedy(forward(acting, p, o, obs_ndim))))
    seeds = jax.tree.leaves(params)[0].shape[0]
    return np.stack([
        evaluate_host(env_name, lambda o, i=i: np.asarray(greedy(jax.tree.map(lambda x: x[i], params), o)),
                      episodes, base_seed + i)
        for i in range(seeds)
    ])

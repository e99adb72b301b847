"""The actor-learner ("Sebulba") runner for host environments (`gym:NAME`), in its simplest form.

    actor  (host)    acts with its copy of the policy (one jitted `explore` call for all seeds and
                     envs), steps the Gymnasium environments, and emits `Rollout`s tagged with the
                     policy version they were acted with;
    learner (device) stores each rollout and learns from it (one jitted `learn` call, vmapped over
                     seeds), then publishes the new policy with its version.

Here the one actor runs in-process and in lockstep with the learner, so every env step is followed
by its gradient steps exactly as in RLx2's loop (one update per env step). The parts talk only through
`Rollout` and `PolicyCopy`: more actors, actor processes or Ray actors (the next issue) replace
`InlineActor` and the loop in `_run` without touching the learner or the algorithms.

What is saved: the learner's whole state (networks, optimizers, replay buffer, counters) and the
actor's keys. Host simulators cannot be checkpointed, so a resumed run starts fresh episodes (reseeded
by the chunk index); everything the learner knows carries on exactly.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sparqrl import config as cfg
from sparqrl.algos import get_algorithm
from sparqrl.algos.offpolicy.loop import OffPolicy, Transition
from sparqrl.envs import HostVecEnv, evaluate_host, host_spec
from sparqrl.runners.anakin import (
    RunConfig, RunInterrupted, StopRequests, _device_name, chunk_bounds, load_config, start_run_dir,
)
from sparqrl.runners.checkpoint import Checkpointer, abstract_like
from sparqrl.telemetry import RunLogger, make_progress, plot_returns


class PolicyCopy(NamedTuple):
    """What the learner publishes: the acting parameters of every seed and their version."""

    params: Any  # [seeds, ...]
    version: int  # learner calls that produced it


class Rollout(NamedTuple):
    """What an actor sends: one env step of every environment of every seed."""

    row: Transition  # numpy leaves [seeds, num_envs, ...]
    version: int  # the PolicyCopy version it was acted with
    episode_return: np.ndarray  # [seeds, num_envs], valid where episode_done
    episode_done: np.ndarray  # bool [seeds, num_envs]


class ActorState(NamedTuple):
    key: jax.Array  # [seeds] actor-side keys
    env_steps: jax.Array  # int32 [seeds]: env steps per seed taken so far (warm-up counter)


class InlineActor:
    """One in-process actor stepping `seeds × num_envs` host environments."""

    def __init__(self, loop: OffPolicy, env_name: str, seeds: int, num_envs: int):
        self.envs = HostVecEnv(env_name, seeds * num_envs)
        self.shape = (seeds, num_envs)

        def act(policy: Any, obs: jax.Array, state: ActorState) -> tuple[jax.Array, jax.Array, jax.Array, ActorState]:
            keys = jax.vmap(jax.random.split)(state.key)  # [seeds, 2]
            action, reference = jax.vmap(loop.explore)(policy, obs, keys[:, 1], state.env_steps)
            return loop.to_env(action), action, reference, ActorState(keys[:, 0], state.env_steps + num_envs)

        self._act = jax.jit(act)
        self.obs: np.ndarray | None = None

    def reset(self, seed: int) -> None:
        self.obs = self._split(self.envs.reset(seed))

    def _split(self, x: np.ndarray) -> np.ndarray:
        return x.reshape(self.shape + x.shape[1:])

    def step(self, policy: PolicyCopy, state: ActorState) -> tuple[Rollout, ActorState]:
        env_action, action, reference, state = self._act(policy.params, self.obs, state)
        out = self.envs.step(np.asarray(env_action).reshape((-1,) + env_action.shape[2:]))
        row = Transition(
            obs=self.obs, action=np.asarray(action), reward=self._split(out.reward), next_obs=self._split(out.final_obs),
            terminated=self._split(out.terminated), truncated=self._split(out.truncated),
            reference_action=np.asarray(reference),
        )
        self.obs = self._split(out.obs)
        return Rollout(row, policy.version, self._split(out.episode_return), self._split(out.episode_done)), state

    def close(self) -> None:
        self.envs.close()


def _prepare(algo_name: str, algo_config: Any, run: RunConfig) -> tuple[Any, Any, Any]:
    """Every check that can fail on user input, before anything is compiled or written."""
    module = get_algorithm(algo_name)
    run.validate()
    cfg.require(hasattr(module, "make_offpolicy"), "algo", algo_name,
                "host environments (gym:NAME) run through the actor-learner runner, which trains td3 and sac; "
                f"{algo_name} runs on device environments (gymnax ids, brax:NAME)")
    spec = host_spec(run.env)
    return module, algo_config.validate(spec), spec


def train(algo_name: str, algo_config: Any, run: RunConfig) -> dict:
    """Train from scratch on a host environment; returns the summary (also in `run.out/summary.json`)."""
    module, algo_config, spec = _prepare(algo_name, algo_config, run)
    out = start_run_dir(algo_name, algo_config, run)
    return _run(module, algo_name, algo_config, run, spec, out, resuming=False)


def resume(out_dir: str | Path) -> dict:
    out = Path(out_dir)
    algo_name, algo_config, run = load_config(out)
    module, algo_config, spec = _prepare(algo_name, algo_config, run)
    return _run(module, algo_name, algo_config, run, spec, out, resuming=True)


def _run(module: Any, algo_name: str, config: Any, run: RunConfig, spec: Any, out: Path, *, resuming: bool) -> dict:
    wall_start = time.perf_counter()
    loop: OffPolicy = module.make_offpolicy(config, spec)
    seeds, num_envs = run.seeds, config.num_envs
    num_updates = config.num_updates
    bounds = chunk_bounds(num_updates, run.chunks)

    keys = jax.random.split(jax.random.PRNGKey(run.seed), seeds)
    compile_start = time.perf_counter()
    init = jax.jit(jax.vmap(loop.init))

    def learn(learner: Any, sums: dict, row: Transition) -> tuple[Any, dict]:
        learner, metrics = jax.vmap(loop.learn)(learner, row)
        return learner, {k: sums[k] + metrics[k] for k in metrics}

    learner = init(keys)
    example_row = _example_row(spec, seeds, num_envs)
    metric_shapes = jax.eval_shape(lambda l, r: jax.vmap(loop.learn)(l, r)[1], learner, example_row)

    def zeros() -> dict:
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), metric_shapes)

    # Donated: the replay buffer is updated in place instead of copied at every env step.
    learn_c = jax.jit(learn, donate_argnums=(0, 1)).lower(learner, zeros(), example_row).compile()
    actor = InlineActor(loop, run.env, seeds, num_envs)
    actor_state = ActorState(jax.random.split(jax.random.PRNGKey(run.seed + 1), seeds), jnp.zeros(seeds, jnp.int32))
    policy_fn = jax.jit(jax.vmap(loop.policy))
    compile_time = time.perf_counter() - compile_start

    # Checkpoints are numbered by learner updates (the policy version): an interrupt saves the learner
    # exactly where it stopped, which may be inside a chunk.
    checkpointer = Checkpointer(out / "checkpoint")
    done_chunks, updates_done = 0, 0
    prior = {"wall_time_s": 0.0, "compile_time_s": 0.0, "actor_s": 0.0, "learner_s": 0.0}
    if resuming:
        (learner, actor_state), saved = checkpointer.restore(abstract_like((learner, actor_state)))
        done_chunks, updates_done = saved["chunks_done"], saved["updates_done"]
        prior = {k: saved[k] for k in prior}
    compile_time += prior["compile_time_s"]
    timers = {"actor_s": prior["actor_s"], "learner_s": prior["learner_s"]}
    logged_step = (bounds[done_chunks - 1] if done_chunks else 0) * num_envs
    logger = RunLogger(out, resume_chunk=done_chunks if resuming else None,
                       resume_step=logged_step + 1 if resuming else None)
    actor.reset(run.seed + 1000 + updates_done)  # host simulators restart: fresh, reseeded episodes

    def elapsed() -> float:
        return prior["wall_time_s"] + time.perf_counter() - wall_start

    def meta() -> dict:
        return {"chunks_done": done_chunks, "updates_done": updates_done, "wall_time_s": elapsed(),
                "compile_time_s": compile_time, **timers}

    def evaluate(learner: Any, episodes: int) -> np.ndarray:
        return _evaluate_seeds(loop, run.env, policy_fn(learner), episodes, run.seed + 100)

    stop = StopRequests()
    progress = make_progress(run.progress)
    eval_returns, saved_at = None, updates_done
    session_start = (updates_done * num_envs, time.perf_counter())
    try:
        with progress:
            task = progress.add_task(f"{algo_name} {run.env}", total=num_updates * num_envs, sps=0.0, ret="-")
            progress.update(task, completed=updates_done * num_envs)
            for chunk in range(done_chunks, len(bounds)):
                sums, ep_sum, ep_count = zeros(), np.zeros(seeds), np.zeros(seeds)
                n = bounds[chunk] - updates_done
                for _ in range(n):
                    stop.check()  # between learner calls only: never with donated buffers in flight
                    t0 = time.perf_counter()
                    rollout, actor_state = actor.step(PolicyCopy(policy_fn(learner), updates_done), actor_state)
                    t1 = time.perf_counter()
                    learner, sums = learn_c(learner, sums, rollout.row)
                    jax.block_until_ready(sums)
                    timers["actor_s"] += t1 - t0
                    timers["learner_s"] += time.perf_counter() - t1
                    updates_done += 1
                    ep_sum += np.where(rollout.episode_done, rollout.episode_return, 0.0).sum(axis=1)
                    ep_count += rollout.episode_done.sum(axis=1)
                per_seed = {k: np.asarray(v) / n for k, v in jax.device_get(sums).items()}
                per_seed["episode_return"] = np.where(ep_count > 0, ep_sum / np.maximum(ep_count, 1), np.nan)
                is_last = chunk == len(bounds) - 1
                if is_last or (run.eval_every and (chunk + 1) % run.eval_every == 0):
                    eval_returns = evaluate(learner, run.eval_episodes)
                    per_seed["eval_return"] = eval_returns.mean(axis=1)
                env_step = updates_done * num_envs
                logger.log(chunk + 1, env_step, elapsed(), per_seed)
                rate = (env_step - session_start[0]) * seeds / max(time.perf_counter() - session_start[1], 1e-9)
                ret = per_seed["episode_return"]
                progress.update(task, completed=env_step, sps=rate,
                                ret="-" if np.all(np.isnan(ret)) else f"{np.nanmean(ret):.1f}")
                done_chunks = chunk + 1
                if is_last or done_chunks % run.checkpoint_every == 0:
                    checkpointer.save(updates_done, (learner, actor_state), meta())
                    saved_at = updates_done
    except KeyboardInterrupt:
        if saved_at != updates_done:
            checkpointer.save(updates_done, (learner, actor_state), meta())
        raise RunInterrupted(
            f"interrupted after {updates_done * num_envs} env steps per seed; "
            f"checkpoint saved; continue with: sparqrl train --resume {out}"
        ) from None
    finally:
        stop.close()
        logger.close()
        checkpointer.close()
        actor.close()

    if eval_returns is None:  # resumed a run that had already finished
        eval_returns = evaluate(learner, run.eval_episodes)
    wall = elapsed()
    final = eval_returns.mean(axis=1)
    steps = num_updates * num_envs
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
        "env_steps_per_s": steps * seeds / max(wall - compile_time, 1e-9),
        "compile_time_s": compile_time,
        "device": _device_name(),
        "runner": "sebulba",
        "actors": 1,
        "actor_precision": "fp32",
        "actor_steps_per_s": steps * seeds / max(timers["actor_s"], 1e-9),
        "learner_updates_per_s": gradient_steps * seeds / max(timers["learner_s"], 1e-9),
        **loop.summary,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_returns(out / "metrics.csv", out / "returns.png", f"{algo_name} on {run.env}, {seeds} seed(s)")
    return summary


def evaluate_saved(out_dir: str | Path, episodes: int | None = None, seed: int | None = None) -> dict:
    """Evaluate the saved policy of a host-environment run: deterministic episodes per seed."""
    out = Path(out_dir)
    algo_name, config, run = load_config(out)
    module, config, spec = _prepare(algo_name, config, run)
    loop: OffPolicy = module.make_offpolicy(config, spec)
    episodes = run.eval_episodes if episodes is None else episodes
    cfg.require(episodes >= 1, "episodes", episodes, "must be >= 1")
    keys = jax.random.split(jax.random.PRNGKey(run.seed), run.seeds)
    learner_shape = jax.eval_shape(jax.vmap(loop.init), keys)
    actor_shape = ActorState(keys, jnp.zeros(run.seeds, jnp.int32))
    checkpointer = Checkpointer(out / "checkpoint")
    try:
        (learner, _), _ = checkpointer.restore(abstract_like((learner_shape, actor_shape)))
    finally:
        checkpointer.close()
    per_seed = _evaluate_seeds(loop, run.env, jax.vmap(loop.policy)(learner), episodes,
                               run.seed + 100 if seed is None else seed).mean(axis=1)
    return {"env": run.env, "episodes_per_seed": episodes, "return_mean": float(per_seed.mean()),
            "return_std": float(per_seed.std()), "return_per_seed": [float(x) for x in per_seed]}


def _evaluate_seeds(loop: OffPolicy, env_name: str, params: Any, episodes: int, base_seed: int) -> np.ndarray:
    """[seeds, episodes] deterministic returns: seed i's policy (`params` [seeds, ...]) on host envs
    seeded base_seed + i."""
    greedy = jax.jit(lambda p, o: loop.to_env(loop.greedy(p, o)))
    seeds = jax.tree.leaves(params)[0].shape[0]
    return np.stack([
        evaluate_host(env_name, lambda o, i=i: np.asarray(greedy(jax.tree.map(lambda x: x[i], params), o)),
                      episodes, base_seed + i)
        for i in range(seeds)
    ])


def _example_row(spec: Any, seeds: int, num_envs: int) -> Transition:
    """Zeros shaped like one rollout row [seeds, num_envs, ...] (what `learn` is compiled for)."""
    lead = (seeds, num_envs)
    obs = np.zeros(lead + tuple(spec.observation_shape), np.float32)
    action = np.zeros(lead + tuple(spec.action_space.shape), np.float32)
    flag = np.zeros(lead, bool)
    return Transition(obs, action, np.zeros(lead, np.float32), obs, flag, flag, action)

"""The actor-learner ("Sebulba") runner for host environments (`gym:NAME`): ActorQ on Ray.

    actors  (CPU)     `--actors N` actors (`sparqrl.runners.actors`), each stepping its own seeds × num_envs
                      Gymnasium environments with the newest policy copy it was handed, in the precision
                      `--actor-precision` names; they send `Fragment`s of T env steps tagged with the
                      policy version they were acted with (DQN adds Ape-X's actor-side priorities);
    learner (device)  learns from each fragment as it arrives (one jitted, donated call: the algorithm's
                      `learn` on the fragment [T, N], vmapped over seeds) and every `publish_every` updates
                      quantizes its fp32 policy network once and publishes it as the next version; in this
                      process, or with `--learner-resources` in a Ray actor on a cluster node that offers them
                      (`runners.learner`: the same `Learner` either way; this process keeps the run folder).

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
import itertools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sparqrl import config as cfg, presets
from sparqrl.algos import get_algorithm
from sparqrl.algos.base import ActorLearner, Step, acting_aux, explore_one, forward, recurrent_acts
from sparqrl.envs import evaluate_host, host_spec, is_atari
from sparqrl.envs.custom import is_local
from sparqrl.extras import need_installed
from sparqrl.runners.actors import (
    ActorSpec,
    Fragment,
    Placement,
    RayPool,
    check_ray_address,
    make_pool,
    network_paths,
    ray_session,
)
from sparqrl.runners.learner import Learner, LearnerClient, RemoteLearnerBase, place_learner
from sparqrl.runners.rundir import RunDir, start_run_dir
from sparqrl.runners.run_config import RunConfig
from sparqrl.signals import StopRequests
from sparqrl.runners.session import (ChunkHook, Deferred, check_memory, chunk_bounds, concrete, eval_summary, notify,
                                     run_session, saved_state, use_compile_cache)


class Prepared:
    """A checked run: the algorithm module, its resolved config, the env spec and the actor-learner."""

    def __init__(self, algo_name: str, algo_config: Any, run: RunConfig):
        module = get_algorithm(algo_name)
        run.validate()
        cfg.check_numbers(algo_config)
        self.spec = host_spec(run.env)
        self.config = algo_config.validate(self.spec)
        self.al: ActorLearner = module.make_actor_learner(self.config, self.spec)
        envs = run.seeds * self.al.num_envs
        cfg.require(envs <= MAX_ENVS_PER_ACTOR, "num_envs", self.al.num_envs, f"gives each actor seeds x num_envs = "
                    f"{envs:,} host environments; one actor steps at most {MAX_ENVS_PER_ACTOR:,} (each a Python object "
                    "stepped in turn by one process); lower seeds or num_envs")
        self.T = resolve_fragment_steps(algo_name, self.al, run)
        if self.al.for_fragments is not None:
            self.al = self.al.for_fragments(self.T)
        cfg.require(run.inference == "actor" or self.al.acting.priority is None, "inference", run.inference,
                    f"is not available for {algo_name}: its actors compute Ape-X priorities with their own policy "
                    "copy, and with central inference they hold none (use inference=actor)")
        self.fragments = self.al.steps_per_env // self.T
        cfg.require(self.fragments >= 1, "fragment_steps", self.T,
                    f"must be <= the run's env steps per environment ({self.al.steps_per_env})")
        # The policy network must be a Dense chain (after any convolutions) for any precision: checked here,
        # before compiling.
        self.policy_fn = jax.jit(jax.vmap(self.al.policy))
        keys = jax.random.split(jax.random.PRNGKey(run.seed), run.seeds)
        self.learner_shape = jax.eval_shape(jax.vmap(self.al.init), keys)
        check_memory(self.learner_shape, run)
        policy_shape = jax.eval_shape(jax.vmap(self.al.policy), self.learner_shape)
        one = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), policy_shape)
        recurrent = self.al.acting.memory is not None  # (its actors run the network whole: `actors.recurrent_step`)
        self.paths = None if recurrent else network_paths(self.al.acting, one, self.spec.observation_shape)


MAX_ENVS_PER_ACTOR = 4096
"""Host environments (seeds x num_envs) one actor process holds and steps, checked before anything starts."""
DEFAULT_FRAGMENT_STEPS = 10  # replay-based learners: store and learn step by step, so T only sets the batching


def resolve_fragment_steps(algo_name: str, al: ActorLearner, run: RunConfig) -> int:
    """T: the learner's own (PPO: num_steps) or the run's `fragment_steps` (default 10)."""
    if al.fragment_steps:
        cfg.require(run.fragment_steps in (None, al.fragment_steps), "fragment_steps", run.fragment_steps,
                    f"{algo_name} learns from fragments of exactly its num_steps ({al.fragment_steps}) env steps "
                    "per environment: leave fragment_steps unset and set num_steps")
        return al.fragment_steps
    return DEFAULT_FRAGMENT_STEPS if run.fragment_steps is None else run.fragment_steps


def check_extras(run: RunConfig) -> None:
    """The extras a run's actors need, before it starts (loading its policy needs neither)."""
    if run.actor_precision == "int8":
        need_installed("onnxruntime", "actor_precision=int8 (ONNX Runtime's integer kernels)")
    if run.env_backend == "envpool":
        from sparqrl.envs.envpool_env import task_id

        task_id(run.env)  # installed, and has the game
    if run.resolved_backend == "ray":
        need_installed("ray", f"backend=ray ({run.actors} actors)")
        cfg.require(not is_local(run.env), "env", run.env, "is an object of this process, which Ray's actor "
                    "processes cannot rebuild: define it at module level of an importable module, or use --backend inline")
        if run.ray_address is not None:
            check_ray_address(run.ray_address)  # (before the run folder is written)


def check_learner(algo_name: str, run: RunConfig, driver: type | None) -> None:
    """A remote learner (`--learner-resources`) is `SebulbaDriver`'s: refused, before anything is written, for a
    driver of its own (gradient actors', `runners.gradients`, whose learner applies what its actors send)."""
    cfg.require(run.learner_resources is None or driver is None, "learner_resources", run.learner_resources,
                f"is not available for {algo_name}: its actors send gradients, which the learner in this process "
                "applies")


def train(algo_name: str, algo_config: Any, run: RunConfig, *, on_chunk: ChunkHook | None = None,
          driver: type | None = None) -> dict:
    """Train from scratch on a host environment; returns the summary (also in `run.out/summary.json`).
    driver: `SebulbaDriver` (None) or a subclass (`runners.gradients`)."""
    check_extras(run)
    check_learner(algo_name, run, driver)
    prepared = Prepared(algo_name, algo_config, run)
    if run.preset not in ("auto", "none"):  # said once every check has passed, as on the device
        notify(presets.describe(run.preset, prepared.config, run.env, run))
    rundir = start_run_dir(algo_name, prepared.config, run)
    return _run(prepared, algo_name, run, rundir, resuming=False, on_chunk=on_chunk, driver=driver)


def resume(rundir: RunDir, algo_name: str, algo_config: Any, run: RunConfig, *,
           on_chunk: ChunkHook | None = None, driver: type | None = None) -> dict:
    """Continue the run in `rundir` from its newest intact checkpoint (fresh host episodes); driver: as `train`'s."""
    check_extras(run)
    check_learner(algo_name, run, driver)
    return _run(Prepared(algo_name, algo_config, run), algo_name, run, rundir, resuming=True, on_chunk=on_chunk,
                driver=driver)


def _learn_fragment(al: ActorLearner):
    """(learner [S], steps [T, S, N, ...]) -> (learner, per-seed metrics [S], means over the fragment). A learner
    that joins fragments (`ActorLearner.joins_fragments`: a replay's n-step windows) gets each one's last step
    marked truncated (`end_fragment`): the fragment it stores next may come from another actor's envs."""
    cnn = al.acting.features is not None

    def learn(learner: Any, steps: Any) -> tuple[Any, dict]:
        if al.joins_fragments:
            steps = end_fragment(steps)
        steps = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), steps)  # [S, T, N, ...]
        if cnn and jax.tree.leaves(steps)[0].shape[0] == 1:  # one seed of a CNN learner: not vmapped (XLA's
            # CPU runs a vmapped CNN's gradient ~2x slower: benchmarks/dqn_atari_learner.py --vmap)
            learner, metrics = al.learn(*jax.tree.map(lambda x: x[0], (learner, steps)))
            return jax.tree.map(lambda x: x[None], (learner, metrics))
        return jax.vmap(al.learn)(learner, steps)

    return learn


def end_fragment(steps: Step) -> Step:
    """A fragment `steps` (leaves [T, ...]) with its last step marked `truncated`: an n-step window ends there and
    bootstraps from that step's next_obs, as at a time limit (a step also terminated stays terminated)."""
    return steps._replace(truncated=jnp.asarray(steps.truncated, jnp.bool_).at[-1].set(True))


def _run(p: Prepared, algo_name: str, run: RunConfig, rundir: RunDir, *, resuming: bool,
         on_chunk: ChunkHook | None, driver: type | None = None) -> dict:
    """One session of a run (fresh or resumed). Ray, when used, starts first: before the session's own
    threads (energy meter, logger, checkpointer, XLA's compiler); see `ray_session`."""
    processes = run.actors + (run.inference == "central")  # actors, and the central inference server
    with ray_session(run.ray_address, processes) if run.resolved_backend == "ray" else contextlib.nullcontext():
        return run_session(rundir, run, algo_name, (driver or SebulbaDriver)(p, algo_name, run), resuming=resuming,
                           on_chunk=on_chunk)


TIMERS = ("startup_s", "actor_busy_s", "learner_s", "publish_s", "wait_s")


class SebulbaDriver:
    """The actor-learner run for the shared session loop: one chunk is `bounds[c] - bounds[c-1]`
    fragments, each learnt as it arrives. Checkpoints are numbered by learner updates (= policy
    versions): an interrupt saves the learner exactly where it stopped, which may be inside a chunk."""

    actor_class: type | None = None  # what the pool runs: `Actor` (None) or a subclass (`runners.gradients`)
    publishes_params = False  # True: every version carries the fp32 policy params too (`PolicyCopy.params`)

    def __init__(self, p: Prepared, algo_name: str, run: RunConfig):
        self.p, self.run = p, run
        self.al = p.al
        self.T = p.T
        self.bounds = chunk_bounds(p.fragments, run.chunks)
        self.env_steps_per_update = self.T * p.al.num_envs
        self.members = run.seeds
        self.member_names = [f"seed {i}" for i in range(run.seeds)]
        self.compile_time_s = 0.0
        self.timers = dict.fromkeys(TIMERS, 0.0)
        self.prior = {"versions": 0, "restarts": 0, "dropped": 0, "lost": 0}
        self.counts = {"versions": 0, "lag_sum": 0.0, "fragments": 0, "order_violations": 0, "nbytes": 0, "dropped": 0}
        self.max_lag = run.resolved_max_lag if p.al.on_policy else None
        self.spec = ActorSpec(algo_name, p.config, run.env, run.seeds, run.actors, self.T, run.seed, run.imports,
                              run.inference, run.inference_deadline_ms, run.env_backend, run.actor_precision,
                              run.quant_granularity)
        self.learn_fragment = _learn_fragment(p.al)
        self.pool = None
        self.learner: Learner | LearnerClient | None = None  # `build` makes it
        self.state: Any = None  # the learner's state as of the last chunk (`LearnerState`) or the start
        self.started = self.learning = False  # `start` ran; a fragment was learned (after set-up and compilation)
        self.updates_done = 0
        self.last_seen: dict[tuple[int, int], tuple[int, int]] = {}  # place -> (sequence, version) of its latest
        # On a cluster: the actors over its nodes; each (place, incarnation) logs its node once
        self.placement = Placement(run.actors_per_node) if run.ray_address is not None else None
        self.nodes_logged: set[tuple[int, int]] = set()
        self._stop: StopRequests | None = None

    @property
    def startup_s(self) -> float:
        return self.timers["startup_s"]

    def abstract_state(self) -> Any:
        return self.p.learner_shape

    def build(self) -> None:
        start = time.perf_counter()
        self.learner = self.make_learner()  # (a remote one first: bad --learner-resources end before compiling)
        self.timers["startup_s"] += time.perf_counter() - start  # (starting a remote one is set-up)
        if self.run.progress:  # the learner's programs compile now and at the first fragment (JAX's persistent
            # cache, when on, makes a later run of this configuration load them instead)
            notify(f"compiling the learner for {self.run.env} (later runs of this configuration load it from the "
                   "compile cache)" if self.run.compile_cache else f"compiling the learner for {self.run.env} (the "
                   "compile cache is off (--no-compile-cache): every run compiles)")
        start = time.perf_counter()
        self._keys = jax.random.split(jax.random.PRNGKey(self.run.seed), self.run.seeds)
        self._init = jax.jit(jax.vmap(self.al.init)).lower(self._keys).compile()
        self.compile_time_s += time.perf_counter() - start  # the learner compiles for the first fragment

    def init_state(self) -> Any:
        return self._init(self._keys)

    def make_learner(self) -> Learner | LearnerClient:
        """The learner: in this process, or (`--learner-resources`) in a Ray actor placed with those resources."""
        run = self.run
        if run.learner_resources is None:
            return Learner(self.al, self.p.policy_fn, self.p.paths, run, self.learn_fragment, self.publishes_params)
        client = place_learner(RemoteLearner, run.resolved_learner_resources, (self.spec.algo, self.p.config, run),
                               f"sparqrl train --resume {run.out} --ray-address {run.ray_address}", run.learner_resources)
        notify(f"the learner runs on node {client.node} ({client.device}; learner_resources {run.learner_resources})")
        return client

    def meta(self) -> dict[str, Any]:
        return {**self.timers, "versions": self.prior["versions"] + self.counts["versions"],
                "restarts": self.prior["restarts"] + (self.pool.restarts if self.pool is not None else 0),
                "dropped": self.prior["dropped"] + self.counts["dropped"],
                "lost": self.prior["lost"] + (self.pool.requests_lost if self.pool is not None else 0)}

    def restore_meta(self, meta: dict[str, Any]) -> None:
        self.timers = {k: float(meta.get(k, 0.0)) for k in TIMERS}
        self.prior = {k: int(meta.get(k, 0)) for k in self.prior}

    def _publish(self) -> Any:
        start = time.perf_counter()
        ref, nbytes = self.learner.publish(self.pool, self.updates_done)
        self.timers["publish_s"] += time.perf_counter() - start
        self.counts["versions"] += 1
        self.counts["nbytes"] = nbytes
        return ref

    def start(self, state: Any, updates_done: int, stop: StopRequests) -> None:
        self.learner.start(state)
        self.state, self.updates_done, self._stop, self.started = state, updates_done, stop, True
        self._pool_start = time.perf_counter()
        remote = isinstance(self.learner, LearnerClient)
        self.pool = make_pool(self.run.resolved_backend, self.spec, reseed=updates_done, actor_class=self.actor_class,
                              placement=self.placement, apart=remote, check_source=self.learner.check if remote else None)
        self._copy_ref = self._publish()
        for actor_id in range(self.run.actors):
            for _ in range(self.run.resolved_in_flight):
                self.pool.submit(actor_id, self._copy_ref)

    def run_chunk(self, chunk: int) -> tuple[Any, dict[str, np.ndarray]]:
        seeds, timers, counts = self.run.seeds, self.timers, self.counts
        ep_sum, ep_count = np.zeros(seeds), np.zeros(seeds)
        n = self.bounds[chunk] - self.updates_done
        while self.updates_done < self.bounds[chunk]:
            self._stop.check()  # between learner calls only: never with donated buffers in flight
            t0 = time.perf_counter()
            frag: Fragment = self.pool.next()
            if self.placement is not None:
                self._log_node(frag)
            t1 = time.perf_counter()
            ep_sum += np.where(frag.episode_done, frag.episode_return, 0.0).sum(axis=(0, 2))
            ep_count += frag.episode_done.sum(axis=(0, 2))
            timers["actor_busy_s"] += frag.busy_s
            if self.max_lag is not None and self.updates_done - frag.version > self.max_lag:
                # On-policy data acted with too old a policy: dropped and counted, never learned from.
                counts["dropped"] += 1
                timers["wait_s"] += t1 - t0
                self.pool.submit(frag.actor_id, self._copy_ref)
                continue
            if not self.learning:
                # Starting the actors (processes, Ray, their jitted programs) until the first fragment
                # arrives is set-up, like compilation: kept out of the steps/s rate.
                timers["startup_s"] += t1 - self._pool_start
                self.learning, t0 = True, t1
            compile_s = self.learner.learn(frag.steps)  # compiled for the first fragment's shapes
            t2 = time.perf_counter()
            self.compile_time_s += compile_s
            timers["wait_s"] += t1 - t0
            timers["learner_s"] += t2 - t1 - compile_s
            self.updates_done += 1
            # Versions must not go back within an actor, in the order it made its fragments (which Ray
            # may deliver out of order).
            place = (frag.actor_id, frag.incarnation)
            seq, version = self.last_seen.get(place, (-1, -1))
            counts["order_violations"] += int((frag.sequence - seq) * (frag.version - version) < 0)
            self.last_seen[place] = max((seq, version), (frag.sequence, frag.version))
            counts["lag_sum"] += self.updates_done - 1 - frag.version
            counts["fragments"] += 1
            if self.updates_done % self.run.publish_every == 0:
                self._copy_ref = self._publish()
            self.pool.submit(frag.actor_id, self._copy_ref)
        per_seed = self.learner.take_means(n)
        per_seed["episode_return"] = np.where(ep_count > 0, ep_sum / np.maximum(ep_count, 1), np.nan)
        per_seed["policy_lag"] = np.full(seeds, counts["lag_sum"] / max(counts["fragments"], 1))
        self.state = LearnerState(self, self.updates_done)  # (a remote learner's: fetched only where used)
        return self.state, per_seed

    def learner_at(self, updates: int) -> Learner | LearnerClient:
        """The learner, whose state is still the one after `updates` updates (a chunk's end, or where a run stopped):
        the session uses a chunk's state before the learner goes on, or not at all."""
        assert updates == self.updates_done, f"the state after update {updates} asked after {self.updates_done}"
        return self.learner

    def _log_node(self, frag: Fragment) -> None:
        """One line per actor process of a cluster run, at its first fragment: the node it runs on."""
        place = (frag.actor_id, frag.incarnation)
        node = self.pool.actor_nodes.get(place)
        if node is not None and place not in self.nodes_logged:
            self.nodes_logged.add(place)
            notify(f"actor {frag.actor_id} (incarnation {frag.incarnation}) runs on node {node}")

    def evaluate(self, state: Any) -> np.ndarray:
        if isinstance(state, LearnerState) and not state.fetched:  # only its policy params asked of the learner
            policy = self.learner_at(state.updates).policy_params()
        else:
            policy = self.p.policy_fn(concrete(state))
        return _evaluate_seeds(self.al, self.run.env, policy, self.run.eval_episodes, self.run.seed + 100)

    def interrupted_state(self) -> tuple[int, Any] | None:
        return (self.updates_done, LearnerState(self, self.updates_done)) if self.started else None

    def finish(self, rundir: Any, final: np.ndarray) -> dict[str, Any]:
        return {}

    def summary(self) -> dict[str, Any]:
        steps, seeds, timers, counts = self.bounds[-1] * self.env_steps_per_update, self.run.seeds, self.timers, self.counts
        gradient_steps = int(np.asarray(concrete(self.state).gradient_steps)[0])  # this session's and earlier ones
        # (the last chunk's state: fetched already to checkpoint it)
        pool = self.pool
        stats = pool.server_stats() if isinstance(pool, RayPool) else None  # actors' requests per batch
        server = {} if stats is None else {"inference_batch_mean": stats["mean_batch"]}
        return {
            "runner": "sebulba",
            "backend": pool.backend,
            "actors": self.run.actors,
            "actor_precision": self.run.actor_precision,
            # env steps (all seeds) per second of one actor's busy time (acting + stepping, not waiting)
            "actor_steps_per_s": steps * seeds / max(timers["actor_busy_s"], 1e-9),
            "learner_updates_per_s": gradient_steps * seeds / max(timers["learner_s"], 1e-9),
            "startup_s": timers["startup_s"],
            "learner_wait_s": timers["wait_s"],
            "publish_s": timers["publish_s"],
            "versions_published": self.prior["versions"] + counts["versions"],
            "broadcast_bytes": counts["nbytes"],
            "policy_lag_mean": counts["lag_sum"] / max(counts["fragments"], 1),
            "fragment_steps": self.T,
            "inference": self.run.inference,
            **server,
            "max_lag": self.max_lag,
            "fragments_dropped": self.prior["dropped"] + counts["dropped"],
            "version_order_violations": counts["order_violations"],
            "actor_restarts": self.prior["restarts"] + pool.restarts,
            # Ray: distinct nodes that ran this session's actors, and how many of them were lost during it
            "actor_nodes": len(set(pool.actor_nodes.values())),
            "nodes_lost": pool.nodes_lost(),
            "fragments_lost": self.prior["lost"] + pool.requests_lost,
            "actor_failures": [f"actor {f.actor_id} incarnation {f.incarnation}: {f.error}" for f in pool.failures[:10]],
            **({} if self.learner.node is None else {"learner_node": self.learner.node,
                                                     "learner_device": self.learner.device}),
            **self.al.summary,
        }

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
        if self.learner is not None:
            self.learner.close()


class LearnerState(Deferred):
    """The learner's state after `updates` updates, fetched from it (`SebulbaDriver.learner_at`) only where used."""

    def __init__(self, driver: SebulbaDriver, updates: int):
        super().__init__(lambda: driver.learner_at(updates).current())
        self.updates = updates


class RemoteLearner(RemoteLearnerBase):
    """A run's `Learner` in a Ray actor (`--learner-resources`), built there from the run's settings: the same
    algorithm, config, policy network checks and compile cache as the driver's."""

    def __init__(self, algo_name: str, algo_config: Any, run: RunConfig):
        use_compile_cache(run.compile_cache)  # before anything compiles in this process
        p = Prepared(algo_name, algo_config, run)
        super().__init__(p.al, p.policy_fn, p.paths, run, _learn_fragment(p.al), publishes_params=False)


def evaluate_saved(rundir: RunDir, algo_name: str, config: Any, run: RunConfig, episodes: int, seed: int | None) -> dict:
    """Evaluate the saved policy of a host-environment run: episodes per seed (fp32; `_evaluate_seeds`)."""
    p = Prepared(algo_name, config, run)
    learner = saved_state(rundir, p.learner_shape)
    per_seed = _evaluate_seeds(p.al, run.env, p.policy_fn(learner), episodes,
                               run.seed + 100 if seed is None else seed).mean(axis=1)
    return eval_summary(run, episodes, per_seed)


def greedy_policy(al: ActorLearner, obs_ndim: int) -> Any:
    """(fp32 policy params of one seed, observation(s)) -> the deterministic action(s) the env takes; a recurrent
    policy's `RecurrentAct`, which refuses single observations in one line."""
    acting = al.acting
    if acting.memory is not None:
        return recurrent_acts(acting, obs_ndim)[0]
    return lambda p, obs: acting.to_env(acting.greedy(forward(acting, p, obs, obs_ndim)))


def sampling_policy(al: ActorLearner, obs_ndim: int) -> Any:
    """(fp32 policy params of one seed, ONE observation, key) -> the exploring action the env takes, as an
    actor's first env slot acts once past any warm-up; a recurrent policy's `RecurrentAct` (as `greedy_policy`)."""
    acting = al.acting
    if acting.memory is not None:
        return recurrent_acts(acting, obs_ndim)[1]
    return lambda p, obs, key: acting.to_env(
        explore_one(acting, forward(acting, p, obs[None], obs_ndim), key, acting_aux(acting, p)))[0]


def evaluating_policy(al: ActorLearner, obs_ndim: int) -> Any:
    """(fp32 policy params of one seed, ONE observation, key) -> the action an Atari evaluation takes:
    `Acting.evaluate` where the algorithm has one (DQN: epsilon-greedy at its final epsilon), else the actors'
    exploring action (PPO, IMPALA: a sample of the policy)."""
    acting = al.acting
    if acting.evaluate is None:
        return sampling_policy(al, obs_ndim)
    return lambda p, obs, key: acting.to_env(acting.evaluate(forward(acting, p, obs[None], obs_ndim), key))[0]


def _evaluate_seeds(al: ActorLearner, env_name: str, params: Any, episodes: int, base_seed: int) -> np.ndarray:
    """[seeds, episodes] returns of the fp32 policy: seed i's (`params` [seeds, ...]) on host envs seeded
    base_seed + i. Deterministic actions, except on Atari (`evaluating_policy`): a deterministic policy can stall
    a game that only starts on FIRE (Breakout) until its 27,000-step limit, and Atari results are reported for
    a stochastic policy (Mnih et al. 2015 evaluate with epsilon 0.05; PPO and IMPALA report their sampling
    policy's games)."""
    obs_ndim = len(host_spec(env_name).observation_shape)
    seeds = jax.tree.leaves(params)[0].shape[0]
    if al.acting.memory is not None:
        return np.stack([
            evaluate_host(env_name, RecurrentEpisodes(al, obs_ndim, jax.tree.map(lambda x: x[i], params),
                                                      is_atari(env_name), base_seed), episodes, base_seed + i)
            for i in range(seeds)
        ])
    if is_atari(env_name):
        sample, key = jax.vmap(evaluating_policy(al, obs_ndim), in_axes=(None, 0, 0)), jax.random.PRNGKey(base_seed)
        act_at = jax.jit(lambda p, o, t: sample(p, o, jax.random.split(jax.random.fold_in(key, t), o.shape[0])))
        counter = itertools.count()  # the step: each step's keys are new
        act = lambda p, o: act_at(p, o, next(counter))  # noqa: E731
    else:
        act = jax.jit(greedy_policy(al, obs_ndim))
    return np.stack([
        evaluate_host(env_name, lambda o, i=i: np.asarray(act(jax.tree.map(lambda x: x[i], params), o)),
                      episodes, base_seed + i)
        for i in range(seeds)
    ])


class RecurrentEpisodes:
    """A recurrent policy (`Acting.memory`) of one seed as `evaluate_host`'s `act(obs [episodes, *obs])`: it carries
    each episode's state from the initial one. No reset is needed: `evaluate_host` scores each env's first episode
    only. Deterministic, or on Atari the exploring action (`evaluating_policy`'s rule) with a new key each step."""

    def __init__(self, al: ActorLearner, obs_ndim: int, params: Any, stochastic: bool, seed: int):
        act = recurrent_acts(al.acting, obs_ndim)[1 if stochastic else 0]
        self.params, self.init, self.step = params, act.init, jax.jit(act.step)
        self.memory, self.key = None, jax.random.PRNGKey(seed)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        if self.memory is None:
            self.memory = self.init(obs.shape[0])
        self.key, key = jax.random.split(self.key)
        action, self.memory = self.step(self.params, obs, jax.random.split(key, obs.shape[0]), self.memory)
        return np.asarray(action)

"""Actors of the actor-learner runner and the pools that run them (`inline` in-process, `ray`).

An actor steps `seeds × num_envs` host environments with the latest policy copy it was handed, in the
precision the learner published it in (`sparqrl.quant`: int8 / fp16 / bf16 / fp32), and returns
`Fragment`s of T env steps, each tagged with the policy version it was acted with. Actors keep no state
that must survive: a replaced actor starts fresh episodes with a new incarnation number.

The pools share one interface and one flow control (ActorQ's broadcast + RLlib's requests in flight):
the driver hands each actor at most `in_flight` collect requests, each naming the newest `PolicyCopy`;
a finished fragment frees a slot, which the driver refills with the newest copy. A slow learner thus
slows the actors (they wait for requests) instead of filling memory: at most actors × in_flight
fragments exist at any time. A copy larger than `INLINE_BYTES` is put in Ray's object store once per
version and every request passes the same reference; a smaller one travels inside each request.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import time
import warnings
from collections import deque
from typing import Any, Iterator, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sparqrl import quant, quiet, signals
from sparqrl.config import ConfigError
from sparqrl.algos.base import Step, observe
from sparqrl.envs.envpool_env import make_vec_env
from sparqrl.envs.custom import import_modules
from sparqrl.runners.inference import CentralPolicy, InferenceServer, make_actor_learner, remote_act

# Actors are CPU processes with one thread each, as ActorQ's (torch.set_num_threads(1), GPUs hidden).
ACTOR_ENV = {
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
    "OMP_NUM_THREADS": "1",
}
# The central inference server shares the learner's GPU, where there is one: no preallocation.
SERVER_ENV = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


class PolicyCopy(NamedTuple):
    """What the learner publishes once per version: numpy only, so Ray shares it zero-copy on a node."""

    version: int  # learner updates (fragments learned) that produced it
    stacks: tuple[quant.QuantizedStack, ...]  # the policy network of each seed, in the actors' precision
    env_steps: int  # env steps per seed the learner had consumed (the actors' warm-up clock)
    nbytes: int  # bytes of the stacks, aux and features: what one broadcast carries
    aux: Any = None  # `Acting.aux` of each seed (numpy, fp32, leaves [seeds, ...]), or None
    features: Any = None  # the convolutions before the stacks (`Acting.features`): fp32 [seeds, ...], or None
    params: Any = None  # the fp32 policy params [seeds, ...]: for the central inference server (actors get None),
    # or for actors that compute gradients with them (A3C, `runners.gradients`)
    network: Any = None  # a recurrent policy's network variables of each seed in the actors' precision
    # (`quant.quantize_tree`, weight-only: a tuple [seeds]) instead of `stacks`; None for a feed-forward policy


class Fragment(NamedTuple):
    """What an actor sends: T env steps of its seeds × num_envs environments (numpy leaves)."""

    actor_id: int  # 0 .. actors-1, the actor's place (a replacement keeps it)
    incarnation: int  # 0 for the first process in that place, +1 for each replacement
    sequence: int  # this actor's fragments so far (0, 1, ...): the order it made them in
    version: int  # the PolicyCopy version every step of the fragment was acted with
    steps: Step  # leaves [T, seeds, num_envs, ...]
    episode_return: np.ndarray  # [T, seeds, num_envs], valid where episode_done
    episode_done: np.ndarray  # bool [T, seeds, num_envs]
    busy_s: float  # seconds spent acting and stepping (not waiting)


class ActorSpec(NamedTuple):
    """Everything needed to build an actor anywhere (pickled to Ray workers)."""

    algo: str
    config: Any  # the resolved algorithm config
    env: str  # gym:NAME
    seeds: int
    actors: int
    fragment_steps: int  # T
    seed: int  # the run's base seed
    imports: tuple[str, ...] = ()  # the run's `--import` modules: a Ray worker imports them before the env
    inference: str = "actor"  # "actor": each actor runs its copy; "central": `sparqrl.runners.inference`
    deadline_ms: float = 2.0  # central inference: the longest a batch waits for the other actors' requests
    env_backend: str = "gymnasium"  # what steps the host envs (`envpool_env.make_vec_env`)
    precision: str = "fp32"  # --actor-precision and --quant-granularity: how an actor that makes its own acting
    granularity: str = "channel"  # copy from the fp32 params quantizes it (`gradients.GradientActor`)



class Actor:
    """One actor: host environments, the newest policy copy it has loaded, jitted exploration; or, with
    central inference, host environments only: `central` answers its requests (`inference.Answer`), a
    `CentralPolicy` in this process or the Ray handle of an `InferenceServer`."""

    def __init__(self, spec: ActorSpec, actor_id: int, incarnation: int, reseed: int = 0, central: Any = None):
        import_modules(spec.imports)  # (a no-op in the driver's process, where they are imported)
        al = make_actor_learner(spec.algo, spec.config, spec.env)
        acting, n = al.acting, al.num_envs
        self.spec, self.actor_id, self.incarnation, self.acting = spec, actor_id, incarnation, acting
        self.shape = (spec.seeds, n)
        self.envs = make_vec_env(spec.env, spec.seeds * n, backend=spec.env_backend)
        # Reseeded by place, incarnation and resume count: a replacement never replays its predecessor.
        base = spec.seed + 1000 * (1 + actor_id) + 100_000 * incarnation + 10_000_000 * reseed
        self.obs = self._split(self.envs.reset(base))
        self.key = jax.random.split(jax.random.PRNGKey(base), spec.seeds)
        slots = jnp.asarray(actor_id * n + np.arange(n), jnp.int32)
        total_slots = spec.actors * n

        def explore_leaves(raw: jax.Array, key: jax.Array, env_steps: jax.Array, aux: Any) -> tuple:
            keys = jax.vmap(jax.random.split)(key)  # [seeds, 2]
            action, extra = jax.vmap(acting.explore, in_axes=(0, 0, None, None, None, 0))(
                raw, keys[:, 1], env_steps, slots, total_slots, aux)
            return (acting.to_env(action), action, extra), keys[:, 0]

        def explore(raw: jax.Array, key: jax.Array, env_steps: jax.Array, aux: Any) -> tuple:
            """(env action, action, extra) packed in one float32 array [seeds, B, k] (`_unpack`), next keys."""
            leaves, key = explore_leaves(raw, key, env_steps, aux)
            return jnp.concatenate([x.reshape(x.shape[:2] + (-1,)).astype(jnp.float32) for x in leaves], -1), key

        self._explore = jax.jit(explore)
        self._explore_leaves = explore_leaves
        self._layout: list[tuple[tuple[int, ...], Any]] | None = None  # of the packed leaves (`_unpack`)
        self._split_keys = jax.jit(jax.vmap(jax.random.split))  # as `explore` splits them
        self.central = None if central is None else (central.act if isinstance(central, CentralPolicy)
                                                     else remote_act(central))
        self._features = None
        if acting.features is not None:  # [seeds, B, *obs] -> [seeds, B, F], each seed's convolutions in fp32
            self._features = jax.jit(jax.vmap(acting.features.apply))
        self._observe = None
        if acting.observe is not None:  # obs [seeds, B, *obs] -> the network's input, with each seed's aux
            self._observe = jax.jit(jax.vmap(lambda aux, obs: observe(acting, aux, obs)))
        self.gamma = acting.return_gamma
        self.discounted = np.zeros(self.shape, np.float32)  # each env's discounted return so far
        self._priority = None
        if acting.priority is not None:  # over [T, seeds, ...]
            self._priority = jax.jit(jax.vmap(jax.vmap(acting.priority)))
        self.version, self.env_steps, self.forwards, self.aux, self.sequence = -1, 0, (), None, 0
        self.conv_params, self.raw_width = None, 0  # the copy's convolutions; its network's output width
        self.memory = None  # a recurrent policy's state of every env [seeds, n, ...] (numpy), before the next step
        if acting.memory is not None:
            self.memory = jax.device_get(acting.memory.init(self.shape))
            # by whether the copy is int8 (`quant.int8_apply`); jitted when first used
            self._act_recurrent = {int8: jax.jit(recurrent_step(acting, explore, int8)) for int8 in (False, True)}
            self.variables, self.int8 = None, False  # the copy's network variables [seeds, ...]: fp32, or int8

    def _split(self, x: np.ndarray) -> np.ndarray:
        return x.reshape(self.shape + x.shape[1:])

    def _forward(self, obs: np.ndarray) -> np.ndarray:
        """raw [seeds, B, out] of each seed's policy copy on raw obs [seeds, B, *obs_shape]."""
        if self._observe is not None:
            obs = np.asarray(self._observe(self.aux, obs))
        if self._features is not None:
            flat = np.asarray(self._features(self.conv_params, obs))
        else:
            flat = obs.reshape(obs.shape[:2] + (-1,)).astype(np.float32)
        return np.stack([f(flat[i]) for i, f in enumerate(self.forwards)])

    def _unpack(self, packed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(env action, action, extra) from what `explore` packed (each leaf's dtype and shape, found once).
        One transfer instead of three: each costs an actor ~30 us of Python. Integer actions are exact in float32
        (below 2^24)."""
        if self._layout is None:
            raw = jax.ShapeDtypeStruct(self.shape + (self.raw_width,), jnp.float32)
            leaves, _ = jax.eval_shape(self._explore_leaves, raw, self.key, self.env_steps, self.aux)
            self._layout = [(x.shape, x.dtype) for x in leaves]
        out, start = [], 0
        for shape, dtype in self._layout:
            width = int(np.prod(shape[2:], dtype=np.int64))
            out.append(packed[..., start:start + width].reshape(shape).astype(dtype, copy=False))
            start += width
        return tuple(out)

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        """The Ray node this actor runs on (hex id): a cluster run logs it and counts the nodes it used and lost."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def collect(self, copy: PolicyCopy) -> Fragment:
        """T env steps of every environment with the newest copy this actor holds: `copy` (loaded once per
        version) unless it already acts with a newer one. So the versions of an actor's fragments never go
        back, even if requests are delivered out of order."""
        start = time.perf_counter()
        if copy.version > self.version:
            if self.central is None and copy.network is not None:  # a recurrent policy: its variables, in fp32
                self.int8 = quant.is_int8(copy.network)  # or int8 as sent (`quant.int8_apply`)
                per_seed = copy.network if self.int8 else [quant.dequantize_tree(v) for v in copy.network]
                self.variables = jax.device_put(jax.tree.map(lambda *xs: np.stack(xs), *per_seed))
                self.raw_width = output_width(quant.dequantize_tree(copy.network[0]))
            elif self.central is None:
                self.forwards = tuple(quant.make_forward(stack) for stack in copy.stacks)
                self.raw_width = copy.stacks[0].kernels[-1].shape[1]
            self.version, self.env_steps, self.aux, self.conv_params = (copy.version, copy.env_steps, copy.aux,
                                                                        copy.features)
        seeds, n = self.shape
        rows, returns, dones, discounted, memories = [], [], [], [], []
        acted_with = self.version  # central: the oldest version the server acted with in this fragment
        for step in range(self.spec.fragment_steps):
            if self.memory is not None:  # the state before acting on self.obs, as the learner re-runs it
                memories.append(self.memory)
            if self.central is None and self.memory is not None:
                act = self._act_recurrent[self.int8]
                packed, self.key, memory = act(self.variables, self.aux, self.obs, self.memory, self.key,
                                               self.env_steps)
                env_action, action, extra = self._unpack(np.asarray(packed))
            elif self.central is None:
                packed, self.key = self._explore(self._forward(self.obs), self.key, self.env_steps, self.aux)
                env_action, action, extra = self._unpack(np.asarray(packed))  # one transfer, not three
            else:
                keys = np.asarray(self._split_keys(self.key))
                self.key = keys[:, 0]
                env_action, action, extra, version, memory = self.central(self.actor_id, self.obs, keys[:, 1],
                                                                          self.env_steps, self.version, self.memory)
                acted_with = version if step == 0 else min(acted_with, version)
            # The run's env steps so far as this actor counts them (the learner's count at the copy it
            # loaded last, then every actor stepping as fast as this one): the warm-up clock.
            self.env_steps += n * self.spec.actors
            out = self.envs.step(env_action.reshape((seeds * n,) + env_action.shape[2:]))
            rows.append((self.obs, action, self._split(out.reward), self._split(out.final_obs),
                         self._split(out.terminated), self._split(out.truncated), extra))
            returns.append(self._split(out.episode_return))
            dones.append(self._split(out.episode_done))
            if self.memory is not None:  # an ended episode's env starts the next from the initial state
                self.memory = reset_state(jax.device_get(memory), rows[-1][4] | rows[-1][5])
            if self.gamma is not None:  # G <- gamma G + r, restarted after each episode's end
                self.discounted = self.gamma * self.discounted + rows[-1][2]
                discounted.append(self.discounted)
                self.discounted = np.where(rows[-1][4] | rows[-1][5], 0.0, self.discounted).astype(np.float32)
            self.obs = self._split(out.obs)
        obs, action, reward, next_obs, terminated, truncated, extra = (
            jax.tree.map(lambda *xs: np.stack(xs), *column) for column in zip(*rows))
        priority = np.ones(reward.shape, np.float32)
        steps = Step(obs, action, reward.astype(np.float32), next_obs, terminated, truncated, extra, priority,
                     np.stack(discounted).astype(np.float32) if discounted else None,
                     memory=jax.tree.map(lambda *xs: np.stack(xs), *memories) if memories else None)
        if self._priority is not None:  # Ape-X: initial priorities from this actor's own copy
            raw_next = self._forward(next_obs.swapaxes(0, 1).reshape((seeds, -1) + next_obs.shape[3:]))
            raw_next = raw_next.reshape((seeds, -1, n) + raw_next.shape[2:]).swapaxes(0, 1)
            steps = steps._replace(priority=np.asarray(self._priority(raw_next, steps), np.float32))
        self.sequence += 1
        return Fragment(self.actor_id, self.incarnation, self.sequence - 1, acted_with, steps, np.stack(returns),
                        np.stack(dones), time.perf_counter() - start)

    def collect_apart(self, copy: PolicyCopy) -> tuple[Fragment, Step]:
        """`collect` as two Ray objects (called with num_returns=2): the fragment without its steps, for the driver's
        bookkeeping, and the steps, which the driver hands on to a remote learner by reference (`RayPool` apart)."""
        fragment = self.collect(copy)
        return fragment._replace(steps=None), fragment.steps

    def close(self) -> None:
        self.envs.close()


def recurrent_step(acting: Any, explore: Any, int8: bool = False) -> Any:
    """An actor's step of a recurrent policy (`Acting.memory`) for all its seeds: (variables [seeds, ...], aux
    [seeds, ...], raw obs [seeds, n, *obs], state [seeds, n, ...], keys [seeds, 2], env_steps) -> (what
    `explore` packs, next keys, the state after the step). One program: the cell and the exploration. `int8`:
    the variables are int8 (`quant.quantize_tree`) and every matmul runs in int8 (`quant.int8_apply`)."""
    apply = functools.partial(quant.int8_apply, acting.network) if int8 else acting.network.apply

    def one_seed(variables: Any, aux: Any, obs: jax.Array, memory: Any) -> tuple[jax.Array, Any]:
        raw, _, memory = apply(variables, observe(acting, aux, obs), memory)
        return raw, memory

    def step(variables: Any, aux: Any, obs: jax.Array, memory: Any, key: jax.Array, env_steps: jax.Array) -> tuple:
        raw, memory = jax.vmap(one_seed)(variables, aux, obs, memory)
        packed, key = explore(raw, key, env_steps, aux)
        return packed, key, memory

    return step


def reset_state(memory: Any, done: np.ndarray) -> Any:
    """`nets.memory.reset_carry` in numpy: the initial (zero) state where `done` [...] (an env's episode ended)."""
    return jax.tree.map(lambda c: np.where(done[..., None], np.float32(0), c), memory)


def output_width(variables: Any) -> int:
    """The raw output width of a recurrent actor-critic's variables (its actor head 'Dense_0', [seeds, in, out])."""
    return int(variables["params"]["Dense_0"]["kernel"].shape[-1])


# ---- pools -----------------------------------------------------------------------------------------


MAX_FAILURES_IN_A_ROW = 5
"""A place whose actors fail this often without delivering data stops the run (a broken environment or
cluster, not bad luck)."""


class ActorFailure(NamedTuple):
    actor_id: int
    incarnation: int
    error: str


class _Replacements:
    """What both pools keep about replacing failed actors: every failure, the replacements made, and per
    place the failures since it last delivered a fragment (too many in a row stop the run)."""

    def __init__(self, actors: int):
        self.restarts = 0
        self.failures: list[ActorFailure] = []
        self.failing = [0] * actors
        self.requests_lost = 0  # collect requests whose actor failed before it sent the fragment (never learned)
        self.actor_nodes: dict[tuple[int, int], str] = {}  # (place, incarnation) -> the node it ran on (Ray only)

    def nodes_lost(self) -> int:
        """Nodes that ran this pool's actors and are gone (an in-process pool has no nodes)."""
        return 0

    def _failed(self, actor_id: int, incarnation: int, error: str) -> None:
        """Record a failure of the actor in place `actor_id`, which the caller then replaces."""
        self.failures.append(ActorFailure(actor_id, incarnation, error))
        self.failing[actor_id] += 1
        if self.failing[actor_id] > MAX_FAILURES_IN_A_ROW:
            raise RuntimeError(f"actor {actor_id} failed {self.failing[actor_id]} times in a row without "
                               f"delivering data; last: {error}")
        warnings.warn(f"actor {actor_id} (incarnation {incarnation}) failed and is replaced: {error}")
        self.restarts += 1


class InlinePool(_Replacements):
    """All actors in this process, run one request at a time in submission order (for debugging, tests
    and deterministic runs)."""

    backend = "inline"

    def __init__(self, spec: ActorSpec, reseed: int = 0, actor_class: type | None = None):
        super().__init__(spec.actors)
        self.spec, self.reseed, self.actor_class = spec, reseed, actor_class or Actor
        self.central = CentralPolicy(spec) if spec.inference == "central" else None
        self.actors = [self.actor_class(spec, i, 0, reseed, self.central) for i in range(spec.actors)]
        self.requests: deque[tuple[int, PolicyCopy]] = deque()

    def publish(self, copy: PolicyCopy) -> PolicyCopy:
        if self.central is not None:  # the server gets the weights, actors a ticket
            self.central.load(copy)
            return copy._replace(params=None)
        return copy

    def submit(self, actor_id: int, copy: PolicyCopy) -> None:
        self.requests.append((actor_id, copy))

    def next(self) -> Fragment:
        while True:
            actor_id, copy = self.requests.popleft()
            try:
                fragment = self.actors[actor_id].collect(copy)
            except Exception as error:  # an environment or actor crash: replace the actor, go on
                self.requests_lost += 1
                self._replace(actor_id, repr(error))
                self.submit(actor_id, copy)
                continue
            self.failing[actor_id] = 0
            return fragment

    def _replace(self, actor_id: int, error: str) -> None:
        old = self.actors[actor_id]
        self._failed(actor_id, old.incarnation, error)
        try:
            old.close()
        except Exception:
            pass
        self.actors[actor_id] = self.actor_class(self.spec, actor_id, old.incarnation + 1, self.reseed, self.central)

    def close(self) -> None:
        for actor in self.actors:
            actor.close()


INLINE_BYTES = 64 * 1024
"""Policy copies below this size travel inside each request rather than through Ray's object store."""


class Placement(NamedTuple):
    """Where the actors of a run on a Ray cluster (`--ray-address`) go. `per_node` None: spread over the nodes, one
    per node while there are enough (a SPREAD placement group, one 1-CPU bundle per actor); K: K actors on each
    node (a STRICT_SPREAD group of K-CPU bundles, actor i in bundle i // K). A bundle whose node is lost is placed
    again by Ray on a surviving node with room, where the actor's replacement then starts."""

    per_node: int | None = None

    def bundles(self, actors: int) -> tuple[list[dict[str, float]], str]:
        if self.per_node is None:
            return [{"CPU": 1.0}] * actors, "SPREAD"
        return [{"CPU": float(min(self.per_node, actors - start))} for start in range(0, actors, self.per_node)], \
            "STRICT_SPREAD"

    def bundle(self, actor_id: int) -> int:
        return actor_id if self.per_node is None else actor_id // self.per_node


PLACEMENT_TIMEOUT_S = 120.0
"""How long a run waits for the cluster to reserve its actors' CPUs (`Placement`) before it gives up."""


class RayPool(_Replacements):
    """Each actor a Ray actor process (1 CPU, 1 thread); requests in flight tracked by ObjectRef. With a
    `Placement`, the actors are placed over the cluster's nodes. `apart` (a remote learner): each fragment comes
    back as two objects (`Actor.collect_apart`); `next` fetches the small one and returns the fragment with the
    reference of its steps in place of them, so the steps go from actor to learner without passing here.
    `check_source`: called before a failed actor is replaced; it raises if the published copies' source (a remote
    learner, which owns them) is gone, whose loss fails every request without any actor being at fault."""

    backend = "ray"

    def __init__(self, spec: ActorSpec, reseed: int = 0, actor_class: type | None = None,
                 placement: Placement | None = None, apart: bool = False, check_source: Any = None):
        import ray

        super().__init__(spec.actors)
        self.ray, self.spec, self.reseed, self.apart, self.check_source = ray, spec, reseed, apart, check_source
        self.steps_refs: dict[Any, Any] = {}  # apart: a request's ObjectRef -> the reference of its steps
        if not ray.is_initialized():
            raise RuntimeError("RayPool needs Ray started: use it inside `ray_session(...)`")
        self.remote_actor = ray.remote(num_cpus=1, max_restarts=0, runtime_env={"env_vars": ACTOR_ENV})(
            actor_class or Actor)
        self.placement, self.group, self.node_refs = placement, None, {}
        if placement is not None:
            self.group = self._reserve(placement)
        self.server = None
        if spec.inference == "central":  # on a GPU when the cluster has one (Ray hides GPUs from the others)
            gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
            self.server = ray.remote(num_cpus=1, num_gpus=gpus, max_restarts=0, runtime_env={"env_vars": SERVER_ENV})(
                InferenceServer).remote(spec, spec.deadline_ms)
        self.handles: list[Any] = [self._start(i, 0) for i in range(spec.actors)]
        self.incarnations = [0] * spec.actors
        self.pending: dict[Any, tuple[int, int, Any]] = {}  # ObjectRef -> (actor_id, incarnation, copy ref)
        self.latest: Any = None  # what requests of the newest published version pass

    def _reserve(self, placement: Placement) -> Any:
        """The placement group of the actors' CPUs, once the cluster has reserved them (a `ConfigError` after
        `PLACEMENT_TIMEOUT_S` if it cannot)."""
        from ray.util.placement_group import placement_group, remove_placement_group

        bundles, strategy = placement.bundles(self.spec.actors)
        group = placement_group(bundles, strategy=strategy)
        ready, _ = self.ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            remove_placement_group(group)
            free = sorted((n["Resources"].get("CPU", 0) for n in self.ray.nodes() if n["Alive"]), reverse=True)
            field, value = ("actors_per_node", placement.per_node) if placement.per_node else ("actors", self.spec.actors)
            raise ConfigError(f"{field}={value}: the cluster did not place {len(bundles)} bundle(s) of "
                              f"{bundles[0]['CPU']:g} CPU(s) ({strategy}) within {PLACEMENT_TIMEOUT_S:g} s; its nodes' "
                              f"CPUs: {free}")
        return group

    def _start(self, actor_id: int, incarnation: int) -> Any:
        """A new actor process in place `actor_id` (in its bundle, with a `Placement`); its node is asked for first."""
        remote = self.remote_actor
        if self.group is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            remote = remote.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.group, placement_group_bundle_index=self.placement.bundle(actor_id)))
        handle = remote.remote(self.spec, actor_id, incarnation, self.reseed, self.server)
        self.node_refs[actor_id, incarnation] = handle.node_id.remote()  # (runs before its first collect)
        return handle

    def _learn_node(self, actor_id: int, incarnation: int) -> None:
        """Record the node of (actor_id, incarnation) once its answer is in, without waiting for it."""
        ref = self.node_refs.pop((actor_id, incarnation), None)
        if ref is None:
            return
        try:
            if self.ray.wait([ref], timeout=0)[0]:
                self.actor_nodes[actor_id, incarnation] = self.ray.get(ref)
                return
        except self.ray.exceptions.RayError:  # the actor died before it answered: its node is unknown
            return
        self.node_refs[actor_id, incarnation] = ref

    def nodes_lost(self) -> int:
        dead = {node["NodeID"] for node in self.ray.nodes() if not node["Alive"]}
        return len(dead & set(self.actor_nodes.values()))

    def publish(self, copy: PolicyCopy) -> Any:
        """What every request of this version passes: a small copy itself (Ray copies a task argument under
        its 100 KiB `max_direct_call_object_size` into the request, with no object-store round trip), a large
        one put in the object store once, by reference. Central inference: the server loads the copy, and
        requests pass a ticket without the weights. A reference (a remote learner put the copy in the object store)
        is passed as it is."""
        if isinstance(copy, self.ray.ObjectRef):
            self.latest = copy
            return copy
        if self.server is not None:
            self.server.load.remote(self.ray.put(copy))
            copy = copy._replace(params=None)
        self.latest = copy if copy.nbytes < INLINE_BYTES else self.ray.put(copy)
        return self.latest

    def server_stats(self) -> dict[str, float] | None:
        return None if self.server is None else self.ray.get(self.server.stats.remote())

    def submit(self, actor_id: int, copy_ref: Any) -> None:
        handle = self.handles[actor_id]
        if self.apart:
            ref, self.steps_refs[ref] = handle.collect_apart.options(num_returns=2).remote(copy_ref)
        else:
            ref = handle.collect.remote(copy_ref)
        self.pending[ref] = (actor_id, self.incarnations[actor_id], copy_ref)

    def next(self) -> Fragment:
        """The next fragment any actor has finished. A fragment a dead actor finished before it died is
        still returned (its result belongs to this process, not to the actor); a request it had not
        finished fails, and is submitted again to the actor's replacement, so every place keeps its number
        of requests in flight."""
        while True:
            ready, _ = self.ray.wait(list(self.pending), num_returns=1)
            actor_id, incarnation, copy_ref = self.pending.pop(ready[0])
            steps = self.steps_refs.pop(ready[0], None)
            self._learn_node(actor_id, incarnation)
            try:
                fragment = self.ray.get(ready[0]) if steps is None else self.ray.get(ready[0])._replace(steps=steps)
            except self.ray.exceptions.RayError as error:  # died (its node too), raised, or never started
                if self.check_source is not None:
                    self.check_source()
                self.requests_lost += 1
                if incarnation == self.incarnations[actor_id]:  # not yet replaced
                    self._replace(actor_id, f"{type(error).__name__}: {str(error).splitlines()[0]}")
                self.submit(actor_id, self.latest)  # the newest version (an on-policy learner would drop an old one)
                continue
            if incarnation == self.incarnations[actor_id]:
                self.failing[actor_id] = 0
            return fragment

    def _replace(self, actor_id: int, error: str) -> None:
        """Replace a dead actor by a new process in its place (a new incarnation)."""
        self._failed(actor_id, self.incarnations[actor_id], error)
        self.ray.kill(self.handles[actor_id], no_restart=True)
        self.incarnations[actor_id] += 1
        self.handles[actor_id] = self._start(actor_id, self.incarnations[actor_id])

    def pids(self) -> list[int]:
        return self.ray.get([h.pid.remote() for h in self.handles])

    def close(self) -> None:
        """End our actors and inference server (the Ray instance is `ray_session`'s)."""
        for handle in self.handles + ([self.server] if self.server is not None else []):
            try:
                self.ray.kill(handle, no_restart=True)
            except Exception:
                pass
        self.pending.clear()
        self.steps_refs.clear()
        if self.group is not None:  # the cluster's CPUs it reserved, freed for other runs
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.group)


_local_instance_ran = False  # see ray_session

# Ray's own switch for a local-only instance (what it does on macOS and Windows): with it off, the node's
# IP is the loopback address, and every process of the instance listens there only.
_RAY_CLUSTER_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOOPBACK = ("127.0.0.1", "::1")


@contextlib.contextmanager
def _loopback_node() -> Iterator[None]:
    """While a local Ray instance starts: its node's IP is the loopback address, so that every process it
    starts listens on loopback only. Ray (2.60) binds its servers to loopback when the node's IP is a
    loopback one (GCS, raylet and object manager, the core workers' gRPC servers of the driver and actors,
    the runtime-env and dashboard agents, the metrics exporters) and to all interfaces otherwise; but
    `ray.init(_node_ip_address="127.0.0.1")` alone is turned into the machine's address, unless Ray's
    local-only switch is off (`ray_constants.ENABLE_RAY_CLUSTER`, read from the environment variable
    `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER` when Ray is imported). Both are set here for the start only and
    restored after: the variable for the processes the instance starts (they inherit it), the constant for
    this process, which imported Ray already. Joining a cluster (`address`) does not come here."""
    import ray._private.ray_constants as ray_constants

    saved_env, saved_constant = os.environ.get(_RAY_CLUSTER_SWITCH), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[_RAY_CLUSTER_SWITCH] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_constant
        if saved_env is None:
            os.environ.pop(_RAY_CLUSTER_SWITCH, None)
        else:
            os.environ[_RAY_CLUSTER_SWITCH] = saved_env


@contextlib.contextmanager
def _signals_kept() -> Iterator[None]:
    """While Ray starts: SIGTERM stays the run's flag (`sparqrl.signals`). `ray.init` (2.60) takes SIGTERM over
    (its driver's `sys.exit`, the head node's clean-up), through `ray._private.utils.set_sigterm_handler`: a no-op
    here for the start (which takes ~20 s on a loaded 2-core machine), and any handler Ray installs otherwise is
    undone after it (`signals.kept`). Ray's processes still end with the run: `ray_session` shuts Ray down."""
    import ray._private.utils as ray_utils

    saved = ray_utils.set_sigterm_handler
    ray_utils.set_sigterm_handler = lambda handler: None
    try:
        with signals.kept():
            yield
    finally:
        ray_utils.set_sigterm_handler = saved


RAY_CONNECT_TIMEOUT_S = 5.0
"""How long `check_ray_address` waits for a cluster's port to answer."""


def check_ray_address(address: str, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """A one-line `ConfigError` unless the Ray cluster `address` names answers within `timeout_s` (a TCP connect
    to its GCS port; `ray://HOST:PORT`: to its client server). "auto" is the cluster Ray itself would join
    (RAY_ADDRESS, then the newest `ray start` on this machine). Checked before the run folder is written:
    `ray.init` answers no cluster with a traceback, and an address where nothing listens only after minutes
    (its GCS reconnect timeouts). A port that answers must then complete a gRPC (HTTP/2) handshake within the same
    bound, as a Ray GCS and a Ray client server do: anything else listening there (a web server, a database, a
    silent socket) is refused here, where `ray.init` would wait ~30 s after the folder was written."""
    import ray._private.services as services

    try:
        target = (address.removeprefix("ray://") if address.startswith("ray://")
                  else services.canonicalize_bootstrap_address(address))
    except ConnectionError:  # "auto", and Ray finds no cluster
        raise ConfigError(f"ray_address={address!r}: no Ray cluster is running on this machine (RAY_ADDRESS is unset "
                          "and no `ray start` cluster was found); start one with `ray start --head`, or leave "
                          "--ray-address out to run a local instance of this run") from None
    except ValueError:
        raise ConfigError(f"ray_address={address!r} is not allowed: must be HOST:PORT, ray://HOST:PORT or auto"
                          ) from None
    if target is None:  # "local": the run starts its own instance
        return
    host, _, port = target.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as error:
        why = getattr(error, "strerror", None) or error  # ('Connection refused'; a timeout has none)
        raise ConfigError(f"ray_address={address!r}: nothing answers at {target} within {timeout_s:g} s ({why}); "
                          "start the cluster (`ray start --head`) or give its GCS's address (HOST:6379 by default)"
                          ) from None
    if not speaks_grpc(target, timeout_s):
        raise ConfigError(f"ray_address={address!r}: {target} answers but not as gRPC within {timeout_s:g} s, so it is "
                          "not a Ray cluster's GCS (or client server); give the address `ray start --head` printed "
                          "(HOST:6379 by default)")


def speaks_grpc(target: str, timeout_s: float) -> bool:
    """Whether `target` (HOST:PORT) completes a gRPC channel's HTTP/2 handshake within `timeout_s`: a transport
    check (no call, no credentials), which a Ray GCS or client server passes at once. grpc comes with Ray."""
    import grpc

    channel = grpc.insecure_channel(target)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout_s)
        return True
    except grpc.FutureTimeoutError:
        return False
    finally:
        channel.close()


@contextlib.contextmanager
def ray_session(address: str | None, actors: int) -> Iterator[None]:
    """Ray for one run: join the cluster at `address`, or start a new local instance (address "local":
    never one found running) with a CPU per actor even on fewer cores (`actors` counts a central inference
    server too); on exit, disconnect, which ends a local instance and every process it started. Nothing if
    Ray is already running in this process.

    A local instance listens on loopback only (`_loopback_node`) and has no dashboard: joining a cluster
    is the one way a run is reachable from other machines (README, "Ray and the network").

    Runners enter it first, before they start threads of their own (energy meter, logger, checkpointer,
    XLA's compiler): Ray forks its processes here, and once a start of the local instance hung in fork
    in a process that had many threads running. Ray's start keeps the run's signal handlers (`_signals_kept`):
    a Ctrl-C or SIGTERM sent before or during it stops the run as one sent later."""
    import ray

    global _local_instance_ran
    if ray.is_initialized():
        yield
        return
    if address:
        if _local_instance_ran:
            raise RuntimeError(
                f"ray_address={address!r}: this Python process already ran a local Ray instance, and Ray (2.60) "
                "then fails to create actors on a cluster it joins (each dies before it starts); join the "
                "cluster from a new process, e.g. `sparqrl train ... --ray-address ADDRESS`")
        try:
            with _signals_kept(), quiet.exec_forks():
                ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        except ConnectionError as error:  # it answered `check_ray_address`'s connect, but not as a Ray cluster
            raise ConfigError(f"ray_address={address!r}: {error} (something answers there, but not a Ray "
                              "cluster's GCS of this Ray version)") from None
    else:
        with _loopback_node(), _signals_kept(), quiet.exec_forks():  # Ray starts its processes with subprocess
            ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False,
                     logging_level="ERROR", log_to_driver=False, num_cpus=max(os.cpu_count() or 1, actors))
        _local_instance_ran = True
        node_ip = ray._private.worker.global_worker.node.node_ip_address
        if node_ip not in LOOPBACK:  # a Ray that no longer honours the switch: refuse to listen beyond
            ray.shutdown()
            raise RuntimeError(f"the local Ray instance's node IP is {node_ip}, not loopback: its processes "
                               "would listen on every interface of this machine")
    try:
        yield
    finally:
        ray.shutdown()


def make_pool(backend: str, spec: ActorSpec, reseed: int = 0, actor_class: type | None = None,
              placement: Placement | None = None, apart: bool = False, check_source: Any = None
              ) -> InlinePool | RayPool:
    """The actors of a run (a ray pool inside `ray_session`); `actor_class`: `Actor` (None) or a subclass; `placement`:
    over a cluster's nodes (`Placement`), or None, where Ray puts them (one node); `apart`, `check_source`:
    `RayPool`'s (a remote learner)."""
    if backend == "ray":
        return RayPool(spec, reseed, actor_class, placement, apart, check_source)
    return InlinePool(spec, reseed, actor_class)


def quantized_copy(version: int, policy: Any, acting: Any, paths: Any, precision: str, granularity: str,
                   env_steps: int) -> PolicyCopy:
    """Quantize each seed's policy network (numpy policy params [seeds, ...]) into a `PolicyCopy`; the
    acting's aux (fp32) goes with it. A recurrent policy (`Acting.memory`) goes as its variables
    (`recurrent_network`)."""
    seeds = jax.tree.leaves(policy)[0].shape[0]
    fp32 = lambda tree: jax.tree.map(lambda x: np.asarray(x, np.float32), jax.device_get(tree))  # noqa: E731
    aux = None if acting.aux is None else fp32(_seeds_aux(acting.aux)(policy))
    if acting.memory is not None:
        network = recurrent_network(acting, policy, precision, granularity)
        nbytes = sum(quant.nbytes(v) for v in network) + sum(x.nbytes for x in jax.tree.leaves(aux))
        return PolicyCopy(version, (), env_steps, nbytes, aux, network=network)
    stacks = tuple(
        quant.quantize(quant.dense_stack(acting.network_params(jax.tree.map(lambda x: x[i], policy)), paths,
                                         acting.activation), precision, granularity)
        for i in range(seeds)
    )
    features = None
    if acting.features is not None:
        features = fp32(jax.vmap(lambda p: acting.features.select(acting.network_params(p)))(policy))
    nbytes = sum(quant.nbytes(s) for s in stacks) + sum(x.nbytes for x in jax.tree.leaves((aux, features)))
    return PolicyCopy(version, stacks, env_steps, nbytes, aux, features)


def recurrent_network(acting: Any, policy: Any, precision: str, granularity: str) -> tuple[Any, ...]:
    """Each seed's recurrent network variables (numpy policy params [seeds, ...]) in `precision`
    (`quant.quantize_tree`): fp16 / bf16 weights cast, which the actor widens to fp32 once per version and runs in
    fp32 (weight-only, as the quant stack's fp16 / bf16 Dense chains); int8 weights (kernels; biases float32),
    which the actor multiplies in int8 (`quant.int8_apply`, the int8 Dense chains' arithmetic)."""
    seeds = jax.tree.leaves(policy)[0].shape[0]
    return tuple(quant.quantize_tree(acting.network_params(jax.tree.map(lambda x: x[i], policy)), precision,
                                     granularity) for i in range(seeds))


@functools.cache
def _seeds_aux(aux: Any) -> Any:
    """`Acting.aux` of every seed, compiled once per acting (unjitted, its dispatches cost ~0.3 ms a publish)."""
    return jax.jit(jax.vmap(aux))


def network_paths(acting: Any, policy: Any, obs_shape: tuple[int, ...]) -> Any:
    """The Dense layers of the policy network in call order (checked to be a plain chain, after the
    convolutions of `acting.features` where it has them)."""
    one = jax.tree.map(lambda x: x[0], policy)
    variables = acting.network_params(one)
    example = np.zeros((1, int(np.prod(obs_shape))), np.float32)
    features = None
    if acting.features is not None:
        conv = acting.features.select(variables)
        features = lambda flat: acting.features.apply(conv, flat.reshape((-1, *obs_shape)))  # noqa: E731
    return quant.stack_paths(acting.network, variables, example, features=features)


"""Central inference (`--inference central`, SEED RL: Espeholt et al. 2020; reference `actorq_distributed.md` §5).

Actors keep no policy: every env step they send their observations (and the PRNG key their own acting
would have used) to one inference server, which answers every actor's request of that step with one
batched forward pass of the learner's fp32 policy on its device, then the algorithm's exploration. The
server waits for all actors' requests of a step, or at most `deadline_ms` after the first one, so a slow
actor never stalls the others; a late request joins the next batch. With the same parameters,
observations and keys, an actor gets the actions its own fp32 copy would have chosen (up to the float
rounding of XLA's matmul against ONNX Runtime's), so the two layouts are comparable run for run.

The server is `CentralPolicy` in this process for the inline back-end (requests arrive one at a time:
no batching, a debugging and testing layout) and a Ray actor (`InferenceServer`, asyncio) for the ray
back-end. The learner publishes each version to the server only; actors get a ticket (the version number
and the warm-up clock) and tag a fragment with the oldest version the server acted with in it.

A recurrent policy (`Acting.memory`): the state stays with the actors, which send each env's with the request and
get the state after the step back with the actions (the server keeps nothing between steps), so a late request or a
replaced actor cannot mix up states.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from sparqrl.algos import get_algorithm
from sparqrl.algos.base import ActorLearner, acting_aux, network_step, observe
from sparqrl.envs import host_spec

# (actor_id, obs [seeds, n, *obs], explore keys [seeds, 2], env_steps, version, state [seeds, n, ...] or None)
#   -> (env_action, action, extra, version, the state after the step or None)
Answer = tuple[np.ndarray, np.ndarray, Any, int, Any]


def make_actor_learner(algo: str, config: Any, env: str) -> ActorLearner:
    """The learner's pure functions of `algo` for host env `env`: what an actor and the central policy act with."""
    return get_algorithm(algo).make_actor_learner(config, host_spec(env))


class CentralPolicy:
    """The batched policy step of a run's actors: fp32, on this process's default JAX device. Requests of
    any subset of actors are padded to all `spec.actors` (one compiled shape)."""

    def __init__(self, spec: Any):
        al = make_actor_learner(spec.algo, spec.config, spec.env)
        acting, n, actors = al.acting, al.num_envs, spec.actors
        obs_ndim = len(host_spec(spec.env).observation_shape)
        slots = jnp.asarray(np.arange(actors * n).reshape(actors, n), jnp.int32)
        self.actors, self.params, self.version = actors, None, -1

        def one_seed(policy_params: Any, obs: jax.Array, key: jax.Array, memory: Any, env_steps: jax.Array,
                     slots_a: jax.Array):
            aux = acting_aux(acting, policy_params)
            raw, memory = network_step(acting, policy_params, observe(acting, aux, obs), memory, obs_ndim)
            action, extra = acting.explore(raw, key, env_steps, slots_a, actors * n, aux)
            return acting.to_env(action), action, extra, memory

        def step(policy: Any, obs: jax.Array, keys: jax.Array, env_steps: jax.Array, memory: Any) -> tuple:
            """obs [A, S, n, *obs], keys [A, S, 2], env_steps [A], memory [A, S, n, ...] or None -> each
            [A, S, n, ...]."""
            per_actor = lambda o, k, m, e, s: jax.vmap(one_seed, in_axes=(0, 0, 0, 0, None, None))(  # noqa: E731
                policy, o, k, m, e, s)
            return jax.vmap(per_actor)(obs, keys, memory, env_steps, slots)

        self._step = jax.jit(step)

    def load(self, copy: Any) -> None:
        """Act with `copy` (a `PolicyCopy` carrying fp32 `params`) from now on, unless a newer one is loaded."""
        if copy.version > self.version:
            self.params, self.version = jax.device_put(copy.params), copy.version

    def answer(self, requests: dict[int, tuple[np.ndarray, np.ndarray, int, Any]]) -> dict[int, Answer]:
        """One batched step for {actor_id: (obs, keys, env_steps, state or None)}."""
        first = next(iter(requests.values()))
        padded = lambda x: np.zeros((self.actors,) + np.shape(x), np.asarray(x).dtype)  # noqa: E731
        obs, keys, memory = padded(first[0]), padded(first[1]), jax.tree.map(padded, first[3])
        env_steps = np.zeros(self.actors, np.int32)
        for actor_id, (o, k, e, m) in requests.items():
            obs[actor_id], keys[actor_id], env_steps[actor_id] = o, k, e
            for into, x in zip(jax.tree.leaves(memory), jax.tree.leaves(m)):
                into[actor_id] = x
        env_action, action, extra, memory = jax.device_get(self._step(self.params, obs, keys, env_steps, memory))
        pick = lambda tree, i: jax.tree.map(lambda x: x[i], tree)  # noqa: E731
        return {i: (env_action[i], action[i], pick(extra, i), self.version, pick(memory, i)) for i in requests}

    def act(self, actor_id: int, obs: np.ndarray, keys: np.ndarray, env_steps: int, version: int = 0,
            memory: Any = None) -> Answer:
        """One actor's request, answered at once (the inline back-end, where the copy of `version` is loaded
        before any request of it)."""
        del version
        return self.answer({actor_id: (obs, keys, env_steps, memory)})[actor_id]


class InferenceServer:
    """The Ray actor of central inference: batches the actors' requests of one step (all of them, or those
    in by `deadline_ms` after the first) into one `CentralPolicy.answer`. Its methods run on one asyncio
    loop, so batching needs no locks."""

    def __init__(self, spec: Any, deadline_ms: float):
        from sparqrl.envs.custom import import_modules

        import_modules(spec.imports)
        self.policy = CentralPolicy(spec)
        self.deadline_s = deadline_ms / 1000.0
        self.pending: dict[int, tuple[tuple, asyncio.Future]] = {}
        self.batch = 0  # the number of the batch now filling (a deadline timer of an earlier one is void)
        self.served = 0  # batches answered, and the requests in them: the mean batch size
        self.requests = 0
        self.loaded = asyncio.Event()  # set by each `load`

    def load(self, copy: Any) -> int:
        self.policy.load(copy)
        self.loaded.set()
        return self.policy.version

    async def act(self, actor_id: int, obs: np.ndarray, keys: np.ndarray, env_steps: int, version: int,
                  memory: Any = None) -> Answer:
        """An actor's request, made holding the ticket of `version` (with a recurrent policy's state). Ray orders
        no calls between two callers, so the learner's `load` of that version can come after the request: it
        waits for it."""
        while self.policy.version < version:
            self.loaded.clear()
            await self.loaded.wait()
        future = asyncio.get_running_loop().create_future()
        self.pending[actor_id] = ((obs, keys, env_steps, memory), future)
        if len(self.pending) == self.policy.actors:
            self._serve()
        elif len(self.pending) == 1:
            asyncio.get_running_loop().call_later(self.deadline_s, self._serve_batch, self.batch)
        return await future

    def _serve_batch(self, batch: int) -> None:
        if batch == self.batch and self.pending:
            self._serve()

    def _serve(self) -> None:
        pending, self.pending = self.pending, {}
        self.batch += 1
        self.served, self.requests = self.served + 1, self.requests + len(pending)
        try:
            answers = self.policy.answer({i: request for i, (request, _) in pending.items()})
        except Exception as error:  # every waiting actor learns of it (and is replaced by the pool)
            for _, future in pending.values():
                future.set_exception(error)
            return
        for i, (_, future) in pending.items():
            future.set_result(answers[i])

    def stats(self) -> dict[str, float]:
        return {"batches": self.served, "mean_batch": self.requests / max(self.served, 1)}


def remote_act(handle: Any) -> Callable[..., Answer]:
    """An actor's call to the Ray inference server (blocking: it needs the actions to step)."""
    import ray

    return lambda *request: ray.get(handle.act.remote(*request))

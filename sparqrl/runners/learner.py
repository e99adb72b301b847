"""The learner of the actor-learner runner: its state, the compiled update and the policy copies it publishes.

One class, `Learner`, used two ways by `sebulba.SebulbaDriver`: directly, in the process that runs `sparqrl train`
(the default), or inside a Ray actor placed on a cluster node with the resources `--learner-resources` names
(`RemoteLearner`: the same object, behind a Ray handle). The driver keeps the run: the folder, metrics, evaluation,
checkpoints (it fetches the learner's whole state only to save it, and the policy params to evaluate), the actors'
requests and their bookkeeping.
With a remote learner, fragments go from the actors to it by object reference (the driver passes the reference,
not the data) and it puts each policy copy into Ray's object store itself.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from sparqrl import config as cfg
from sparqrl.runners.actors import PolicyCopy, quantized_copy
from sparqrl.runners.errors import RunFailed
from sparqrl.runners.session import device_name


class Learner:
    """State [seeds, ...] + the update (the algorithm's learn on one fragment, jitted and donated, compiled for the
    first fragment's shapes) + the chunk's metric sums + the publishing of policy copies."""

    node: str | None = None  # the Ray node of a remote learner (`LearnerClient`); None: the driver's process
    device: str | None = None  # a remote learner's devices (summary.json's `device` names the driver's)

    def __init__(self, al: Any, policy_fn: Callable, paths: Any, run: Any, learn_fragment: Callable,
                 publishes_params: bool):
        self.al, self.policy_fn, self.paths, self.run = al, policy_fn, paths, run
        self.learn_fragment, self.publishes_params = learn_fragment, publishes_params
        self._learn = jax.jit(self._learn_sum, donate_argnums=(0, 1))  # donated: the replay buffer is updated in place
        self._learn_c: Any = None
        self._zero_sums: Callable[[], Any] | None = None
        self.sums: Any = None
        self.state: Any = None

    def start(self, state: Any) -> None:
        self.state = state

    def _learn_sum(self, learner: Any, sums: dict, steps: Any) -> tuple[Any, dict]:
        learner, metrics = self.learn_fragment(learner, steps)
        return learner, jax.tree.map(jnp.add, sums, metrics)

    def learn(self, steps: Any) -> float:
        """Learn from one fragment's steps (leaves [T, seeds, ...]); returns the seconds spent compiling (the
        first call only)."""
        compile_s = 0.0
        if self._learn_c is None:
            start = time.perf_counter()
            shapes = jax.eval_shape(self.learn_fragment, self.state, steps)[1]
            self._zero_sums = lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)  # noqa: E731
            self._learn_c = self._learn.lower(self.state, self._zero_sums(), steps).compile()
            compile_s = time.perf_counter() - start
        if self.sums is None:
            self.sums = self._zero_sums()
        self.state, self.sums = self._learn_c(self.state, self.sums, steps)
        jax.block_until_ready(self.sums)
        return compile_s

    def take_means(self, n: int) -> dict[str, np.ndarray]:
        """The per-seed means of the metrics over the `n` fragments learned since the last call (then reset)."""
        sums, self.sums = self.sums, None
        return {k: np.asarray(v) / max(n, 1) for k, v in jax.device_get(sums).items()} if sums is not None else {}

    def policy_copy(self, version: int) -> PolicyCopy:
        """The policy as the actors take it: quantized (`--actor-precision`), or the fp32 params alone: a central
        server's (`inference.CentralPolicy`), or those of actors that make their acting copy from them
        (`publishes_params`: `gradients.GradientActor`; they would otherwise come twice, in the fp32 copy too)."""
        policy = jax.device_get(self.policy_params())
        env_steps = int(np.asarray(self.state.env_steps)[0])
        if self.run.inference == "central" or self.publishes_params:
            return PolicyCopy(version, (), env_steps, sum(x.nbytes for x in jax.tree.leaves(policy)), params=policy)
        return quantized_copy(version, policy, self.al.acting, self.paths, self.run.actor_precision,
                              self.run.quant_granularity, env_steps)

    def publish(self, pool: Any, version: int) -> tuple[Any, int]:
        """(what the actors' requests pass for this version, its bytes)."""
        copy = self.policy_copy(version)
        return pool.publish(copy), copy.nbytes

    def current(self) -> Any:
        """The state as it is now (this process's arrays: the next `learn` donates them)."""
        return self.state

    def policy_params(self) -> Any:
        """The fp32 policy params [seeds, ...] as they are now: what evaluation needs of the state."""
        return self.policy_fn(self.state)

    def close(self) -> None:
        """Nothing to end: the learner lives in this process."""


class RemoteLearnerBase(Learner):
    """What a Ray actor running a `Learner` adds: its node, a state that travels as numpy, and policy copies put
    into the object store here (`sebulba.RemoteLearner` builds the learner from the run's settings)."""

    def where(self) -> tuple[str, str]:
        """(the id of the Ray node it runs on, its devices as `session.device_name` names them)."""
        import ray

        return ray.get_runtime_context().get_node_id(), device_name()

    def start(self, state: Any) -> None:
        super().start(jax.device_put(state))

    def current(self) -> Any:
        return jax.device_get(self.state)

    def policy_params(self) -> Any:
        return jax.device_get(super().policy_params())

    def publish_ref(self, version: int) -> tuple[list[Any], int]:
        """The copy put in this node's object store: a reference (in a list, so Ray hands it on unresolved)."""
        import ray

        copy = self.policy_copy(version)
        return [ray.put(copy)], copy.nbytes


class LearnerClient:
    """A `Learner` in a Ray actor, with the in-process one's interface: each call waits for its answer. If the
    learner's process or node is lost, the run ends in one line (`RunFailed`) saying to resume from the last
    checkpoint; an error the learner raised is raised here as it was."""

    def __init__(self, handle: Any, node: str, resume_command: str):
        import ray

        self.ray, self.handle, self.node, self.resume_command = ray, handle, node, resume_command

    def _get(self, ref: Any) -> Any:
        try:
            return self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as error:
            raise error.as_instanceof_cause() from None
        except self.ray.exceptions.RayError as error:  # died: its process or its node lost
            raise RunFailed(f"the learner (on node {self.node}) was lost ({type(error).__name__}); the run can go on "
                            f"from its last checkpoint: `{self.resume_command}`") from None

    def start(self, state: Any) -> None:
        self._get(self.handle.start.remote(jax.device_get(state)))

    def learn(self, steps: Any) -> float:
        return self._get(self.handle.learn.remote(steps))  # `steps`: a reference, which Ray resolves there

    def take_means(self, n: int) -> dict[str, np.ndarray]:
        return self._get(self.handle.take_means.remote(n))

    def publish(self, pool: Any, version: int) -> tuple[Any, int]:
        (ref,), nbytes = self._get(self.handle.publish_ref.remote(version))
        return pool.publish(ref), nbytes

    def current(self) -> Any:
        return self._get(self.handle.current.remote())

    def policy_params(self) -> Any:
        return self._get(self.handle.policy_params.remote())

    def check(self) -> None:
        """Returns if the learner is alive; else the one-line `RunFailed` of `_get`."""
        self._get(self.handle.where.remote())

    def close(self) -> None:
        try:
            self.ray.kill(self.handle, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone (its node lost)
            pass


LEARNER_START_TIMEOUT_S = 120.0
"""How long a run waits for its remote learner to be placed and started (`place_learner`)."""


def offered(nodes: list[dict]) -> str:
    """What the cluster's live nodes offer, for a message: `{CPU: 1, node_a: 1}; {...}`."""
    def one(node: dict) -> str:
        items = (f"{k}: {v:g}" for k, v in sorted(node["Resources"].items())
                 if not k.startswith(("node:", "memory", "object_store_memory", "accelerator_type")))
        return "{" + ", ".join(items) + "}"

    return "; ".join(one(node) for node in nodes if node["Alive"])


def place_learner(remote_class: type, resources: dict[str, float], args: tuple, resume_command: str,
                  text: str) -> LearnerClient:
    """Start `remote_class(*args)` as a Ray actor with `resources` (CPU and GPU among them; 1 CPU unless named) on
    a node that offers them, and wait (`LEARNER_START_TIMEOUT_S` at most) until it runs. A one-line `ConfigError`
    naming `--learner-resources` and what the nodes offer if no node has them, or if it is not placed in time."""
    import ray

    nodes = ray.nodes()
    fits = [n for n in nodes if n["Alive"] and all(n["Resources"].get(k, 0) >= v for k, v in resources.items())]
    cfg.require(bool(fits), "learner_resources", text, f"no node of the cluster offers them; its nodes offer: "
                f"{offered(nodes)}")
    own = dict(resources)
    cpus, gpus = own.pop("CPU", 1.0), own.pop("GPU", 0.0)
    handle = ray.remote(num_cpus=cpus, num_gpus=gpus, resources=own, max_restarts=0)(remote_class).remote(*args)
    where = handle.where.remote()
    ready, _ = ray.wait([where], timeout=LEARNER_START_TIMEOUT_S)
    if not ready:
        ray.kill(handle, no_restart=True)
        raise cfg.ConfigError(f"learner_resources={text!r}: the cluster did not start the learner with them within "
                              f"{LEARNER_START_TIMEOUT_S:g} s (busy?); its nodes offer: {offered(ray.nodes())}")
    client = LearnerClient(handle, "?", resume_command)
    client.node, client.device = client._get(where)
    return client

"""How a run is driven (`RunConfig`), shared by both runners and the CLI; the algorithm's
hyperparameters live in its own Config."""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Literal

from sparqrl import config as cfg, presets
from sparqrl.envs import validate_env_name
from sparqrl.envs.core import is_atari
from sparqrl.envs.custom import import_modules
from sparqrl.telemetry import wandb_log
from sparqrl.telemetry.energy import validate_country

MAX_SEEDS = 65_536
MAX_EVAL_EPISODES = 65_536
"""Evaluation episodes per seed at most: they run side by side, each holding its own environment state."""


def check_episodes(field: str, episodes: int) -> None:
    cfg.require(episodes <= MAX_EVAL_EPISODES, field, episodes, f"must be <= {MAX_EVAL_EPISODES:,} per seed (they "
                "run side by side, each holding its own environment state in memory)")


ACTORS_PER_CPU = 4
"""Actors a machine runs at most per CPU core: each is a process stepping its own environments, so more only
wait for a core (and a million of them would fork until the machine gives out)."""
MAX_CLUSTER_ACTORS = 16_384
"""Actors at most on a Ray cluster (--ray-address), whose size is only known once joined."""


def parse_resources(text: str) -> dict[str, float]:
    """`NAME=NUMBER[,NAME=NUMBER...]` (e.g. `node_b=1,GPU=1`) -> {name: amount}; a one-line `ConfigError` otherwise."""
    allowed = "must be NAME=NUMBER[,NAME=NUMBER...] with numbers > 0, each name once, e.g. GPU=1 or node_b=1,CPU=4"
    resources: dict[str, float] = {}
    for item in str(text).split(","):
        name, sep, amount = (part.strip() for part in item.partition("="))
        try:
            value = float(amount)
        except ValueError:
            value = math.nan
        cfg.require(bool(sep and name) and 0 < value < math.inf and name not in resources, "learner_resources", text,
                    allowed)
        resources[name] = value
    return resources


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """How a run is driven; the algorithm's hyperparameters live in its own Config."""

    env: str = "CartPole-v1"
    """Environment: a gymnax id (e.g. CartPole-v1, Breakout-MinAtar) or brax:NAME (e.g. brax:ant), both on
    device; or gym:NAME (e.g. gym:HalfCheetah-v5), a Gymnasium environment stepped on the host (every algorithm).
    Your own: gym:MODULE:CLASS (a gymnasium.Env subclass or zero-argument factory, on the host) or
    jax:MODULE:ATTR (an env with sparqrl's Env protocol or a gymnax Environment, on the device). act:DIR
    (act:DIR:silent): the victim env of the ACT meta run in DIR, its adversary held fixed (silent)."""
    imports: tuple[str, ...] = ()
    """Modules imported before the environment is resolved, e.g. one that registers the Gymnasium id that
    env names (on the command line: --import MODULE, repeatable). Recorded, so eval and resume import them
    too."""
    preset: str = "auto"
    """Tuned hyperparameters for the environment (`sparqrl.presets`: ppo-minatar for *-MinAtar, ppo-brax for
    brax:NAME, ppo-pendulum for Pendulum-v1, ppo-atari, impala-atari and dqn-atari for gym:ALE/NAME, impala-host
    for other gym:NAME): auto, the environment's preset for the algorithm where there is one; none, the algorithm's
    defaults; or a preset's name. Fields you set win over it. A run records the one it used (auto resolved)."""
    seeds: int = 1
    """Independent seeds trained at once in one vmapped program (sharded over devices)."""
    seed: int = 0
    """Base seed; the seeds' keys are split from it."""
    out: str = "runs/latest"
    """Output directory (summary.json, metrics.csv, TensorBoard, returns.png, checkpoint/, config.json)."""
    overwrite: bool = False
    """Replace the sparqrl run already in the output directory: only the files that run wrote are deleted,
    and only once the new run has passed every check. A folder holding anything else is never replaced."""
    chunks: int = 50
    """Number of host-loop chunks: progress, logging and checkpoints happen between chunks."""
    eval_every: int = 10
    """Evaluate the deterministic policy every this many chunks (0: only at the end)."""
    eval_episodes: int = 10
    """Deterministic evaluation episodes per seed."""
    checkpoint_every: int = 5
    """Save a checkpoint every this many chunks (and always at the end and on Ctrl-C)."""
    checkpoint_interval_s: float = 30.0
    """Periodic checkpoints are at least this many seconds apart: one costs 0.1-0.2 s of orbax's own overhead
    whatever the state's size, more than a short chunk. A kill -9 loses at most this much training (Ctrl-C
    and the end of the run always save). 0: every checkpoint_every chunks."""
    progress: bool = True
    """Show progress: a live bar on a terminal; otherwise (CI, a log file, nohup) a complete line after the
    first chunk and every ~5 % of the run (env steps, return, steps/s, ETA)."""
    compile_cache: bool = True
    """Keep compiled programs in JAX's persistent compilation cache ($XDG_CACHE_HOME/sparqrl/xla, default
    ~/.cache/sparqrl/xla) and their traced form in $XDG_CACHE_HOME/sparqrl/programs, so a second run of the
    same configuration neither traces nor compiles them. From Python, the first run of a process decides
    XLA's cache for the whole process."""
    energy: bool = True
    """Measure the run's energy and CO2 with codecarbon's offline tracker (never online): summary.json gets
    energy_kwh, co2_kg and energy_method (how power was read: RAPL, NVML, or codecarbon's estimate), and
    emissions.csv one row per session. Costs about 2 s once per process, then milliseconds."""
    country: str = "USA"
    """3-letter ISO code of the country whose electricity grid powers the run (e.g. USA, FRA, DEU, IND):
    co2_kg = energy_kwh x its carbon intensity from codecarbon's offline data, so CO2 scales with it."""
    wandb: str | None = None
    """Also log to this Weights & Biases project (the wandb extra): TensorBoard's scalars, config.json as the
    W&B config, summary.json as its summary and the run's files as an artifact; W&B's folder is OUT/wandb."""
    wandb_mode: Literal["offline", "online"] = "offline"
    """offline: W&B writes only OUT/wandb, nothing leaves the machine (`wandb sync OUT/wandb` uploads it
    later); online: it uploads as the run goes (after `wandb login`)."""

    # ---- the actor-learner runner (gym:NAME environments) ----
    actors: int = 1
    """Actors, each stepping its own seeds × num_envs host environments."""
    actor_precision: Literal["fp32", "bf16", "fp16", "int8"] = "fp32"
    """Precision of the policy copy actors act with (ActorQ): int8 (symmetric weights, activations quantized
    per call, ONNX Runtime integer kernels; a recurrent policy's in JAX), fp16/bf16 (16-bit weights), fp32. The
    learner trains in fp32."""
    quant_granularity: Literal["channel", "tensor"] = "channel"
    """int8 weight scales: one per output channel, or one per tensor (ActorQ / PyTorch dynamic quantization)."""
    backend: Literal["auto", "inline", "ray"] = "auto"
    """Where actors run: inline (this process, one request at a time: debugging, tests), ray (one process per
    actor), auto (ray when actors > 1)."""
    ray_address: str | None = None
    """Connect to this existing Ray cluster (e.g. auto or ray://host:10001) instead of starting a local one."""
    fragment_steps: int | None = None
    """Env steps per environment in one fragment an actor sends (the learner learns from it in one call).
    None: the algorithm's (PPO: its num_steps, the only value it takes; replay-based learners: 10)."""
    publish_every: int = 1
    """Publish a new policy copy every this many learner updates (fragments learned), once per version."""
    in_flight: int | None = None
    """Collect requests in flight per actor: bounds the data waiting for the learner (backpressure). None: 1
    with the inline back-end (it runs requests one at a time, so a second one would only make the data a
    version older) and 2 with ray (an actor steps its next fragment while the learner learns)."""
    env_backend: Literal["gymnasium", "envpool"] = "gymnasium"
    """What steps the actors' host environments: gymnasium (Gymnasium's vector env, every gym:NAME) or envpool
    (EnvPool's C++ thread pool, Atari games only, with the same preprocessing; the envpool extra). Evaluation
    always runs on Gymnasium."""
    inference: Literal["actor", "central"] = "actor"
    """Where actions are computed: actor (each actor runs its own policy copy, in actor_precision) or central
    (SEED RL: actors only step environments and send observations; one server answers all of them with a
    batched fp32 forward pass on its device; fp32 only)."""
    inference_deadline_ms: float = 2.0
    """Central inference: the longest a batch waits, after its first request, for the other actors' requests."""
    actors_per_node: int | None = None
    """With --ray-address: put this many actors on each node of the cluster. None: spread them over its nodes,
    one per node while actors <= nodes. (The learner runs in this process unless --learner-resources places it.)"""
    learner_resources: str | None = None
    """With --ray-address: run the learner (its state, compiled update and policy publishing) in a Ray actor on a
    node of the cluster that offers these resources, NAME=NUMBER[,NAME=NUMBER...] (e.g. GPU=1, or node_b=1 for a
    node started with that custom resource; 1 CPU unless CPU is named). None: in this process."""
    max_lag: int | None = None
    """On-policy learners (PPO): a fragment acted with a policy version more than this many learner updates
    older than the learner's is dropped and counted (summary.json's fragments_dropped), never trained on.
    None: actors x in_flight (what the actors can have in flight; inline runs then never drop)."""

    def evaluates_after(self, chunk: int, chunks: int) -> bool:
        """Whether the deterministic policy is evaluated after chunk `chunk` (0-based) of `chunks`: every
        `eval_every` chunks and after the last."""
        return chunk == chunks - 1 or (self.eval_every > 0 and (chunk + 1) % self.eval_every == 0)

    @property
    def resolved_max_lag(self) -> int:
        return self.actors * self.resolved_in_flight if self.max_lag is None else self.max_lag

    @property
    def resolved_in_flight(self) -> int:
        return (2 if self.resolved_backend == "ray" else 1) if self.in_flight is None else self.in_flight

    @property
    def max_actors(self) -> int:
        """What the machine (or a Ray cluster) can run: `ACTORS_PER_CPU` per core, `MAX_CLUSTER_ACTORS`."""
        return ACTORS_PER_CPU * (os.cpu_count() or 1) if self.ray_address is None else MAX_CLUSTER_ACTORS

    @property
    def resolved_learner_resources(self) -> dict[str, float] | None:
        return None if self.learner_resources is None else parse_resources(self.learner_resources)

    @property
    def resolved_backend(self) -> str:
        return ("ray" if self.actors > 1 else "inline") if self.backend == "auto" else self.backend

    def validate(self) -> None:
        cfg.check_numbers(self)
        cfg.require(self.seeds <= MAX_SEEDS, "seeds", self.seeds,
                    f"must be <= {MAX_SEEDS:,} in one run (each seed is a copy of the whole training state)")
        import_modules(self.imports)  # first: they may register the env's id
        validate_env_name(self.env)
        cfg.one_of("preset", self.preset, presets.CHOICES)
        for name in ("seeds", "chunks", "eval_episodes", "checkpoint_every"):
            cfg.require(getattr(self, name) >= 1, name, getattr(self, name), "must be >= 1")
        check_episodes("eval_episodes", self.eval_episodes)
        cfg.require(self.eval_every >= 0, "eval_every", self.eval_every, "must be >= 0")
        cfg.require(self.checkpoint_interval_s >= 0, "checkpoint_interval_s", self.checkpoint_interval_s, "must be >= 0")
        cfg.check_path("out", self.out)
        validate_country(self.country, "country")
        wandb_log.validate(self.wandb, self.wandb_mode)
        for name in ("actors", "fragment_steps", "publish_every", "in_flight"):
            value = getattr(self, name)
            if value is not None or name not in ("fragment_steps", "in_flight"):
                cfg.require(isinstance(value, int) and value >= 1, name, value, "must be an int >= 1")
        cfg.require(self.actors <= self.max_actors, "actors", self.actors, f"must be <= {self.max_actors:,}: "
                    + (f"{ACTORS_PER_CPU} per CPU core of this machine's {os.cpu_count() or 1} (each actor is a "
                       "process stepping its own environments; more only wait for a core; a Ray cluster, "
                       "--ray-address, holds more)" if self.ray_address is None else "on a Ray cluster"))
        if self.max_lag is not None:
            floor = self.actors * self.resolved_in_flight - 1
            cfg.require(isinstance(self.max_lag, int) and self.max_lag >= floor, "max_lag", self.max_lag,
                        f"must be an int >= actors x in_flight - 1 = {floor} (the lag of every fragment when each "
                        "actor keeps in_flight requests in flight), or none for the default")
        cfg.one_of("actor_precision", self.actor_precision, ("fp32", "bf16", "fp16", "int8"))
        cfg.one_of("quant_granularity", self.quant_granularity, ("channel", "tensor"))
        cfg.one_of("backend", self.backend, ("auto", "inline", "ray"))
        cfg.one_of("inference", self.inference, ("actor", "central"))
        cfg.one_of("env_backend", self.env_backend, ("gymnasium", "envpool"))
        cfg.require(self.env_backend == "gymnasium" or is_atari(self.env), "env_backend",
                    self.env_backend, f"steps Atari games only (gym:ALE/NAME-v5); env {self.env} runs on gymnasium")
        cfg.require(self.inference == "actor" or self.actor_precision == "fp32", "actor_precision",
                    self.actor_precision, "must be fp32 with inference=central (the server runs the learner's fp32 "
                    "policy; quantized copies are for actors that run their own)")
        cfg.require(self.inference_deadline_ms > 0, "inference_deadline_ms", self.inference_deadline_ms, "must be > 0")
        cfg.require(self.ray_address is None or self.resolved_backend == "ray", "ray_address", self.ray_address,
                    f"needs the ray backend (backend is {self.backend!r} with {self.actors} actor(s))")
        if self.actors_per_node is not None:
            cfg.require(isinstance(self.actors_per_node, int) and self.actors_per_node >= 1, "actors_per_node",
                        self.actors_per_node, "must be an int >= 1")
            cfg.require(self.ray_address is not None, "actors_per_node", self.actors_per_node,
                        "needs --ray-address: it places actors on the nodes of a Ray cluster")
        if self.learner_resources is not None:
            self.resolved_learner_resources  # noqa: B018 - parsed: one line if malformed
            cfg.require(self.ray_address is not None, "learner_resources", self.learner_resources,
                        "needs --ray-address: it places the learner on a node of a Ray cluster")
            cfg.require(self.inference == "actor", "learner_resources", self.learner_resources,
                        "needs inference=actor (a central inference server takes its weights from the driver)")

"""The Python API: train, load a trained policy, act with it.

    import sparqrl

    run = sparqrl.train("ppo", "CartPole-v1", steps=100_000, seeds=4, out="runs/cartpole", lr=3e-4)
    run.summary["final_return_mean"], run.metrics["eval_return"]    # summary.json; per chunk [chunks, seeds]
    agent = sparqrl.load("runs/cartpole")                          # any run: on-device or gym:NAME
    agent.act(obs)                                                 # one observation or a batch [B, *obs_shape]
    agent.evaluate(episodes=20)                                    # deterministic returns per seed

`train` is the CLI's `sparqrl train` (same run folder, checkpoints, resume), with keyword arguments for
the run's options (`RunConfig`: seed, chunks, eval_every, energy, ...) and the algorithm's config fields
(`sparqrl train ALGO --help` lists them). `load` restores the newest intact checkpoint; it never starts
Ray nor compiles the training program (only the small acting function, on first use).

Bad input raises `sparqrl.config.ConfigError` (one line naming the field, value and what is allowed)
before anything is written or compiled.

A run folder is data, never code (`sparqrl.trust`): `load` and `train(resume=True)` import a module the
folder names (its `imports`, the module of a `gym:MODULE:ATTR` / `jax:MODULE:ATTR` env) only when the call
names it too (`env=`, `imports=`) or passes `trust_imports=True`.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

import sparqrl.meta.prefix  # noqa: F401 (importing it registers the act:DIR env with sparqrl.envs)
from sparqrl import config as cfg, presets
from sparqrl.algos import ALGORITHMS, get_algorithm
from sparqrl.runners.run_config import RunConfig
from sparqrl.telemetry.logger import read_metrics
from sparqrl.trust import Trust, named

Callback = Callable[[dict[str, Any]], Any]
"""Called after each chunk with {"chunk", "env_step" (per seed so far), metric: [seeds] array}; returning
False stops the run after that chunk with a checkpoint (`train(..., resume=True)` goes on)."""


UpdateHook = Callable[[dict[str, float]], Any]
"""Called from inside the compiled training program (`jax.debug.callback`, not ordered) after each update of each
seed with that update's scalar metrics {name: float} (metrics.csv holds their means over each chunk; with
several seeds, one call per seed, in no guaranteed order). On-device runs only (not gym:NAME). Only a run given
one has the callback in its program (docs/api/index.md: its cost per update)."""


class _StopRequested(KeyboardInterrupt):
    """The callback returned False: the session saves a checkpoint as on Ctrl-C."""


@dataclasses.dataclass(frozen=True)
class Run:
    """A finished (or callback-stopped) training run."""

    path: Path
    """The run folder (summary.json, metrics.csv, TensorBoard, checkpoint/, config.json)."""
    summary: dict[str, Any]
    """summary.json's content; empty when the callback stopped the run."""
    metrics: dict[str, np.ndarray]
    """metrics.csv as arrays (its 6 significant digits): chunk, env_step, wall_time_s [chunks]; every metric
    [chunks, seeds] (NaN where a seed had no value in a chunk, e.g. eval_return between evaluations)."""
    stopped: bool = False
    """True when the callback stopped the run before its end."""

    def load(self) -> "Agent":
        return load(self.path, trust_imports=True)  # (the run this process just trained)


def _split_options(algo: str, options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Keyword arguments -> (RunConfig fields, algorithm Config fields); an unknown name is an error."""
    run_fields = {f.name for f in dataclasses.fields(RunConfig)}
    algo_fields = {f.name for f in dataclasses.fields(get_algorithm(algo).Config)}
    for name in options:
        if name not in run_fields and name not in algo_fields:
            cfg.fail(name, options[name], f"must be a run option (RunConfig) or a field of {algo}'s config"
                                          f"{cfg.close_matches(name, sorted(run_fields | algo_fields))}")
    return ({k: v for k, v in options.items() if k in run_fields and k not in algo_fields},
            {k: v for k, v in options.items() if k in algo_fields})


def _network_options(options: dict[str, Any]) -> dict[str, Any]:
    """`network=` as the config records it: a torso (a MODULE:ATTR name or a callable at a module's top level,
    `nets.torso.name_for`) for every network, or {"actor": torso, "critic": torso} for each its own
    (actor_network, critic_network)."""
    from sparqrl.nets.torso import name_for

    out = dict(options)
    value = out.pop("network", None)
    if isinstance(value, dict):
        cfg.require(bool(value) and set(value) <= {"actor", "critic"}, "network", value,
                    "must be a torso, or a dict {'actor': torso, 'critic': torso} (either key may be left out)")
        out.update({f"{name}_network": torso for name, torso in value.items()})
    elif value is not None:
        out["network"] = value
    for field in ("network", "actor_network", "critic_network"):
        if out.get(field) is not None:
            out[field] = name_for(field, out[field])
    return out


def _strings(values: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in values.items()}


def train(algo: str, env: Any, *, steps: int, seeds: int = 1, out: str | Path | None = None, overwrite: bool = False,
          resume: bool = False, callback: Callback | None = None, progress: bool = False,
          trust_imports: bool = False, on_update: UpdateHook | None = None, **options: Any) -> Run:
    """Train `algo` (ppo, impala, dqn, td3, sac) on `env` for `steps` env steps per seed, `seeds` seeds side by side.

    env: a name (a gymnax id, brax:NAME, gym:NAME, gym:MODULE:CLASS, jax:MODULE:ATTR), or your own environment
    object: a gymnasium.Env subclass or zero-argument factory (stepped on the host: every algorithm), or a JAX
    env (sparqrl's `Env` protocol, or a gymnax Environment instance, class or factory; on the device). An
    object a new process can import (defined at module level of an importable module) is recorded by that
    name; any other (a lambda, a local class) trains, but `load`/`eval` in a new process then need it
    again (`sparqrl.load(DIR, env=obj)`). Pass `imports=("my_module",)` to import modules first (e.g. one
    registering a Gymnasium id).

    out: the run folder (default: a new temporary folder). overwrite: replace a sparqrl run already there.
    resume: continue the run in `out` from its checkpoint, with its saved config (the other arguments but
    `callback` and `progress` are not used, save that `env` and `imports=` name the modules the run may
    import). trust_imports: with resume, import the modules and join the Ray address the folder names
    (only for a folder whose code you trust: a run folder is data, see `sparqrl.trust`).
    callback: see `Callback`. on_update: see `UpdateHook`. progress: show the progress bar. options: `RunConfig`
    fields (seed, chunks, eval_every, eval_episodes, energy, ...) and `algo`'s config fields (lr, num_envs, hidden,
    ...); network: your own torso (`sparqrl.nets.torso`): a callable at a module's top level returning a flax
    Module, or its "MODULE:ATTR" name, or {"actor": ..., "critic": ...} (recorded by name, never pickled).
    """
    from sparqrl import runners
    from sparqrl.envs import resolve_env_name
    from sparqrl.envs.custom import name_for

    cfg.one_of("algo", algo, ALGORITHMS)
    run_options, algo_options = _split_options(algo, _network_options(options))
    if "imports" in run_options:  # module names, joined: str() of a tuple of strings would keep the quotes
        imports = run_options["imports"]
        run_options["imports"] = imports if isinstance(imports, str) else ",".join(map(str, imports))
    env = resolve_env_name(env) if isinstance(env, str) else name_for(env)  # act:DIR as the CLI records it
    if out is None:
        cfg.require(not resume, "resume", resume, "needs out=, the folder of the run to continue")
        out = tempfile.mkdtemp(prefix=f"sparqrl-{algo}-")
        overwrite = True  # the empty folder just made
    # the CLI's conversions and checks, from the values' string forms (3e-4, (64, 64), True, None)
    given = _strings(
        {**run_options, "env": env, "seeds": seeds, "out": out, "overwrite": overwrite, "progress": progress})
    run = cfg.override(RunConfig(), given)
    preset = presets.find(algo, run.env, run.preset)  # the env's tuned values under the caller's own
    run = dataclasses.replace(cfg.override(presets.apply_run(preset, RunConfig()), given),
                              preset=presets.name_of(preset))
    config = cfg.override(presets.apply(preset, get_algorithm(algo).Config()),
                          _strings({**algo_options, "total_timesteps": steps}))

    def on_chunk(chunks: int, metrics: dict[str, Any]) -> None:
        if callback is not None and callback({"chunk": chunks, **metrics}) is False:
            raise _StopRequested

    hooks: dict[str, Any] = {"on_chunk": on_chunk}
    if on_update is not None:
        cfg.require(callable(on_update), "on_update", repr(on_update), "must be a callable taking a dict of metrics")
        hooks["on_update"] = on_update
    try:
        if resume:
            torsos = tuple(cfg.reference_module(spec) for _, spec in config.network_references())  # network=
            trust = named(run.imports + torsos, run.env, python=True, everything=trust_imports)
            summary = runners.resume(out, progress=progress, trust=trust, **hooks)
        else:
            summary = runners.train(algo, config, run, **hooks)
    except runners.RunInterrupted:
        if callback is None:
            raise
        summary, stopped = {}, True  # our _StopRequested (a real Ctrl-C in a callback run stops alike)
    else:
        stopped = False
    path = Path(out)
    return Run(path=path, summary=summary, metrics=read_metrics(path / "metrics.csv"), stopped=stopped)


class Agent:
    """A trained policy: `act` on NumPy observations, `evaluate` in the run's environment.

    algo, env, config, run: the run's algorithm name, environment, algorithm config and `RunConfig`;
    obs_shape, action_space: the environment's (`sparqrl.envs.Discrete` or `Box`);
    seeds: how many trained policies the run holds (one per seed; a sweep's: settings x seeds).
    """

    def __init__(self, path: Path, algo: str, config: Any, run: RunConfig, obs_shape: tuple[int, ...],
                 action_space: Any, params: Any, act_one: Callable[[Any, Any, Any], Any],
                 sample_one: Callable[[Any, Any, Any], Any], trust: Trust):
        """act_one / sample_one: (one seed's policy params, ONE observation, key) -> the deterministic / the
        exploring action; trust: what `load` was allowed to import (`evaluate` opens the folder again)."""
        self.path, self.algo, self.config, self.run, self._trust = path, algo, config, run, trust
        self.env, self.obs_shape, self.action_space = run.env, obs_shape, action_space
        import jax

        self._params, self._one = params, {True: act_one, False: sample_one}
        self.seeds = int(jax.tree.leaves(params)[0].shape[0])
        self._act: dict[tuple[bool, bool], Callable] = {}
        self._key = jax.random.PRNGKey(0)

    def __repr__(self) -> str:
        return f"Agent({self.algo} on {self.env}, {self.seeds} seed(s), from {self.path})"

    def policy_params(self, seed: int = 0) -> Any:
        """Seed `seed`'s policy parameters as NumPy arrays (what `act` runs: networks and normaliser)."""
        import jax

        self._check_seed(seed)
        return jax.tree.map(lambda x: np.asarray(x[seed]), self._params)

    def act_function(self, deterministic: bool = True) -> Callable[[Any, Any, Any], Any]:
        """The library's own act that `act` compiles: (one seed's `policy_params`, ONE observation, key) -> action
        (deterministic: the key is not read). A recurrent policy's is its `RecurrentAct` (`init`, `step` over a
        batch of episodes with their state), which refuses single observations: what `sparqrl export` checks an
        exported recurrent policy against."""
        cfg.require(isinstance(deterministic, bool), "deterministic", deterministic, "must be True or False")
        return self._one[deterministic]

    def _check_seed(self, seed: Any) -> None:
        cfg.require(cfg.is_int(seed) and 0 <= seed < self.seeds, "seed", seed,
                    f"must be an integer in [0, {self.seeds}) (the run's trained policies)")

    def act(self, obs: Any, seed: int = 0, deterministic: bool = True, key: Any = None) -> np.ndarray:
        """The action of seed `seed`'s policy for one observation [*obs_shape] or a batch [B, *obs_shape].

        deterministic: True, the greedy / mean action, the one evaluation uses; False, an exploring action
        as training draws it once past its warm-up: PPO samples its policy, DQN is epsilon-greedy at its final
        epsilon (on a host env: Ape-X's first actor slot's epsilon), TD3 adds its Gaussian exploration noise,
        SAC samples its squashed Gaussian.
        key: for the draw, a JAX PRNG key or an int; default: the agent's own stream (a new draw each call,
        starting from the same one at each `load`).
        """
        import jax

        cfg.require(isinstance(deterministic, bool), "deterministic", deterministic, "must be True or False")
        self._check_seed(seed)
        try:
            obs = np.asarray(obs, np.float32)
        except (TypeError, ValueError) as error:
            cfg.fail("obs", type(obs).__name__, f"must be an array of numbers ({error})")
        batched = obs.shape[1:] == self.obs_shape
        cfg.require(obs.shape == self.obs_shape or batched, "obs", f"shape {obs.shape}",
                    f"must be {self.obs_shape} or [batch, *{self.obs_shape}]")
        if key is None:
            self._key, key = jax.random.split(self._key)
        elif isinstance(key, int):
            key = jax.random.PRNGKey(key)
        if (deterministic, batched) not in self._act:
            one = self._one[deterministic]
            self._act[deterministic, batched] = jax.jit(jax.vmap(one, in_axes=(None, 0, 0)) if batched else one)
        keys = jax.random.split(key, len(obs)) if batched else key
        params = jax.tree.map(lambda x: x[seed], self._params)
        return np.asarray(self._act[deterministic, batched](params, obs, keys))

    def evaluate(self, episodes: int = 10, seed: int | None = None, env: Any = None) -> dict[str, Any]:
        """Deterministic episodes per trained policy, as `sparqrl eval`: {"env", "episodes_per_seed",
        "return_mean", "return_std", "return_per_seed"}.

        env: None, the run's environment; else a name or environment object as `train` takes, whose
        observation shape and action space must be the run's (a one-line error names both otherwise).
        seed: the evaluation seed (default: the run's).
        """
        from sparqrl import runners

        if env is None:
            return runners.evaluate_saved(self.path, episodes, seed, self._trust)
        return runners.evaluate_policy(self.run, self._params, self._one[True], env, episodes, seed)


def load(run_dir: str | Path, env: Any = None, trust_imports: bool | Trust = False) -> Agent:
    """The trained policies of the run in `run_dir` (its newest intact checkpoint), for `act` and `evaluate`.

    env: the environment object of a run trained on one that a new process cannot import (a lambda, a local
    class: see `train`); other runs rebuild theirs by name (`Agent.evaluate(env=...)` evaluates elsewhere).
    Passing the run's own env (its name or object) also allows importing its module.
    trust_imports: True imports the modules the folder names (its `imports`, its env's module); otherwise
    one the folder names and `env` does not is a ConfigError (a run folder is data, see `sparqrl.trust`).
    The CLI passes the `Trust` of its command's flags.
    """
    import jax

    from sparqrl.envs import custom, is_host_env, resolve_env_name
    from sparqrl.runners.rundir import open_run_dir

    if isinstance(trust_imports, Trust):
        trust = trust_imports
    else:
        cfg.require(isinstance(trust_imports, bool), "trust_imports", trust_imports, "must be True or False")
        given = None if env is None else env if isinstance(env, str) else custom.name_for(env)
        trust = named((), given, python=True, everything=trust_imports)
    rundir, algo_name, algo_config, run = open_run_dir(run_dir, "run_dir", trust)
    if env is not None and custom.is_local(run.env):
        custom.bind(run.env, env)
    elif env is not None:
        same = resolve_env_name(env) == run.env if isinstance(env, str) else custom.name_for(env) == run.env
        cfg.require(same, "env", env if isinstance(env, str) else repr(env),
                    f"must be the run's own environment ({run.env}), which is rebuilt by name: leave env out "
                    "(agent.evaluate(env=...) evaluates on another)")
    if is_host_env(run.env):
        from sparqrl.runners import sebulba
        from sparqrl.runners.session import saved_state

        prepared = sebulba.Prepared(algo_name, algo_config, run)
        params = prepared.policy_fn(saved_state(rundir, prepared.learner_shape))
        obs_shape = tuple(prepared.spec.observation_shape)
        greedy = sebulba.greedy_policy(prepared.al, len(obs_shape))  # a recurrent policy's: a `RecurrentAct`, as is
        act_one = greedy if prepared.al.acting.memory is not None else lambda p, obs, key: greedy(p, obs)
        return Agent(Path(run_dir), algo_name, prepared.config, run, obs_shape, prepared.spec.action_space, params,
                     act_one, sebulba.sampling_policy(prepared.al, len(obs_shape)), trust)

    from sparqrl.runners.anakin import load_state

    algo_name, algo_config, run, env, driver, state = load_state(run_dir, trust)
    algo = driver.algo
    params = jax.vmap(algo.policy)(state)
    return Agent(Path(run_dir), algo_name, algo_config, run, tuple(env.observation_shape), env.action_space, params,
                 algo.act, algo.sample, trust)

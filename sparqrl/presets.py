"""Per-environment presets: published, tuned hyperparameters, chosen by the environment's name.

An algorithm's Config defaults are one environment's tuned values (PPO and DQN: PureJaxRL's CartPole-v1;
TD3 and SAC: their papers' MuJoCo settings). Where another environment family has published settings of its
own, a preset holds them, and `sparqrl train` / `sparqrl sweep` / `sparqrl.train` start from them
(`RunConfig.preset`: "auto" by default; "none" for the plain defaults; or a preset's name). Every field the
user sets wins over the preset; the run records the preset it used in config.json (`run.preset`).

Presets change only fields that tune learning (rates, batch layout, network activation, normalisation; of
the run, `run_fields`: how far the actor-learner runner's actors may lag the learner), never the budget
(`total_timesteps`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from sparqrl import config as cfg


@dataclasses.dataclass(frozen=True)
class Preset:
    name: str
    algo: str
    matches: Callable[[str], bool]
    """Whether an environment name is in the preset's family."""
    family: str
    """The family in words, for the README and errors."""
    source: str
    fields: Mapping[str, Any]
    """The algorithm's config fields it sets."""
    run_fields: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """The `RunConfig` fields it sets (the user's own values win over them as over `fields`)."""


def _atari(env: str) -> bool:
    return env.startswith("gym:ALE/")  # (`envs.core.is_atari` without importing JAX)


PRESETS: tuple[Preset, ...] = (
    Preset(
        name="ppo-minatar", algo="ppo", matches=lambda env: env.endswith("-MinAtar"), family="gymnax MinAtar (*-MinAtar)",
        source="PureJaxRL's MinAtar PPO config (brax_minatar notebook, 'briefly tuned' for gymnax's MinAtar), "
               "with its flattened-observation MLP",
        fields={"lr": 5e-3, "num_envs": 64, "num_steps": 128, "update_epochs": 4, "num_minibatches": 8,
                "activation": "relu", "anneal_lr": True, "ent_coef": 0.01, "torso": "mlp"},
    ),
    Preset(
        name="ppo-brax", algo="ppo", matches=lambda env: env.startswith("brax:"), family="Brax (brax:NAME)",
        source="PureJaxRL's continuous-action PPO config (ppo_continuous_action.py, Brax hopper), NORMALIZE_ENV "
               "as observation and reward normalisation",
        fields={"lr": 3e-4, "num_envs": 2048, "num_steps": 10, "update_epochs": 4, "num_minibatches": 32,
                "ent_coef": 0.0, "anneal_lr": False, "activation": "tanh", "normalize_obs": True,
                "normalize_reward": True},
    ),
    Preset(
        name="ppo-atari", algo="ppo", matches=_atari, family="Atari (gym:ALE/NAME)",
        source="the PPO paper's Atari settings (Schulman et al. 2017, Table 5: 8 actors x 128 steps, Adam 2.5e-4 "
               "annealed, clip 0.1, entropy 0.01) as OpenAI Baselines' ppo2 runs them (4 epochs of 4 minibatches, "
               "value coefficient 0.5), on the Nature CNN (its 512-unit layer, relu)",
        fields={"lr": 2.5e-4, "num_envs": 8, "num_steps": 128, "update_epochs": 4, "num_minibatches": 4,
                "clip_eps": 0.1, "ent_coef": 0.01, "vf_coef": 0.5, "anneal_lr": True, "gamma": 0.99,
                "gae_lambda": 0.95, "hidden": (512,), "activation": "relu", "torso": "auto",
                "normalize_obs": False, "normalize_reward": False},
    ),
    Preset(
        name="impala-atari", algo="impala", matches=_atari,
        family="Atari (gym:ALE/NAME)",
        source="IMPALA's Atari settings (Espeholt et al. 2018, Table G.1: unroll 20, learning rate 6e-4 annealed, "
               "entropy 0.01, baseline cost 0.5, gradient clip 40; Adam here: the paper's RMSProp, IMPALA's "
               "default, is not yet measured on Atari), on the Nature CNN (its 512-unit layer, relu)",
        fields={"optimizer": "adam", "lr": 6e-4, "num_envs": 8, "num_steps": 20, "anneal_lr": True, "gamma": 0.99,
                "ent_coef": 0.01, "vf_coef": 0.5, "max_grad_norm": 40.0, "hidden": (512,), "activation": "relu",
                "torso": "auto"},
    ),
    Preset(
        name="dqn-atari", algo="dqn", matches=_atari, family="Atari (gym:ALE/NAME)",
        source="the Nature DQN's network and batch (Mnih et al. 2015: 32, a gradient step every 4 agent steps), "
               "Double DQN, Adam 1e-4, a 100k-transition replay stored frame by frame (~1 GB; Nature: 1M), with "
               "Ape-X's prioritized replay and per-slot epsilons",
        fields={"num_envs": 8, "buffer_size": 100_000, "batch_size": 32, "lr": 1e-4, "train_interval": 4,
                "target_update_interval": 8000, "gamma": 0.99, "double_dqn": True, "hidden": (512,),
                "activation": "relu", "max_grad_norm": 10.0},
    ),
    Preset(
        name="ppo-pendulum", algo="ppo", matches=lambda env: env == "Pendulum-v1", family="gymnax Pendulum-v1",
        source="sparqrl's own sweep (BENCHMARKS.md, 'Presets'): PureJaxRL's continuous layout at 16 envs x 128 "
               "steps, gamma and lr picked over {0.9, 0.95, 0.99} x {3e-4, 1e-3}",
        fields={"lr": 3e-4, "num_envs": 16, "num_steps": 128, "update_epochs": 10, "num_minibatches": 32,
                "gamma": 0.95, "ent_coef": 0.0, "anneal_lr": False, "normalize_obs": True, "normalize_reward": True},
    ),
    Preset(
        name="impala-host", algo="impala", matches=lambda env: env.startswith("gym:") and not _atari(env),
        family="host environments (gym:NAME but Atari)",
        source="sparqrl's own runs (BENCHMARKS.md, 'impala-host: the collapse'): the actor-learner runner's actors "
               "act with copies a few versions old, and V-trace's importance weights clipped at 1 then bias the "
               "policy gradient toward the learner's own recent moves whenever the critic overestimates, until one "
               "action is certain; rho_bar 10 leaves them unclipped in practice (on device they are 1), and one "
               "request in flight per actor (lag: actors - 1 versions, not 2 x actors - 1) keeps the learner's "
               "policy near the actors' copy, so that the weights stay under 10",
        fields={"rho_bar": 10.0},
        run_fields={"in_flight": 1},
    ),
)

NAMES = tuple(p.name for p in PRESETS)
CHOICES = ("auto", "none") + NAMES


def find(algo: str, env: str, choice: str = "auto") -> Preset | None:
    """The preset `choice` selects for `algo` on `env`: auto, the env family's (None where there is none);
    none, None; a name, that preset (which must be `algo`'s)."""
    cfg.one_of("preset", choice, CHOICES)
    if choice == "none":
        return None
    if choice != "auto":
        preset = next(p for p in PRESETS if p.name == choice)
        cfg.require(preset.algo == algo, "preset", choice, f"is a preset of {preset.algo}, not of {algo}")
        return preset
    return next((p for p in PRESETS if p.algo == algo and p.matches(env)), None)


def apply(preset: Preset | None, config: Any) -> Any:
    """`config` with the preset's fields (the caller then applies the user's own values over it)."""
    return config if preset is None else dataclasses.replace(config, **preset.fields)


def apply_run(preset: Preset | None, run: Any) -> Any:
    """`run` (a `RunConfig`) with the preset's run fields (the caller then applies the user's own values)."""
    return run if preset is None else dataclasses.replace(run, **preset.run_fields)


def describe(name: str, config: Any, env: str, run: Any = None) -> str:
    """The line a run prints about the preset it uses: its values as the run has them (the user's win); its run
    fields where `run` is given (the runner that uses them)."""
    preset = next(p for p in PRESETS if p.name == name)
    used = ", ".join([f"{k}={getattr(config, k)}" for k in preset.fields]
                     + [f"{k}={getattr(run, k)}" for k in (preset.run_fields if run is not None else ())])
    return f"preset {name} for {env}: {used} (--preset none: the algorithm's defaults)"


def name_of(preset: Preset | None) -> str:
    """What a run records in `run.preset`."""
    return "none" if preset is None else preset.name

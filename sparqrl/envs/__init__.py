"""Environments: gymnax ids run on device, `brax:NAME` runs Brax on device, `gym:ID` runs
Gymnasium on the host; a user's own runs as `gym:MODULE:ATTR` (host) or `jax:MODULE:ATTR` (device),
see `sparqrl.envs.custom`. `act:DIR` (and `act:DIR:silent`) is the victim env of an ACT meta run in DIR
with its evolved adversary held fixed (a silent one), see `sparqrl.meta.act`.

`make_env(name)` returns a device `Env` wrapped with episode statistics; a host env is described by
`host_spec(name)` and stepped by `HostVecEnv` in the actor-learner runner. An unknown name is a
`ConfigError` that lists the close matches.

Gymnasium is imported only for a `gym:` name (or a misspelt name's suggestions): the host-env names
below are loaded from `gym_env` on first use, so a device run starts without it.
"""

from __future__ import annotations

from typing import Any

from sparqrl.config import ConfigError, close_matches
from sparqrl.envs.core import Box, Discrete, Env, Space, StepOut, action_dim, is_atari, is_discrete, is_host_env
from sparqrl.envs.wrappers import EpisodeStats, RunningStats, normalize, running_stats_init, running_stats_update

__all__ = [
    "Box", "Discrete", "Env", "EpisodeStats", "HostSpec", "HostStep", "HostVecEnv", "RunningStats", "Space",
    "StepOut", "action_dim", "env_names", "evaluate_host", "host_spec", "is_act_env", "is_atari", "is_discrete",
    "is_host_env", "make_env", "normalize", "resolve_env_name", "running_stats_init", "running_stats_update",
    "validate_env_name",
]

BRAX_NAMES = (
    "ant", "fast", "halfcheetah", "hopper", "humanoid", "humanoidstandup", "inverted_pendulum",
    "inverted_double_pendulum", "pusher", "reacher", "swimmer", "walker2d",
)


ACT_PREFIX = "act:"
"""Names of ACT victim envs start with this: `act:DIR[:silent]` (`sparqrl.meta.act`, read when one is named)."""


def is_act_env(name: Any) -> bool:
    """Whether `name` is an `act:DIR[:silent]` env (a fixed ACT adversary; no import)."""
    return isinstance(name, str) and name.startswith(ACT_PREFIX)


def _act() -> Any:
    """`sparqrl.meta.act`, imported for an `act:` name only (the meta package needs evosax)."""
    from sparqrl.extras import need_installed

    need_installed("evosax", "an act:DIR environment (an ACT meta run's adversary)")
    from sparqrl.meta import act

    return act


def resolve_env_name(name: str) -> str:
    """The name a run records for env `name`: an `act:DIR[:silent]` one resolved to its absolute folder and
    the hash of what it builds (`sparqrl.meta.act.resolve_env_name`), checked; any other name as it is."""
    return _act().resolve_env_name(name) if is_act_env(name) else name


_HOST_NAMES = ("HostSpec", "HostStep", "HostVecEnv", "evaluate_host", "gym_names", "host_spec")


def __getattr__(name: str) -> Any:
    if name in _HOST_NAMES:
        from sparqrl.envs import gym_env

        return getattr(gym_env, name)
    raise AttributeError(f"module 'sparqrl.envs' has no attribute {name!r}")


def device_env_names() -> list[str]:
    from sparqrl.envs.gymnax_env import gymnax

    return list(gymnax.registered_envs) + [f"brax:{n}" for n in BRAX_NAMES]


def env_names() -> list[str]:
    from sparqrl.envs.gym_env import gym_names

    return device_env_names() + gym_names()


def validate_env_name(name: str) -> None:
    """Raise a `ConfigError` for an unknown environment name, listing the close matches. A user's own
    (`gym:MODULE:ATTR`, `jax:MODULE:ATTR`) is imported and looked up; building and checking it is left to
    `make_env` / `host_spec`."""
    if not isinstance(name, str):
        raise ConfigError(f"env={name!r} must be an environment name (a string)")
    if is_act_env(name):
        _act().open_env_name(name)  # the folder, its adversary and a recorded hash
        return
    from sparqrl.envs import custom

    if custom.is_custom(name):
        custom.resolve_name_only(name)
        return
    if not is_host_env(name) and name in device_env_names():
        return  # (Gymnasium's registry is read only for a gym: name or a misspelt one)
    if is_atari(name):
        from sparqrl.envs import atari

        atari.register()  # ALE ids exist once ale_py is imported; without it, the atari extra's one line
    names = env_names()
    if name not in names:
        raise ConfigError(f"env={name!r} is not a known environment{close_matches(name, names)}")


def make_env(name: str) -> Env:
    """Build the device environment `name` with episode statistics."""
    if is_act_env(name):
        return _act().env_from_name(name)  # (its checks are validate_env_name's)
    validate_env_name(name)
    if is_host_env(name):
        raise ConfigError(
            f"env={name!r} is a host (Gymnasium) environment: it runs through the actor-learner "
            "runner (HostVecEnv), not make_env, which builds device environments only"
        )
    from sparqrl.envs import custom

    if custom.is_custom(name):
        return EpisodeStats(custom.device_env(name))
    if name.startswith("brax:"):
        from sparqrl.envs.brax_env import make_brax

        return EpisodeStats(make_brax(name.removeprefix("brax:")))
    from sparqrl.envs.gymnax_env import make_gymnax

    return EpisodeStats(make_gymnax(name))

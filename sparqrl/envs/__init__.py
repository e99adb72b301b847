"""Environments: gymnax ids run on device, `brax:NAME` runs Brax on device, `gym:ID` runs
Gymnasium on the host; a user's own runs as `gym:MODULE:ATTR` (host) or `jax:MODULE:ATTR` (device),
see `sparqrl.envs.custom`. A name under a prefix that a package above this one owns is opened by what that
package registers (`register_prefix`): `act:DIR` by `sparqrl.meta.prefix` (opened by `sparqrl.meta.act`), so
`envs` imports nothing above it.

`make_env(name)` returns a device `Env` wrapped with episode statistics; a host env is described by
`host_spec(name)` and stepped by `HostVecEnv` in the actor-learner runner. An unknown name is a
`ConfigError` that lists the close matches.

Gymnasium is imported only for a `gym:` name (or a misspelt name's suggestions): the host-env names
below are loaded from `gym_env` on first use, so a device run starts without it.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import lazy_loader

from sparqrl.config import ConfigError, close_matches
from sparqrl.envs.core import Box, Discrete, Env, Space, StepOut, action_dim, is_atari, is_discrete, is_host_env

__all__ = [
    "Box", "Discrete", "Env", "EpisodeStats", "HostSpec", "HostStep", "HostVecEnv", "RunningStats", "Space",
    "EnvPrefix", "StepOut", "action_dim", "env_names", "evaluate_host", "host_spec", "is_atari", "is_discrete",
    "is_host_env", "make_env", "normalize", "register_prefix", "resolve_env_name", "running_stats_init",
    "running_stats_update", "validate_env_name",
]

BRAX_NAMES = (
    "ant", "fast", "halfcheetah", "hopper", "humanoid", "humanoidstandup", "inverted_pendulum",
    "inverted_double_pendulum", "pusher", "reacher", "swimmer", "walker2d",
)


class EnvPrefix(NamedTuple):
    """How the names under a prefix owned by a package above `envs` are opened: that package registers a
    loader of one (`register_prefix`), and the entry points (CLI, `sparqrl.api`) import the registering module."""

    check: Callable[[str], Any]
    """Raise a one-line ConfigError for a bad name (what `validate_env_name` does for the others)."""
    make: Callable[[str], Env]
    """The device env the name builds, with episode statistics (its checks are `check`'s)."""
    resolve: Callable[[str], str]
    """The name as a run records it (checked), so that it rebuilds the same env later."""


_PREFIXES: dict[str, Callable[[], EnvPrefix]] = {}
"""The registered prefixes and the loaders of what opens their names."""


def register_prefix(prefix: str, load: Callable[[], EnvPrefix]) -> None:
    """Open every env name that starts with `prefix` with the EnvPrefix `load()` returns (called by the
    package that owns the prefix). `load` runs at the first such name, so that what opens them (JAX, a run's
    files) loads only when a command names one."""
    _PREFIXES[prefix] = load


def _opener(name: Any) -> EnvPrefix | None:
    """What opens `name`, if it starts with a registered prefix."""
    matches = [load for prefix, load in _PREFIXES.items() if isinstance(name, str) and name.startswith(prefix)]
    return matches[0]() if matches else None


def resolve_env_name(name: str) -> str:
    """The name a run records for env `name`: a registered prefix's as its opener resolves it (e.g. `act:DIR`
    to its absolute folder and the hash of what it builds), checked; any other name as it is."""
    opener = _opener(name)
    return name if opener is None else opener.resolve(name)


# Loaded on first use: the host names bring Gymnasium, the wrappers JAX (the command's help needs neither).
__getattr__, __dir__, _ = lazy_loader.attach(__name__, submod_attrs={
    "gym_env": ["HostSpec", "HostStep", "HostVecEnv", "evaluate_host", "gym_names", "host_spec"],
    "wrappers": ["EpisodeStats", "RunningStats", "normalize", "running_stats_init", "running_stats_update"],
})


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
    opener = _opener(name)
    if opener is not None:
        opener.check(name)
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
    opener = _opener(name)
    if opener is not None:
        return opener.make(name)
    validate_env_name(name)
    if is_host_env(name):
        raise ConfigError(
            f"env={name!r} is a host (Gymnasium) environment: it runs through the actor-learner "
            "runner (HostVecEnv), not make_env, which builds device environments only"
        )
    from sparqrl.envs import custom
    from sparqrl.envs.wrappers import EpisodeStats

    if custom.is_custom(name):
        return EpisodeStats(custom.device_env(name))
    if name.startswith("brax:"):
        from sparqrl.envs.brax_env import make_brax

        return EpisodeStats(make_brax(name.removeprefix("brax:")))
    from sparqrl.envs.gymnax_env import make_gymnax

    return EpisodeStats(make_gymnax(name))

"""Environments: gymnax ids run on device, `brax:NAME` runs Brax on device.

`make_env(name)` returns an `Env` wrapped with episode statistics. An unknown name is a
`ConfigError` that lists the close matches.
"""

from __future__ import annotations

from sparqrl.config import ConfigError, close_matches
from sparqrl.envs.core import Box, Discrete, Env, Space, StepOut, action_dim, is_discrete
from sparqrl.envs.wrappers import EpisodeStats, RunningStats, normalize, running_stats_init, running_stats_update

__all__ = [
    "Box", "Discrete", "Env", "EpisodeStats", "RunningStats", "Space", "StepOut", "action_dim",
    "env_names", "is_discrete", "make_env", "normalize", "running_stats_init", "running_stats_update",
    "validate_env_name",
]

BRAX_NAMES = (
    "ant", "fast", "halfcheetah", "hopper", "humanoid", "humanoidstandup", "inverted_pendulum",
    "inverted_double_pendulum", "pusher", "reacher", "swimmer", "walker2d",
)


def env_names() -> list[str]:
    import gymnax

    return list(gymnax.registered_envs) + [f"brax:{n}" for n in BRAX_NAMES]


def validate_env_name(name: str) -> None:
    """Raise a `ConfigError` for an unknown environment name, listing the close matches."""
    names = env_names()
    if name not in names:
        raise ConfigError(f"env={name!r} is not a known environment{close_matches(name, names)}")


def make_env(name: str) -> Env:
    """Build the environment `name` with episode statistics."""
    validate_env_name(name)
    if name.startswith("brax:"):
        from sparqrl.envs.brax_env import make_brax

        return EpisodeStats(make_brax(name.removeprefix("brax:")))
    from sparqrl.envs.gymnax_env import make_gymnax

    return EpisodeStats(make_gymnax(name))
